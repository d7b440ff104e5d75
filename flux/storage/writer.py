"""The log writer: appends into a buffer, one task writes and syncs (group commit).

``append`` is synchronous and cheap: it encodes the record, gives it its position
and queues it (with ``interval`` and ``never``, a small record appended when
everything before it is written is written at once: its caller finds it durable).
The writer task (:meth:`LogWriter.run`) takes everything queued, writes it in a
worker thread (:meth:`~flux.host.DiskFile.awrite_at`, at the records' place in the
segment: a write a segment, at most :data:`WRITE_SLICE_BYTES` each), and syncs as the
fsync mode says (with ``always``, in the thread call of the group's last write); one
fsync covers every record written before it, and records appended while it writes or
syncs form the next group. With ``always`` the last segment keeps zeros written ahead
of its records (up to :data:`PREWRITE_BYTES`), so that a group's fsync changes no metadata;
recovery takes zeros from a segment's last record to the end of its file for its end
(a sealed segment keeps what was left of them: at most what the next record did not
fit in, or the rest of a megabyte when a new generation or boot started a segment).
With ``always`` and ``sync_lanes`` above 1 (:data:`SYNC_LANES` is 1: see there) a
group that fits one write does not wait for the fsync before it: once that group's
write took, its fsync goes on in its thread and the next group is written and fsynced
beside it (up to ``sync_lanes`` at once),
each on an open file of its own, so that each fsync learns of a write-back error
(Linux reports each one to each open file once; two fsyncs on one open file could
see it reported to the later one only). A group counts as synced only when every
group before it has too: the marks move in log order. No write of the writer task
runs on the event loop: even a small write(2) may wait on the file system's journal
while another log's fsync commits it.
Waiters learn the *durable mark* (DESIGN.md G9): with ``always`` the position up to
which everything is fsynced, with ``interval`` and ``never`` the position up to which
everything is written.

A write that finds the disk full (``ENOSPC``, ``EDQUOT``) is cut back to the last
whole record and tried again later (every ``full_retry`` seconds): what was
queued stays queued, in order, and waits; ``full`` says so meanwhile. Any other
write error, and any fsync error, stops the log for good (:class:`LogFailed`).
A failed fsync first leaves a marker in the log's directory naming the synced and
durable marks (:func:`~flux.storage.segment.fsync_failed_name`): the kernel may have
dropped the pages it could not write while reads still return them, so recovery
must not trust what lies past the synced mark (:mod:`~flux.storage.recovery`).
When that directory takes no new file (a dead disk), the marker goes to the log's
*spare* directory instead (:attr:`LogWriter.spare`, on another file system, kept for
the rest of the machine's boot), which recovery reads too.
"""

from __future__ import annotations

import collections
import enum
import errno
import math
import posixpath
from collections.abc import Callable
from typing import Any, NamedTuple

import trio

from flux.histogram import LatencyHistogram
from flux.host import Disk, SyncFailed
from flux.storage import record
from flux.storage.errors import LogFailed
from flux.storage.segment import SegmentHeader, encode_header, fsync_failed_name, segment_name
from flux.storage.table import OpenSegment, SegmentTable

# ``interval`` and ``never``: a record up to this size, appended when everything before it
# is written, is written at once by ``append`` (one small write(2) on the event loop)
# rather than by the writer task, so its reply need not wait for that task to run
INLINE_WRITE_BYTES = 64 * 1024
WRITE_SLICE_BYTES = 1 << 20   # the most the writer task joins and writes at once
# ``always``: groups whose write+fsync may be under way at once (each on its own open
# file). One by default: with two, an fsync error and a power loss before its marker is
# durable can leave the failed group's pages a hole with the next group's records
# durable after it, which recovery cannot tell from damage (a needless new generation;
# the simulator's busy-disk scenario, seeds 201 and 233); and on this machine two gained
# nothing measurable. ``LogWriter(sync_lanes=2)`` keeps the overlap for its tests.
SYNC_LANES = 1
# ``always``: zeros written ahead of the records in the last segment, refilled when half
# is used, so that most groups overwrite space the file already has: their fsync
# (``fdatasync``) then changes no metadata and waits for no journal commit (measured
# here: 0.10 ms against 0.14 for an append's). A log writes PREWRITE_FIRST ahead at
# first and twice as much at each refill, up to PREWRITE_BYTES: a quiet topic's log
# holds little more than its records, a busy one refills once a megabyte.
PREWRITE_FIRST = 64 * 1024
PREWRITE_BYTES = 1 << 20


class FsyncMode(enum.StrEnum):
    """When the writer fsyncs (``storage.fsync``)."""

    ALWAYS = "always"       # before any record of a group counts as durable
    INTERVAL = "interval"   # every fsync_interval seconds; written counts as durable
    NEVER = "never"         # only at a segment roll, an explicit sync and close


class Appended(NamedTuple):
    """Where an appended record went: its position and the position after it."""

    position: int
    end: int


class _Group:
    """One group of records written and fsynced in one thread call (``always``)."""

    __slots__ = ("done", "end", "lane", "ok", "took", "written")

    def __init__(self, end: int, lane: int) -> None:
        self.end = end               # the position after its last record
        self.lane = lane             # which open file of the segment it uses
        self.written = trio.Event()  # its write took (or the call ended)
        self.done = False            # the call ended
        self.ok = False              # ... with the group written and fsynced
        self.took = 0.0


class WriterStats:
    """What the writer has done, for STATS and benchmarks."""

    def __init__(self) -> None:
        self.records = 0
        self.bytes = 0
        self.writes = 0
        self.syncs = 0
        self.sync_seconds = 0.0
        self.recent_syncs: collections.deque[float] = collections.deque(maxlen=1024)
        self.sync_times = LatencyHistogram()  # the shard shares one among its logs (STATS)
        self.rolls = 0
        self.full = 0            # times a write found the disk full


class LogWriter:
    """Appends records to the log in ``table`` and makes them durable in groups.

    Run :meth:`run` in a nursery; it returns after :meth:`close` or a failure.
    Positions continue from ``table.end`` (what recovery left). The first write
    starts a new segment when the log is empty or its last segment has another
    generation or boot id, so each segment's header tells the truth about its records.
    """

    def __init__(self, disk: Disk, table: SegmentTable, *, owner: str, generation: int,
                 boot_id: str, fsync: FsyncMode = FsyncMode.ALWAYS, fsync_interval: float = 1.0,
                 segment_bytes: int = 64 * 1024 * 1024,
                 now: Callable[[], float] = trio.current_time,
                 wall_time: Callable[[], float] | None = None,
                 snapshot: Callable[[], tuple[int, bytes]] | None = None,
                 on_progress: Callable[[], None] | None = None,
                 sync_lanes: int = SYNC_LANES) -> None:
        if segment_bytes < 4096:
            raise ValueError("segment_bytes must be at least 4096")
        if fsync is FsyncMode.INTERVAL and not fsync_interval > 0:
            raise ValueError("fsync_interval must be positive")
        self.disk = disk
        self.table = table
        self.owner = owner
        self.generation = generation
        self.boot_id = boot_id
        self.fsync = FsyncMode(fsync)
        self.fsync_interval = fsync_interval
        self.segment_bytes = segment_bytes
        self._now = now
        self._wall = wall_time or (lambda: 0.0)
        # the record each new segment starts with (type, body): the owner's whole state,
        # so that the segments before it can be dropped without losing any of it
        self.snapshot = snapshot
        # called (synchronously, in the writer task) each time the written, synced or
        # durable mark moves or the log fails: the owner releases what waited right
        # away, without a task of its own waking up for it
        self.on_progress = on_progress
        # ``always``: how many groups may be fsynced at once (1: one fsync after another)
        self.sync_lanes = max(1, sync_lanes)
        # ``always``: bytes of zeros the next refill writes ahead of the records
        self.ahead = min(PREWRITE_FIRST, PREWRITE_BYTES)
        self.stats = WriterStats()
        self.appended = table.end   # after the last record appended (queued or written)
        self.written = table.end    # after the last record write(2) took
        self.synced = table.end     # after the last record an fsync covered
        self.durable = table.end    # the durable mark (G9)
        self.failed: LogFailed | None = None
        self.unmarked = False   # an fsync failed and no marker could be left for recovery
        # where the marker goes when the log's own directory takes none (None: nowhere)
        self.spare: str | None = None
        self.full: str | None = None   # why the last write found the disk full (retried)
        self.full_retry = 0.25         # seconds between tries while the disk is full
        self.on_full: Callable[[str | None], None] = lambda reason: None  # told of changes
        self._queue: list[bytes] = []
        self._groups: collections.deque[_Group] = collections.deque()  # under way, oldest first
        self._rolls: collections.deque[int] = collections.deque()  # positions that start a segment
        self._header_size = len(self._header(0))
        last = table.last
        if last is None or self._needs_new_segment(last):
            self._fill = segment_bytes + 1           # the first append starts a segment
        else:
            self._fill = last.offset_of(last.end)
        self._sync_wanted = table.end
        self._closing = False
        self._wake = trio.Event()
        self._progress = trio.Event()
        self._failed = trio.Event()
        self._done = trio.Event()

    def _header(self, first: int) -> bytes:
        return encode_header(SegmentHeader(self.owner, self.generation, first, self.boot_id,
                                           self._wall()))

    def _needs_new_segment(self, last: OpenSegment) -> bool:
        return (last.header.generation != self.generation or last.header.boot_id != self.boot_id
                or last.header.owner != self.owner)

    # -- the caller's side ---------------------------------------------------------

    def append(self, rtype: int, body: bytes) -> Appended:
        """Queue one record; returns its position. Raises LogFailed once the log has failed,
        RuntimeError once closing, ValueError for a bad type or body (record.encode)."""
        if self.failed is not None:
            raise self.failed
        if self._closing:
            raise RuntimeError("the log writer is closing")
        data = record.encode(rtype, body)
        if self._fill + len(data) > self.segment_bytes and self._fill > self._header_size:
            self._rolls.append(self.appended)
            self._fill = self._header_size
            if self.snapshot is not None:
                self._queue_record(record.encode(*self.snapshot()))
        position = self._queue_record(data)
        if (self.fsync is not FsyncMode.ALWAYS and position == self.written
                and len(data) <= INLINE_WRITE_BYTES and not self._rolls and self.full is None):
            # everything before it is written and no roll is due: write it now, so that
            # the caller finds it durable at once (nothing is held back for it)
            self._queue.clear()   # it holds just this record
            if self._write([data]):
                self.durable = self.written
                self._progress.set()
                self._progress = trio.Event()
            elif self.failed is None:   # the disk is full: the writer task tries again
                self._queue.append(data)
        self._wake.set()   # the writer task writes what is queued, or re-arms its interval
        return Appended(position, self.appended)

    def _queue_record(self, data: bytes) -> int:
        position = self.appended
        self._fill += len(data)
        self._queue.append(data)
        self.appended = position + len(data)
        return position

    @property
    def size(self) -> int:
        """Bytes the log's records take (appended, from its first segment's start, less
        what compaction left out)."""
        return self.appended - self.table.start - self.table.saved

    async def wait_durable(self, end: int) -> int:
        """Wait until the durable mark reaches ``end`` (an :class:`Appended` end); returns the mark.

        Raises LogFailed if the log failed before the record became durable.
        """
        while self.durable < end:
            if self.failed is not None:
                raise self.failed
            await self._progress.wait()
        return self.durable

    async def wait_failed(self) -> LogFailed:
        """Wait until the log fails (it never recovers from that); returns why."""
        await self._failed.wait()
        assert self.failed is not None
        return self.failed

    async def sync(self) -> int:
        """Fsync everything appended so far, whatever the mode; returns the synced mark.

        Raises LogFailed if the log fails first.
        """
        target = self.appended
        self._sync_wanted = max(self._sync_wanted, target)
        self._wake.set()
        while self.synced < target:
            if self.failed is not None:
                raise self.failed
            await self._progress.wait()
        return self.synced

    async def close(self) -> None:
        """Write and fsync what is queued, then stop :meth:`run` and close the files.

        Raises LogFailed if that last write or fsync fails.
        """
        self._closing = True
        self._sync_wanted = max(self._sync_wanted, self.appended)
        self._wake.set()
        await self._done.wait()
        self.table.close()
        if self.failed is not None and self.synced < self.appended:
            raise self.failed

    async def drop_before(self, position: int) -> int:
        """Remove every whole segment that ends at or before ``position`` (never the one
        being written); returns the log's new start. For retention and compaction: the
        caller has copied whatever it still needs. Raises OSError if the disk fails."""
        dropped = False
        while len(self.table.segments) > 1 and self.table.segments[0].end <= position:
            segment = self.table.drop_first()
            segment.close()
            await self.disk.discard(segment.path)  # off the loop: it frees the file's blocks
            dropped = True
        if dropped:
            await self.disk.sync_dir(self.table.directory)
        return self.table.start

    # -- the writer task -----------------------------------------------------------

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """The one task that writes and syncs. Returns after close() or a failure."""
        task_status.started()
        next_sync = self._now() + self.fsync_interval if self.fsync is FsyncMode.INTERVAL else math.inf
        if self.fsync is FsyncMode.ALWAYS and self._fill <= self.segment_bytes:
            self._open_lanes(self.table.last)   # before this writer writes to it
        try:
            async with trio.open_nursery() as groups:
                while self.failed is None:
                    if self.full is not None:
                        if self._closing:
                            self._fail(f"the disk is still full at close ({self.full})", None,
                                       retryable=True)
                            break
                        await trio.sleep_until(self._now() + self.full_retry)
                        if not self._queue:   # nothing left to write: nothing is full
                            self.full = None
                            self.on_full(None)
                    elif not self._queue and (self._sync_wanted <= self.synced or self._groups):
                        # nothing to write (groups under way move the marks themselves)
                        if self._closing and not self._groups:
                            break
                        deadline = next_sync if self.synced < self.written and not self._groups \
                            else math.inf
                        if self._now() < deadline:
                            with trio.move_on_at(deadline):
                                await self._wake.wait()
                        self._wake = trio.Event()
                    if self._queue:
                        if self._overlaps():
                            await self._start_group(groups)
                        else:
                            await self._drain()
                            if self.failed is None:
                                await self._write_queued()
                    if self.failed is not None:
                        break
                    due = self.fsync is FsyncMode.INTERVAL and self._now() >= next_sync
                    if (self.fsync is FsyncMode.ALWAYS or due or self._sync_wanted > self.synced) \
                            and self.synced < self.written and not self._groups:
                        await self._sync()
                    if due:
                        next_sync = self._now() + self.fsync_interval
                await self._drain()   # (after a failure: the calls under way end first)
        finally:
            self._done.set()
            self._notify()

    # -- overlapping fsyncs (``always``) ---------------------------------------------

    def _open_lanes(self, segment: OpenSegment | None) -> None:
        """Open the segment's other files for overlapping fsyncs, before anything is
        written to it by this writer (each open file samples the write-back errors
        from its opening on). If one cannot be opened, fewer fsyncs overlap."""
        if segment is None:
            return
        while len(segment.lanes) < self.sync_lanes - 1:
            try:
                segment.lanes.append(self.disk.open(segment.path))
            except OSError:
                return

    def _overlaps(self) -> bool:
        """Whether what is queued can go as one group beside the fsyncs under way: with
        ``always``, no segment roll due and one write's worth queued."""
        if self.fsync is not FsyncMode.ALWAYS or self._rolls:
            return False
        segment = self.table.last
        if segment is None or segment.end != self.written:
            return False
        return self.appended - self.written <= WRITE_SLICE_BYTES

    def _fill_to(self, segment: OpenSegment, end: int) -> int:
        """With ``always``, the file length to write zeros up to after a write that ends at
        file offset ``end`` (0: none now): :attr:`ahead` bytes past ``end`` once half of
        what was written ahead is used, never past the segment's size; each refill
        doubles :attr:`ahead`, up to :data:`PREWRITE_BYTES`."""
        ahead = self.ahead
        if self.fsync is not FsyncMode.ALWAYS or end + ahead // 2 <= segment.allocated:
            return 0
        target = min(end + ahead, self.segment_bytes)
        if target <= max(end, segment.allocated):
            return 0
        self.ahead = min(2 * ahead, PREWRITE_BYTES)
        return target

    async def _drain(self) -> None:
        """Wait until no group is under way (each one's end wakes the writer task)."""
        while self._groups:
            self._wake = trio.Event()
            await self._wake.wait()

    async def _start_group(self, nursery: trio.Nursery) -> None:
        """Write what is queued as one group in a thread call that fsyncs it too; return
        once its write took (the fsync goes on), so the next group can follow it."""
        segment = self.table.last
        assert segment is not None
        while len(self._groups) >= 1 + len(segment.lanes):   # every open file is busy
            self._wake = trio.Event()
            await self._wake.wait()
            if self.failed is not None or not self._overlaps():
                return   # (what was appended meanwhile may need a roll: the loop sees)
        busy = {g.lane for g in self._groups}
        lane = next(i for i in range(1 + len(segment.lanes)) if i not in busy)
        chunk, self._queue = self._queue, []
        group = _Group(self.appended, lane)
        self._groups.append(group)
        nursery.start_soon(self._write_group, group, segment, chunk,
                           segment.offset_of(self.written))
        await group.written.wait()

    async def _write_group(self, group: _Group, segment: OpenSegment, chunk: list[bytes],
                           offset: int) -> None:
        file = segment.file if group.lane == 0 else segment.lanes[group.lane - 1]
        data = b"".join(chunk)
        fill = self._fill_to(segment, offset + len(data))
        started = self._now()

        def wrote() -> None:
            if not group.written.is_set():
                self._wrote(segment, chunk, data, fill)
                group.written.set()
                if self.full is not None:   # the write took: the disk has room again
                    self.full = None
                    self.on_full(None)
        try:
            await file.awrite_at(offset, data, sync=True, fill_to=fill, on_written=wrote)
        except SyncFailed as e:   # written, not synced: the log fails
            wrote()
            group.done = True   # (a later group that ends meanwhile settles it, unapplied)
            await self._sync_failed(segment, e)
        except OSError as e:
            if not self._write_failed(segment, e) and self.failed is None:
                self._queue[:0] = chunk   # the disk is full: tried again, first
        else:
            wrote()
            group.ok = True
            group.took = self._now() - started
        finally:
            group.done = True
            group.written.set()
            self._settle_groups()
            self._wake.set()

    def _settle_groups(self) -> None:
        """Apply the marks of the groups that ended, in log order: a group counts as
        synced only once every group before it has."""
        while self._groups and self._groups[0].done:
            group = self._groups.popleft()
            if group.ok and self.failed is None:
                self._synced(group.end, group.took)

    def _notify(self) -> None:
        self._progress.set()
        self._progress = trio.Event()
        if self.on_progress is not None:
            self.on_progress()

    def _fail(self, reason: str, cause: BaseException | None, retryable: bool = False) -> None:
        if not self._failed.is_set():   # (failed may be set: a marker was being made)
            self.failed = LogFailed(reason, cause=cause, retryable=retryable, written=self.written)
            self._queue.clear()
            self._rolls.clear()
            self._failed.set()
        self._notify()

    async def _write_queued(self) -> None:
        queue, self._queue = self._queue, []
        position = self.written
        start = 0      # queue[start:i] is the chunk to write next
        size = 0       # its bytes
        for i, data in enumerate(queue):
            roll = bool(self._rolls) and self._rolls[0] == position
            if start < i and (roll or size + len(data) > WRITE_SLICE_BYTES):
                if not await self._write_off_loop(queue[start:i]):
                    return self._requeue(queue[start:])
                start, size = i, 0
            if roll:
                if not await self._roll(position):
                    return self._requeue(queue[start:])
                self._rolls.popleft()
            position += len(data)
            size += len(data)
        # with ``always``, the last write is fsynced in its thread call (the group's fsync)
        if start < len(queue) and not await self._write_off_loop(
                queue[start:], sync=self.fsync is FsyncMode.ALWAYS):
            return self._requeue(queue[start:])
        if self.full is not None:
            self.full = None
            self.on_full(None)
        if self.fsync is not FsyncMode.ALWAYS:
            self.durable = self.written
        self._notify()

    def _requeue(self, unwritten: list[bytes]) -> None:
        """A write failed: if the disk was full, what was not written waits to be tried
        again (before anything appended since); otherwise the log has failed."""
        if self.failed is None:
            self._queue[:0] = unwritten
        if self.fsync is not FsyncMode.ALWAYS:
            self.durable = self.written
        self._notify()

    def _disk_full(self, reason: str) -> None:
        if self.full is None:
            self.stats.full += 1
        self.full = reason
        self.on_full(reason)

    def _write(self, chunk: list[bytes]) -> bool:
        """Write ``chunk`` at the end of the last segment, on the loop; False if it failed."""
        segment = self.table.last
        assert segment is not None
        data = b"".join(chunk)
        try:
            segment.file.write_at(segment.offset_of(self.written), data)
        except OSError as e:
            return self._write_failed(segment, e)
        return self._wrote(segment, chunk, data)

    async def _write_off_loop(self, chunk: list[bytes], sync: bool = False) -> bool:
        """:meth:`_write` for the writer task, in a worker thread (a soak's shards logged
        writes of 13 bytes to 26 KB that held the loop 3-32 ms); with ``sync``, fsynced in
        the same thread call (one round trip to a thread, not two). Meanwhile appends
        queue behind it (none is written at once: the written mark is behind them)."""
        segment = self.table.last
        assert segment is not None
        data = b"".join(chunk)
        offset = segment.offset_of(self.written)
        fill = self._fill_to(segment, offset + len(data))
        started = self._now()
        try:
            await segment.file.awrite_at(offset, data, sync=sync, fill_to=fill)
        except SyncFailed as e:   # written, not synced
            self._wrote(segment, chunk, data, fill)
            await self._sync_failed(segment, e)
            return False
        except OSError as e:
            return self._write_failed(segment, e)
        self._wrote(segment, chunk, data, fill)
        if sync:
            self._synced(self.written, self._now() - started)
        return True

    def _write_failed(self, segment: OpenSegment, e: OSError) -> bool:
        try:  # what a short write left behind would read as a torn tail: cut it now
            segment.allocated = segment.offset_of(self.written)
            segment.file.truncate(segment.allocated)
        except OSError as e2:
            self._fail(f"write to {segment.path} failed ({e}); so did cutting it back ({e2})", e)
            return False
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            self._disk_full(f"write to {segment.path} failed: {e.strerror or e}")
        else:
            self._fail(f"write to {segment.path} failed: {e}", e)
        return False

    def _wrote(self, segment: OpenSegment, chunk: list[bytes], data: bytes, fill: int = 0) -> bool:
        self.written += len(data)
        segment.end = self.written
        segment.allocated = max(segment.allocated, segment.offset_of(self.written), fill)
        self.stats.records += len(chunk)
        self.stats.bytes += len(data)
        self.stats.writes += 1
        return True

    async def _sync(self) -> bool:
        segment = self.table.last
        assert segment is not None
        target = self.written
        started = self._now()
        try:
            await segment.file.sync()
        except OSError as e:
            await self._sync_failed(segment, e)
            return False
        self._synced(target, self._now() - started)
        return True

    async def _sync_failed(self, segment: OpenSegment, e: OSError) -> None:
        # Never retried: after a failed fsync the kernel may have dropped the
        # pages it could not write, so a second fsync could "succeed" over a hole.
        self._fail(f"fsync of {segment.path} failed: {e}{await self._mark_fsync_failed()}", e)

    def _synced(self, target: int, took: float) -> None:
        self.stats.syncs += 1
        self.stats.sync_seconds += took
        self.stats.recent_syncs.append(took)
        self.stats.sync_times.observe(took)
        self.synced = target
        self.durable = max(self.durable, target)
        self._notify()

    async def _roll(self, position: int) -> bool:
        """Start a segment at ``position``; the previous one is fsynced first, so every
        segment but the last is whole on disk (recovery relies on it)."""
        previous = self.table.last
        if previous is not None and previous.end == previous.first == position:
            # An empty segment (a roll cut short, or a torn tail cut back to its header)
            # has this segment's name: rewrite it with the new header.
            self.table.drop_last().close()
            previous = self.table.last
        if previous is not None and self.synced < self.written and not await self._sync():
            return False
        path = self.table.path_for(segment_name(position))
        header = self._header(position)
        fill = min(len(header) + self.ahead, self.segment_bytes) \
            if self.fsync is FsyncMode.ALWAYS else 0
        try:
            file = self.disk.open(path, create=True)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                self._disk_full(f"starting segment {path} failed: {e.strerror or e}")
            else:
                self._fail(f"starting segment {path} failed: {e}", e)
            return False
        try:
            if file.size():   # left by a roll that did not finish
                file.truncate(0)
            await file.awrite_at(0, header, fill_to=fill)
        except OSError as e:
            file.close()
            if e.errno in (errno.ENOSPC, errno.EDQUOT):  # tried again: the roll starts over
                self._disk_full(f"starting segment {path} failed: {e.strerror or e}")
            else:
                self._fail(f"starting segment {path} failed: {e}", e)
            return False
        try:
            await file.sync()
            await self.disk.sync_dir(self.table.directory)
        except OSError as e:
            file.close()
            self._fail(f"starting segment {path} failed: {e}{await self._mark_fsync_failed()}", e)
            return False
        segment = OpenSegment(path, file, SegmentHeader(self.owner, self.generation, position,
                                                        self.boot_id), len(header), position,
                              allocated=max(len(header), fill))
        self.table.add(segment)
        self.stats.rolls += 1
        if previous is not None:   # written and synced: its other files are done
            previous.close_lanes()
        if self.fsync is FsyncMode.ALWAYS:
            self._open_lanes(segment)
        return True

    async def _mark_fsync_failed(self) -> str:
        """An fsync failed: leave the marker recovery looks for (an empty file, then its
        directory entry synced, best effort: a process restart in this boot reads it from
        the page cache anyway). Returns what to add to the failure's reason."""
        path = posixpath.join(self.table.directory, fsync_failed_name(self.synced, self.durable))
        # meanwhile appends are refused (none is written, and the durable mark stays)
        self.failed = LogFailed("an fsync failed", written=self.written)
        try:
            file = self.disk.open(path, create=True)
        except OSError as e:
            spare = await leave_marker(self.disk, self.spare, posixpath.basename(path))
            if spare is not None:
                return (f"; the log's directory took no marker ({e}): it is {spare} instead,"
                        f" and recovery in this boot cuts the log at {self.synced}")
            self.unmarked = True
            return (f"; leaving the marker {path} failed too ({e}), and in {self.spare}:"
                    f" a restart in this boot would count records past position"
                    f" {self.synced} as durable")
        try:
            await file.sync()
            await self.disk.sync_dir(self.table.directory)
        except OSError as e:
            return f"; the marker {path} is made but may not be durable ({e})"
        finally:
            file.close()
        return f"; recovery cuts the log at {self.synced} ({path})"


async def leave_marker(disk: Disk, directory: str | None, name: str) -> str | None:
    """Make the empty marker ``name`` in ``directory`` (made if missing), synced best
    effort; its path, or None if there is no directory or it takes no file."""
    if directory is None:
        return None
    path = posixpath.join(directory, name)
    try:
        disk.makedirs(directory)
        disk.open(path, create=True).close()
    except OSError:
        return None
    try:   # a restart in this boot finds it whether or not this reaches the medium
        file = disk.open(path)
        try:
            await file.sync()
        finally:
            file.close()
        await disk.sync_dir(directory)
    except OSError:
        pass
    return path
