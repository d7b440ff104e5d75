"""What a chaos run does: seed, length, fault count and mix, workload, broker config.

:class:`ChaosSettings` has the defaults of ``make chaos``; :func:`from_env` applies
the ``CHAOS_*`` environment variables, and the command line (:mod:`chaos.__main__`)
applies its flags over those.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from chaos.schedule import DEFAULT_MIX, parse_mix

# Small timeouts so that faults make acks time out and retries fire within seconds;
# heartbeat 2 s: the router replaces a shard silent for 6 s (a long pause), shorter
# pauses are survived.
BROKER_SETTINGS: tuple[str, ...] = (
    "subscriber.timeout=1",
    "subscriber.retry_interval=0.2",
    "subscriber.retry_count=5",
    "subscriber.heartbeat=2",
    "subscriber.inactive_time=60",
    "subscriber.cleanup_time=5",
    "message.ttl=30",
    "message.cleanup_time=2",
    "message.dedup_window=120",
    "router.adopt_window=3",
    "shard.orphan_timeout=20",
)
SHARDS = 3
STORAGE_MODES = ("memory", "disk", "mixed")
FSYNC_MODES = ("always", "interval", "never")
# topic names by storage kind: a policy matching DISK_PREFIX puts a mixed run's disk
# topics on disk (the names say the kind, so a report line needs no lookup)
DISK_PREFIX = "chaos.disk"
MEMORY_PREFIX = "chaos.mem"


@dataclass
class ChaosSettings:
    seed: int = 1
    duration: float = 200.0          # seconds of the fault phase
    faults: int = 220                # faults planned over it
    mix: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    warmup: float = 3.0
    liveness: float = 15.0           # seconds after the heal for everything to arrive
    producers: int = 3
    subscribers: int = 3
    pullers: int = 1                 # pull readers (FETCH, COMMIT after each page)
    pool: int = 3                    # workers sharing one key-ordered subscription (G10)
    topics: int = 6                  # mixed: every shard holds a disk and a memory topic
    rate: float = 11.0               # messages per second per producer and topic
    flavours: tuple[str, ...] = ("trio", "asyncio")
    request_timeout: float = 1.0
    retry_deadline: float = 8.0
    slow_ack: float = 0.02           # share of messages the first subscriber acks late
    withhold: float = 0.001          # share the second one leaves unacked until inactive (G4)
    latency_bound: float = 0.3       # one-way delay (and jitter) the checker tolerates
    out: Path = Path("chaos-results")
    storage: str = "mixed"           # memory, disk (every topic), mixed (about half on disk)
    fsync: str = "always"            # storage.fsync of the disk topics
    keep_data: bool = False          # keep the run's data directory (removed by default)
    plant: str | None = None         # a planted broker bug (chaos/planted), to prove the checker
    png: bool = True
    tls: bool = False                # the broker's client ports speak TLS (a throwaway CA)
    broker_settings: tuple[str, ...] = BROKER_SETTINGS
    extra_settings: tuple[str, ...] = ()

    @property
    def settings(self) -> list[str]:
        """``--set`` items for ``flux serve`` (defaults, then the user's)."""
        return [*self.broker_settings, *self.extra_settings]

    def storage_overrides(self, data_dir: Path | None, pool_topic: str | None = None
                          ) -> list[str]:
        """``--set`` items that give the broker this run's storage, in ``data_dir``
        (``flux serve --data-dir DIR`` is ``storage.dir=DIR`` plus ``storage.kind=disk``),
        and the worker pool's topic its dead-letter policy (G11)."""
        policies: list[dict[str, object]] = []
        if pool_topic is not None:
            pool: dict[str, object] = {"match": pool_topic, "dead_letter": True}
            if self.storage == "mixed" and pool_topic.startswith(DISK_PREFIX + "."):
                pool["storage"] = "disk"  # (first match wins: it keeps its storage)
            policies.append(pool)
        items: list[str] = []
        if self.storage != "memory" and data_dir is not None:
            items = [f"storage.dir={data_dir}", f"storage.fsync={self.fsync}"]
            if self.storage == "disk":
                items.append("storage.kind=disk")
            else:
                policies.append({"match": f"{DISK_PREFIX}.>", "storage": "disk"})
        if policies:
            items.append(f"topics={json.dumps(policies)}")
        return items

    def serve_args(self, data_dir: Path | None, pool_topic: str | None = None) -> list[str]:
        """Arguments of ``flux serve`` for this run's storage: ``--data-dir`` when every
        topic is on disk (as a user would start it), else the overrides."""
        if self.storage == "disk" and data_dir is not None:
            policy = [item for item in self.storage_overrides(data_dir, pool_topic)
                      if item.startswith("topics=")]
            return ["--data-dir", str(data_dir), "--set", f"storage.fsync={self.fsync}",
                    *(arg for item in policy for arg in ("--set", item))]
        return [arg for item in self.storage_overrides(data_dir, pool_topic)
                for arg in ("--set", item)]

    def replace(self, **changes: object) -> ChaosSettings:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


def from_env(env: dict[str, str] | None = None) -> ChaosSettings:
    """Defaults, with ``CHAOS_SEED``, ``CHAOS_DURATION``, ``CHAOS_FAULTS``, ``CHAOS_MIX``
    (``kind=weight,...``), ``CHAOS_RATE``, ``CHAOS_LIVENESS``, ``CHAOS_OUT``,
    ``CHAOS_STORAGE``, ``CHAOS_FSYNC`` and ``CHAOS_POOL`` applied.
    Raises ValueError for a bad value (naming the variable)."""
    env = dict(os.environ) if env is None else env
    s = ChaosSettings()
    readers = {
        "CHAOS_SEED": ("seed", int), "CHAOS_DURATION": ("duration", float),
        "CHAOS_FAULTS": ("faults", int), "CHAOS_MIX": ("mix", parse_mix),
        "CHAOS_RATE": ("rate", float), "CHAOS_LIVENESS": ("liveness", float),
        "CHAOS_OUT": ("out", Path), "CHAOS_STORAGE": ("storage", _choice(STORAGE_MODES)),
        "CHAOS_FSYNC": ("fsync", _choice(FSYNC_MODES)), "CHAOS_POOL": ("pool", int),
    }
    for var, (attr, parse) in readers.items():
        raw = env.get(var)
        if raw is None or raw == "":
            continue
        try:
            setattr(s, attr, parse(raw))  # type: ignore[operator]
        except ValueError as exc:
            raise ValueError(f"{var}={raw!r}: {exc}") from None
    return s


def _choice(options: tuple[str, ...]) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if raw not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return raw
    return parse
