"""A disk topic's journal as the shard core sees it: records out, durable marks in (G9).

The core stays free of I/O. For a disk topic it appends one record per change
(a PUBLISH group, a named subscription made or deleted, a subscription's acks or
commit, a trim of the head) to the topic's :class:`Appender` (the log writer,
which the shell runs) and *holds back* what G9 says must wait for durability:
replies (PUBLISHED, ACKED, COMMITTED, a SUBSCRIBED that made a subscription) and
the topic's *exposed* end (deliveries and FETCH reach only offsets below it).
When the writer's durable mark moves, the shell calls
``ShardCore.storage_progress`` and :meth:`TopicJournal.advance` releases
everything the mark now covers, in order.

Record bodies are MessagePack arrays; their layout is PROTOCOL.md §14.4. A PUBLISH
record is also where an evicted chunk's payloads come back from
(:meth:`TopicJournal.read_payloads`, :mod:`flux.shard.cache`), and a KEEP record
where its kept delayed messages do (:meth:`TopicJournal.read_kept`,
:mod:`flux.shard.kept`).
"""

from __future__ import annotations

import bisect
import logging
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgpack

from flux import errors
from flux import protocol as P
from flux.shard.columns import untracked
from flux.shard.publish_record import array_header
from flux.storage.errors import StorageError
from flux.storage.record import HEADER_SIZE, Record

log = logging.getLogger("flux.shard")

# record types (flux.storage.record: type 0 is never written)
PUBLISH = 1        # [first offset, wall time, [id, ...], [payload, ...](, {keys, headers, due})]
SUBSCRIPTION = 2   # [name, kind (journal_mode), start offset, wall time created]
UNSUBSCRIBED = 3   # [name]: the named subscription was deleted
TRIM = 5           # [oldest]: messages below were cleaned up
IDS = 7            # [first offset, wall time, [id, ...]]: a PUBLISH record whose messages
                   # are all gone, kept by compaction for its ids (still in the dedup window)
PUSHES = 8         # [name, pushes, [first offset, count, ...]]: these runs of offsets were
                   # pushed for the pushes-th time (G11: counts that survive a restart)
KEEP = 9           # [[offset, id, wall time, payload, key, headers, wall due], ...]: delayed
                   # messages a trim passed, held out of line whole (G12)
RELEASE = 10       # [offset, ...]: kept messages cleaned up
# acks above a cursor travel as runs, [first offset, count, ...] (Acks.as_runs): a record
# costs two numbers a run, however many offsets a run holds (data format 2)
CURSOR = 11        # [name, cursor, [first, count, ...]]: acks added since the last one
SNAPSHOT = 12      # [next offset, oldest, [[name, mode, start, created, cursor,
                   #  [first, count, ...](, [offset, pushes, ...])], ...](, [kept offset, ...])]
# what data format 1 wrote instead, acks as every offset: still read, never written
CURSOR_V1 = 4      # [name, cursor, [acked offset above the cursor, ...]]
SNAPSHOT_V1 = 6    # as SNAPSHOT, each row's acks [acked offset, ...]

# a KEEP record takes no more messages once its payloads reach this: a kept message is
# read back with its whole record (the checksum covers the record), so records stay small
KEEP_BYTES = 1 << 16

_pack = msgpack.Packer(use_bin_type=True).pack
_IDS_HEAD = P.array_header(3)   # an IDS record's body: an array of three


class Appender(Protocol):
    """What the core needs of a log writer (``flux.storage.LogWriter`` is one)."""

    generation: int
    durable: int
    appended: int
    synced: int    # the end of the last record an fsync covered (durable: written, too)
    # the record each new segment starts with (the topic's whole state)
    snapshot: Callable[[], tuple[int, bytes]] | None

    @property
    def size(self) -> int:
        """Bytes the log holds."""
        ...

    def append(self, rtype: int, body: bytes) -> Any:
        """Queue a record; returns something with an ``end`` position."""
        ...


class RecordReader(Protocol):
    """Reads a record back by position, verifying its checksum (``flux.storage.LogReader``)."""

    def read(self, position: int, size_hint: int = 0) -> Record:
        """The record at ``position``; raises a StorageError (CorruptRecord, NotInLog) if
        there is no intact record there."""
        ...


@dataclass(eq=False)
class Held:
    """A reply that may go out only once every record it depends on is durable, and
    everything its session was sent after it."""

    conn: int
    frame: list[Any]
    waiting: int = 0   # journals whose durable mark has yet to reach this reply's record
    released: bool = False
    # frames the session was sent after this reply, before its next held one: they go
    # out behind it, so a connection's frames keep their order (a DELIVER or SUB_ENDED
    # never overtakes the SUBSCRIBED it follows)
    behind: list[list[Any]] = field(default_factory=list)
    # pushes among those frames, (subscription, offsets, pushes, epoch): their ack
    # timeout (G4) starts when they go out, not when they were made
    pushes: list[tuple[Any, Sequence[int], Any, int]] = field(default_factory=list)


@dataclass(eq=False)
class TopicJournal:
    """One disk topic's link to its log: the writer, what waits on it, and the exposed end."""

    topic: str
    writer: Appender
    exposed: int                           # offsets below are durable: deliver and fetch them
    failed: str | None = None              # why the log stopped taking records
    _waits: deque[tuple[int, Held | None, int]] = field(default_factory=deque)
    # each PUBLISH record still in the log: (its end position, the offset after its
    # messages, its wall time); the log before ``droppable`` holds nothing live (one
    # entry a record: not walked by the garbage collector, flux.shard.columns)
    published: deque[tuple[int, int, float]] = field(
        default_factory=lambda: untracked(deque()))
    droppable: int = 0
    # reads records back (evicted payloads); None: nothing can be evicted
    reader: RecordReader | None = None
    # told of damage found reading a record back (the shell recovers this topic's log:
    # recovery sets the damage aside and starts a new generation, G9)
    on_damage: Callable[[TopicJournal, str], None] | None = None
    damaged: str | None = None             # the first damage read back, if any
    last_position: int = -1                # where the last record appended starts (-1: none)
    # as of the last cleanup pass: the oldest offset held, and the wall time before which
    # stored ids have left the dedup window (what compaction keeps, :meth:`judge`)
    held_from: int = 0
    forgotten_before: float = float("-inf")
    compactions: int = 0                   # segments compaction rewrote, and bytes it saved
    compacted_bytes: int = 0
    # the offset below which the last TRIM appended says messages were cleaned up
    trimmed_to: int = 0
    # each kept message (G12: a pending delayed message a trim passed) -> the position of
    # its latest KEEP record, in the order of those positions
    kept: dict[int, int] = field(default_factory=dict)

    @property
    def generation(self) -> int:
        return self.writer.generation

    def append(self, rtype: int, body: list[Any] | bytes) -> int:
        """Append a record; returns the position its durability is waited for by. Once
        the log has failed nothing is appended (``failed`` says why; the shell's
        watcher fails what waits)."""
        data = body if isinstance(body, bytes) else _pack(body)
        try:
            where = self.writer.append(rtype, data)
        except Exception as exc:  # LogFailed, or the writer closing: no record is written
            if self.failed is None:
                self.failed = str(exc) or exc.__class__.__name__
            self.last_position = -1
            return int(self.writer.appended)
        self.last_position = int(where.position)
        return int(where.end)

    def read_payloads(self, position: int, end: int, first: int) -> bytes:
        """The payloads of the PUBLISH record at ``position`` .. ``end`` (its messages start
        at offset ``first``), packed as the record holds them (one MessagePack array).

        Every read verifies the record's checksum. A record that cannot be read intact is
        damage: it is logged, reported to ``on_damage``, and answered with
        StorageUnavailable (retryable: recovery sets the damage aside), never with its bytes.
        """
        if self.reader is None:
            raise errors.StorageUnavailable(
                f"the log of topic {self.topic!r} cannot be read back")
        try:
            rec = self.reader.read(position, end - position - HEADER_SIZE)
        except (StorageError, OSError, ValueError) as exc:  # damage, or an I/O error
            raise self._damage(f"reading position {position} back failed: {exc}") from None
        if rec.type != PUBLISH or rec.end != end:
            raise self._damage(f"the record at position {position} is not the PUBLISH record"
                               f" of offsets from {first} (type {rec.type}, end {rec.end})")
        unpacker = msgpack.Unpacker(raw=False)
        unpacker.feed(rec.body)
        try:
            fields = unpacker.read_array_header()
            if fields not in (4, 5) or unpacker.unpack() != first:
                raise ValueError("another first offset")
            unpacker.skip()  # wall time
            unpacker.skip()  # ids
            start = unpacker.tell()
            if fields == 4:  # the payloads end the record
                return rec.body[start:]
            unpacker.skip()  # the payloads, then the keys, headers and due times
            return rec.body[start:unpacker.tell()]
        except (ValueError, msgpack.UnpackException) as exc:
            raise self._damage(f"the record at position {position} is not the PUBLISH record"
                               f" of offsets from {first}: {exc}") from None

    def read_kept(self, position: int, offsets: Sequence[int]) -> tuple[list[list[Any]], int]:
        """The rows of the kept messages ``offsets`` (G12) in the KEEP record at
        ``position``, and the record's size. Every read verifies the checksum; a record
        that cannot be read intact, is not a KEEP record or lacks one of them is damage
        (as :meth:`read_payloads`)."""
        if self.reader is None:
            raise errors.StorageUnavailable(
                f"the log of topic {self.topic!r} cannot be read back")
        try:
            rec = self.reader.read(position)
        except (StorageError, OSError, ValueError) as exc:  # damage, or an I/O error
            raise self._damage(f"reading position {position} back failed: {exc}") from None
        wanted = set(offsets)
        try:
            if rec.type != KEEP:
                raise ValueError(f"a record of type {rec.type}")
            rows = [row for row in msgpack.unpackb(rec.body, raw=False) if row[0] in wanted]
            if len(rows) != len(wanted) or any(len(row) != 7 for row in rows):
                raise ValueError(f"it holds {sorted(row[0] for row in rows)} of them")
        except (ValueError, TypeError, IndexError, msgpack.UnpackException) as exc:
            raise self._damage(f"the record at position {position} is not the KEEP record"
                               f" of kept offsets {sorted(wanted)}: {exc}") from None
        return rows, rec.end - position

    def _damage(self, reason: str) -> errors.StorageUnavailable:
        """Damage read back: log and report it; the error to answer with."""
        log.error("topic %r: %s; not delivered (its log is recovered, which sets the"
                  " damage aside)", self.topic, reason)
        if self.damaged is None:
            self.damaged = reason
            if self.failed is None:
                self.failed = f"damage in the log: {reason}"
            if self.on_damage is not None:
                self.on_damage(self, reason)
        return errors.StorageUnavailable(
            f"a record of topic {self.topic!r} is damaged on disk ({reason}); retry after"
            " its log is recovered")

    def trim(self, oldest: int) -> None:
        """Messages below ``oldest`` were cleaned up (the ones kept are in KEEP records,
        appended first: a log that holds this TRIM holds them)."""
        self.trimmed_to = oldest
        self.append(TRIM, [oldest])

    def keep(self, rows: Sequence[list[Any]]) -> list[tuple[list[int], int, int]]:
        """Append KEEP records of these kept messages (a row each, offset first: see KEEP),
        about ``KEEP_BYTES`` of payloads a record; each offset's latest record is there.
        Returns where each record went: (its offsets, position, end)."""
        kept = self.kept
        written: list[tuple[list[int], int, int]] = []
        start = 0
        while start < len(rows):
            end, size = start, 0
            while end < len(rows) and (end == start or size < KEEP_BYTES):
                size += len(rows[end][3])
                end += 1
            batch = rows[start:end]
            record_end = self.append(KEEP, list(batch))
            if self.last_position >= 0:
                for row in batch:
                    kept.pop(row[0], None)  # (moved to the end: positions stay in order)
                    kept[row[0]] = self.last_position
                written.append(([row[0] for row in batch], self.last_position, record_end))
            start = end
        return written

    def release(self, offsets: Sequence[int]) -> None:
        """Append a RELEASE record: these kept messages were cleaned up."""
        self.append(RELEASE, list(offsets))
        for o in offsets:
            self.kept.pop(o, None)

    def published_at(self, end: int, next_offset: int, wall: float) -> None:
        """A PUBLISH record ending at ``end`` holds the messages below ``next_offset``."""
        self.published.append((end, next_offset, wall))

    def retain(self, oldest: int, forgotten_before: float) -> list[int]:
        """Move ``droppable`` past every PUBLISH record whose messages are all gone
        (below ``oldest``) and whose ids left the dedup window (stored before
        ``forgotten_before``, wall time). Every log segment begins with a SNAPSHOT of
        the topic, so segments wholly before it can be removed. Returns the kept
        messages whose KEEP record is now before it: the caller appends them again at
        once (:meth:`keep`), before the writer drops anything (it syncs first)."""
        self.held_from, self.forgotten_before = oldest, forgotten_before
        published = self.published
        while published and published[0][1] <= oldest and published[0][2] < forgotten_before:
            self.droppable = max(self.droppable, published.popleft()[0])
        kept = self.kept
        if not published:  # no message left in the log: everything written may go, but
            # kept messages stay where they are (written again only as PUBLISH records go)
            end = self.writer.durable
            if kept:
                end = min(end, next(iter(kept.values())))
            self.droppable = max(self.droppable, end)
        moved: list[int] = []
        for o, position in kept.items():
            if position >= self.droppable:
                break
            moved.append(o)
        return moved

    def first_live_end(self) -> int | None:
        """The end position of the first PUBLISH record that still holds a message (as
        of the last cleanup pass); None if none does. Compaction stays before it."""
        published = self.published
        i = bisect.bisect_right(published, self.held_from, key=lambda e: e[1])
        return published[i][0] if i < len(published) else None

    def last_wall_before(self, position: int) -> float | None:
        """The wall time of the last PUBLISH record (still tracked) ending at or before
        ``position``; None if there is none."""
        published = self.published
        i = bisect.bisect_right(published, position, key=lambda e: e[0])
        return published[i - 1][2] if i else None

    def judge(self, rec: Record) -> bool | tuple[int, bytes]:
        """Compaction's verdict on a record of a sealed segment that holds no message
        still held (:mod:`flux.storage.compaction`): a PUBLISH record becomes an IDS
        record while its ids are in the dedup window, and goes after; a SNAPSHOT stays
        (the log may start at its segment); subscription changes, cursors and trims go,
        as the SNAPSHOT that starts the next segment (durable first) holds them all. A
        KEEP record stays while it is the latest of a message still kept, or the latest is
        not fsynced yet; a RELEASE goes (the next SNAPSHOT lists the messages still kept)."""
        rtype = rec.type
        if rtype == KEEP:  # (a later one not fsynced yet may be lost with the power)
            kept, position, synced = self.kept, rec.position, self.writer.synced
            return any((latest := kept.get(row[0], -1)) == position or latest >= synced
                       for row in msgpack.unpackb(rec.body, raw=False))
        if rtype in (PUBLISH, IDS):
            # the ids are skipped (in C), not unpacked into a str each: an IDS record
            # takes the PUBLISH body's first three fields as they are
            body = rec.body
            unpacker = msgpack.Unpacker(raw=False)
            unpacker.feed(body)
            unpacker.read_array_header()
            fields_at = unpacker.tell()
            first, wall = unpacker.unpack(), unpacker.unpack()
            ids = array_header(body, unpacker.tell())
            if ids is None or first + ids[0] > self.held_from:
                return True   # a message still held (never expected here): keep it
            if wall < self.forgotten_before:
                return False
            if rtype == IDS:
                return True
            unpacker.skip()
            return IDS, _IDS_HEAD + body[fields_at:unpacker.tell()]
        return rtype not in (SUBSCRIPTION, UNSUBSCRIBED, CURSOR, CURSOR_V1, TRIM, PUSHES,
                             RELEASE)

    def publish_body(self, first: int, wall: float, ids: Any, packed_payloads: bytes,
                     meta: dict[str, Any] | None = None) -> bytes:
        """A PUBLISH record's body around payloads already packed as one array; ``meta``
        (keys, headers and wall due times, when the run has any) is a fifth field."""
        head = (P.array_header(4 if meta is None else 5), _pack(first), _pack(wall),
                _pack(list(ids)), packed_payloads)
        return b"".join(head if meta is None else (*head, _pack(meta)))

    def hold(self, held: Held, end: int) -> bool:
        """``held`` waits (also) for this journal's durable mark to reach ``end``;
        False if the mark is there already (nothing to wait for)."""
        if self.writer.durable >= end:
            return False
        held.waiting += 1
        self._waits.append((end, held, -1))
        return True

    def expose_at(self, end: int, next_offset: int) -> None:
        """Offsets below ``next_offset`` are exposed once the mark reaches ``end``."""
        if self.writer.durable >= end and not self._waits:
            self.exposed = next_offset
        else:
            self._waits.append((end, None, next_offset))

    def advance(self) -> tuple[list[Held], bool]:
        """Release what the durable mark now covers: the replies ready to go, and
        whether the exposed end moved."""
        durable = self.writer.durable
        waits = self._waits
        ready: list[Held] = []
        moved = False
        while waits and waits[0][0] <= durable:
            _, held, next_offset = waits.popleft()
            if held is None:
                if next_offset > self.exposed:
                    self.exposed = next_offset
                    moved = True
            else:
                held.waiting -= 1
                if held.waiting == 0:
                    ready.append(held)
        return ready, moved

    def fail(self, reason: str) -> list[Held]:
        """The log stopped: every held reply is answered with its error, none is released."""
        self.failed = reason
        stranded = [held for _, held, _ in self._waits if held is not None]
        self._waits.clear()
        return stranded


def journal_mode(sub: Any) -> str:
    """How SUBSCRIPTION and SNAPSHOT records name a subscription's kind: ``push``,
    ``pull``, ``shared`` or ``shared-keyed`` (a shared push subscription, G10)."""
    group = sub.group
    if group is None:
        return str(sub.mode)
    return "shared-keyed" if group.key_ordered else "shared"


def subscription_row(sub: Any, epoch: float) -> list[Any]:
    """A named subscription as SNAPSHOT carries it (``epoch``: wall minus monotonic time),
    its acks above the cursor as runs; a seventh field, when it has any, holds its
    surviving push counts (G11) as ``[offset, pushes, ...]``."""
    row = [sub.name, journal_mode(sub), sub.start_offset, epoch + sub.created_at, sub.cursor,
           sub.acked.as_runs()]
    counts = sub.surviving_counts()
    if counts:
        row.append([x for o in sorted(counts) for x in (o, counts[o])])
    return row


def snapshot_body(next_offset: int, oldest: int, subs: list[list[Any]],
                  kept: Iterable[int] = ()) -> bytes:
    """A SNAPSHOT record's body; a fourth field, when any message is kept (G12), lists
    the kept offsets whose KEEP records came before it."""
    return bytes(_pack([next_offset, oldest, subs, sorted(kept)] if kept
                       else [next_offset, oldest, subs]))
