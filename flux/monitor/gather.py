"""The monitor's cache: every shard's STATS, gathered periodically, and recent rates.

:class:`StatsGatherer` asks each registered shard for STATS every
``http.stats_interval`` seconds (never per message) and keeps the latest
:class:`Snapshot`; :class:`RateHistory` turns successive snapshots into message
rates for the dashboard's charts and ``flux top``. What the router knows of its
shards comes through :class:`ShardDirectory`, so this module never reaches into
the router's internals. Time is read only through the :class:`~flux.host.Host`.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import ssl
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import trio

from flux import errors, protocol
from flux.host import Host
from flux.monitor.shardlink import ShardLink

log = logging.getLogger("flux.monitor")

HISTORY_SECONDS = 600.0   # how far back the rate charts reach
RATE_WINDOW = 10.0        # seconds over which per-topic and per-subscription rates are taken
COUNTERS = ("published", "duplicates", "delivered", "redelivered", "acked", "trimmed")


@dataclasses.dataclass(frozen=True)
class ShardEntry:
    """What the router knows of one shard index."""

    index: int
    registered: bool
    pid: int | None = None
    generation: int | None = None
    address: str | None = None      # where the shard listens (the monitor dials it)
    restarts: int = 0
    recovering: bool = False        # registered, still rebuilding its disk topics (Busy)


class ShardDirectory(Protocol):
    """The router as the monitor sees it."""

    shard_count: int

    def entries(self) -> list[ShardEntry]:
        """One entry per shard index, in index order."""
        ...

    def stopping(self) -> bool:
        """Whether the broker is stopping."""
        ...


@dataclasses.dataclass(frozen=True)
class ShardView:
    """One shard in a snapshot: the router's entry and its latest STATS reply."""

    entry: ShardEntry
    stats: dict[str, Any] | None    # None until a STATS reply of this generation arrived
    error: str | None = None        # why the last gathering failed, if it did

    @property
    def up(self) -> bool:
        """Registered, and its last STATS request was answered."""
        return self.entry.registered and self.stats is not None and self.error is None


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """Every shard's view at one gathering (``at``: the host's monotonic clock)."""

    at: float
    wall: float
    shards: tuple[ShardView, ...]

    def topics(self) -> Iterable[tuple[int, str, dict[str, Any]]]:
        """``(shard index, topic name, topic stats)`` of every shard that answered."""
        for view in self.shards:
            if view.stats is not None:
                for name in sorted(view.stats["topics"]):
                    yield view.entry.index, name, view.stats["topics"][name]


def lag(topic: dict[str, Any], sub: dict[str, Any]) -> int:
    """Messages at or above the cursor not yet acked (exact when the shard reports them)."""
    if "lag" in sub:
        return int(sub["lag"])
    return max(0, int(topic["next_offset"]) - int(sub["cursor"]))


@dataclasses.dataclass(frozen=True)
class Sample:
    """Totals at one gathering: broker-wide counters (resets undone), topic and cursor
    positions (for rates)."""

    at: float
    wall: float
    totals: dict[str, int]
    offsets: dict[str, int]                 # topic -> next offset
    cursors: dict[tuple[str, str], int]     # (topic, subscription) -> cursor
    shards: dict[int, dict[str, int]] = dataclasses.field(default_factory=dict)  # per shard


class RateHistory:
    """Successive samples; counters survive shard restarts (a drop counts as a reset)."""

    def __init__(self, keep_seconds: float = HISTORY_SECONDS) -> None:
        self.keep_seconds = keep_seconds
        self.samples: deque[Sample] = deque()
        self._last: dict[int, tuple[int, dict[str, int]]] = {}   # shard -> (generation, counters)
        self._totals = dict.fromkeys(COUNTERS, 0)
        self._shard_totals: dict[int, dict[str, int]] = {}

    def add(self, snapshot: Snapshot) -> Sample:
        """Record a snapshot; returns its sample."""
        offsets: dict[str, int] = {}
        cursors: dict[tuple[str, str], int] = {}
        for view in snapshot.shards:
            stats = view.stats
            if stats is None or view.error is not None:
                continue
            counters = {k: int(stats.get("counters", {}).get(k, 0)) for k in COUNTERS}
            generation = int(stats["generation"])
            previous = self._last.get(view.entry.index)
            shard_totals = self._shard_totals.setdefault(view.entry.index,
                                                         dict.fromkeys(COUNTERS, 0))
            for key in COUNTERS:
                before = 0
                if previous is not None and previous[0] == generation:
                    before = previous[1][key]
                # a new generation (or a counter that went down) started from zero
                delta = counters[key] - before
                grown = delta if delta >= 0 else counters[key]
                self._totals[key] += grown
                shard_totals[key] += grown
            self._last[view.entry.index] = (generation, counters)
            for name, topic in stats["topics"].items():
                offsets[name] = int(topic["next_offset"])
                for sub_name, sub in topic["subscriptions"].items():
                    cursors[(name, sub_name)] = int(sub["cursor"])
        sample = Sample(snapshot.at, snapshot.wall, dict(self._totals), offsets, cursors,
                        {index: dict(t) for index, t in self._shard_totals.items()})
        self.samples.append(sample)
        while self.samples and self.samples[0].at < snapshot.at - self.keep_seconds:
            self.samples.popleft()
        return sample

    def series(self, key: str) -> list[tuple[float, float]]:
        """``(wall time, rate per second)`` of counter ``key`` between successive samples."""
        out: list[tuple[float, float]] = []
        for before, after in itertools.pairwise(self.samples):
            dt = after.at - before.at
            if dt > 0:
                out.append((after.wall, (after.totals[key] - before.totals[key]) / dt))
        return out

    def _window(self, seconds: float) -> tuple[Sample, Sample] | None:
        if len(self.samples) < 2:
            return None
        last = self.samples[-1]
        first = self.samples[-2]
        for sample in reversed(self.samples):
            if sample.at < last.at - seconds:
                break
            first = sample
        if first is last:
            first = self.samples[-2]
        return first, last

    def rate(self, key: str, seconds: float = RATE_WINDOW) -> float:
        """Counter ``key`` per second over about the last ``seconds``."""
        window = self._window(seconds)
        if window is None:
            return 0.0
        first, last = window
        return (last.totals[key] - first.totals[key]) / (last.at - first.at)

    def shard_rate(self, index: int, key: str, seconds: float = RATE_WINDOW) -> float:
        """Counter ``key`` of shard ``index`` per second over about the last ``seconds``."""
        return self._moved(seconds, lambda s: s.shards.get(index, {}).get(key))

    def topic_rate(self, topic: str, seconds: float = RATE_WINDOW) -> float:
        """Publishes per second to ``topic`` (its next offset's growth)."""
        return self._moved(seconds, lambda s: s.offsets.get(topic))

    def ack_rate(self, topic: str, name: str, seconds: float = RATE_WINDOW) -> float:
        """How fast subscription ``name``'s cursor moves (messages per second)."""
        return self._moved(seconds, lambda s: s.cursors.get((topic, name)))

    def _moved(self, seconds: float, position: Any) -> float:
        window = self._window(seconds)
        if window is None:
            return 0.0
        first, last = window
        a, b = position(first), position(last)
        if a is None or b is None or b < a:  # new, or reset by a new generation
            return 0.0
        return float(b - a) / (last.at - first.at)


class StatsGatherer:
    """Gathers every registered shard's STATS each ``interval`` seconds into a cache."""

    def __init__(self, host: Host, directory: ShardDirectory, interval: float,
                 timeout: float | None = None,
                 hello: Callable[[], dict[str, Any]] | None = None,
                 tls: Callable[[], ssl.SSLContext | None] | None = None) -> None:
        self.host = host
        # the context its new links speak TLS to the shards with (it may be reloaded)
        self.tls = tls
        self.directory = directory
        self.hello = hello  # credential fields of its links' HELLOs (with auth on)
        self.interval = interval
        self.timeout = timeout if timeout is not None else max(1.0, interval)
        self.history = RateHistory()
        self.snapshot = Snapshot(host.now(), host.wall_time(), tuple(
            ShardView(entry, None) for entry in directory.entries()))
        self.gatherings = 0
        self._links: dict[int, ShardLink] = {}
        self._updated = trio.Event()

    async def run(self) -> None:
        """Gather forever, one pass every ``interval`` seconds."""
        try:
            while True:
                started = self.host.now()
                try:
                    await self.gather()
                except Exception:  # a malformed reply must not stop the router's monitor
                    log.exception("gathering shard STATS failed; trying again next interval")
                await self.host.sleep_until(max(started + self.interval, self.host.now()))
        finally:
            with trio.CancelScope(shield=True):
                for link in self._links.values():
                    await link.aclose()

    async def wait_gathered(self) -> None:
        """Wait for the next completed gathering."""
        await self._updated.wait()

    async def gather(self) -> Snapshot:
        """Ask every registered shard for STATS (concurrently); cache and return the result."""
        entries = self.directory.entries()
        previous = {view.entry.index: view for view in self.snapshot.shards}
        views: list[ShardView | None] = [None] * len(entries)

        async def one(position: int, entry: ShardEntry) -> None:
            views[position] = await self._gather_one(entry, previous.get(entry.index))

        async with trio.open_nursery() as nursery:
            for position, entry in enumerate(entries):
                nursery.start_soon(one, position, entry)
        snapshot = Snapshot(self.host.now(), self.host.wall_time(),
                            tuple(v for v in views if v is not None))
        self.snapshot = snapshot
        self.history.add(snapshot)
        self.gatherings += 1
        self._updated.set()
        self._updated = trio.Event()
        return snapshot

    async def _gather_one(self, entry: ShardEntry, previous: ShardView | None) -> ShardView:
        if not entry.registered or entry.address is None:
            await self._drop_link(entry.index)
            return ShardView(entry, None, "not registered")
        try:
            reply = await (await self.link(entry)).request([protocol.STATS, 0])
        except errors.FluxError as exc:
            log.debug("STATS of shard %d failed: %s", entry.index, exc)
            kept = previous.stats if previous is not None and previous.stats is not None \
                and previous.stats.get("generation") == entry.generation else None
            return ShardView(entry, kept, f"{type(exc).__name__}: {exc}")
        stats = reply[2] if len(reply) > 2 and isinstance(reply[2], dict) else None
        if stats is None or type(stats.get("generation")) is not int \
                or not isinstance(stats.get("topics"), dict):
            return ShardView(entry, None, "malformed STATS reply")
        return ShardView(entry, stats)

    async def link(self, entry: ShardEntry) -> ShardLink:
        """The connection to ``entry``'s shard (a new one when its address changed)."""
        assert entry.address is not None
        link = self._links.get(entry.index)
        if link is None or link.address != entry.address:
            if link is not None:
                await link.aclose()
            link = ShardLink(self.host, entry.address, self.timeout, self.hello,
                             self.tls() if self.tls is not None else None)
            self._links[entry.index] = link
        return link

    async def _drop_link(self, index: int) -> None:
        link = self._links.pop(index, None)
        if link is not None:
            await link.aclose()
