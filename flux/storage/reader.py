"""Reading records back: one record by position, or a scan from a position.

Every read verifies the record's checksum; a record that fails it is never
returned (:class:`CorruptRecord` says where). Reads go through the page cache
and reach only what the writer has written (``limit``); the caller decides how
much of that to expose (below the durable mark, DESIGN.md G9).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from flux.storage import record
from flux.storage.errors import CorruptRecord, NotInLog
from flux.storage.record import Record
from flux.storage.table import OpenSegment, SegmentTable

CHUNK = 1024 * 1024


class LogReader:
    """Reads records of the log in ``table`` below ``limit()`` (by default, all written)."""

    def __init__(self, table: SegmentTable, limit: Callable[[], int] | None = None) -> None:
        self.table = table
        self._limit = limit or (lambda: table.end)

    def read(self, position: int, size_hint: int = 0) -> Record:
        """The record at ``position`` (a position an append returned).

        ``size_hint`` (the record's body length, if known) saves a second read.
        Raises NotInLog for a position outside the log, CorruptRecord if the
        bytes there are not a whole record that passes its checksum.
        """
        if position >= self._limit():
            raise NotInLog(f"position {position} is not written yet (limit {self._limit()})")
        segment = self.table.find(position)
        offset = segment.offset_of(position)
        buf = segment.file.read_at(offset, record.HEADER_SIZE + size_hint)
        try:
            return record.decode(buf, 0, position)
        except record.Torn:
            if len(buf) < record.HEADER_SIZE:
                raise CorruptRecord(segment.path, position, "header runs past the end of the file") \
                    from None
            length = record.body_length(buf, 0)
            if length > record.MAX_BODY or position + record.HEADER_SIZE + length > segment.end:
                raise CorruptRecord(segment.path, position,
                                    f"length {length} runs past the segment's end") from None
            buf = segment.file.read_at(offset, record.HEADER_SIZE + length)
        except record.Bad as e:
            raise CorruptRecord(segment.path, position, str(e)) from None
        try:
            return record.decode(buf, 0, position)
        except (record.Torn, record.Bad) as e:
            raise CorruptRecord(segment.path, position, str(e)) from None

    def scan(self, start: int | None = None, end: int | None = None) -> Iterator[Record]:
        """Every record from ``start`` (a record's position; default the log's start) up to
        ``end`` (default ``limit()``), in order, read in large chunks.

        Raises CorruptRecord at the first record that fails its check (the records
        before it have been yielded), NotInLog if ``start`` is outside the log.
        """
        position = self.table.start if start is None else start
        stop = self._limit() if end is None else min(end, self._limit())
        if position >= stop:
            return
        segment: OpenSegment | None = self.table.find(position)
        while segment is not None and position < stop:
            yield from _scan_segment(segment, position, min(stop, segment.end))
            position = min(stop, segment.end)
            segment = self.table.after(segment)


def _scan_segment(segment: OpenSegment, position: int, stop: int) -> Iterator[Record]:
    """The records of one segment from ``position`` to ``stop`` (both record boundaries)."""
    buf = b""
    at = 0
    loaded = segment.offset_of(position)   # the file offset just after buf's last byte
    stop_offset = segment.offset_of(stop)
    records: list[Record] = []
    while position < stop:
        at, position = record.decode_run(buf, at, position, records)
        if records:
            yield from records
            records.clear()
            continue
        if position >= stop:
            break
        try:
            record.decode(buf, at, position)
        except record.Torn:
            pass
        except record.Bad as e:
            raise CorruptRecord(segment.path, position, str(e)) from None
        if loaded >= stop_offset:
            raise CorruptRecord(segment.path, position, "record runs past the end")
        need = CHUNK
        if len(buf) - at >= record.HEADER_SIZE:  # a record bigger than a chunk
            need = max(need, record.HEADER_SIZE + record.body_length(buf, at))
        more = segment.file.read_at(loaded, min(need, stop_offset - loaded))
        if not more:
            raise CorruptRecord(segment.path, position, "file ends inside a record")
        buf = buf[at:] + more
        at = 0
        loaded += len(more)
