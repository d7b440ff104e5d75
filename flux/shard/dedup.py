"""One topic's dedup window: the message ids accepted in the last ``dedup_window``
seconds, with their original offsets (G3).

Lives here: remembering runs of ids, finding a duplicate's offset, and forgetting
expired ids lazily, a slice at a time. The log of messages is
:mod:`flux.shard.topic`; when ids are forgotten is decided by the publish path and
the cleanup passes; a large window's index of hashes is :mod:`flux.shard.serial_index`.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from heapq import heappop, heappush
from itertools import accumulate, chain, islice, repeat
from typing import TYPE_CHECKING, Any

from flux.shard.columns import column

if TYPE_CHECKING:
    import numpy as np

    from flux.shard import serial_index
    from flux.shard.serial_index import SerialIndex
else:  # numpy costs a new shard process ~0.1 s to import: only a compact window needs it
    np = serial_index = None

EXPIRE_SLICE = 1024  # most dedup ids one publish or lookup forgets on its way
# a window holding more ids than this packs them and indexes their hashes (once, about
# 4 ms); a smaller one keeps a dict of its ids, the fastest for small windows (read when
# a window is made: the simulator lowers it for some seeds, so its topics go compact)
COMPACT_IDS = 8192
# a large window looks up groups of at most this many ids one by one (numpy's calls
# cost more than a few scalar probes; the C walks, than one)
SCALAR_IDS = 24
SCALAR_IDS_FAST = 2
# Memory a remembered id takes beyond its bytes, as shard.max_memory counts it: in a
# dict (its string's header and the dict's entry, measured about 100 B), and in a
# compact window (its slots, 12-36 B, and its share of a table made ahead, up to about
# 50 B just after a growing window made one; python -m flux.bench.dedup)
DICT_ID_COST = 100
COMPACT_ID_COST = 48
# a compact window's small publishes (single ones, above all) join the newest mark while
# it holds fewer id characters than this and was begun at most ``merge_span`` seconds
# before (MERGE_SPAN, or MERGE_SHARE of a shorter window): a mark's own cost, some 200 B,
# is shared by its ids instead of taken by each; its ids are remembered as long as its
# newest one, that much longer at most (both read when a window is made: the simulator
# raises them for some seeds, so that its sparse publishes join marks too)
MERGE_CHARS = 2048
MERGE_SPAN = 0.05
MERGE_SHARE = 0.01
MASK64 = (1 << 64) - 1


def load_compact() -> None:
    """Import what a compact window needs (numpy, :mod:`flux.shard.serial_index`): done
    the first time a window turns compact, or ahead of it (a shard, once it serves)."""
    global np, serial_index
    if serial_index is None:
        import numpy

        from flux.shard import serial_index as index
        np, serial_index = numpy, index


class DedupWindow:
    """Message ids accepted in the last ``window`` seconds, with their offsets.

    A topic's accepted ids take consecutive offsets, so the window keeps them in
    acceptance order, as *marks*: the ids remembered together, with their first
    offset, expiry time and id bytes in flat lists beside them (columns the garbage
    collector does not walk, :mod:`flux.shard.columns`).

    A small window (up to ``compact_ids`` ids) keeps a dict id -> mark number (one
    int shared by the mark's ids) and each mark's ids as a tuple (the one the log
    holds too): "is it known?" for a group is one C call, and a duplicate's offset
    one probe. Past ``compact_ids`` ids the window turns *compact* until it is empty
    again: each mark's ids are packed into one string, every id remembered gets a
    *serial* (acceptance order: a mark's ids have consecutive serials, so an id's
    offset is its mark's first offset plus its place), and a
    :class:`~flux.shard.serial_index.SerialIndex` maps ids' hashes to serials. A hit
    there is checked against the packed id, so two ids sharing a hash never make a
    new message a duplicate. That costs some 15-45 bytes an id beside its packed
    bytes, where a string per id and a dict cost over 100; groups are looked up and
    placed in bulk (numpy), nothing ever rehashes, and forgetting is moving the
    oldest serial on (a table goes whole once all its serials are dead). The hashes
    are ``hasher``'s (``hash``: salted per process, which only speed depends on), and
    ``min_room`` ids the smallest table takes (tests make both collide early).

    Forgetting is lazy and bounded: a call forgets at most ``EXPIRE_SLICE`` ids
    (the cleanup passes forget the rest in slices), because forgetting a burst at
    once stalls the shard. Ids past their window but not forgotten yet count as
    forgotten everywhere: :meth:`get` with ``now`` does not find them, and
    :meth:`live_bytes` does not count them. An id accepted again meanwhile is taken
    out of its old mark (blanked "" in a tuple; a *hole* in a packed mark), so each
    id is remembered in one mark only. A compact window's small publishes join its
    newest mark (see :data:`MERGE_CHARS`): an id of one is then remembered up to
    ``merge_span`` seconds past its window (G3 holds: never less than the window).
    """

    __slots__ = ("_asked", "_at", "_base", "_bytes", "_count", "_due", "_due_bytes",
                 "_expected", "_hash", "_head", "_hole_at", "_holes", "_ids", "_index",
                 "_min_room", "_next_serial", "_offset", "_oldest", "_serial", "_serials",
                 "_tail_from", "_width", "compact_ids", "held_bytes", "merge_span", "window")

    def __init__(self, window: float, compact_ids: int | None = None,
                 hasher: Callable[[str], int] = hash, min_room: int | None = None) -> None:
        self.window = window
        self.compact_ids = COMPACT_IDS if compact_ids is None else compact_ids
        self._hash = hasher
        self._index: dict[str, int] = {}        # small: id -> mark number
        self._min_room = min_room
        self._expected = 0   # ids about to be remembered (expect): the index's first table
        # compact: hash -> serial (made when the window first turns compact)
        self._serials: SerialIndex | None = None
        self._count = 0                         # ids remembered
        # the last ids known_any looked up and their hashes (compact, until remember_all)
        self._asked: tuple[object, Any] = (None, None)
        # lists, not deques: a deque costs 760 bytes even empty, and a topic has several
        self._ids: list[Any] = column()         # mark k: these ids (tuple, or packed str), ...
        self._width: list[int | array[int]] = column()  # ... compact: each id's length or their ends
        self._serial: list[int] = column()      # ... compact: the first id's serial, ...
        self._offset: list[int] = column()      # ... at consecutive offsets from this one, ...
        self._at: list[float] = column()        # ... forgotten at this time, ...
        self._bytes: list[int] = column()       # ... holding this many id bytes
        self._base = 0                          # the number of the mark at index 0
        self._head = 0                          # the oldest mark still remembered
        self._due = 0                           # marks _head.._due-1 are past their window,
        self._due_bytes = 0                     # ... and hold this many bytes
        self.held_bytes = 0                     # id bytes of every mark, due ones too
        self._next_serial = 0                   # compact: the serial the next id gets
        self._oldest = 0                        # compact: the oldest serial remembered
        self._holes: dict[int, int] = {}        # compact: serials in no index -> bytes taken
        self._hole_at: list[int] = []           # ... off already; a heap of those serials
        self.merge_span = min(MERGE_SPAN, window * MERGE_SHARE)
        self._tail_from = -math.inf             # compact: when the newest mark was begun

    def __len__(self) -> int:
        return self._count

    @property
    def compact(self) -> bool:
        """Whether the ids are packed and indexed by hash (a large window)."""
        return bool(self._serial)

    @property
    def id_cost(self) -> int:
        """What each remembered id takes beyond its bytes now (:data:`DICT_ID_COST` or
        :data:`COMPACT_ID_COST`)."""
        return COMPACT_ID_COST if self._serial else DICT_ID_COST

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

    def expect(self, count: int) -> None:
        """About ``count`` ids are about to be remembered (a recovery rebuilding the
        window): if the window turns compact, its index makes one table for them all."""
        self._expected = count

    def keys_for(self, ids: Iterable[str]) -> dict[str, int]:
        """``ids`` as the dict :meth:`remember_all` takes (one entry per distinct id)."""
        return dict.fromkeys(ids, self.next_mark)

    def get(self, message_id: str, now: float | None = None) -> int | None:
        """Like :meth:`lookup` without forgetting any ids first. Without ``now``, the
        caller made sure nothing due is left (it ran :meth:`expire` to the end)."""
        if self._serial:
            serial = self._find(message_id)
            if serial is None:
                return None
            k = bisect_right(self._serial, serial, self._head) - 1
            if now is not None and self._at[k] <= now:
                return None  # past its window, not forgotten yet
            return self._offset[k] + serial - self._serial[k]
        mark = self._index.get(message_id)
        if mark is None:
            return None
        k = mark - self._base
        if now is not None and self._at[k] <= now:
            return None  # past its window, not forgotten yet
        place: int = self._ids[k].index(message_id)
        return self._offset[k] + place

    def finder(self, now: float) -> Callable[[str], int | None]:
        """:meth:`get` at ``now`` as a plain function, for a loop over many ids."""
        get = self.get
        return lambda message_id: get(message_id, now)

    def known_any(self, ids: Iterable[str]) -> bool:
        """Whether any of ``ids`` is remembered (maybe past its window): the publish
        fast path asks this once per group and leaves any hit to :meth:`finder`."""
        if not self._serial:
            return not self._index.keys().isdisjoint(ids)
        if not isinstance(ids, Sequence | dict):
            ids = list(ids)
        if len(ids) == 1:  # (a single publish)
            return self._find(next(iter(ids))) is not None
        if len(ids) <= self._scalar_ids():
            find = self._find
            return any(find(message_id) is not None for message_id in ids)
        probe = self._probe(ids)
        self._asked = (ids, probe)  # remember_all(keys=ids) reuses them
        assert self._serials is not None
        maybe = self._serials.maybe(*probe)
        if not maybe.any():
            return False
        listed = list(ids)
        return any(self._find(listed[i]) is not None for i in np.flatnonzero(maybe).tolist())

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
                added -= self._blank(keys)
        if self._serial:
            if len(keys) == len(ids) and self._merges(ids, first, now):
                packed = self._merge_packed(ids, keys)
                if size is None:
                    size = packed
                self._asked = (None, None)
                self._count += len(ids)
                self._at[-1] = now + self.window
                self._bytes[-1] += size
                self.held_bytes += size
                return
            packed = self._remember_packed(ids, keys)
            self._tail_from = now
            if size is None:
                size = packed
        else:
            if size is None:
                size = len("".join(ids))
            self._index.update(keys)
            self._ids.append(tuple(ids))
            self._count += added
        self._asked = (None, None)
        self._count += len(keys)
        self._offset.append(first)
        self._at.append(now + self.window)
        self._bytes.append(size)
        self.held_bytes += size
        if not self._serial and self._count > self.compact_ids:
            self._make_compact()

    def _scalar_ids(self) -> int:
        return SCALAR_IDS if serial_index.fast is None else SCALAR_IDS_FAST

    def _probe(self, ids: Iterable[str]) -> tuple[Any, Any]:
        """``hasher`` of each id as unsigned 64-bit numbers, and their fingerprints (None
        where the C walks make them as they go)."""
        fast = serial_index.fast
        if fast is not None and self._hash is hash:
            return np.frombuffer(fast.hashes(ids), np.uint64), None
        if not isinstance(ids, Sequence | dict):
            ids = list(ids)
        hashes = np.fromiter(map(self._hash, ids), np.int64, len(ids)).view(np.uint64)
        return hashes, None if fast is not None else serial_index.fingerprints(hashes)

    def _find(self, message_id: str) -> int | None:
        """The serial of ``message_id`` if a compact window remembers it."""
        assert self._serials is not None
        return self._serials.find(self._hash(message_id) & MASK64, self._holds, message_id)

    def _holds(self, serial: int, message_id: str) -> bool:
        """Whether live ``serial``'s packed id is ``message_id``."""
        k = bisect_right(self._serial, serial, self._head) - 1
        place = serial - self._serial[k]
        width = self._width[k]
        if isinstance(width, int):
            return len(message_id) == width and self._ids[k].startswith(message_id, place * width)
        start = width[place - 1] if place else 0
        return width[place] - start == len(message_id) and self._ids[k].startswith(
            message_id, start)

    def _merges(self, ids: Sequence[str], first: int, now: float) -> bool:
        """Whether ``ids`` (distinct, accepted at ``first``, ...) join the newest mark
        of a compact window: begun at most ``merge_span`` ago, not full, and their
        offsets right after its own."""
        k = len(self._ids) - 1
        if now - self._tail_from > self.merge_span or k < self._head \
                or self._offset[k] + self._next_serial - self._serial[k] != first:
            return False
        size = len(ids[0]) if len(ids) == 1 else sum(map(len, ids))
        return len(self._ids[k]) + size <= MERGE_CHARS

    def _merge_packed(self, ids: Sequence[str], keys: dict[str, int]) -> int:
        """``ids`` (see :meth:`_merges`; ``keys`` theirs) appended to the newest mark and
        indexed; returns their packed length."""
        packed = ids[0] if len(ids) == 1 else "".join(ids)
        width = self._width[-1]
        if isinstance(width, int):
            if len(packed) != width * len(ids) or list(map(len, ids)).count(width) != len(ids):
                # ids of another length: the mark's ids get their ends
                held = self._next_serial - self._serial[-1]
                ends = array("I", range(width, width * held + 1, width)) if width \
                    else array("I", bytes(4 * held))
                ends.extend(islice(accumulate(map(len, ids), initial=width * held), 1, None))
                self._width[-1] = ends
        else:
            width.extend(islice(accumulate(map(len, ids), initial=width[-1]), 1, None))
        self._ids[-1] += packed
        self._index_ids(keys, self._next_serial)
        self._next_serial += len(ids)
        return len(packed)

    def _index_ids(self, keys: dict[str, int], serial: int) -> None:
        """Index ``keys`` (distinct ids, in order) at serials ``serial``, ``serial + 1``,
        ... (with the hashes :meth:`known_any` made of them, if it did)."""
        n = len(keys)
        assert self._serials is not None
        if n <= self._scalar_ids():
            add, hasher = self._serials.add, self._hash
            for i, message_id in enumerate(keys):
                add(hasher(message_id) & MASK64, serial + i)
            return
        asked, probe = self._asked
        hashes, prints = probe if asked is keys else self._probe(keys)
        self._serials.add_all(hashes, prints, np.arange(serial, serial + n, dtype=np.int64))

    def _remember_packed(self, ids: Sequence[str], keys: dict[str, int]) -> int:
        """A compact window's new mark: ``ids`` packed, their hashes indexed (an id
        twice in ``ids``: its first place only, the others are holes); returns the
        packed length."""
        serial = self._next_serial
        n = len(ids)
        packed, width = pack(ids)
        assert self._serials is not None
        self._ids.append(packed)
        self._width.append(width)
        self._serial.append(serial)
        self._next_serial = serial + n
        if len(keys) == n:
            self._index_ids(keys, serial)
            return len(packed)
        places: dict[str, int] = {}
        for i, message_id in enumerate(ids):
            if message_id in places:
                self._hole(serial + i, 0)
            else:
                places[message_id] = i
        hashes, prints = self._probe(places)
        self._serials.add_all(hashes, prints,
                              np.fromiter(places.values(), np.int64, len(places)) + serial)
        return len(packed)

    def _hole(self, serial: int, taken: int) -> None:
        self._holes[serial] = taken
        heappush(self._hole_at, serial)

    def _make_compact(self) -> None:
        """Pack the marks' ids and index their hashes (the window outgrew a dict)."""
        load_compact()
        if self._serials is None:
            self._serials = serial_index.SerialIndex(self._min_room or serial_index.MIN_ROOM)
        self._serials.reserved, self._expected = self._expected, 0
        self._trim(self._head)
        self._tail_from = -math.inf  # (the marks begun as tuples take no more ids)
        flat = list(chain.from_iterable(self._ids))
        if len(self._index) == len(flat):
            self._compact_all(flat)
            return
        index, serial = self._index, 0
        hashes: list[int] = []
        serials: list[int] = []
        hasher = self._hash
        for k, ids in enumerate(self._ids):
            mark = self._base + k
            packed, width = pack(ids)
            self._ids[k] = packed
            self._width.append(width)
            self._serial.append(serial)
            if list(map(index.get, ids)).count(mark) == len(ids) == len(set(ids)):
                hashes += map(hasher, ids)  # the usual mark: every id indexed there, once
                serials += range(serial, serial + len(ids))
                serial += len(ids)
                continue
            seen: set[str] = set()
            for i, message_id in enumerate(ids):
                if message_id and message_id not in seen and index.get(message_id) == mark:
                    seen.add(message_id)
                    hashes.append(hasher(message_id))
                    serials.append(serial + i)
                else:  # blanked, or an id twice in a mark
                    self._hole(serial + i, 0)
            serial += len(ids)
        self._next_serial = serial
        self._index = {}
        unsigned = np.array(hashes, np.int64).view(np.uint64)
        assert self._serials is not None
        self._serials.add_all(unsigned, None, np.array(serials, np.int64))

    def _compact_all(self, flat: list[str]) -> None:
        """:meth:`_make_compact` when every id is in its mark once (none blanked, none
        twice: the index has an entry for each): the marks packed and the ids indexed
        in a few calls, not a Python step a mark (8,192 marks of one id took 11 ms)."""
        marks = self._ids
        sizes = list(map(len, marks))
        lengths = set(map(len, flat))
        if len(lengths) == 1:  # ids of one length (the usual): each mark's width is it
            self._ids[:] = list(map("".join, marks))
            self._width.extend(repeat(lengths.pop(), len(marks)))
        else:
            packed = list(map(pack, marks))
            self._ids[:] = [p for p, _ in packed]
            self._width.extend(w for _, w in packed)
        self._serial.extend(accumulate(sizes[:-1], initial=0))
        self._next_serial = len(flat)
        self._index = {}
        hashes, prints = self._probe(flat)
        assert self._serials is not None
        self._serials.add_all(hashes, prints, np.arange(len(flat), dtype=np.int64))

    def _blank(self, keys: dict[str, int]) -> int:
        """Ids past their window, accepted again: take them out of their old marks;
        returns how many a small window's dict will count twice."""
        if self._serial:  # each leaves a hole, and is counted off here
            assert self._serials is not None
            for message_id in keys:
                serial = self._find(message_id)
                if serial is None:
                    continue
                self._serials.remove(self._hash(message_id) & MASK64, serial)
                k = bisect_right(self._serial, serial, self._head) - 1
                n = len(message_id)
                self._hole(serial, n)
                self._take_bytes(k, n)
                self._count -= 1
            return 0
        index = self._index
        marks = self._ids
        blanked = [i for i in keys if i in index]
        for message_id in blanked:
            k = index[message_id] - self._base
            ids = marks[k]
            i = ids.index(message_id)
            marks[k] = (*ids[:i], "", *ids[i + 1:])
            self._take_bytes(k, len(message_id))
        return len(blanked)

    def _take_bytes(self, k: int, n: int) -> None:
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
        serials = self._serials
        if serials is not None and serials.dying:  # dead tables' pages, a slice a call
            serials.release()
        ats, head = self._at, self._head
        if head >= len(ats) or ats[head] > now:
            return 0  # nothing is due (windows end in mark order): the usual case
        self._advance_due(now)
        budget = most if most is not None else 1 << 62
        compact = bool(self._serial)
        k, count = (self._expire_packed if compact else self._expire_ids)(budget)
        marks = self._ids
        if k == len(marks):
            self._trim(k)
            if compact and serials is not None:  # the window is empty: back to a dict
                serials.clear()
                self._holes.clear()
                self._hole_at.clear()
                self._next_serial = self._oldest = 0
        elif k > 64 and k * 2 > len(marks):
            self._trim(k)
        else:
            self._head = k
        return count

    def _trim(self, k: int) -> None:
        """Drop marks 0..k-1 (all forgotten)."""
        self._base += k
        for values in (self._ids, self._width, self._serial, self._offset, self._at,
                       self._bytes):
            del values[:k]
        self._due = max(self._due - k, 0)
        self._head = 0

    def _expire_ids(self, budget: int) -> tuple[int, int]:
        """Forget up to ``budget`` due ids of a small window; returns the first mark
        left and how many ids it forgot."""
        marks = self._ids
        k = self._head
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
            gone = list(map(self._index.pop, ids, repeat(None)))
            self._count -= len(gone) - gone.count(None)
            self.held_bytes -= freed
            self._due_bytes -= freed
            count += len(ids)
            budget -= len(ids)
        return k, count

    def _expire_packed(self, budget: int) -> tuple[int, int]:
        """Forget up to ``budget`` due ids of a compact window: move the oldest serial
        on (a mark's packed ids go when all of them are forgotten)."""
        marks, serials = self._ids, self._serial
        k = self._head
        oldest = start = self._oldest
        holes, hole_at = self._holes, self._hole_at
        while k < self._due and budget > 0:
            end = serials[k + 1] if k + 1 < len(serials) else self._next_serial
            stop = min(end, oldest + budget)
            gaps = taken = 0
            while hole_at and hole_at[0] < stop:
                gaps += 1
                taken += holes.pop(heappop(hole_at))
            if stop < end:  # the mark's rest stays
                freed = self._span_bytes(k, oldest, stop) - taken
                self._bytes[k] -= freed
            else:
                freed = self._bytes[k]
                marks[k] = ""
                k += 1
            self._count -= stop - oldest - gaps
            self.held_bytes -= freed
            self._due_bytes -= freed
            budget -= stop - oldest
            oldest = stop
        self._oldest = oldest
        assert self._serials is not None
        self._serials.drop_before(oldest)
        return k, oldest - start

    def _span_bytes(self, k: int, start: int, stop: int) -> int:
        """Bytes of the packed ids of serials ``start`` .. ``stop - 1`` of mark ``k``."""
        first = self._serial[k]
        width = self._width[k]
        if isinstance(width, int):
            return (stop - start) * width
        return width[stop - first - 1] - (width[start - first - 1] if start > first else 0)


def pack(ids: Sequence[str]) -> tuple[str, int | array[int]]:
    """``ids`` as one string, and their common length or else where each ends in it."""
    if len(ids) == 1:  # (a single publish)
        return ids[0], len(ids[0])
    packed = "".join(ids)
    width = len(ids[0])
    if len(packed) == width * len(ids):
        lengths = list(map(len, ids))
        if lengths.count(width) == len(ids):
            return packed, width
        return packed, array("I", accumulate(lengths))
    return packed, array("I", accumulate(map(len, ids)))
