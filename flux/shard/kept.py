"""Kept messages: delayed messages a trim passed while they were pending (G12).

Cleanup trims a topic's log from the head; a pending delayed message in the trimmed
range leaves the log's chunks but stays held, *out of line*, below the log's oldest
offset, until it is ``ttl`` past its due time and acked by every subscription.
:class:`KeptMessages` holds them for one :class:`~flux.shard.topic.TopicLog`, by offset.

A memory topic's kept message is held whole (*resident*). A disk topic's is written
whole in a KEEP record (PROTOCOL.md §14.4); once that record is durable the message
is *placed*: only the record's position, the message's size and its key stay in
memory (key-ordered groups route by the key), and a delivery, FETCH, dead letter or
copy forward reads the rest back from the record by position, checksum verified
(:meth:`flux.shard.journal.TopicJournal.read_kept`). So a disk topic may keep more
messages than memory holds, as its log does (G9 "Space").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from flux import errors
from flux.message_meta import meta_size

# kept messages read back that stay at hand (a push window's worth: a push's columns,
# then its keys and headers, read them once)
RECENT = 4096

KeptMeta = tuple[Any, Any, Any]  # (key, headers, due: monotonic, None when not delayed)


class Entry(NamedTuple):
    """A held message. ``stored_at`` is on the shard's monotonic clock."""

    id: str
    payload: bytes
    stored_at: float


class Placed(NamedTuple):
    """A kept message whose latest KEEP record is durable: where that record is, the
    bytes of its id and payload (a page's budget counts them) and its key."""

    position: int
    size: int
    key: str | None


Resident = tuple[Entry, KeptMeta]
# reads the kept messages ``offsets`` back from the KEEP record at a position
ReadKept = Callable[[int, Sequence[int]], dict[int, Resident]]


def resident_bytes(kept: Resident) -> int:
    """What a resident kept message counts in memory: id, payload, key and headers."""
    entry, (key, headers, _) = kept
    return len(entry.id) + len(entry.payload) + meta_size(key, headers)


def placed_bytes(placed: Placed) -> int:
    """What a placed kept message counts in memory: its key."""
    return meta_size(placed.key, None)


class KeptMessages:
    """One log's kept messages by offset, in increasing order, resident or placed.

    The byte counts its methods return are what the log's ``held_bytes`` gains (or
    loses, negative): resident messages count whole, placed ones their key only.
    """

    __slots__ = ("_by", "_latest", "_read", "_recent", "_unplaced")

    def __init__(self) -> None:
        self._by: dict[int, Resident | Placed] = {}
        # KEEP records not durable yet: (end, position, offsets), in order of position,
        # and each offset's latest such position (an older record of it places nothing)
        self._unplaced: list[tuple[int, int, Sequence[int]]] = []
        self._latest: dict[int, int] = {}
        self._read: ReadKept | None = None
        # messages read back lately (a delivery asks for columns, then keys and headers)
        self._recent: dict[int, Resident] = {}

    def __len__(self) -> int:
        return len(self._by)

    def __bool__(self) -> bool:
        return bool(self._by)

    def __contains__(self, offset: object) -> bool:
        return offset in self._by

    def __iter__(self) -> Iterator[int]:
        return iter(self._by)

    @property
    def reader(self) -> ReadKept | None:
        """Where placed messages are read back from (None: they cannot be)."""
        return self._read

    @reader.setter
    def reader(self, read: ReadKept | None) -> None:
        self._read = read

    def first(self) -> int:
        """The lowest kept offset (there must be one)."""
        return next(iter(self._by))

    def hold(self, offset: int, kept: Resident) -> int:
        """Hold a message whole (offsets come in increasing order)."""
        self._by[offset] = kept
        return resident_bytes(kept)

    def hold_placed(self, offset: int, placed: Placed) -> int:
        """Hold a message whose latest KEEP record is durable (recovery)."""
        self._by[offset] = placed
        return placed_bytes(placed)

    def release(self, done: Callable[[int], bool]) -> tuple[list[int], int]:
        """Drop the messages whose offset ``done(offset)`` is true: their offsets, and
        the bytes they counted (negative)."""
        by = self._by
        gone = [o for o in by if done(o)]
        freed = 0
        for o in gone:
            kept = by.pop(o)
            freed -= placed_bytes(kept) if isinstance(kept, Placed) else resident_bytes(kept)
            self._recent.pop(o, None)
            self._latest.pop(o, None)
        return gone, freed

    # -- placing: a KEEP record written, then durable ----------------------------------

    def written(self, offsets: Sequence[int], position: int, end: int) -> None:
        """The KEEP record at ``position`` .. ``end`` holds these kept messages (resident:
        written from memory); they are placed once it is durable (:meth:`settle`)."""
        self._unplaced.append((end, position, offsets))
        latest = self._latest
        for o in offsets:
            latest[o] = position

    def settle(self, durable: int) -> int:
        """Place the messages whose latest KEEP record ends at or below ``durable``;
        the bytes that frees (negative)."""
        unplaced = self._unplaced
        if not unplaced or unplaced[0][0] > durable:
            return 0
        by, latest = self._by, self._latest
        freed = 0
        done = 0
        for end, position, offsets in unplaced:
            if end > durable:
                break
            done += 1
            for o in offsets:
                if latest.get(o) != position:
                    continue  # written again since: placed by that record
                del latest[o]
                kept = by.get(o)
                if kept is None or isinstance(kept, Placed):
                    continue
                entry, (key, _, _) = kept
                placed = Placed(position, len(entry.id) + len(entry.payload), key)
                by[o] = placed
                freed += placed_bytes(placed) - resident_bytes(kept)
                self._recent.pop(o, None)
        del unplaced[:done]
        return freed

    def recall(self, offsets: Iterable[int]) -> int:
        """Hold these kept messages whole again (read back if placed: they are about to
        be written in a new KEEP record, before the old one may go); the bytes added.
        Raises StorageUnavailable if one cannot be read back intact."""
        offsets = [o for o in offsets if isinstance(self._by.get(o), Placed)]
        if not offsets:
            return 0
        loaded = self.load(offsets)
        added = 0
        for o in offsets:
            placed = self._by[o]
            assert isinstance(placed, Placed)
            added += resident_bytes(loaded[o]) - placed_bytes(placed)
            self._by[o] = loaded[o]
        return added

    # -- reading -----------------------------------------------------------------------

    def load(self, offsets: Iterable[int]) -> dict[int, Resident]:
        """These kept messages whole, each placed one read back (one read per KEEP record
        they are in). Raises StorageUnavailable if one cannot be read back intact
        (damage: never its bytes). What was read stays at
        hand (up to ``RECENT`` messages) until later reads push it out: a push reads
        payloads, then keys and headers, of the same messages."""
        by, recent = self._by, self._recent
        out: dict[int, Resident] = {}
        wanted: dict[int, list[int]] = {}  # position -> offsets to read there
        for o in offsets:
            kept = by[o]
            if not isinstance(kept, Placed):
                out[o] = kept
            elif o in recent:
                out[o] = recent[o]
            else:
                wanted.setdefault(kept.position, []).append(o)
        if wanted:
            read = self._read
            if read is None:
                raise errors.StorageUnavailable(
                    "a kept message is not in memory, and there is no log to read it from")
            fresh: dict[int, Resident] = {}
            for position, at in wanted.items():
                fresh.update(read(position, at))
            if len(recent) + len(fresh) > RECENT:
                self._recent = recent = {}
            recent.update(fresh)
            out.update(fresh)
        return out

    def get(self, offset: int) -> Resident:
        """The kept message at ``offset`` whole (read back if placed)."""
        kept = self._by[offset]
        return self.load((offset,))[offset] if isinstance(kept, Placed) else kept

    def key(self, offset: int) -> str | None:
        """The key of the kept message at ``offset`` (never read back)."""
        kept = self._by[offset]
        return kept.key if isinstance(kept, Placed) else kept[1][0]

    def size(self, offset: int) -> int:
        """The bytes of the id and payload of the kept message at ``offset`` (never read
        back)."""
        kept = self._by[offset]
        if isinstance(kept, Placed):
            return kept.size
        entry = kept[0]
        return len(entry.id) + len(entry.payload)

    def placed(self, offset: int) -> bool:
        """Whether the kept message at ``offset`` is out of memory (in its KEEP record)."""
        return isinstance(self._by.get(offset), Placed)
