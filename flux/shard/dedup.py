"""One topic's dedup window: the message ids accepted in the last ``dedup_window``
seconds, with their original offsets (G3).

Lives here: remembering runs of ids, finding a duplicate's offset, and forgetting
expired ids lazily, a slice at a time. The log of messages is
:mod:`flux.shard.topic`; when ids are forgotten is decided by the publish path and
the cleanup passes.
"""

from __future__ import annotations

import ctypes
import math
import platform
from collections import deque
from collections.abc import Callable, Iterable, Sequence

EXPIRE_SLICE = 1024  # most dedup ids one publish or lookup forgets on its way
# ids a block of the id -> mark index holds at most (unless one mark is larger): what a
# dict of 2**15 slots takes before it would grow to 2**16, so blocks are full dicts
BLOCK_IDS = 21845

_untrack = (ctypes.pythonapi.PyObject_GC_UnTrack
            if platform.python_implementation() == "CPython" else None)
if _untrack is not None:
    _untrack.argtypes, _untrack.restype = [ctypes.py_object], None


def untracked_set() -> set[str]:
    """An empty set of ids that the cycle collector never walks.

    A set of strings refers only to objects that refer to nothing, so it can never be
    part of a reference cycle; CPython untracks such tuples and dicts by itself, but
    not sets. Walking one costs the collector a cache miss an id: a full collection
    would stall the shard for about 200 ms at 4.5M ids. Only ``str`` goes in.
    """
    ids: set[str] = set()
    if _untrack is not None:
        _untrack(ids)  # the C API's PyObject_GC_UnTrack; refcounting still frees it
    return ids


class DedupWindow:
    """Message ids accepted in the last ``window`` seconds, with their offsets.

    A topic's accepted ids take consecutive offsets, so the window keeps them in
    acceptance order, as *marks*: a tuple of ids remembered together, with its
    first offset, expiry time and id bytes in flat lists beside it.

    Two structures answer for the ids. A set of every remembered id answers "is
    it known?" for each new id with one probe of one table. An index finds a
    known id's mark, so a duplicate's offset is found at once however old it is:
    *blocks* of about ``block_ids`` ids, each a dict of id -> mark number (one int
    shared by the mark's ids), searched newest first. A block is small enough to
    stay in cache while it fills, and it is dropped whole once all of its marks are
    forgotten, so forgetting an id costs one set probe and no dict deletion.
    Neither the set (see :func:`untracked_set`), the dicts (strings and ints) nor
    the tuples are walked by the garbage collector.

    Forgetting is lazy and bounded: a call forgets at most ``EXPIRE_SLICE`` ids
    (the cleanup passes forget the rest in slices), because forgetting a burst at
    once stalls the shard. Ids past their window but not forgotten yet count as
    forgotten everywhere: :meth:`get` with ``now`` does not find them, and
    :meth:`live_bytes` does not count them. An id accepted again meanwhile is
    blanked ("") in its old mark, so each id is a live string in one mark only
    (and the newest block holding it names that mark).
    """

    __slots__ = ("_at", "_base", "_blocks", "_bytes", "_due", "_due_bytes", "_filled", "_head",
                 "_ids", "_known", "_offset", "_starts", "block_ids", "held_bytes", "window")

    def __init__(self, window: float, block_ids: int = BLOCK_IDS) -> None:
        self.window = window
        self.block_ids = block_ids
        self._known = untracked_set()           # every id of the marks not forgotten
        # lists, not deques: a deque costs 760 bytes even empty, and a topic has two
        self._blocks: list[dict[str, int]] = []  # id -> mark number, oldest block first
        self._starts: list[int] = []            # the number of each block's first mark
        self._filled = 0                        # ids in the newest block
        self._ids: list[tuple[str, ...]] = []   # mark k: these ids, ...
        self._offset: list[int] = []            # ... at consecutive offsets from this one, ...
        self._at: list[float] = []              # ... forgotten at this time, ...
        self._bytes: list[int] = []             # ... holding this many id bytes
        self._base = 0                          # the number of the mark at index 0
        self._head = 0                          # the oldest mark still remembered
        self._due = 0                           # marks _head.._due-1 are past their window,
        self._due_bytes = 0                     # ... and hold this many bytes
        self.held_bytes = 0                     # id bytes of every mark, due ones too

    def __len__(self) -> int:
        return len(self._known)

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
        mark = self._mark_of(message_id)
        if mark is None:
            return None
        k = mark - self._base
        if now is not None and self._at[k] <= now:
            return None  # past its window, not forgotten yet
        return self._offset[k] + self._ids[k].index(message_id)

    def _mark_of(self, message_id: str) -> int | None:
        """The number of the mark ``message_id`` is live in, if it is remembered."""
        if message_id not in self._known:
            return None
        for block in reversed(self._blocks):  # a newer block names the live mark
            mark = block.get(message_id)
            if mark is not None:
                return mark
        raise AssertionError(f"dedup id {message_id!r} is in no block")  # pragma: no cover

    def finder(self, now: float) -> Callable[[str], int | None]:
        """:meth:`get` at ``now`` as a plain function, for a loop over many ids."""
        get = self.get
        return lambda message_id: get(message_id, now)

    def known_any(self, ids: Iterable[str]) -> bool:
        """Whether any of ``ids`` is remembered (maybe past its window): the publish
        fast path asks this once per group and leaves any hit to :meth:`finder`."""
        return not self._known.isdisjoint(ids)

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
        if keys is None:
            self.expire(now, EXPIRE_SLICE)  # (it never changes next_mark)
            keys = self.keys_for(ids)
            if not self._known.isdisjoint(keys):
                self._blank([i for i in keys if i in self._known])
        if size is None:
            size = len("".join(ids))
        if not self._blocks or (self._filled and self._filled + len(keys) > self.block_ids):
            self._blocks.append({})  # a new block starts with this mark
            self._starts.append(self.next_mark)
            self._filled = 0
        self._blocks[-1].update(keys)
        self._filled += len(keys)
        self._known.update(keys)
        self._ids.append(tuple(ids))
        self._offset.append(first)
        self._at.append(now + self.window)
        self._bytes.append(size)
        self.held_bytes += size

    def _blank(self, again: list[str]) -> None:
        """Ids past their window, accepted again: blank them in their old marks."""
        marks = self._ids
        for message_id in again:
            mark = self._mark_of(message_id)
            assert mark is not None
            k = mark - self._base
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
        marks, known = self._ids, self._known
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
            deque(map(known.discard, ids), 0)  # forget them ("" is in no set), at C speed
            self.held_bytes -= freed
            self._due_bytes -= freed
            count += len(ids)
            budget -= len(ids)
        self._drop_blocks(self._base + k)
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

    def _drop_blocks(self, forgotten: int) -> None:
        """Drop the blocks whose marks are all forgotten (numbers below ``forgotten``)."""
        starts = self._starts
        drop = 0
        while drop + 1 < len(starts) and starts[drop + 1] <= forgotten:
            drop += 1
        if drop:  # (few blocks: a window holds at most a few hundred)
            del starts[:drop], self._blocks[:drop]
        if starts and forgotten >= self.next_mark:  # every mark is forgotten
            starts.clear()
            self._blocks.clear()
