"""Sets of offsets held as runs: a subscription's acks above its cursor, and (in the
client) the offsets a session delivered and acked.

A message held unacked at a subscription's cursor (a long job, a nak with a delay, a
pending delayed message, a poison key) keeps the cursor still while every later ack
lands above it: as a set of offsets that costs ~60 bytes an ack, without bound and
outside ``shard.max_memory``. Acks mostly come in increasing runs, so :class:`Acks`
keeps sorted, disjoint, maximal runs ``[start, end)`` instead: a stream of acks
behind one stuck message is one run. Membership is a bisection; adding at the end of
the last run, and taking the run at the cursor when it moves, cost O(1). The client
keeps a session's deliveries and acks the same way, for the same reason.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain, compress, islice, repeat
from operator import ne, sub


def sorted_runs(ordered: Sequence[int]) -> list[tuple[int, int]]:
    """The maximal runs ``(start, stop)`` of distinct, increasing ``ordered`` (at C
    speed: one pass to find where a run breaks)."""
    n = len(ordered)
    if not n:
        return []
    if ordered[-1] - ordered[0] == n - 1:
        return [(ordered[0], ordered[-1] + 1)]
    # where the step from one offset to the next is not 1, a run starts
    cuts = list(compress(range(1, n), map(ne, map(sub, islice(ordered, 1, None), ordered),
                                          repeat(1))))
    starts = [0, *cuts]
    return list(zip(map(ordered.__getitem__, starts),
                    [ordered[c - 1] + 1 for c in cuts] + [ordered[-1] + 1], strict=True))


class Acks:
    """A set of offsets (ints) as sorted, disjoint, maximal runs."""

    __slots__ = ("_count", "_ends", "_starts")

    def __init__(self, offsets: Iterable[int] = ()) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._count = 0
        for offset in sorted(set(offsets)):
            self.add(offset)

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __contains__(self, offset: object) -> bool:
        starts = self._starts
        if not starts or type(offset) is not int:
            return False
        i = bisect_right(starts, offset) - 1
        return i >= 0 and offset < self._ends[i]

    def __iter__(self) -> Iterator[int]:
        """The offsets, increasing."""
        return chain.from_iterable(map(range, self._starts, self._ends))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Acks):
            return self._starts == other._starts and self._ends == other._ends
        if isinstance(other, (set, frozenset)):
            return len(other) == self._count and all(o in self for o in other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        runs = ", ".join(f"{s}" if e == s + 1 else f"{s}..{e - 1}"
                         for s, e in zip(self._starts, self._ends, strict=True))
        return f"Acks({{{runs}}})"

    @property
    def runs(self) -> int:
        """How many runs it holds (what it costs)."""
        return len(self._starts)

    def add(self, offset: int) -> bool:
        """Add ``offset``; False if it was held already."""
        starts, ends = self._starts, self._ends
        if ends and offset == ends[-1]:  # the usual case: right after the last run
            ends[-1] = offset + 1
            self._count += 1
            return True
        if not ends or offset > ends[-1]:
            starts.append(offset)
            ends.append(offset + 1)
            self._count += 1
            return True
        i = bisect_right(starts, offset) - 1
        if i >= 0 and offset < ends[i]:
            return False  # held already
        joins_left = i >= 0 and ends[i] == offset
        joins_right = i + 1 < len(starts) and starts[i + 1] == offset + 1
        if joins_left and joins_right:
            ends[i] = ends[i + 1]
            del starts[i + 1], ends[i + 1]
        elif joins_left:
            ends[i] = offset + 1
        elif joins_right:
            starts[i + 1] = offset
        else:
            starts.insert(i + 1, offset)
            ends.insert(i + 1, offset + 1)
        self._count += 1
        return True

    def add_range(self, start: int, stop: int) -> None:
        """Add ``start`` .. ``stop - 1``: O(1) past every offset held, else a bisection
        and a merge with the runs it meets."""
        if start >= stop:
            return
        ends = self._ends
        if not ends or start > ends[-1]:
            self._starts.append(start)
            ends.append(stop)
            self._count += stop - start
        elif start == ends[-1]:
            ends[-1] = stop
            self._count += stop - start
        else:  # merge with the runs it overlaps or touches (runs i .. j-1)
            starts = self._starts
            i = bisect_left(ends, start)
            j = bisect_right(starts, stop)
            if i == j:
                starts.insert(i, start)
                ends.insert(i, stop)
                self._count += stop - start
                return
            low, high = min(starts[i], start), max(ends[j - 1], stop)
            self._count += high - low - sum(map(sub, ends[i:j], starts[i:j]))
            starts[i:j], ends[i:j] = [low], [high]

    def add_sorted(self, ordered: Sequence[int]) -> None:
        """Add distinct, increasing ``ordered``: a run at a time."""
        add_range = self.add_range
        for start, stop in sorted_runs(ordered):
            add_range(start, stop)

    def add_runs(self, runs: Sequence[int]) -> None:
        """Add the runs of a flat ``[first, count, first, count, ...]`` list (as
        :meth:`as_runs` gives them): O(1) a run when they come in increasing order past
        every offset held, merged with what they meet otherwise. ValueError for a list of
        odd length or a negative count."""
        if len(runs) % 2:
            raise ValueError(f"runs of offsets come in pairs (first, count), not {len(runs)}"
                             " numbers")
        add_range = self.add_range
        for first, count in zip(runs[0::2], runs[1::2], strict=True):
            if count < 0:
                raise ValueError(f"a run of offsets from {first} has count {count}")
            add_range(first, first + count)

    @classmethod
    def from_runs(cls, runs: Sequence[int]) -> Acks:
        """The offsets a flat ``[first, count, ...]`` list of runs holds (:meth:`add_runs`)."""
        acks = cls()
        acks.add_runs(runs)
        return acks

    def as_runs(self) -> list[int]:
        """Its runs as one flat list ``[first, count, first, count, ...]``, increasing:
        what a disk topic's log stores, two numbers a run however many offsets it holds."""
        starts = self._starts
        flat = [0] * (2 * len(starts))
        flat[0::2] = starts
        flat[1::2] = map(sub, self._ends, starts)
        return flat

    def min(self) -> int:
        """The lowest offset held (ValueError when empty, as ``min()`` of a set)."""
        if not self._starts:
            raise ValueError("min() of no offsets")
        return self._starts[0]

    def first_missing(self, offset: int) -> int:
        """The lowest offset at or above ``offset`` that is not held."""
        i = bisect_right(self._starts, offset) - 1
        if i >= 0 and offset < self._ends[i]:
            return self._ends[i]  # runs are maximal: a run's end is never held
        return offset

    def first_held(self, offset: int) -> int | None:
        """The lowest offset at or above ``offset`` that is held (None if there is none)."""
        starts = self._starts
        i = bisect_right(starts, offset) - 1
        if i >= 0 and offset < self._ends[i]:
            return offset
        return starts[i + 1] if i + 1 < len(starts) else None

    def take_run(self, offset: int) -> int:
        """If a run starts at ``offset`` (a cursor that just moved there), drop it and
        return its end (where the cursor goes); else return ``offset``."""
        starts = self._starts
        if not starts or starts[0] != offset:
            return offset
        end = self._ends[0]
        del starts[0], self._ends[0]
        self._count -= end - offset
        return end

    def drop_below(self, offset: int) -> None:
        """Forget every offset below ``offset`` (a cursor moved past them)."""
        starts, ends = self._starts, self._ends
        i = bisect_right(ends, offset)  # runs 0..i-1 end at or below it: all gone
        self._count -= sum(e - s for s, e in zip(starts[:i], ends[:i], strict=True))
        del starts[:i], ends[:i]
        if starts and starts[0] < offset:
            self._count -= offset - starts[0]
            starts[0] = offset

    def count_below(self, offset: int) -> int:
        """How many of its offsets are below ``offset``."""
        starts, ends = self._starts, self._ends
        i = bisect_left(starts, offset)  # runs 0 .. i-1 start below it
        return sum(min(e, offset) - s for s, e in zip(starts[:i], ends[:i], strict=True))

    def max(self) -> int:
        """The highest offset held (ValueError when empty, as ``max()`` of a set)."""
        if not self._ends:
            raise ValueError("max() of no acks")
        return self._ends[-1] - 1

    def any_in(self, start: int, stop: int) -> bool:
        """Whether any offset of ``start`` .. ``stop - 1`` is held."""
        if start >= stop or not self._starts:
            return False
        i = bisect_right(self._starts, stop - 1) - 1
        return i >= 0 and self._ends[i] > start

    def missing(self, start: int, stop: int) -> list[int]:
        """The offsets of ``start`` .. ``stop - 1`` not held, increasing."""
        starts, ends = self._starts, self._ends
        out: list[int] = []
        i = max(0, bisect_right(starts, start) - 1)
        o = start
        while o < stop:
            if i < len(starts) and starts[i] <= o:
                if o < ends[i]:
                    o = ends[i]
                i += 1
                continue
            gap_end = min(stop, starts[i]) if i < len(starts) else stop
            out.extend(range(o, gap_end))
            o = gap_end
        return out

    def copy(self) -> Acks:
        twin = Acks()
        twin._starts, twin._ends, twin._count = list(self._starts), list(self._ends), self._count
        return twin
