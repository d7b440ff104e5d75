"""Compaction: rewrite a sealed segment with only the records its owner still needs.

The owner judges each record (:data:`Verdict`): ``True`` keeps it where it is (its
position stays, so whatever refers to it by position still finds it), a
``(type, body)`` keeps a record no bigger in its stead (nothing refers to it by
position), ``False`` leaves it out. Between kept records, JUMP records carry the
positions on, so every record kept in place keeps its position and the segment
its end (:mod:`flux.storage.table`).

The new segment is written beside the old one (``<name>.compact``), fsynced,
renamed over it, and its directory fsynced: a crash leaves the old segment or
the new one, each whole, and recovery removes a leftover ``.compact`` file. The
work is done in slices of about ``slice_bytes`` of the old segment, each read in a
worker thread (:meth:`~flux.host.DiskFile.aread_at`) and followed by the caller's
``pace`` (a budget of bytes a second: the caller's event loop goes on serving
meanwhile); the new segment is written a megabyte at a time, each synced, and it and
its leftovers are written, synced and removed in worker threads
(:meth:`~flux.host.DiskFile.aappend`), never on the loop. A rewrite that would not
save ``min_saving`` stops as soon as that is plain. Never call it on the segment
being written, nor while anything else changes the same table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable

import trio

from flux.host import Disk, DiskFile
from flux.storage import record
from flux.storage.errors import CorruptRecord
from flux.storage.reader import SegmentScan
from flux.storage.record import Record
from flux.storage.segment import COMPACTING
from flux.storage.table import OpenSegment, SegmentTable

# keep in place (True), leave out (False), or keep a (type, body) record in its stead
Verdict = bool | tuple[int, bytes]

SLICE_BYTES = 256 * 1024   # bytes of the old segment judged between two pauses
WRITE_BYTES = 1 << 20      # bytes of the new segment gathered for one write


async def _checkpoint(read: int) -> None:
    await trio.lowlevel.checkpoint()


@dataclasses.dataclass(frozen=True)
class Compacted:
    """What one compaction did."""

    path: str
    records: int          # records read
    kept: int             # records kept in place
    replaced: int         # records kept as a smaller record
    before: int           # bytes of the segment file before
    after: int            # ... and after (``before`` if it was not worth rewriting)

    @property
    def rewritten(self) -> bool:
        return self.after < self.before


async def compact_segment(disk: Disk, table: SegmentTable, segment: OpenSegment,
                          judge: Callable[[Record], Verdict], *, min_saving: float = 0.25,
                          slice_bytes: int = SLICE_BYTES,
                          pace: Callable[[int], Awaitable[None]] = _checkpoint) -> Compacted:
    """Rewrite ``segment`` of ``table`` keeping what ``judge`` says; the table then holds
    the new segment. Not rewritten (the result says so) unless it saves at least
    ``min_saving`` of the file. After each slice of about ``slice_bytes`` read, awaits
    ``pace(bytes read)`` (at least a checkpoint). Raises OSError (the old segment stays,
    untouched) and CorruptRecord (a record that fails its check: the caller stops
    compacting)."""
    assert segment is not table.last, "the segment being written is never compacted"
    before = segment.offset_of(segment.end)
    after_last = segment.file.size() - before
    if after_last < 0 or (after_last and (await segment.file.aread_at(before, after_last)).strip(b"\0")):
        # a sealed segment ends at its last record, or in zeros written ahead of it
        raise CorruptRecord(segment.path, segment.end, f"{after_last} bytes that are not"
                            " zeros after the last record of a sealed segment")
    temp = segment.path + COMPACTING
    if disk.exists(temp):
        await disk.discard(temp)
    out = disk.open(temp, create=True)
    done = False
    limit = before * (1 - min_saving)   # the most the new segment may take
    try:
        new = OpenSegment(segment.path, out, segment.header, segment.header_size, segment.end)
        pending = [await segment.file.aread_at(0, segment.header_size)]
        size = segment.header_size      # the new file's size, pending included
        gathered = size                 # bytes in pending
        position = segment.first        # where the next record written sits in the log
        records = kept = replaced = 0
        sliced = segment.first          # where the slice under way began
        # read in worker threads a slice at a time (after a restart the old segment is
        # not in the page cache: each read waits on the disk)
        scan = SegmentScan(segment, segment.first, segment.end, chunk=slice_bytes)
        while batch := await scan.next():
            for rec in batch:
                records += 1
                verdict = judge(rec)
                data = b""
                if verdict is not True and verdict is not False:
                    data = record.encode(*verdict)
                    if len(data) >= rec.end - rec.position:
                        verdict = True      # not smaller: keep the original in place
                if verdict is True:
                    if position != rec.position:
                        jump = record.encode_jump(rec.position)
                        pending.append(jump)
                        size += len(jump)
                        gathered += len(jump)
                        new.add_jump(rec.position, size)
                    data = record.encode(rec.type, rec.body)
                    position = rec.end
                    kept += 1
                elif data:
                    position += len(data)
                    replaced += 1
                pending.append(data)
                size += len(data)
                gathered += len(data)
                if size > limit:   # not worth it: stop reading at once
                    return Compacted(segment.path, records, kept, replaced, before, before)
                if rec.end - sliced >= slice_bytes:
                    if gathered >= WRITE_BYTES:
                        await out.aappend(b"".join(pending))
                        # synced as it goes: a live log's fsync (which on ext4 may have to
                        # write every file's dirty pages) never waits behind megabytes of ours
                        await out.sync()
                        pending.clear()
                        gathered = 0
                    await pace(rec.end - sliced)
                    sliced = rec.end
        if position != segment.end:
            jump = record.encode_jump(segment.end)
            pending.append(jump)
            size += len(jump)
            new.add_jump(segment.end, size)
        result = Compacted(segment.path, records, kept, replaced, before, before)
        if size > limit:
            return result
        await out.aappend(b"".join(pending))
        await out.sync()
        disk.rename(temp, segment.path)
        done = True
        table.replace(segment, new)
        await segment.file.aclose()  # the old file's last descriptor: frees its blocks
        await disk.sync_dir(table.directory)
        return dataclasses.replace(result, after=size)
    finally:
        if not done:
            await _discard(disk, out, temp)


async def _discard(disk: Disk, out: DiskFile, temp: str) -> None:
    """Remove an unfinished rewrite (off the loop: it may be tens of MB), even when the
    caller is cancelled; recovery removes what a failure here leaves."""
    out.close()
    with trio.CancelScope(shield=True):
        try:
            if disk.exists(temp):
                await disk.discard(temp)
        except OSError:
            pass
