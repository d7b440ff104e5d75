"""The bench's workloads, run against each system in turn, and the figures they yield.

One :class:`Plan` (sizes, counts, rate, repeats) runs the same workloads on every
system: publish throughput, end-to-end throughput with push delivery and
per-message acks, server CPU per message, latency percentiles at a fixed offered
rate, memory per held message, and (Flux) throughput against shard count.
Figures are medians over ``repeat`` runs. Reporting is :mod:`flux.bench.report`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flux.bench import durable, recovery, systems, workqueue
from flux.bench.measure import median, rss_bytes, total_cpu
from flux.bench.run_workers import run_workers
from flux.bench.worker import Spec
from flux.hashing import shard_for

SYSTEMS = ("flux", "nats", "jetstream", "redis")
LABELS = {"flux": "Flux", "nats": "NATS core", "jetstream": "JetStream", "redis": "Redis"}
# messages per run relative to Plan.count (the slow systems get fewer, so runs stay short)
SCALE = {"flux": 1.0, "nats": 1.0, "jetstream": 0.2, "redis": 0.5}
# per system: (publish calls in flight, messages per call)
SHAPE = {"flux": (8, 256), "nats": (1, 256), "jetstream": (16, 256), "redis": (4, 256)}
ID_BYTES = 32


@dataclass
class Plan:
    """What a bench run does."""

    systems: list[str]
    count: int = 400_000            # 100-byte messages per throughput run (4 KiB: / 8)
    sizes: tuple[int, ...] = (100, 4096)
    rate: float = 5000.0            # offered rate of the latency runs
    latency_seconds: float = 5.0
    memory_count: int = 200_000     # messages held for the memory figure
    repeat: int = 3
    shard_counts: tuple[int, ...] = (1, 2)
    client: str = "asyncio"         # the Flux client flavour: asyncio or trio
    # main: the figures above; durable: disk topics beside the peers' durable modes
    # (flux.bench.durable); recovery: a shard restarted over a full disk topic;
    # workqueue: shared subscriptions beside the peers' pools (flux.bench.workqueue)
    sections: tuple[str, ...] = ("main", "durable")
    in_flight: int = 2048           # publishes in flight on every durable row
    data_dir: str | None = None     # where disk rows keep their logs (None: the temp dir)
    recovery_bytes: int = 1 << 30   # payload bytes the recovery run fills the topic with
    recovery_dedup: tuple[str, ...] = ("expired", "full")   # dedup windows the recovery times
    recovery_drop_cache: bool = True   # drop the page cache before the kill (needs root)

    def count_for(self, system: str, size: int) -> int:
        n = self.count * SCALE[system] / (8 if size > 1000 else 1)
        return max(1000, int(n))

    def steps(self) -> int:
        total = 0
        if "main" in self.sections:
            per = self.repeat * len(self.sizes) * 2 + 2   # publish + e2e per size; latency; memory
            flux_scaling = self.repeat * len([n for n in self.shard_counts if n > 1])
            total += per * len(self.systems) + (flux_scaling if "flux" in self.systems else 0)
        if "durable" in self.sections:
            total += durable.steps(self)
        if "recovery" in self.sections and "flux" in self.systems:
            total += recovery.steps(self)
        if "workqueue" in self.sections:
            total += workqueue.steps(self)
        return total


@dataclass
class Figures:
    """What one system measured; throughputs in msg/s, CPU in us/msg, memory in B/msg."""

    publish: dict[int, float] = field(default_factory=dict)
    e2e: dict[int, float] = field(default_factory=dict)
    cpu: dict[int, float] = field(default_factory=dict)
    latency: dict[str, float] = field(default_factory=dict)
    memory: float | None = None
    scaling: dict[int, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    background: list[float] = field(default_factory=list)   # other load, cores, per run


class Runner:
    """Runs a :class:`Plan`; ``advance(description)`` is called before each step."""

    def __init__(self, plan: Plan, advance: Callable[[str], None]) -> None:
        self.plan = plan
        self.advance = advance
        self.figures: dict[str, Figures] = {s: Figures() for s in plan.systems}
        self.configs: dict[str, dict[str, Any]] = {}
        self.versions: dict[str, str] = {}
        self.runs: list[dict[str, Any]] = []
        self._topics = itertools.count()
        self.durable: durable.DurableReport | None = None
        self.recovery: list[recovery.RecoveryFigures] = []
        self.workqueue: workqueue.WorkqueueReport | None = None

    def run(self) -> None:
        """The plan's sections in turn: the main figures, durable topics, recovery, work
        queues."""
        plan = self.plan
        if "main" in plan.sections:
            self._main()
        if "durable" in plan.sections:
            self.durable = durable.run(self)
        if "recovery" in plan.sections and "flux" in plan.systems:
            self.recovery = recovery.run(self)
        if "workqueue" in plan.sections:
            self.workqueue = workqueue.run(self)

    def _main(self) -> None:
        """Every system's brokers run at once and the workloads take turns, system by
        system, so the ratios compare runs made under the same background load."""
        plan = self.plan
        with contextlib.ExitStack() as stack:
            brokers: dict[str, systems.Broker] = {}
            if "flux" in plan.systems:
                brokers["flux"] = stack.enter_context(systems.start_flux(1))
                self._remember(brokers["flux"], "flux",
                               client={**systems.FLUX_CLIENT, "flavour": plan.client})
            if "nats" in plan.systems or "jetstream" in plan.systems:
                nats = stack.enter_context(systems.start_nats())
                for system in ("nats", "jetstream"):
                    if system in plan.systems:
                        brokers[system] = nats
                        self._remember(nats, system)
            if "redis" in plan.systems:
                brokers["redis"] = stack.enter_context(systems.start_redis())
                self._remember(brokers["redis"], "redis")
            self._throughput(brokers)
            for system, broker in brokers.items():
                self._latency(system, broker)
            for system, broker in brokers.items():
                if system != "flux":
                    self.advance(f"{LABELS[system]}: memory per held message")
                    self.figures[system].memory = self._peer_memory(system, broker)
        if "flux" in plan.systems:
            self._flux_memory()
            for shards in plan.shard_counts:
                if shards > 1:
                    self._flux_scaling(shards)

    def _remember(self, broker: systems.Broker, system: str,
                  client: dict[str, Any] | None = None) -> None:
        self.configs[system] = {**broker.settings, **({"client": client} if client else {})}
        self.versions[system] = broker.version

    # -- workloads -----------------------------------------------------------------------

    def _throughput(self, brokers: dict[str, systems.Broker]) -> None:
        plan = self.plan
        pubs: dict[tuple[str, int], list[float]] = {}
        e2es: dict[tuple[str, int], list[float]] = {}
        cpus: dict[tuple[str, int], list[float]] = {}
        for r in range(plan.repeat):
            for size in plan.sizes:
                for system, broker in brokers.items():
                    n = plan.count_for(system, size)
                    key = (system, size)
                    self.advance(f"{LABELS[system]}: publish {n:,} x {size} B"
                                 f" ({r + 1}/{plan.repeat})")
                    out = self._measure(system, broker, [self._producer(system, broker, size, n)])
                    if out is not None:
                        pubs.setdefault(key, []).append(out["rate"])
                    self.advance(f"{LABELS[system]}: end to end {n:,} x {size} B"
                                 f" ({r + 1}/{plan.repeat})")
                    out = self._measure(system, broker, [self._producer(system, broker, size, n)],
                                        consumer=True)
                    if out is not None:
                        e2es.setdefault(key, []).append(out["rate"])
                        if out["server_cpu_us"] is not None:
                            cpus.setdefault(key, []).append(out["server_cpu_us"])
        for (system, size), values in pubs.items():
            self.figures[system].publish[size] = median(values)
        for (system, size), values in e2es.items():
            self.figures[system].e2e[size] = median(values)
        for (system, size), values in cpus.items():
            self.figures[system].cpu[size] = median(values)

    def _latency(self, system: str, broker: systems.Broker) -> None:
        plan = self.plan
        self.advance(f"{LABELS[system]}: latency at {plan.rate:,.0f} msg/s")
        n = max(100, int(plan.rate * plan.latency_seconds))
        spec = self._producer(system, broker, 100, n)
        spec.mode, spec.rate = "latency", plan.rate
        out = self._measure(system, broker, [spec], consumer=True)
        if out is not None:
            self.figures[system].latency = out["latency_us"]

    def _producer(self, system: str, broker: systems.Broker, size: int, n: int,
                  topic: str | None = None) -> Spec:
        window, batch = SHAPE[system]
        return Spec(system, "producer", broker.url, topic or self._topic(system), n, size=size,
                    window=window, batch=batch,
                    options=self._options())

    def _options(self) -> dict[str, Any]:
        """What every Flux worker is told beside its spec (ignored by the peers')."""
        return {"retry_deadline": systems.FLUX_CLIENT["retry_deadline"], "client": self.plan.client}

    def _topic(self, system: str) -> str:
        # JetStream's stream takes "js.>" only, so NATS core subjects are never stored
        prefix = "js" if system == "jetstream" else "bench"
        return f"{prefix}.{system}.{os.getpid()}.{next(self._topics)}"

    def _measure(self, system: str, broker: systems.Broker, producers: list[Spec],
                 consumer: bool = False, figures: Figures | durable.DurableFigures | None = None,
                 ) -> dict[str, Any] | None:
        """Run producers (and a consumer per producer); the figures of that run.

        Errors and background load go to ``figures`` (default: ``system``'s)."""
        fig = figures if figures is not None else self.figures[system]
        status = broker.process.poll()
        if status is not None:  # say so, rather than a worker's "cannot connect"
            fig.errors.append(f"the {broker.name} broker exited before this run (status {status}"
                              + (", killed from outside" if status == -9 else "") + ")")
            return None
        specs: list[Spec] = []
        if producers[0].system == "jetstream":
            import asyncio

            from flux.bench.peer_workers import ensure_stream
            try:
                asyncio.run(ensure_stream(broker.url, 10.0, **producers[0].options.get("stream", {})))
            except Exception as exc:
                fig.errors.append(f"could not make the stream: {exc}"[-300:])
                return None
        for spec in producers:
            specs.append(spec)
            if consumer:
                specs.append(Spec(spec.system, "consumer", broker.url, spec.topic, spec.count,
                                  size=spec.size, mode=spec.mode, rate=spec.rate,
                                  batch=spec.batch,
                                  prefetch=int(systems.FLUX_CLIENT["prefetch"]),
                                  options=spec.options))
        marks: list[Any] = []

        def at_go() -> None:
            marks.extend((_machine_busy(), total_cpu(broker.pids), time.perf_counter()))

        try:
            results = run_workers(specs, at_go)
        except Exception as exc:  # one failed run must not end the whole bench
            fig.errors.append(str(exc)[-300:])
            return None
        busy1, cpu1 = _machine_busy(), total_cpu(broker.pids)
        busy0, cpu0, t0 = marks
        wall = time.perf_counter() - t0
        self.runs.append({"system": system, "specs": [s.__dict__ for s in specs],
                          "results": results})
        errors = [r["error"] for r in results if r.get("error")]
        if errors:
            fig.errors.extend(errors)
            return None
        start = min(r["start"] for r in results if r["role"] == "producer")
        ends = [r["last"] for r in results if r["role"] == ("consumer" if consumer else "producer")]
        total = sum(s.count for s in producers)
        server = (cpu1 - cpu0) if cpu0 is not None and cpu1 is not None else None
        ours = (server or 0.0) + sum(r["cpu"] for r in results)
        if busy0 is not None and busy1 is not None:
            fig.background.append(max(0.0, (busy1 - busy0 - ours) / wall))
        latency: dict[str, float] = next(
            (r["latency_us"] for r in results if r["latency_us"]), {})
        acks: dict[str, float] = next(
            (r["ack_latency_us"] for r in results if r.get("ack_latency_us")), {})
        return {"rate": total / (max(ends) - start), "latency_us": latency, "ack_latency_us": acks,
                "server_cpu_us": 1e6 * server / total if server is not None else None}

    def _flux_scaling(self, shards: int) -> None:
        """Throughput with ``shards`` shards and one producer/consumer pair per shard."""
        fig = self.figures["flux"]
        if 1 in fig.e2e or 100 in fig.e2e:
            fig.scaling[1] = fig.e2e.get(100, 0.0)
        with systems.start_flux(shards) as broker:
            rates = []
            for r in range(self.plan.repeat):
                self.advance(f"Flux: {shards} shards, {shards} pairs ({r + 1}/{self.plan.repeat})")
                topics = _topics_per_shard(shards, self._topic("flux"))
                n = self.plan.count_for("flux", 100)
                out = self._measure("flux", broker, [self._producer("flux", broker, 100, n, t)
                                                     for t in topics], consumer=True)
                if out is not None:
                    rates.append(out["rate"])
            if rates:
                fig.scaling[shards] = median(rates)

    def _flux_memory(self) -> None:
        """Bytes a shard holds per message beyond payload and id (nothing trimmed)."""
        self.advance("Flux: memory per held message")
        settings = {"message.ttl": 3600, "message.dedup_window": 3600}
        with systems.start_flux(1, settings) as broker:
            self.figures["flux"].memory = self._held(
                "flux", broker, broker.pids[0], self._producer("flux", broker, 100,
                                                               self.plan.memory_count))

    def _peer_memory(self, system: str, broker: systems.Broker) -> float | None:
        if system == "nats":
            return None  # NATS core holds no messages
        if system == "jetstream":
            import asyncio

            from flux.bench.peer_workers import ensure_stream
            asyncio.run(ensure_stream(broker.url, 3600.0))
        n = max(1000, int(self.plan.memory_count * SCALE[system]))
        return self._held(system, broker, broker.pids[0], self._producer(system, broker, 100, n))

    def _held(self, system: str, broker: systems.Broker, pid: int, spec: Spec) -> float | None:
        before = rss_bytes(pid)
        try:
            results = run_workers([spec])
        except Exception as exc:
            self.figures[system].errors.append(str(exc)[-300:])
            return None
        time.sleep(0.5)
        after = rss_bytes(pid)
        if before is None or after is None or results[0].get("error"):
            return None
        overhead = (after - before) / spec.count - (spec.size + ID_BYTES)
        if overhead < 0:  # the broker gave memory back meanwhile (a garbage collector)
            self.figures[system].errors.append(
                "memory: resident size grew less than the payloads and ids; no figure")
            return None
        return overhead


def _topics_per_shard(shards: int, base: str) -> list[str]:
    """One topic name per shard index, each routed to its own shard."""
    found: dict[int, str] = {}
    for i in itertools.count():
        name = f"{base}.{i}"
        found.setdefault(shard_for(name, shards), name)
        if len(found) == shards:
            return [found[k] for k in range(shards)]
    raise AssertionError("unreachable")


def _machine_busy() -> float | None:
    """CPU seconds all processes have used, machine-wide (from /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return (sum(fields[:8]) - fields[3] - fields[4]) / ticks
