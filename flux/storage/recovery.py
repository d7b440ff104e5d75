"""Recovery: read a log directory back at start, cut a torn tail, set damage aside, report.

Recovery reads every segment in order and verifies every header and record. The
log ends at the first bad spot, or where nothing but zeros is left of a segment
(space the writer wrote ahead of its records, :data:`~flux.storage.writer.PREWRITE_BYTES`:
zeros from there to the end of the file are the end, not damage; zeros with data after
them are damage like any other bad spot). In the last segment, a bad spot after which no
valid record follows is a *torn tail* (a write cut by a crash or power loss): the
file is truncated there. Anywhere else it is *corruption*: the damaged segment is
copied to ``<name>.damaged`` before being cut, later segments are renamed to
``<name>.damaged``, and the report says where; nothing is wiped. A header whose
magic or version alone is damaged is damage like any other (its checksum tells it
from a foreign file's). A directory that is not this owner's Flux log raises
:class:`ForeignLog` and is left untouched.
Compacted segments (:mod:`~flux.storage.compaction`) read like any other: their
JUMP records carry positions past what was left out; a compaction a crash cut
short left a ``.compact`` file, which is removed (the segment it was rewriting
is still whole).

A failed fsync (:mod:`~flux.storage.writer`) leaves a marker naming the synced
mark: the kernel may have marked the pages it could not write clean, so they read
back (from the page cache) though a power loss will lose them, and a later fsync
"succeeds" without writing them. Recovery never counts them: the log ends at the
synced mark; what lies past it is copied or renamed aside (kept for a person,
never wiped) and cut, durably, and only then is the marker removed. Set aside as
``<name>.unsynced`` when nothing past the mark was exposed (fsync always: nothing
there was acked), else as ``<name>.damaged``: acked records were cut, and like
other damage that calls for a new generation, also at a recovery after a crash
that came before the new generation was on disk.

Recovery fsyncs too (the last segment, which a crash may have left unsynced; a
cut). When one of its own steps fails it leaves the marker ``fsync-failed.recovery``:
the next recovery copies the last segment into a fresh file, fsyncs it and renames
it over the old one, instead of trusting an fsync of pages a failed one may have
marked clean.

Markers the log's directory could not take (a dead disk) are in its *spare*
directory (on another file system, kept for the rest of the machine's boot:
``recover(spare=...)``); recovery reads them there by the same rules and removes
them with the others once the cut is durable.
"""

from __future__ import annotations

import bisect
import dataclasses
import posixpath
import re
from collections.abc import Callable

import trio

from flux.host import Disk, DiskFile
from flux.storage import record
from flux.storage.errors import ForeignLog
from flux.storage.record import Record
from flux.storage.segment import (
    COMPACTING,
    DAMAGED,
    MAX_HEADER,
    REWRITE,
    UNSYNCED,
    Foreign,
    SegmentHeader,
    decode_header,
    generation_field,
    parse_fsync_failed,
    parse_name,
)
from flux.storage.table import OpenSegment, SegmentTable
from flux.storage.writer import leave_marker

CHUNK = 4 * 1024 * 1024   # bytes a scan reads at once (a record boundary starts each read)
RESYNC_TRIES = 1 << 20      # candidate record starts tried after a bad spot before giving up
_NONZERO = re.compile(rb"[^\x00]")


def owner_of_log(disk: Disk, directory: str) -> str | None:
    """The owner the log in ``directory`` names: in its first segment header that can
    be read (a damaged first one does not hide it). None when no segment header can."""
    try:
        names = sorted((first, name) for name in disk.listdir(directory)
                       if (first := parse_name(name)) is not None)
    except OSError:
        return None
    for _, name in names:
        try:
            f = disk.open(posixpath.join(directory, name))
            try:
                return decode_header(f.read_at(0, MAX_HEADER))[0].owner
            finally:
                f.close()
        except (OSError, record.Torn, record.Bad):
            continue
    return None


@dataclasses.dataclass(frozen=True)
class Damage:
    """Where the log stopped being readable, and what recovery did about it."""

    kind: str                       # "torn-tail" or "corrupt"
    path: str                       # the segment file
    position: int                   # log position of the first bad record (or of the segment)
    reason: str
    cut_bytes: int                  # bytes of that segment after ``position`` no longer in the log
    set_aside: tuple[str, ...] = ()  # the *.damaged files recovery left for a person


@dataclasses.dataclass
class RecoveryReport:
    """What recovery read and did (log it; the shard puts it in STATS)."""

    directory: str
    start: int = 0                  # first position the log holds
    end: int = 0                    # where appends continue
    records: int = 0
    bytes: int = 0                  # bytes of segment files read
    seconds: float = 0.0            # on the host's clock
    segments: int = 0
    generation: int | None = None   # of the last segment (None: empty log)
    boot_id: str | None = None      # of the last segment
    damage: Damage | None = None
    # generations of the segments earlier recoveries set aside as damaged: if the log's
    # is among them, a recovery found damage and stopped before a new generation began
    damaged_generations: set[int] = dataclasses.field(default_factory=set)
    removed: list[str] = dataclasses.field(default_factory=list)   # empty, half-made segments
    ignored: list[str] = dataclasses.field(default_factory=list)   # files that are not segments
    # paths of the markers of failed fsyncs found (and removed), the lowest synced mark they name
    # (where the log was cut), and whether anything past it was exposed (durable with
    # fsync interval or never: acked, so the cut lost acked records)
    fsync_failed: list[str] = dataclasses.field(default_factory=list)
    synced_mark: int | None = None
    exposed_past_mark: bool = False
    unsynced_bytes: int = 0         # bytes past the synced mark, set aside
    rewritten: bool = False         # the last segment was copied to fresh pages (REWRITE)


async def recover(disk: Disk, directory: str, *, owner: str,
                  on_record: Callable[[Record], None] | None = None,
                  now: Callable[[], float] = trio.current_time,
                  boot_id: str | None = None,
                  spare: str | None = None) -> tuple[SegmentTable, RecoveryReport]:
    """Recover the log in ``directory`` (made if missing), calling ``on_record`` for each
    good record in order. Returns the open segments (hand them to a LogWriter) and the report.
    ``spare``: the directory of the markers the log's directory could not take (the
    writer's :attr:`~flux.storage.writer.LogWriter.spare`), read like its own.

    ``boot_id``: the machine's current boot. A last segment written in this same boot
    cannot have a torn tail (a process crash leaves every written byte in the page
    cache), so any bad spot in it is corruption, never cut silently as a torn tail.

    Raises ForeignLog if the directory holds another owner's log or an unreadable
    format, and OSError if the disk fails while recovering (then, best effort, it
    leaves the marker that makes the next recovery rewrite the last segment).
    """
    try:
        return await _recover(disk, directory, owner, on_record, now, boot_id, spare)
    except OSError:
        try:
            file = disk.open(posixpath.join(directory, REWRITE), create=True)
        except OSError:   # the directory takes no file: the spare one, if any, does
            await leave_marker(disk, spare, REWRITE)
            raise
        try:
            await file.sync()
            await disk.sync_dir(directory)
        except OSError:
            pass   # made: a restart in this boot sees it in the page cache
        finally:
            file.close()
        raise


async def _recover(disk: Disk, directory: str, owner: str,
                   on_record: Callable[[Record], None] | None, now: Callable[[], float],
                   boot_id: str | None, spare: str | None) -> tuple[SegmentTable, RecoveryReport]:
    started = now()
    disk.makedirs(directory)
    report = RecoveryReport(directory)
    names: list[tuple[int, str]] = []
    if spare is not None and disk.exists(spare):
        for name in disk.listdir(spare):
            _note_marker(report, spare, name)
    for name in disk.listdir(directory):
        if _note_marker(report, directory, name):
            continue
        first = parse_name(name)
        if first is not None:
            names.append((first, name))
        elif name.endswith(COMPACTING):  # a compaction a crash cut short: the old one stands
            disk.remove(posixpath.join(directory, name))
            report.removed.append(name)
        elif DAMAGED in name:
            generation = _generation_of(disk, posixpath.join(directory, name))
            if generation is not None:
                report.damaged_generations.add(generation)
        elif UNSYNCED not in name:
            report.ignored.append(name)
    names.sort()
    mark = report.synced_mark
    table = SegmentTable(directory, start=names[0][0] if names else 0)
    if names:
        disk.read_ahead(table.path_for(names[0][1]))
    scratch = bytearray(CHUNK)   # every segment's records are read through it
    for i, (first, name) in enumerate(names):
        path = table.path_for(name)
        if mark is not None and first >= mark:   # its header may be lost too
            await _set_unsynced(disk, table, names[i:], report)
            break
        last = i == len(names) - 1
        if not last:   # the disk reads the next segment while this one is checked
            disk.read_ahead(table.path_for(names[i + 1][1]))
        file = disk.open(path)
        size = file.size()
        report.bytes += size
        expected = table.end if table.segments else first
        try:
            header, header_size = decode_header(file.read_at(0, MAX_HEADER))
        except Foreign as e:
            file.close()
            if not table.segments:
                raise ForeignLog(path, str(e)) from None
            await _set_aside(disk, table, names[i:], report,
                             Damage("corrupt", path, expected, f"segment header: {e}", size))
            break
        except record.Torn as e:
            file.close()
            if last:   # a segment whose header never reached the disk: it held nothing
                disk.remove(path)
                await disk.sync_dir(directory)
                report.removed.append(name)
                break
            await _set_aside(disk, table, names[i:], report,
                             Damage("corrupt", path, expected, f"segment header: {e}", size))
            break
        except record.Bad as e:
            file.close()
            await _set_aside(disk, table, names[i:], report,
                             Damage("corrupt", path, expected, f"segment header: {e}", size))
            break
        if header.owner != owner:
            file.close()
            raise ForeignLog(path, f"the log of {header.owner!r}, not of {owner!r}")
        if header.first_position != first or header.first_position != expected:
            file.close()
            await _set_aside(disk, table, names[i:], report, Damage(
                "corrupt", path, expected,
                f"segment starts at position {header.first_position}, the log ends at {expected}",
                size))
            break
        segment = OpenSegment(path, file, header, header_size, first, allocated=size)
        table.add(segment)
        bad = await _scan(segment, size, on_record, report, mark, scratch)
        if mark is not None and (segment.end > mark or (bad is not None and bad[0] >= mark)):
            # past the synced mark, whatever it holds (records or a bad spot): cut
            await _cut_unsynced(disk, table, segment, mark, names[i + 1:], report)
            break
        if bad is not None:
            position, reason = bad
            cut = size - segment.offset_of(position)
            tail = file.read_at(segment.offset_of(position), cut)
            same_boot = boot_id is not None and header.boot_id == boot_id
            if last and not same_boot and not _record_follows(tail):
                await _cut_torn_tail(file, segment.offset_of(position))
                report.damage = Damage("torn-tail", path, position, reason, cut)
            else:
                await _cut_corrupt(disk, table, segment, position, names[i + 1:], report,
                                   Damage("corrupt", path, position, reason, cut))
            break
    if table.last is not None:
        # a process crash leaves written records in the page cache, unsynced: they were
        # read back above, and the writer counts everything recovered as synced (with
        # fsync always, durable). Make it so before anyone hears of them (a duplicate's
        # ack, a FETCH); every segment but the last was synced when the next began. So
        # must its directory entry be: a crash in a roll, after the new segment's header
        # was synced and before its directory was, leaves a segment that a power loss
        # would take away with everything written to it after this recovery
        if report.rewritten:
            await _rewrite_last(disk, table)
        else:
            await table.last.file.sync()
        await disk.sync_dir(directory)
        table.last.allocated = table.last.file.size()   # (after any cut: what the writer finds)
    if report.fsync_failed:   # the cut is durable: the markers have done their work
        for path in report.fsync_failed:
            disk.remove(path)
        for parent in sorted({posixpath.dirname(p) for p in report.fsync_failed}):
            await disk.sync_dir(parent)
    report.segments = len(table.segments)
    report.start = table.start
    report.end = table.end
    if table.last is not None:
        report.generation = table.last.header.generation
        report.boot_id = table.last.header.boot_id
    report.seconds = now() - started
    return table, report


def _note_marker(report: RecoveryReport, directory: str, name: str) -> bool:
    """Whether ``name`` in ``directory`` is the marker of a failed fsync (noted in
    ``report``: where the log ends, whether the last segment is copied afresh)."""
    if name == REWRITE:
        report.rewritten = True
    elif (marks := parse_fsync_failed(name)) is not None:
        report.synced_mark = min(marks[0], report.synced_mark if report.synced_mark
                                 is not None else marks[0])
        report.exposed_past_mark = report.exposed_past_mark or marks[1] > marks[0]
    else:
        return False
    report.fsync_failed.append(posixpath.join(directory, name))
    return True


def _generation_of(disk: Disk, path: str) -> int | None:
    """The generation in the header of a segment set aside (None: unreadable). A header
    set aside as damaged is read unchecked: its generation field is most likely whole,
    and a wrong one matches no generation the log has."""
    try:
        file = disk.open(path)
    except OSError:
        return None
    try:
        buf = file.read_at(0, MAX_HEADER)
    except OSError:
        return None
    finally:
        file.close()
    try:
        return decode_header(buf)[0].generation
    except (record.Torn, record.Bad):
        return generation_field(buf)


async def _scan(segment: OpenSegment, size: int, on_record: Callable[[Record], None] | None,
                report: RecoveryReport, mark: int | None = None,
                scratch: bytearray | None = None) -> tuple[int, str] | None:
    """Read every record of ``segment``; returns (position, reason) of the first bad one.
    Records from ``mark`` on (a failed fsync's synced mark) are read, not passed on.
    Reads go into ``scratch`` (a larger buffer for a record that does not fit).
    Yields to the event loop after each chunk, so a long recovery does not stop the
    caller's other tasks (a shard's heartbeats to the router, its Busy answers)."""
    file = segment.file
    offset = segment.header_size     # the file offset of buf[0]
    position = segment.first         # the log position of buf[0]
    records: list[Record] = []
    jumps: list[tuple[int, int]] = []
    need = CHUNK
    if scratch is None:
        scratch = bytearray(CHUNK)
    while offset < size:
        # each read starts at a record boundary: a record cut by the last read is read
        # again whole (no copying of what was read into a growing buffer)
        want = min(need, size - offset)
        if want > len(scratch):
            scratch = bytearray(want)
        got = file.read_into(offset, memoryview(scratch)[:want])
        buf = memoryview(scratch)[:got]
        if got < want:   # the file is shorter than it was: it ends where the read did
            size = offset + got
        at, position = record.decode_run(buf, 0, position, records, jumps)
        segment.end = position
        if jumps:   # a compacted segment: note where its positions continue
            for target, after in jumps:
                segment.add_jump(target, offset + after)
            jumps.clear()
        if records and mark is not None and records[-1].position >= mark:
            del records[bisect.bisect_left(records, mark, key=lambda r: r.position):]
        if records:
            report.records += len(records)
            if on_record is not None:
                for rec in records:
                    on_record(rec)
            records.clear()
        offset += at
        await trio.lowlevel.checkpoint()
        if at == len(buf):
            need = CHUNK
            continue
        if _zeros_to_end(file, buf[at:], offset):   # space written ahead: the end
            return None
        if offset + len(buf) - at >= size:   # what is left of the file is not a record
            return position, _what_is_wrong(buf, at)
        try:
            record.decode(buf, at, position)
        except record.Torn:
            pass                         # the next read, from its start, completes it
        except record.Bad as e:
            return position, str(e)
        need = max(CHUNK, record.HEADER_SIZE)
        if len(buf) - at >= record.HEADER_SIZE:   # a record bigger than a chunk
            need = max(need, record.HEADER_SIZE + record.body_length(buf, at))
    return None


def _zeros_to_end(file: DiskFile, rest: memoryview, offset: int) -> bool:
    """Whether the file holds nothing but zeros from ``offset`` (where ``rest``, read
    already, starts) to its end: space the writer wrote ahead of its records, never
    damage (a record's type is never 0, and anything else there is not all zeros)."""
    return not _NONZERO.search(rest) and _bytes_before_zeros(file, offset + len(rest)) == 0


def _bytes_before_zeros(file: DiskFile, start: int) -> int:
    """Bytes of the file from ``start`` to where nothing but zeros is left (zeros written
    ahead of the records are not data: what recovery reports as set aside)."""
    size = file.size()
    end = at = start
    while at < size:
        chunk = file.read_at(at, min(CHUNK, size - at))
        if not chunk:
            break
        if kept := len(chunk.rstrip(b"\0")):
            end = at + kept
        at += len(chunk)
    return end - start


async def _cut_torn_tail(file: DiskFile, offset: int) -> None:
    """Cut a torn tail off the last segment, durably, so appends follow the last record."""
    file.truncate(offset)
    await file.sync()


def _what_is_wrong(buf: bytes | memoryview, at: int) -> str:
    try:
        record.decode(buf, at, 0)
    except (record.Torn, record.Bad) as e:
        return str(e)
    return "unreadable record"


def _record_follows(tail: bytes) -> bool:
    """Whether a valid record starts anywhere after the bad spot at ``tail[0]`` (then the
    damage is not a torn tail). Gives up (True: call it corruption) after RESYNC_TRIES."""
    try:   # a body or checksum flip: the length still leads to the next record
        length = record.body_length(tail, 0)
        record.decode(tail, record.HEADER_SIZE + length, 0)
        return True
    except (record.Torn, record.Bad):
        pass
    tries = 0
    j = 1
    while j + record.HEADER_SIZE <= len(tail):
        found = _NONZERO.search(tail, j + 8)   # a record's type byte (offset 8) is never 0
        if found is None:
            return False
        j = found.start() - 8
        try:
            record.decode(tail, j, 0)
            return True
        except (record.Torn, record.Bad):
            pass
        tries += 1
        if tries >= RESYNC_TRIES:
            return True
        j += 1
    return False


def _aside_name(disk: Disk, path: str, suffix: str = DAMAGED) -> str:
    name = path + suffix
    n = 1
    while disk.exists(name):
        name = f"{path}{suffix}.{n}"
        n += 1
    return name


async def _cut_corrupt(disk: Disk, table: SegmentTable, segment: OpenSegment, position: int,
                       later: list[tuple[int, str]], report: RecoveryReport, damage: Damage) -> None:
    """Copy the damaged segment aside, cut it at ``position``, set later segments aside."""
    copy_path = await _copy_aside_and_cut(disk, table, segment, position, DAMAGED)
    await _set_aside(disk, table, later, report, damage, (copy_path,))


async def _cut_unsynced(disk: Disk, table: SegmentTable, segment: OpenSegment, mark: int,
                        later: list[tuple[int, str]], report: RecoveryReport) -> None:
    """Copy ``segment`` aside, cut it at the synced mark, set later segments aside."""
    report.unsynced_bytes += _bytes_before_zeros(segment.file, segment.offset_of(mark))
    await _copy_aside_and_cut(disk, table, segment, mark,
                              _unsynced_suffix(report, segment.header))
    await _set_unsynced(disk, table, later, report)


async def _copy_aside_and_cut(disk: Disk, table: SegmentTable, segment: OpenSegment,
                              position: int, suffix: str) -> str:
    """Copy ``segment`` whole to ``<name><suffix>`` (synced), then cut it at ``position``,
    durably; returns the copy's path."""
    copy_path = _aside_name(disk, segment.path, suffix)
    copy = disk.open(copy_path, create=True)
    try:
        await _copy(segment.file, copy)
    finally:
        copy.close()
    await disk.sync_dir(table.directory)
    segment.file.truncate(segment.offset_of(position))
    await segment.file.sync()
    segment.end = position
    return copy_path


async def _set_unsynced(disk: Disk, table: SegmentTable, names: list[tuple[int, str]],
                        report: RecoveryReport) -> None:
    """Rename the segments ``names`` (wholly past the synced mark) aside."""
    for _, name in names:
        path = table.path_for(name)
        file = disk.open(path)
        try:
            report.unsynced_bytes += _bytes_before_zeros(file, 0)
            header: SegmentHeader | None = decode_header(file.read_at(0, MAX_HEADER))[0]
        except (record.Torn, record.Bad):
            header = None
        finally:
            file.close()
        disk.rename(path, _aside_name(disk, path, _unsynced_suffix(report, header)))
    if names:
        await disk.sync_dir(table.directory)


def _unsynced_suffix(report: RecoveryReport, header: SegmentHeader | None) -> str:
    """``.damaged`` if records past the mark were exposed (then the generation of what is
    set aside calls for a new one, as damage's does), else ``.unsynced``."""
    if not report.exposed_past_mark:
        return UNSYNCED
    if header is not None:
        report.damaged_generations.add(header.generation)
    return DAMAGED


async def _rewrite_last(disk: Disk, table: SegmentTable) -> None:
    """Copy the last segment into a fresh file, synced, renamed over it: an fsync of its
    own pages proves nothing after one failed, a copy's pages are new."""
    old = table.last
    assert old is not None
    temp = old.path + COMPACTING   # removed by the next recovery if a crash cuts this short
    file = disk.open(temp, create=True)
    try:
        await _copy(old.file, file)
        disk.rename(temp, old.path)
        await disk.sync_dir(table.directory)
    except BaseException:
        file.close()
        raise
    table.replace(old, dataclasses.replace(old, file=file))
    old.file.close()


async def _copy(src: DiskFile, dst: DiskFile) -> None:
    dst.truncate(0)
    offset = 0
    while chunk := src.read_at(offset, CHUNK):
        dst.append(chunk)
        offset += len(chunk)
    await dst.sync()


async def _set_aside(disk: Disk, table: SegmentTable, names: list[tuple[int, str]],
                     report: RecoveryReport, damage: Damage, already: tuple[str, ...] = ()) -> None:
    """Rename the segments ``names`` to *.damaged (a later segment never continues a cut log)."""
    aside = list(already)
    for _, name in names:
        path = table.path_for(name)
        target = _aside_name(disk, path)
        disk.rename(path, target)
        aside.append(target)
    if names:
        await disk.sync_dir(table.directory)
    report.damage = dataclasses.replace(damage, set_aside=tuple(aside))
