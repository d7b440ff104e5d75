"""Fault schedules for chaos runs: which fault, on what, when and for how long, from a seed.

A :class:`PlannedFault` names a kind of :data:`KINDS` and its target (a shard index,
or the router). :func:`draw_schedule` spreads ``count`` faults over the fault
phase, weighted by a :data:`DEFAULT_MIX`-like mix, never starting a fault on a
target another fault still holds. Carrying faults out is :mod:`chaos.faults`' job.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# shard-kill   SIGKILL a shard process; the router restarts it (new generation, G7)
# shard-pause  SIGSTOP a shard, SIGCONT after `duration` (acks time out, retries fire;
#              a long pause outlives the router's heartbeat watchdog, which replaces it)
# router-kill  SIGKILL the router; the runner restarts it after `duration` (adoption)
# latency      the shard's proxy delays every chunk by `amount` seconds for `duration`
# stall        the shard's proxy holds all traffic for `duration`, then delivers it
# reset        the shard's proxy resets every connection (an RST each way)
# blackhole    the shard's proxy drops all traffic for `duration`, then resets what it broke
KINDS = ("shard-kill", "shard-pause", "router-kill", "latency", "stall", "reset", "blackhole")
NETWORK = ("latency", "stall", "reset", "blackhole")
DEFAULT_MIX: dict[str, float] = {
    "shard-kill": 1.0, "shard-pause": 1.5, "router-kill": 0.6,
    "latency": 1.6, "stall": 1.6, "reset": 1.6, "blackhole": 1.2,
}
LONG_PAUSE_SHARE = 0.15
# seconds a target stays held after a fault ends (a restart, a re-registration)
SETTLE = {"shard-kill": 3.0, "shard-pause": 1.0, "router-kill": 4.0}


@dataclass(frozen=True, order=True)
class PlannedFault:
    at: float               # seconds after the fault phase began
    kind: str
    target: int             # shard index; -1 for the router
    duration: float = 0.0
    amount: float = 0.0     # latency: seconds added per chunk

    @property
    def target_name(self) -> str:
        """The host name the history uses: ``shard-<index>`` or ``router``."""
        return "router" if self.target < 0 else f"shard-{self.target}"

    def describe(self) -> str:
        text = f"{self.kind}:{self.target_name}@{self.at:.2f}"
        if self.duration:
            text += f"+{self.duration:.2f}"
        if self.amount:
            text += f" ({self.amount * 1000:.0f}ms)"
        return text


def parse_mix(text: str) -> dict[str, float]:
    """``"shard-kill=1,reset=2"`` -> weights (kinds not named get 0). Raises ValueError."""
    mix = dict.fromkeys(KINDS, 0.0)
    for part in text.split(","):
        if not part.strip():
            continue
        kind, sep, weight = part.partition("=")
        kind = kind.strip()
        if kind not in KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; known: {', '.join(KINDS)}")
        mix[kind] = float(weight) if sep else 1.0
        if mix[kind] < 0:
            raise ValueError(f"fault weight of {kind} must be >= 0")
    if not any(mix.values()):
        raise ValueError("the fault mix gives every kind weight 0")
    return mix


def _duration(rng: random.Random, kind: str) -> tuple[float, float]:
    """(duration, amount) for one fault of ``kind``."""
    if kind == "shard-pause":
        if rng.random() < LONG_PAUSE_SHARE:
            return rng.uniform(7.0, 9.0), 0.0
        return rng.uniform(1.0, 3.5), 0.0
    if kind == "router-kill":
        return rng.uniform(0.2, 2.0), 0.0
    if kind == "latency":
        return rng.uniform(1.0, 4.0), rng.uniform(0.02, 0.3)
    if kind == "stall":
        return rng.uniform(0.3, 2.5), 0.0
    if kind == "blackhole":
        return rng.uniform(0.5, 3.0), 0.0
    return 0.0, 0.0


def _resource(kind: str, target: int) -> str:
    if kind == "router-kill":
        return "router"
    return f"{'net' if kind in NETWORK else 'proc'}:{target}"


def draw_schedule(rng: random.Random, mix: dict[str, float], count: int, span: float,
                  shards: int) -> list[PlannedFault]:
    """``count`` faults spread over ``span`` seconds (one per slot of ``span/count``,
    at a random point in it), each on a target that is free then (later in the phase
    when none is; fewer faults only if the phase is too full for ``count``)."""
    kinds = [k for k in KINDS if mix.get(k, 0.0) > 0]
    weights = [mix[k] for k in kinds]
    busy: dict[str, float] = {}
    plan: list[PlannedFault] = []
    slot = span / max(1, count)
    for i in range(count):
        at = (i + rng.random()) * slot
        kind = rng.choices(kinds, weights)[0]
        targets = [-1] if kind == "router-kill" else list(range(shards))
        free = [t for t in targets if busy.get(_resource(kind, t), -1.0) <= at]
        if not free:
            # every target of that kind is held: the first that frees up takes it, if the
            # phase lasts that long (else any kind's soonest target)
            options = [(busy.get(_resource(k, t), -1.0), k, t) for k in kinds
                       for t in ([-1] if k == "router-kill" else range(shards))]
            same = [o for o in options if o[1] == kind and o[0] < span]
            soonest = min(same or options)
            if soonest[0] >= span:
                continue
            at, kind, free = max(at, soonest[0]), soonest[1], [soonest[2]]
        target = rng.choice(free)
        duration, amount = _duration(rng, kind)
        busy[_resource(kind, target)] = at + duration + SETTLE.get(kind, 0.2)
        plan.append(PlannedFault(at, kind, target, duration, amount))
    plan.sort()
    return plan
