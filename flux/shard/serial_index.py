"""A large dedup window's index: an id's 64-bit hash -> its *serial* (the how-manieth
id the window remembered), in a ring of fixed-size open-addressing tables.

Lives here: placing and finding hashes, one at a time and in bulk (numpy). What an
id is, and whether a serial found really holds it, is :mod:`flux.shard.dedup`'s: a
hash says only where to look (ids may share one), so every hit is a candidate that
the caller's ``accept`` checks against the id itself.

Ids are remembered and forgotten strictly in acceptance order, so serials only grow
and a serial below the oldest remembered one is dead. Each table takes a run of
serials, as many as the window holds when it is made (three times that while it is
still growing), filled once up to half its slots; it never grows, rehashes or
deletes, and goes whole once every serial in it is dead. A slot holds a 16-bit
fingerprint (the hash's top bits; 0: empty) and, beside it, the serial less the
table's first one (6 bytes a slot, 12 an id). An id taken out early (accepted again
after its window) keeps its fingerprint, with its serial set to :data:`DEAD`. A probe
runs forward from the id's home slot (the hash's low 32 bits scaled to the table)
into a padding past the table's homes and never wraps; the last slot stays empty,
so every probe ends. Tables are anonymous mappings in small pages (see
:func:`_zeros`).

The walks themselves run in C (:data:`fast`, ``flux/shard/_serial_probe.c``, built
with Flux where a C compiler is) or, without it, in numpy: a step of every id of a
group per numpy call, some ten times slower.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from types import ModuleType

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

fast: ModuleType | None  # the walks in C; None: numpy's (tests run both)
try:
    from flux.shard import _serial_probe as fast
except ImportError:  # pragma: no cover (built with Flux where a C compiler is)
    fast = None

MASK64 = (1 << 64) - 1
MIN_ROOM = 1 << 15  # ids the smallest table takes (it has twice as many slots)
ROOM_STEP = 1024    # a new table takes as many ids as are live, rounded up to this,
GROWING = 3         # ... or this many times as many while none has died yet
PAD = 64            # slots past a table's homes that a probe may run into
LOW32 = np.uint64(0xFFFFFFFF)
SHIFT32 = np.uint64(32)
WINDOW = 16         # slots a batch probe reads from each id's home slot at once
RELEASE_BYTES = 16 << 20  # dead tables' pages given back to the kernel a call (a page multiple)
DEAD = 0xFFFFFFFF   # the serial part of a slot whose id was taken out

Hashes = npt.NDArray[np.uint64]
Prints = npt.NDArray[np.uint16]


def fingerprints(hashes: Hashes) -> Prints:
    """Each hash's fingerprint: its top 16 bits, 0 made 1 (0 marks an empty slot)."""
    fps = (hashes >> np.uint64(48)).astype(np.uint16)
    fps[fps == 0] = 1
    return fps


def fingerprint(h: int) -> int:
    """:func:`fingerprints` of one hash."""
    return (h >> 48) or 1


def _zeros(size: int) -> mmap.mmap:
    """``size`` zero bytes, in pages of their own that the kernel zeroes as they are first
    touched, in small pages: a huge page (what numpy asks for big arrays) is zeroed
    whole on its first touch, and random writes into a new table touch them all at
    once (a third of a second for 128 MB)."""
    pages = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        pages.madvise(mmap.MADV_NOHUGEPAGE)
    return pages


class _Table:
    """Serials ``first`` .. ``stop - 1`` (at most ``room`` of them), placed by hash."""

    __slots__ = ("count", "first", "fp_area", "fps", "fpv", "homes", "homes64", "last_slot",
                 "pages", "rel_area", "rels", "relv", "room", "rows", "stop")

    def __init__(self, first: int, room: int) -> None:
        self.first = self.stop = first
        self.room = room
        self.count = 0
        self.homes = 2 * room  # an id's home slot: its hash's low 32 bits scaled to this
        self.last_slot = self.homes - 1 + PAD  # always empty: ends every probe
        # a batch probe may read a WINDOW past the last slot (never written)
        slots = self.last_slot + 1 + WINDOW
        fps, rels = _zeros(2 * slots), _zeros(4 * slots)
        self.fp_area, self.rel_area = fps, rels
        # given back to the kernel a slice at a time once dead: (mapping, bytes given back)
        self.pages = [(fps, 0), (rels, 0)]
        self.fps = np.frombuffer(fps, np.uint16)
        self.rels = np.frombuffer(rels, np.uint32)
        self.fpv = memoryview(fps).cast("H")
        self.relv = memoryview(rels).cast("I")
        self.rows = sliding_window_view(self.fps, WINDOW)  # rows[i]: slots i .. i + WINDOW - 1
        self.homes64 = np.uint64(self.homes)

    def home(self, h: int) -> int:
        return ((h & 0xFFFFFFFF) * self.homes) >> 32

    def homes_of(self, hashes: Hashes) -> npt.NDArray[np.int64]:
        """:meth:`home` of each hash."""
        return ((hashes & LOW32) * self.homes64 >> SHIFT32).view(np.int64)

    def takes(self, serial: int) -> bool:
        return serial - self.first < self.room and self.count < self.room

    def put(self, h: int, fp: int, serial: int) -> bool:
        """Place one serial; False when the probe ran to the padding's end (the table
        then takes no more)."""
        fpv, i = self.fpv, self.home(h)
        while fpv[i]:
            i += 1
        if i >= self.last_slot:
            self.room = self.count  # full: the next serial opens a new table
            return False
        fpv[i] = fp
        self.relv[i] = serial - self.first
        self.count += 1
        self.stop = serial + 1
        return True

    def put_all(self, hashes: Hashes, fps: Prints | None,
                serials: npt.NDArray[np.int64]) -> list[int]:
        """Place serials (ascending, within this table's room) in bulk; returns the
        indices of those it could not place (rare: the table then takes no more)."""
        if fast is not None:
            return self._place(hashes, serials)
        if fps is None:
            fps = fingerprints(hashes)
        fp_slots, rel_slots = self.fps, self.rels
        starts = self.homes_of(hashes)
        rels = (serials - self.first).astype(np.uint32)
        pending: npt.NDArray[np.intp] | None = None  # None: all of them
        left: list[int] = []
        while True:
            empty = self.rows[starts] == 0
            slots = starts + empty.argmax(1)
            found = empty.any(1) & (slots < self.last_slot)
            more = None
            if not found.all():  # a cluster longer than the window, or the table's end
                if pending is None:
                    pending = np.arange(len(hashes))
                on = ~found & (starts + WINDOW < self.last_slot)
                ended = ~found & ~on
                if ended.any():
                    self.room = self.count  # full: the next serial opens a new table
                    left += pending[ended].tolist()
                more, more_starts = pending[on], starts[on] + WINDOW
                pending, slots = pending[found], slots[found]
            # ids of this batch that chose the same empty slot: one takes it (numpy
            # writes the last), the rest probe again from there
            mine = rels if pending is None else rels[pending]
            fp_slots[slots] = fps if pending is None else fps[pending]
            rel_slots[slots] = mine
            lost = rel_slots[slots] != mine
            if lost.any():
                if pending is None:
                    pending = np.arange(len(hashes))
                self.count += len(mine) - int(lost.sum())
                starts, pending = slots[lost], pending[lost]
            else:
                self.count += len(mine)
                if more is None:
                    break
                starts, pending = slots[:0], pending[:0]  # type: ignore[index]
            if more is not None:
                pending = np.concatenate((pending, more))
                starts = np.concatenate((starts, more_starts))
            if not len(pending):
                break
        if len(serials):
            self.stop = max(self.stop, int(serials[-1]) + 1)
        return sorted(left)


    def _place(self, hashes: Hashes, serials: npt.NDArray[np.int64]) -> list[int]:
        """:meth:`put_all` in C: one after another, up to the first that does not fit."""
        assert fast is not None
        n = len(serials)
        placed: int = fast.place(self.fp_area, self.rel_area, self.homes, self.last_slot,
                            self.first, np.ascontiguousarray(hashes, np.uint64),
                            np.ascontiguousarray(serials, np.int64))
        self.count += placed
        if placed:
            self.stop = max(self.stop, int(serials[placed - 1]) + 1)
        if placed < n:
            self.room = self.count  # full: the rest open the next table
        return list(range(placed, n))


class SerialIndex:
    """Hash -> serial for the ids of a large dedup window (see the module's doc)."""

    __slots__ = ("_areas", "_tables", "dying", "min_room", "oldest", "reserved")

    def __init__(self, min_room: int = MIN_ROOM) -> None:
        self._tables: list[_Table] = []
        # the tables' areas as the C walks take them: (fps, homes) and (fps, rels, homes,
        # first) of each (kept in step with _tables)
        self._areas: tuple[list[tuple[mmap.mmap, int]],
                           list[tuple[mmap.mmap, mmap.mmap, int, int]]] = ([], [])
        # dead tables whose pages are still being given back: freeing a big table's
        # pages at once costs its size (20 ms for 300 MB), so each call gives back
        # RELEASE_BYTES of them (MADV_DONTNEED; unmapping them after is cheap)
        self.dying: list[_Table] = []
        self.min_room = min_room
        self.oldest = 0  # serials below this are dead
        # ids the next table made takes at least (a rebuilt window's, known ahead: one
        # table for them all, not a growing window's ring of ever larger ones)
        self.reserved = 0

    @property
    def tables(self) -> int:
        return len(self._tables)

    def _table_for(self, serial: int) -> _Table:
        """The table that takes ``serial`` (a new one if the newest is full)."""
        tables = self._tables
        if tables and tables[-1].takes(serial):
            return tables[-1]
        live = serial - self.oldest
        if tables and tables[0].first >= self.oldest:
            live *= GROWING  # none died yet: the window is growing
        step = min(ROOM_STEP, self.min_room)
        room = max(self.min_room, -(-live // step) * step, self.reserved)  # (rounded up)
        self.reserved = 0
        table = _Table(serial, room)
        tables.append(table)
        self._areas_changed()
        return table

    def _areas_changed(self) -> None:
        self._areas = ([(t.fp_area, t.homes) for t in self._tables],
                       [(t.fp_area, t.rel_area, t.homes, t.first) for t in self._tables])

    def add(self, h: int, serial: int) -> None:
        """Place one serial (above every serial placed before)."""
        fp = fingerprint(h)
        while not self._table_for(serial).put(h, fp, serial):
            pass

    def add_all(self, hashes: Hashes, fps: Prints | None,
                serials: npt.NDArray[np.int64]) -> None:
        """Place ``serials`` (ascending, above every serial placed before) in bulk;
        ``fps``: :func:`fingerprints` of ``hashes`` (None: made when needed)."""
        done, n = 0, len(serials)
        while done < n:
            table = self._table_for(int(serials[done]))
            # the serials this table still has room for
            stop = int(np.searchsorted(serials, table.first + table.room, "left"))
            stop = min(stop, done + table.room - table.count)
            left = table.put_all(hashes[done:stop], None if fps is None else fps[done:stop],
                                 serials[done:stop])
            for i in left:  # the table is full now: these open the next one
                self.add(int(hashes[done + i]), int(serials[done + i]))
            done = stop

    def find(self, h: int, accept: Callable[[int, str], bool], key: str) -> int | None:
        """The newest live serial with hash ``h`` that ``accept(serial, key)``."""
        if fast is not None:
            for serial in fast.find(self._areas[1], h, self.oldest):
                if accept(serial, key):
                    return int(serial)
            return None
        fp = fingerprint(h)
        oldest = self.oldest
        for table in reversed(self._tables):
            fpv, i = table.fpv, table.home(h)
            x = fpv[i]
            while x:
                if x == fp:
                    rel = table.relv[i]
                    if rel != DEAD:
                        serial = table.first + rel
                        if serial >= oldest and accept(serial, key):
                            return serial
                i += 1
                x = fpv[i]
        return None

    def remove(self, h: int, serial: int) -> None:
        """Take ``serial`` (placed with hash ``h``) out."""
        fp = fingerprint(h)
        for table in reversed(self._tables):
            if table.first <= serial < table.stop:
                fpv, relv, i, rel = table.fpv, table.relv, table.home(h), serial - table.first
                while fpv[i]:
                    if fpv[i] == fp and relv[i] == rel:
                        relv[i] = DEAD
                        return
                    i += 1

    def maybe(self, hashes: Hashes, fps: Prints | None) -> npt.NDArray[np.bool_]:
        """For each hash, whether some table may hold it: a slot with its fingerprint
        before the first empty one from its home (``False`` is certain: the hash is in
        no table)."""
        if fast is not None:
            marks = np.zeros(len(hashes), np.uint8)
            fast.maybe(self._areas[0], np.ascontiguousarray(hashes, np.uint64), marks)
            return marks.view(np.bool_)
        if fps is None:
            fps = fingerprints(hashes)
        out = np.zeros(len(hashes), bool)
        for table in self._tables:
            starts = table.homes_of(hashes)
            # most homes are empty: only the others read a window of slots
            which = table.fps[starts].nonzero()[0]
            starts, prints = starts[which], fps[which]
            while len(which):
                seen = table.rows[starts]
                # the first slot either empty or the fingerprint: empty means absent
                first = ((seen == prints[:, None]) | (seen == 0)).argmax(1)
                last = seen[np.arange(len(seen)), first]
                hit = last == prints
                out[which[hit]] = True
                on = (last != 0) & ~hit  # neither in the window: read on
                which, starts, prints = which[on], starts[on] + WINDOW, prints[on]
        return out

    def drop_before(self, serial: int) -> None:
        """Serials below ``serial`` are dead: drop the tables holding only those."""
        self.oldest = serial
        tables = self._tables
        while tables and tables[0].stop <= serial and (len(tables) > 1
                                                       or tables[0].count >= tables[0].room):
            self.dying.append(tables.pop(0))
            self._areas_changed()
        if self.dying:
            self.release()

    def release(self) -> None:
        """Give back up to :data:`RELEASE_BYTES` of dead tables' pages."""
        budget = RELEASE_BYTES
        dying = self.dying
        while dying and budget > 0:
            pages = dying[0].pages
            if not pages:
                del dying[0]  # (its mappings go with the table's last reference)
                continue
            area, done = pages[-1]
            size = len(area) - done
            if size > budget:  # (a slice that ends short of the end ends on a page)
                size = budget - budget % mmap.PAGESIZE
                if not size:
                    break
            area.madvise(mmap.MADV_DONTNEED, done, size)
            budget -= size
            if done + size >= len(area):
                pages.pop()
            else:
                pages[-1] = (area, done + size)

    def clear(self) -> None:
        self.dying += self._tables
        self._tables.clear()
        self._areas_changed()
        self.oldest = 0
