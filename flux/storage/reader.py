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
    scan = SegmentScan(segment, position, stop)
    while True:
        records = scan.decoded()
        if records:
            yield from records
            continue
        want = scan.wanted()
        if want is None:
            return
        scan.feed(segment.file.read_at(*want))


class SegmentScan:
    """Reading one segment's records from ``position`` to ``stop`` (both record
    boundaries) a chunk at a time, the reads left to the caller: :func:`_scan_segment`
    reads on the spot; :meth:`next` in a worker thread (compaction reads whole segments
    while the loop serves, and a segment not in the page cache waits on the disk)."""

    __slots__ = ("_at", "_buf", "_loaded", "_position", "_stop", "_stop_offset", "chunk",
                 "segment")

    def __init__(self, segment: OpenSegment, position: int, stop: int,
                 chunk: int = CHUNK) -> None:
        self.segment = segment
        self.chunk = chunk
        self._buf = b""
        self._at = 0
        self._position = position
        self._stop = stop
        self._loaded = segment.offset_of(position)   # the file offset after buf's last byte
        self._stop_offset = segment.offset_of(stop)

    def decoded(self) -> list[Record]:
        """The whole records the bytes read so far hold and no call returned yet."""
        records: list[Record] = []
        if self._position < self._stop:
            self._at, self._position = record.decode_run(self._buf, self._at, self._position,
                                                         records)
        return records

    def wanted(self) -> tuple[int, int] | None:
        """(file offset, length) of the next read, after :meth:`decoded` returned nothing;
        None at ``stop``. Raises CorruptRecord where the bytes are not a record."""
        position, buf, at = self._position, self._buf, self._at
        if position >= self._stop:
            return None
        try:
            record.decode(buf, at, position)
        except record.Torn:
            pass
        except record.Bad as e:
            raise CorruptRecord(self.segment.path, position, str(e)) from None
        if self._loaded >= self._stop_offset:
            raise CorruptRecord(self.segment.path, position, "record runs past the end")
        need = self.chunk
        if len(buf) - at >= record.HEADER_SIZE:  # a record bigger than a chunk
            need = max(need, record.HEADER_SIZE + record.body_length(buf, at))
        return self._loaded, min(need, self._stop_offset - self._loaded)

    def feed(self, more: bytes) -> None:
        """The bytes a read that :meth:`wanted` asked for returned."""
        if not more:
            raise CorruptRecord(self.segment.path, self._position, "file ends inside a record")
        self._buf = self._buf[self._at:] + more
        self._at = 0
        self._loaded += len(more)

    async def next(self) -> list[Record]:
        """The next records, reading a chunk in a worker thread when it needs bytes
        (:meth:`~flux.host.DiskFile.aread_at`); an empty list at ``stop``. Raises
        CorruptRecord, and OSError if a read fails."""
        while True:
            records = self.decoded()
            if records:
                return records
            want = self.wanted()
            if want is None:
                return records
            self.feed(await self.segment.file.aread_at(*want))
