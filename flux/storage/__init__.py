"""The storage engine of disk topics (DESIGN.md G9): an append-only log of checksummed records.

Layering, bottom up: :mod:`~flux.storage.record` (the record format),
:mod:`~flux.storage.segment` (segment names and headers), :mod:`~flux.storage.table`
(a log's open segments), :mod:`~flux.storage.writer` (group commit),
:mod:`~flux.storage.reader` (verified reads), :mod:`~flux.storage.recovery`
(start-up scan, torn tails, damage). Files are reached only through the host's
:class:`flux.host.Disk` seam. A record body is opaque bytes; its type is a small
int chosen by the caller. How an owner uses it::

    table, report = await recover(disk, directory, owner=topic, on_record=replay)
    writer = LogWriter(disk, table, owner=topic, generation=gen, boot_id=disk.boot_id())
    nursery.start_soon(writer.run)
    where = writer.append(RECORD_TYPE, body)    # position, end
    await writer.wait_durable(where.end)          # then ack
    LogReader(table, limit=lambda: writer.durable).read(where.position)
"""

from flux.storage.errors import CorruptRecord, ForeignLog, LogFailed, NotInLog, StorageError
from flux.storage.reader import LogReader
from flux.storage.record import Record
from flux.storage.recovery import Damage, RecoveryReport, recover
from flux.storage.writer import Appended, FsyncMode, LogWriter

__all__ = [
    "Appended",
    "CorruptRecord",
    "Damage",
    "ForeignLog",
    "FsyncMode",
    "LogFailed",
    "LogReader",
    "LogWriter",
    "NotInLog",
    "Record",
    "RecoveryReport",
    "StorageError",
    "recover",
]
