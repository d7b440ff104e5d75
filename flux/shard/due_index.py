"""A topic's index of its held delayed messages (G12), a few bytes per message.

Delayed messages are indexed in *runs* of consecutive offsets: a :class:`DueRun`
holds the due time of every offset of its range (8 bytes each in one array, NaN
for a message due when stored) and, once sealed, the order of its delayed ones by
(due, offset), 2 bytes each, and how many of them are due already (fired). The
newest run stays open: publishes append to it (a message published alone costs no
object of its own) until it holds ``RUN_ITEMS`` offsets, ordinary messages
stored since leave too wide a gap, or it must fire; then it is sealed. This index is the only place
due times are kept (the log holds keys and headers only). The shard's timer heap
holds one entry per run with messages still pending, keyed by the earliest of
them; firing walks a run's order, never anything else. :class:`TopicDelays`
keeps a topic's runs in offset order, for lookups by offset and the few walks
STATS, attaches and cleanup make (per run, not per message, wherever a run can be
answered whole).
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from collections.abc import Collection, Iterator, Sequence

RUN_ITEMS = 4096  # offsets an open run takes before a new one starts (sealing sorts them)
RUN_GAP = 64      # ordinary messages an open run spans (8 bytes each) rather than close


class DueRun:
    """Due times of the offsets from ``first`` on (NaN: not delayed)."""

    __slots__ = ("count", "dues", "fired", "first", "last", "last_due", "order", "timer",
                 "topic")

    def __init__(self, topic: str, first: int) -> None:
        self.topic = topic
        self.first = first
        self.dues = array("d")  # due (monotonic) of each offset of the run, NaN: not delayed
        self.count = 0        # delayed messages in it
        self.last = -1        # its highest delayed offset
        self.last_due = -math.inf  # its latest due time
        self.order: array[int] | None = None  # sealed: its delayed items in (due, offset) order
        self.fired = 0  # how many of ``order`` are due already
        self.timer = math.inf  # the key of its live entry in the shard's timer heap

    @property
    def end(self) -> int:
        return self.first + len(self.dues)

    def append(self, first: int, dues: Sequence[float | None]) -> float:
        """Take the due times of offsets ``first`` on (an open run's end or a little
        past it: the gap is not delayed); returns the earliest of them (inf: none)."""
        column = self.dues
        if first > self.end:
            column.extend([math.nan] * (first - self.end))
        soonest = math.inf
        for i, due in enumerate(dues):
            if due is None:
                column.append(math.nan)
                continue
            column.append(due)
            self.count += 1
            self.last = first + i
            self.last_due = max(self.last_due, due)
            soonest = min(soonest, due)
        return soonest

    def seal(self) -> array[int]:
        """Order its delayed messages by (due, offset): it takes no more appends."""
        order = self.order
        if order is None:
            dues = self.dues
            delayed = [i for i, due in enumerate(dues) if due == due]
            delayed.sort(key=dues.__getitem__)  # stable: equal dues stay in offset order
            order = self.order = array("H" if len(dues) <= 0xFFFF else "I", delayed)
        return order

    def next_due(self) -> float | None:
        """The due time of its earliest pending message (None: all fired)."""
        order = self.seal()
        return self.dues[order[self.fired]] if self.fired < len(order) else None

    def fire(self, now: float) -> list[int]:
        """Mark the pending messages due by ``now`` fired (sealing it); returns their
        item indexes, in (due, offset) order."""
        start, end = self.fired, self.due_by(now)
        self.fired = end
        return list(self.seal()[start:end])

    def due_by(self, now: float) -> int:
        """How many of its delayed messages are due by ``now`` (a prefix of its order)."""
        order, fired = self.seal(), self.fired
        if fired == len(order) or self.dues[order[fired]] > now:
            return fired  # the usual case: what fired is what is due
        return bisect_right(order, now, fired, key=self.dues.__getitem__)

    def pending_from(self, offset: int, now: float) -> int:
        """How many of its messages at or above ``offset`` are not due by ``now``."""
        first, dues = self.first, self.dues
        if self.order is None:  # open: look at the items themselves (at most RUN_ITEMS)
            return sum(1 for i in range(max(0, offset - first), len(dues)) if dues[i] > now)
        due = self.due_by(now)
        if offset <= first:
            return len(self.order) - due
        return sum(1 for i in self.order[due:] if first + i >= offset)


class TopicDelays:
    """A topic's :class:`DueRun` s in offset order: the delayed messages it holds."""

    __slots__ = ("_firsts", "_head", "_runs", "last", "release_at")

    def __init__(self) -> None:
        self._runs: list[DueRun] = []
        self._firsts: list[int] = []  # each run's first offset (for bisect)
        self._head = 0  # runs before it are forgotten (compacted away now and then)
        self.last = -1  # the highest delayed offset stored (-1: none)
        # cleanup need not look at the messages kept out of line (TopicLog) before the
        # time ``now - ttl`` reaches this
        self.release_at = -math.inf

    def __bool__(self) -> bool:
        return self._head < len(self._runs)

    def __len__(self) -> int:
        """Delayed messages in the runs it holds (trimmed ones included until forgotten)."""
        return sum(run.count for run in self.runs())

    def __contains__(self, offset: object) -> bool:
        return type(offset) is int and self.due_of(offset) is not None

    def add(self, topic: str, first: int, dues: Sequence[float | None]
            ) -> tuple[DueRun | None, float]:
        """Index the due times (None: not delayed) of offsets stored from ``first`` on
        (above every offset indexed). Returns the run they went to (None: none is
        delayed, and no run is open) and the earliest of them (inf: none)."""
        runs = self._runs
        run = runs[-1] if self._head < len(runs) else None
        if (run is None or run.order is not None or first - run.end > RUN_GAP
                or first + len(dues) - run.first > RUN_ITEMS):
            if not any(due is not None for due in dues):
                return None, math.inf
            if run is not None:
                run.seal()  # closed: only the newest run is ever open (walked item by item)
            run = DueRun(topic, first)
            runs.append(run)
            self._firsts.append(first)
        soonest = run.append(first, dues)
        self.last = max(self.last, run.last)
        return run, soonest

    def column(self, first: int, count: int) -> list[float | None] | None:
        """The due times of offsets ``first`` .. ``first + count - 1`` (None: none is
        delayed)."""
        dues = [self.due_of(o) for o in range(first, first + count)]
        return dues if any(d is not None for d in dues) else None

    def run_of(self, offset: int) -> DueRun | None:
        """The run holding ``offset`` (None: no held run does)."""
        k = bisect_right(self._firsts, offset, self._head) - 1
        if k < self._head:
            return None
        run = self._runs[k]
        return run if offset < run.end else None

    def due_of(self, offset: int) -> float | None:
        """The due time (monotonic) of the delayed message at ``offset`` (None: none)."""
        run = self.run_of(offset)
        if run is None:
            return None
        due = run.dues[offset - run.first]
        return None if due != due else due

    def undelayed_from(self, offset: int) -> int:
        """The first offset at or above ``offset`` of no delayed message (a run wholly
        delayed is passed over at once)."""
        while True:
            run = self.run_of(offset)
            if run is None:
                return offset
            dues, first = run.dues, run.first
            if run.count < len(dues):
                for i in range(offset - first, len(dues)):
                    if dues[i] != dues[i]:  # NaN: due when stored
                        return first + i
            offset = run.end

    def runs(self, offset: int = 0) -> Iterator[DueRun]:
        """The runs holding offsets at or above ``offset``, in offset order."""
        runs = self._runs
        k = max(self._head, bisect_right(self._firsts, offset, self._head) - 1)
        for j in range(k, len(runs)):
            run = runs[j]
            if run.end > offset:
                yield run

    def items(self) -> Iterator[tuple[int, float]]:
        """(offset, due) of every delayed message indexed, in offset order."""
        for run in self.runs():
            first, dues = run.first, run.dues
            for i, due in enumerate(dues):
                if due == due:
                    yield first + i, due

    def pending(self, cursor: int, acked: Collection[int], now: float) -> int:
        """Delayed messages not due by ``now`` at or above ``cursor`` and not in ``acked``
        (per run, not per message, for a run wholly above ``cursor``; the acks are looked
        at one by one only while they are fewer than the pending messages)."""
        count = sum(run.pending_from(cursor, now) for run in self.runs(cursor))
        if not acked or not count:
            return count
        if len(acked) <= count:
            for o in acked:
                if o >= cursor:
                    due = self.due_of(o)
                    if due is not None and due > now:
                        count -= 1
            return count
        for run in self.runs(cursor):
            first, dues = run.first, run.dues
            for i in range(max(0, cursor - first), len(dues)):
                if dues[i] > now and first + i in acked:
                    count -= 1
        return count

    def keep(self, start: int, stop: int, limit: float) -> list[int]:
        """The delayed offsets in ``start`` .. ``stop - 1`` due after ``limit``."""
        out: list[int] = []
        for run in self.runs(start):
            first = run.first
            if first >= stop:
                break
            if run.last_due <= limit:
                continue
            dues = run.dues
            out += (first + i for i in range(max(0, start - first), min(len(dues), stop - first))
                    if dues[i] > limit)
        return out

    def forget_below(self, lowest: int) -> None:
        """Forget the runs wholly below ``lowest`` (their messages are no longer held)."""
        runs, head = self._runs, self._head
        while head < len(runs) and runs[head].end <= lowest:
            head += 1
        if head == len(runs):
            runs.clear()
            self._firsts.clear()
            head = 0
        elif head > 64 and head * 2 > len(runs):
            del runs[:head]
            del self._firsts[:head]
            head = 0
        self._head = head
