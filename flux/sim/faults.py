"""Fault plans: timed faults drawn from a seed, written as one line, shrinkable.

A :class:`Fault` is what happens, to whom and for how long; a :class:`FaultPlan`
is a tuple of them in time order. :func:`draw_plan` makes one from a seeded
``random.Random``; :meth:`FaultPlan.encode` / :func:`decode_plan` give the text
that ``flux sim --plan`` replays. Carrying faults out is :mod:`flux.sim.world`'s job.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

# What each kind does (targets: shard-N, router, or a link "a<->b" / one way "a->b"):
#   crash     SIGKILL a shard; the router restarts it with a new generation (G7)
#   pause     SIGSTOP a shard for `duration`: its timers and sockets freeze
#   router    kill the router; a supervisor restarts it after `duration`
#   partition hold all traffic on a link for `duration` (one way with "->")
#   stall     a short partition
#   reset     reset every connection on a link (an RST each way)
#   slow      multiply a link's latency by `factor` for `duration`
#   power     a shard machine loses power: the shard dies and its disk keeps only what
#             was fsynced (an unsynced tail may survive torn or zero-filled, G9)
#   flip      a bit of a synced block of a shard machine's disk flips, and the shard is
#             killed (so recovery reads the damage back)
#   rot       a bit of a synced block flips while the shard runs: a read back (a delivery
#             or FETCH of an evicted payload, compaction) or a later recovery finds it
#   eio       the next fsync on a shard machine's disk fails (EIO): the log stops, the
#             shard exits and the router restarts it (G9); as on Linux, what it did not
#             write still reads back, until a power loss. With a duration
#             (``FaultMix.eio_joined``: scenario busy-disk) it waits up to that long for
#             an fsync that starts while another of its file is under way, and fails
#             the write-back of the one under way: each overlapping fsync must see it
#   nofiles   a shard machine's data directory takes no new file for `duration` (EIO):
#             drawn only with an eio at the same moment (``FaultMix.nofiles_with_eio``:
#             scenario dead-disk),
#             so the failed fsync's marker cannot be made in the log's directory
#   full      a shard machine's disk is full for `duration`: every write fails (ENOSPC)
#   slowdisk  a shard machine's fsyncs take 0.2-2 s each for `duration`
KINDS = ("crash", "pause", "router", "partition", "stall", "reset", "slow", "power", "flip",
         "eio", "full", "slowdisk", "rot", "nofiles")
SHARD_INSTANT = ("crash", "power", "flip", "eio", "rot")   # instant faults of a shard machine
SHARD_SPAN = ("pause", "full", "slowdisk")            # ... and those that last a while


@dataclass(frozen=True, order=True)
class Fault:
    at: float
    kind: str
    target: str
    duration: float = 0.0
    factor: float = 1.0

    def encode(self) -> str:
        text = f"{self.kind}:{self.target}@{self.at:g}"
        if self.duration:
            text += f"+{self.duration:g}"
        if self.factor != 1.0:
            text += f"x{self.factor:g}"
        return text

    @classmethod
    def decode(cls, text: str) -> Fault:
        kind, _, rest = text.partition(":")
        target, _, when = rest.rpartition("@")
        factor = 1.0
        if "x" in when:
            when, _, f = when.partition("x")
            factor = float(f)
        at, _, duration = when.partition("+")
        if kind not in KINDS or not target:
            raise ValueError(f"bad fault {text!r}: expected kind:target@at[+duration][xfactor]")
        return cls(float(at), kind, target, float(duration or 0.0), factor)


@dataclass(frozen=True)
class FaultPlan:
    faults: tuple[Fault, ...] = ()

    def __len__(self) -> int:
        return len(self.faults)

    def __iter__(self) -> Iterator[Fault]:
        return iter(self.faults)

    def encode(self) -> str:
        """One shell-safe line: ``kind:target@at+duration,...`` (``-`` when empty)."""
        return ",".join(f.encode() for f in self.faults) or "-"

    def subset(self, keep: Sequence[int]) -> FaultPlan:
        return FaultPlan(tuple(self.faults[i] for i in keep))


def decode_plan(text: str) -> FaultPlan:
    """Parse :meth:`FaultPlan.encode` output; raises ValueError on a bad fault."""
    text = text.strip()
    if text in ("", "-"):
        return FaultPlan()
    return FaultPlan(tuple(sorted(Fault.decode(part) for part in text.split(",") if part)))


@dataclass(frozen=True)
class FaultMix:
    """How often each kind is drawn (relative weights) and how many faults a run gets."""

    weights: tuple[tuple[str, float], ...]
    count: tuple[int, int] = (2, 10)
    pause: tuple[float, float] = (0.5, 6.0)
    router_down: tuple[float, float] = (0.5, 5.0)
    partition: tuple[float, float] = (0.5, 8.0)
    stall: tuple[float, float] = (0.05, 0.8)
    slow: tuple[float, float] = (1.0, 6.0)
    producers_only: bool = False  # link faults pick producers, not subscribers
    # chance that an eio is followed, this many seconds later, by a power loss of its
    # machine (what a failed fsync lost is then gone); drawn after the other faults,
    # so a seed's other faults stay what they were
    power_after_eio: float = 0.0
    power_delay: tuple[float, float] = (2.0, 10.0)
    # seconds an eio waits for an fsync to start beside another of its file, whose
    # write-back it then fails (0: it fails the next fsync); given to each eio as its
    # duration, so a seed's faults are drawn as without it
    eio_joined: float = 0.0
    # chance that an eio comes with a "nofiles" spell of this many seconds on its machine
    # (drawn after the power losses, so they stay what they were)
    nofiles_with_eio: float = 0.0
    nofiles: tuple[float, float] = (0.5, 4.0)
    links: tuple[tuple[str, float], ...] = (
        ("client<->shard", 1.0), ("client<->router", 1.0), ("router<->shard", 1.0))


def draw_plan(rng: random.Random, mix: FaultMix, *, shards: int, clients: Sequence[str],
              start: float, end: float) -> FaultPlan:
    """A random plan of faults between ``start`` and ``end`` (simulated seconds)."""
    kinds = [k for k, _ in mix.weights]
    weights = [w for _, w in mix.weights]
    if not kinds or end <= start:
        return FaultPlan()
    shard_hosts = [f"shard-{i}" for i in range(shards)]
    faults: list[Fault] = []
    for _ in range(rng.randint(*mix.count)):
        kind = rng.choices(kinds, weights)[0]
        at = round(rng.uniform(start, end), 3)
        if kind in SHARD_INSTANT:
            faults.append(Fault(at, kind, rng.choice(shard_hosts),
                                mix.eio_joined if kind == "eio" else 0.0))
        elif kind in SHARD_SPAN:
            faults.append(Fault(at, kind, rng.choice(shard_hosts), _dur(rng, mix.pause)))
        elif kind == "router":
            faults.append(Fault(at, kind, "router", _dur(rng, mix.router_down)))
        else:
            link = _link(rng, mix, shard_hosts, clients,
                         one_way_ok=kind in ("partition", "stall"))
            if kind == "reset":
                faults.append(Fault(at, kind, link))
            elif kind == "slow":
                faults.append(Fault(at, kind, link, _dur(rng, mix.slow),
                                    round(rng.uniform(3.0, 30.0), 1)))
            else:
                span = mix.partition if kind == "partition" else mix.stall
                faults.append(Fault(at, kind, link, _dur(rng, span)))
    if mix.power_after_eio:
        for fault in [f for f in faults if f.kind == "eio"]:
            if rng.random() < mix.power_after_eio:
                at = round(fault.at + rng.uniform(*mix.power_delay), 3)
                faults.append(Fault(min(at, end), "power", fault.target))
    if mix.nofiles_with_eio:
        for fault in [f for f in faults if f.kind == "eio"]:
            if rng.random() < mix.nofiles_with_eio:
                faults.append(Fault(fault.at, "nofiles", fault.target, _dur(rng, mix.nofiles)))
    return FaultPlan(tuple(sorted(faults)))


def _dur(rng: random.Random, span: tuple[float, float]) -> float:
    return round(rng.uniform(*span), 3)


def _link(rng: random.Random, mix: FaultMix, shards: list[str], clients: Sequence[str], *,
          one_way_ok: bool) -> str:
    """A random link ``a<->b`` (or one way ``a->b``) of one of the three kinds."""
    kind = rng.choices([k for k, _ in mix.links], [w for _, w in mix.links])[0]
    if kind == "client<->shard" and clients:
        a, b = rng.choice(list(clients)), rng.choice(shards)
    elif kind == "client<->router" and clients:
        a, b = rng.choice(list(clients)), "router"
    else:
        a, b = "router", rng.choice(shards)
    if one_way_ok and rng.random() < 0.4:
        if rng.random() < 0.5:
            a, b = b, a
        return f"{a}->{b}"
    return f"{a}<->{b}"

