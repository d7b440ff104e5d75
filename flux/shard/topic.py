"""One topic's storage: the in-memory log of messages and its dedup window.

:class:`TopicLog` is the small interface a durable log can later replace
(append, read a range, trim the head). :class:`DedupWindow` remembers accepted
message ids for ``message.dedup_window`` seconds with their original offsets.
Neither knows about subscriptions; cleanup decides what may be trimmed.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple


class Entry(NamedTuple):
    """A held message. ``stored_at`` is on the shard's monotonic clock."""

    id: str
    payload: bytes
    stored_at: float


class TopicLog:
    """Messages of one topic at consecutive offsets; the oldest may be trimmed."""

    __slots__ = ("_entries", "_first", "_head", "held_bytes")

    def __init__(self) -> None:
        self._entries: list[Entry] = []
        self._first = 0      # offset of self._entries[0]
        self._head = 0       # index of the oldest held entry in self._entries
        self.held_bytes = 0  # payload + id bytes of held messages

    @property
    def oldest(self) -> int:
        """Offset of the oldest held message (== ``next_offset`` when empty)."""
        return self._first + self._head

    @property
    def next_offset(self) -> int:
        """The offset the next append gets; offsets are never reused."""
        return self._first + len(self._entries)

    def __len__(self) -> int:
        return len(self._entries) - self._head

    def append(self, message_id: str, payload: bytes, now: float) -> int:
        """Store a message and return its offset."""
        self._entries.append(Entry(message_id, payload, now))
        self.held_bytes += len(payload) + len(message_id)
        return self._first + len(self._entries) - 1

    def get(self, offset: int) -> Entry | None:
        """The entry at ``offset`` if it is held."""
        i = offset - self._first
        if i < self._head or i >= len(self._entries):
            return None
        return self._entries[i]

    def read(self, start: int, max_messages: int, max_bytes: int) -> list[tuple[int, Entry]]:
        """Held messages from ``start`` on: at most ``max_messages``, and about
        ``max_bytes`` of payload (always at least one if any is held)."""
        i = max(start - self._first, self._head)
        out: list[tuple[int, Entry]] = []
        size = 0
        entries = self._entries
        while i < len(entries) and len(out) < max_messages:
            entry = entries[i]
            size += len(entry.payload) + len(entry.id)
            if out and size > max_bytes:
                break
            out.append((self._first + i, entry))
            i += 1
        return out

    def trim(self, below: int, stored_before: float) -> int:
        """Drop held messages with offset < ``below`` stored at or before
        ``stored_before``; stops at the first that must stay. Returns the count."""
        entries = self._entries
        head = self._head
        limit = min(below - self._first, len(entries))
        dropped = 0
        while head < limit and entries[head].stored_at <= stored_before:
            entry = entries[head]
            self.held_bytes -= len(entry.payload) + len(entry.id)
            head += 1
            dropped += 1
        if head > 1024 and head * 2 > len(entries):
            del entries[:head]
            self._first += head
            head = 0
        elif head == len(entries) and head:
            entries.clear()
            self._first += head
            head = 0
        self._head = head
        return dropped


class DedupWindow:
    """Message ids accepted in the last ``window`` seconds, with their offsets."""

    __slots__ = ("_expiry", "_offsets", "held_bytes", "window")

    def __init__(self, window: float) -> None:
        self.window = window
        self._offsets: dict[str, int] = {}
        self._expiry: deque[tuple[float, str]] = deque()
        self.held_bytes = 0

    def __len__(self) -> int:
        return len(self._offsets)

    def lookup(self, message_id: str, now: float) -> int | None:
        """The original offset of ``message_id`` if it is still remembered."""
        if self._expiry and self._expiry[0][0] <= now:
            self.expire(now)
        return self._offsets.get(message_id)

    def remember(self, message_id: str, offset: int, now: float) -> None:
        """Remember an accepted id until ``now + window``."""
        if self.window <= 0:
            return
        self._offsets[message_id] = offset
        self._expiry.append((now + self.window, message_id))
        self.held_bytes += len(message_id)

    def expire(self, now: float) -> int:
        """Forget ids whose window has passed; returns how many."""
        expiry = self._expiry
        offsets = self._offsets
        count = 0
        while expiry and expiry[0][0] <= now:
            _, message_id = expiry.popleft()
            offsets.pop(message_id, None)
            self.held_bytes -= len(message_id)
            count += 1
        return count
