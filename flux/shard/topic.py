"""One topic's storage: the in-memory log of messages and its dedup window.

:class:`TopicLog` is the small interface a durable log can later replace
(append, read a range, trim the head). :class:`DedupWindow` remembers accepted
message ids for ``message.dedup_window`` seconds with their original offsets.
Neither knows about subscriptions; cleanup decides what may be trimmed.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable
from typing import NamedTuple


class Entry(NamedTuple):
    """A held message. ``stored_at`` is on the shard's monotonic clock."""

    id: str
    payload: bytes
    stored_at: float


class TopicLog:
    """Messages of one topic at consecutive offsets; the oldest may be trimmed.

    Ids and payloads sit in two parallel lists and store times in a short list of
    marks (one per distinct ``now``, i.e. per PUBLISH frame), so a held message
    costs two list slots beyond its id and payload objects.
    """

    __slots__ = ("_first", "_head", "_ids", "_mark_at", "_mark_offset", "_payloads",
                 "held_bytes")

    def __init__(self) -> None:
        self._ids: list[str] = []
        self._payloads: list[bytes] = []
        self._mark_offset: list[int] = []   # a mark: from this offset on, stored at ...
        self._mark_at: list[float] = []     # ... this time (until the next mark)
        self._first = 0      # offset of self._ids[0]
        self._head = 0       # index of the oldest held entry in self._ids
        self.held_bytes = 0  # payload + id bytes of held messages

    @property
    def oldest(self) -> int:
        """Offset of the oldest held message (== ``next_offset`` when empty)."""
        return self._first + self._head

    @property
    def next_offset(self) -> int:
        """The offset the next append gets; offsets are never reused."""
        return self._first + len(self._ids)

    def __len__(self) -> int:
        return len(self._ids) - self._head

    def append(self, message_id: str, payload: bytes, now: float) -> int:
        """Store a message and return its offset."""
        ids = self._ids
        offset = self._first + len(ids)
        if not self._mark_at or self._mark_at[-1] != now:
            self._mark_offset.append(offset)
            self._mark_at.append(now)
        ids.append(message_id)
        self._payloads.append(payload)
        self.held_bytes += len(payload) + len(message_id)
        return offset

    def extend(self, ids: list[str], payloads: list[bytes], now: float,
               size: int | None = None) -> int:
        """Store several messages at once; returns the offset of the first. ``size``:
        their id and payload lengths summed, if the caller already knows it."""
        offset = self._first + len(self._ids)
        if ids:
            if not self._mark_at or self._mark_at[-1] != now:
                self._mark_offset.append(offset)
                self._mark_at.append(now)
            self._ids += ids
            self._payloads += payloads
            if size is None:
                size = sum(map(len, ids)) + sum(map(len, payloads))
            self.held_bytes += size
        return offset

    def stored_at(self, offset: int) -> float:
        """When the message at ``offset`` (held, or the next one) was stored."""
        return self._mark_at[bisect_right(self._mark_offset, offset) - 1]

    def get(self, offset: int) -> Entry | None:
        """The entry at ``offset`` if it is held."""
        i = offset - self._first
        if i < self._head or i >= len(self._ids):
            return None
        return Entry(self._ids[i], self._payloads[i], self.stored_at(offset))

    def span(self, start: int, stop: int, epoch: float = 0.0
             ) -> tuple[list[str], list[bytes], list[float]]:
        """Ids, payloads and store times (plus ``epoch``) of the held offsets ``start``
        to ``stop - 1`` (the caller makes sure they are held)."""
        a, b = start - self._first, stop - self._first
        offsets, ats = self._mark_offset, self._mark_at
        m = bisect_right(offsets, start) - 1
        times: list[float] = []
        pos = start
        while pos < stop:
            end = offsets[m + 1] if m + 1 < len(offsets) and offsets[m + 1] < stop else stop
            times += [epoch + ats[m]] * (end - pos)
            pos = end
            m += 1
        return self._ids[a:b], self._payloads[a:b], times

    def read(self, start: int, max_messages: int, max_bytes: int) -> list[tuple[int, Entry]]:
        """Held messages from ``start`` on: at most ``max_messages``, and about
        ``max_bytes`` of payload (always at least one if any is held)."""
        i = max(start - self._first, self._head)
        out: list[tuple[int, Entry]] = []
        size = 0
        ids, payloads = self._ids, self._payloads
        while i < len(ids) and len(out) < max_messages:
            size += len(payloads[i]) + len(ids[i])
            if out and size > max_bytes:
                break
            offset = self._first + i
            out.append((offset, Entry(ids[i], payloads[i], self.stored_at(offset))))
            i += 1
        return out

    def trim(self, below: int, stored_before: float) -> int:
        """Drop held messages with offset < ``below`` stored at or before
        ``stored_before``; stops at the first that must stay. Returns the count."""
        ids, payloads = self._ids, self._payloads
        first, head = self._first, self._head
        limit = min(below - first, len(ids))
        if head >= limit:
            return 0
        # the first message stored after the cutoff stops the trim (times never decrease
        # within a mark; a later mark may have an earlier time, so walk them in order)
        offsets, ats = self._mark_offset, self._mark_at
        m = bisect_right(offsets, first + head) - 1
        stop = head
        while stop < limit and ats[m] <= stored_before:
            stop = min(limit, (offsets[m + 1] - first) if m + 1 < len(offsets) else limit)
            m += 1
        dropped = stop - head
        if not dropped:
            return 0
        # joining the ids (short) counts them faster than len() per id
        self.held_bytes -= len("".join(ids[head:stop])) + sum(map(len, payloads[head:stop]))
        # release the objects now, not at the next compaction
        ids[head:stop] = [""] * dropped
        payloads[head:stop] = [b""] * dropped
        head = stop
        if head == len(ids):
            ids.clear()
            payloads.clear()
            self._first += head
            head = 0
            self._drop_marks(self._first)
        elif head > 1024 and head * 2 > len(ids):
            del ids[:head]
            del payloads[:head]
            self._first += head
            head = 0
            self._drop_marks(self._first)
        self._head = head
        return dropped

    def _drop_marks(self, oldest: int) -> None:
        """Forget marks that only cover offsets below ``oldest``."""
        offsets = self._mark_offset
        k = bisect_right(offsets, oldest) - 1
        if k > 0:
            del offsets[:k]
            del self._mark_at[:k]
        if not self._ids:  # empty: the next append starts a mark
            offsets.clear()
            self._mark_at.clear()


class DedupWindow:
    """Message ids accepted in the last ``window`` seconds, with their offsets.

    A topic's accepted ids take consecutive offsets, so the window keeps them in
    acceptance order (a list) with a set beside it for membership; ids remembered
    together share a *mark* (first position, first offset, expiry time) in three
    flat lists. An id thus costs a set entry and a list slot, and nothing the
    garbage collector has to walk. A duplicate's offset is found by searching the
    list from its recent end: duplicates are retries, rare and recent.
    """

    __slots__ = ("_head", "_known", "_mark_at", "_mark_head", "_mark_offset", "_mark_pos",
                 "_order", "held_bytes", "window")

    def __init__(self, window: float) -> None:
        self.window = window
        self._known: set[str] = set()
        self._order: list[str] = []       # remembered ids, oldest first, from _head on
        self._head = 0
        self._mark_pos: list[int] = []    # a mark: from this index of _order on, ...
        self._mark_offset: list[int] = []  # ... ids have consecutive offsets from this one ...
        self._mark_at: list[float] = []   # ... and are forgotten at this time
        self._mark_head = 0
        self.held_bytes = 0

    def __len__(self) -> int:
        return len(self._known)

    def lookup(self, message_id: str, now: float) -> int | None:
        """The original offset of ``message_id`` if it is still remembered."""
        self.expire(now)
        return self.get(message_id)

    def remember(self, message_id: str, offset: int, now: float) -> None:
        """Remember an accepted id until ``now + window``."""
        self.remember_all([message_id], offset, now)

    def get(self, message_id: str) -> int | None:
        """Like :meth:`lookup` without expiring first (the caller ran :meth:`expire`)."""
        if message_id not in self._known:
            return None
        i = self._position(message_id)
        m = bisect_right(self._mark_pos, i, self._mark_head) - 1
        return self._mark_offset[m] + i - self._mark_pos[m]

    def finder(self) -> Callable[[str], int | None]:
        """:meth:`get` as a plain function, for a loop over many ids (after :meth:`expire`)."""
        return self.get

    def known_any(self, ids: Iterable[str]) -> bool:
        """Whether any of ``ids`` is remembered (after :meth:`expire`): the publish fast
        path asks this once per group and leaves any hit to :meth:`finder`."""
        return not self._known.isdisjoint(ids)

    def remember_all(self, ids: list[str], first: int, now: float, size: int | None = None
                     ) -> None:
        """Remember ``ids``, accepted at offsets ``first``, ``first + 1``, ... (``size``:
        their lengths summed, if the caller already knows it). None may be remembered."""
        if self.window <= 0 or not ids:
            return
        self.expire(now)
        at = now + self.window
        order = self._order
        marks = self._mark_pos
        if (len(marks) == self._mark_head or self._mark_at[-1] != at
                or self._mark_offset[-1] + len(order) - marks[-1] != first):
            marks.append(len(order))
            self._mark_offset.append(first)
            self._mark_at.append(at)
        order += ids
        self._known.update(ids)
        self.held_bytes += len("".join(ids)) if size is None else size

    def expire(self, now: float) -> int:
        """Forget ids whose window has passed; returns how many."""
        ats, k = self._mark_at, self._mark_head
        if k == len(ats) or ats[k] > now:
            return 0
        k = bisect_right(ats, now, k)
        order, head = self._order, self._head
        stop = self._mark_pos[k] if k < len(ats) else len(order)
        gone = order[head:stop]
        self._known.difference_update(gone)
        self.held_bytes -= len("".join(gone))
        order[head:stop] = [""] * (stop - head)  # release the ids now, not at compaction
        head = stop
        if head == len(order) or (head > 1024 and head * 2 > len(order)):
            del order[:head]
            del self._mark_pos[:k]
            del self._mark_offset[:k]
            del ats[:k]
            self._mark_pos[:] = [p - head for p in self._mark_pos]
            head = k = 0
        self._head, self._mark_head = head, k
        return len(gone)

    def _position(self, message_id: str) -> int:
        """Index in ``_order`` of a remembered id, searched from the newest end."""
        order, head = self._order, self._head
        stop, step = len(order), 256
        while stop > head:
            start = max(head, stop - step)
            try:
                return order.index(message_id, start, stop)
            except ValueError:
                stop, step = start, step * 4
        raise KeyError(message_id)  # unreachable while _known and _order agree
