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
work is done in slices (a checkpoint every ``slice_records`` records) so that
the caller's event loop goes on serving. Never call it on the segment being
written, nor while anything else changes the same table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import trio

from flux.host import Disk
from flux.storage import record
from flux.storage.errors import CorruptRecord
from flux.storage.reader import _scan_segment
from flux.storage.record import Record
from flux.storage.segment import COMPACTING
from flux.storage.table import OpenSegment, SegmentTable

# keep in place (True), leave out (False), or keep a (type, body) record in its stead
Verdict = bool | tuple[int, bytes]


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
                          slice_records: int = 512) -> Compacted:
    """Rewrite ``segment`` of ``table`` keeping what ``judge`` says; the table then holds
    the new segment. Not rewritten (the result says so) unless it saves at least
    ``min_saving`` of the file. Raises OSError (the old segment stays, untouched) and
    CorruptRecord (a record that fails its check: the caller stops compacting)."""
    assert segment is not table.last, "the segment being written is never compacted"
    before = segment.offset_of(segment.end)
    if segment.file.size() != before:  # a sealed segment ends at its last record
        raise CorruptRecord(segment.path, segment.end, f"{segment.file.size() - before} bytes"
                            " after the last record of a sealed segment")
    temp = segment.path + COMPACTING
    if disk.exists(temp):
        disk.remove(temp)
    out = disk.open(temp, create=True)
    done = False
    try:
        new = OpenSegment(segment.path, out, segment.header, segment.header_size, segment.end)
        pending = [segment.file.read_at(0, segment.header_size)]
        size = segment.header_size      # the new file's size, pending included
        position = segment.first        # where the next record written sits in the log
        records = kept = replaced = 0
        for rec in _scan_segment(segment, segment.first, segment.end):
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
                    new.add_jump(rec.position, size)
                data = record.encode(rec.type, rec.body)
                position = rec.end
                kept += 1
            elif data:
                position += len(data)
                replaced += 1
            pending.append(data)
            size += len(data)
            if records % slice_records == 0:
                out.append(b"".join(pending))
                pending.clear()
                await trio.lowlevel.checkpoint()
        if position != segment.end:
            jump = record.encode_jump(segment.end)
            pending.append(jump)
            size += len(jump)
            new.add_jump(segment.end, size)
        result = Compacted(segment.path, records, kept, replaced, before, before)
        if size > before * (1 - min_saving):
            return result
        out.append(b"".join(pending))
        await out.sync()
        disk.rename(temp, segment.path)
        done = True
        table.replace(segment, new)
        await segment.file.aclose()  # the old file's last descriptor: frees its blocks
        await disk.sync_dir(table.directory)
        return dataclasses.replace(result, after=size)
    finally:
        if not done:
            out.close()
            if disk.exists(temp):
                disk.remove(temp)
