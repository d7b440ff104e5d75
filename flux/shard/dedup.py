"""One topic's dedup window: the message ids accepted in the last ``dedup_window``
seconds, with their original offsets (G3).

Lives here: remembering runs of ids, finding a duplicate's offset, and forgetting
expired ids lazily, a slice at a time. The log of messages is
:mod:`flux.shard.topic`; when ids are forgotten is decided by the publish path and
the cleanup passes.
"""

from __future__ import annotations

import math
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import repeat
from operator import contains, rshift, setitem

EXPIRE_SLICE = 1024  # most dedup ids one publish or lookup forgets on its way
# the index of a window holding more ids than this is spread over PARTITIONS dicts (at
# most a few milliseconds' work, once): a dict rehashes all its ids at once when it
# grows, about 35 ns an id of a big table here, so a partition's growth stays under
# 20 ms up to some 150M ids in a window (far more than a shard's memory holds)
PART_IDS = 32768
PARTITION_BITS = 8
PARTITIONS = 1 << PARTITION_BITS
HASH_BITS = sys.hash_info.width


class DedupWindow:
    """Message ids accepted in the last ``window`` seconds, with their offsets.

    A topic's accepted ids take consecutive offsets, so the window keeps them in
    acceptance order, as *marks*: a tuple of ids remembered together, with its
    first offset, expiry time and id bytes in flat lists beside it.

    An *index* maps every remembered id to the number of its mark (one int shared
    by the mark's ids), so both "is it known?" and a duplicate's offset take one
    probe of one table. Once it holds more than ``part_ids`` ids, the index is spread
    over ``PARTITIONS`` dicts by the top bits of the ids' hashes (a dict places an id
    by its low bits, which must not be alike within a partition), and stays so until
    the window is empty. So a call that makes a table grow rehashes the ids of one
    partition only: one big table would rehash every id at once (100 ms and more at
    millions of ids). A dict of strings and ints is never walked by the garbage
    collector (CPython untracks it).

    Forgetting is lazy and bounded: a call forgets at most ``EXPIRE_SLICE`` ids
    (the cleanup passes forget the rest in slices), because forgetting a burst at
    once stalls the shard. Ids past their window but not forgotten yet count as
    forgotten everywhere: :meth:`get` with ``now`` does not find them, and
    :meth:`live_bytes` does not count them. An id accepted again meanwhile is
    blanked ("") in its old mark, so each id is a live string in one mark only
    (the one the index names).
    """

    __slots__ = ("_asked", "_at", "_base", "_bytes", "_count", "_dir", "_due", "_due_bytes",
                 "_head", "_ids", "_offset", "_shift", "held_bytes", "part_ids", "window")

    def __init__(self, window: float, part_ids: int = PART_IDS) -> None:
        self.window = window
        self.part_ids = part_ids
        # the index: id -> mark number, in partition dir[hash(id) >> _shift], the slot
        # of the hash's top bits (a list index below 0 counts from the end, so the slot
        # is those bits read unsigned); one partition is [part, part]
        self._dir: list[dict[str, int]] = []
        self._shift = HASH_BITS - 1
        self._count = 0                         # ids in the index
        # the last ids known_any looked up and their partitions (until the index changes)
        self._asked: tuple[object, list[dict[str, int]]] = (None, [])
        self._reset_index()
        # lists, not deques: a deque costs 760 bytes even empty, and a topic has several
        self._ids: list[tuple[str, ...]] = []   # mark k: these ids, ...
        self._offset: list[int] = []            # ... at consecutive offsets from this one, ...
        self._at: list[float] = []              # ... forgotten at this time, ...
        self._bytes: list[int] = []             # ... holding this many id bytes
        self._base = 0                          # the number of the mark at index 0
        self._head = 0                          # the oldest mark still remembered
        self._due = 0                           # marks _head.._due-1 are past their window,
        self._due_bytes = 0                     # ... and hold this many bytes
        self.held_bytes = 0                     # id bytes of every mark, due ones too

    def _reset_index(self) -> None:
        """One empty partition (the index holds no id)."""
        self._asked = (None, [])
        part: dict[str, int] = {}
        self._dir = [part, part]
        self._shift = HASH_BITS - 1

    def __len__(self) -> int:
        return self._count

    @property
    def partitions(self) -> int:
        """How many partitions the index has now."""
        return 1 if self._dir[0] is self._dir[-1] else len(self._dir)

    def _parts(self, ids: Iterable[str]) -> Iterator[dict[str, int]]:
        """The partition of each of ``ids``, in order (at C speed)."""
        return map(self._dir.__getitem__, map(rshift, map(hash, ids), repeat(self._shift)))

    def due_at(self) -> float:
        """When the oldest remembered id's window ends (``inf`` when none is)."""
        return self._at[self._head] if self._head < len(self._at) else math.inf

    def lookup(self, message_id: str, now: float) -> int | None:
        """The original offset of ``message_id`` if it is still remembered."""
        self.expire(now, EXPIRE_SLICE)
        return self.get(message_id, now)

    def remember(self, message_id: str, offset: int, now: float) -> None:
        """Remember an accepted id until ``now + window``."""
        self.remember_all([message_id], offset, now)

    @property
    def next_mark(self) -> int:
        """The number the next remembered run of ids gets."""
        return self._base + len(self._ids)

    def keys_for(self, ids: Iterable[str]) -> dict[str, int]:
        """``ids`` as the dict :meth:`remember_all` takes (one entry per distinct id)."""
        return dict.fromkeys(ids, self.next_mark)

    def get(self, message_id: str, now: float | None = None) -> int | None:
        """Like :meth:`lookup` without forgetting any ids first. Without ``now``, the
        caller made sure nothing due is left (it ran :meth:`expire` to the end)."""
        mark = self._dir[hash(message_id) >> self._shift].get(message_id)
        if mark is None:
            return None
        k = mark - self._base
        if now is not None and self._at[k] <= now:
            return None  # past its window, not forgotten yet
        return self._offset[k] + self._ids[k].index(message_id)

    def finder(self, now: float) -> Callable[[str], int | None]:
        """:meth:`get` at ``now`` as a plain function, for a loop over many ids."""
        get = self.get
        return lambda message_id: get(message_id, now)

    def known_any(self, ids: Iterable[str]) -> bool:
        """Whether any of ``ids`` is remembered (maybe past its window): the publish
        fast path asks this once per group and leaves any hit to :meth:`finder`."""
        if self._dir[0] is self._dir[-1]:  # one partition
            return not self._dir[0].keys().isdisjoint(ids)
        parts = list(self._parts(ids))
        self._asked = (ids, parts)  # remember_all(keys=ids) reuses them
        return any(map(contains, parts, ids))

    def live_bytes(self, now: float) -> int:
        """Id bytes of the ids still in their window at ``now``."""
        self._advance_due(now)
        return self.held_bytes - self._due_bytes

    def remember_all(self, ids: Sequence[str], first: int, now: float, size: int | None = None,
                     keys: dict[str, int] | None = None) -> None:
        """Remember ``ids``, accepted at offsets ``first``, ``first + 1``, ... (``size``:
        their lengths summed, ``keys``: :meth:`keys_for` of them, if the caller has them;
        a caller with ``keys`` made sure none is known, and forgot a slice of due ids
        just before). None may be in its window."""
        if self.window <= 0 or not ids:
            return
        added = 0
        if keys is None:
            self.expire(now, EXPIRE_SLICE)  # (it never changes next_mark)
            keys = self.keys_for(ids)
            if self.known_any(keys):  # one C-speed probe of each id when none is known
                again = [i for i, part in zip(keys, self._parts(keys), strict=True) if i in part]
                self._blank(again)
                added -= len(again)
                self._asked = (None, [])
        if size is None:
            size = len("".join(ids))
        if self._dir[0] is self._dir[-1]:  # one partition
            self._dir[0].update(keys)
            if self._count + added + len(keys) > self.part_ids:
                self._partition()
        else:
            asked, parts = self._asked
            if asked is not keys:
                parts = list(self._parts(keys))
            deque(map(setitem, parts, keys, repeat(self.next_mark)), 0)
        self._asked = (None, [])
        self._count += added + len(keys)
        self._ids.append(tuple(ids))
        self._offset.append(first)
        self._at.append(now + self.window)
        self._bytes.append(size)
        self.held_bytes += size

    def _partition(self) -> None:
        """Spread the ids of the one partition over ``PARTITIONS`` of them."""
        part = self._dir[0]
        shift = HASH_BITS - PARTITION_BITS
        slots = list(map(rshift, map(hash, part), repeat(shift)))
        # a key of another type (None, in no mark) makes a dict keep each key's hash
        # beside it: a probe compares hashes without reading strings (cache misses)
        dir_: list[dict[str, int]] = [{None: -1} for _ in range(PARTITIONS)]  # type: ignore[dict-item]
        deque(map(setitem, map(dir_.__getitem__, slots), part, part.values()), 0)
        self._dir, self._shift = dir_, shift
        self._asked = (None, [])

    def _blank(self, again: list[str]) -> None:
        """Ids past their window, accepted again: blank them in their old marks."""
        marks = self._ids
        dir_, shift = self._dir, self._shift
        for message_id in again:
            k = dir_[hash(message_id) >> shift][message_id] - self._base
            ids = marks[k]
            i = ids.index(message_id)
            marks[k] = (*ids[:i], "", *ids[i + 1:])
            n = len(message_id)
            self._bytes[k] -= n
            self.held_bytes -= n
            if k < self._due:
                self._due_bytes -= n

    def _advance_due(self, now: float) -> None:
        ats, k = self._at, self._due if self._due > self._head else self._head
        if k < len(ats) and ats[k] <= now:
            added = 0
            while k < len(ats) and ats[k] <= now:
                added += self._bytes[k]
                k += 1
            self._due_bytes += added
        self._due = k

    def expire(self, now: float, most: int | None = None) -> int:
        """Forget ids whose window has passed, oldest first (at most ``most``);
        returns how many."""
        ats, head = self._at, self._head
        if head >= len(ats) or ats[head] > now:
            return 0  # nothing is due (windows end in mark order): the usual case
        self._advance_due(now)
        marks = self._ids
        k = self._head
        budget = most if most is not None else 1 << 62
        count = 0
        while k < self._due and budget > 0:
            ids = marks[k]
            if len(ids) > budget:  # cut the mark in two: its rest stays
                ids, marks[k] = ids[:budget], ids[budget:]
                self._offset[k] += budget
                freed = len("".join(ids))
                self._bytes[k] -= freed
            else:
                marks[k] = ()
                freed = self._bytes[k]
                k += 1
            self._forget(ids)
            self.held_bytes -= freed
            self._due_bytes -= freed
            count += len(ids)
            budget -= len(ids)
        if k == len(marks):
            self._base += k
            for column in (marks, self._offset, self._at, self._bytes):
                column.clear()
            k = 0
            self._due = 0
        elif k > 64 and k * 2 > len(marks):
            self._base += k
            for column in (marks, self._offset, self._at, self._bytes):
                del column[:k]
            self._due -= k
            k = 0
        self._head = k
        return count

    def _forget(self, ids: tuple[str, ...]) -> None:
        """Take ``ids`` out of the index ("" is a blanked id: in no partition), at C speed."""
        if self._dir[0] is self._dir[-1]:  # one partition
            gone = list(map(self._dir[0].pop, ids, repeat(None)))
        else:
            gone = list(map(dict.pop, self._parts(ids), ids, repeat(None)))
        self._count -= len(gone) - gone.count(None)
        if not self._count and len(self._dir) > 2:
            self._reset_index()  # the window is empty: its partitions go
