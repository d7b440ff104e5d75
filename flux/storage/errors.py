"""Errors of the storage engine: damage found on disk, and a log that can no longer write.

These stay inside the broker: the shard maps them to the typed errors clients see
(``StorageUnavailable``, a new generation) when it wires disk topics in.
"""

from __future__ import annotations


class StorageError(Exception):
    """Base of every storage engine error."""


class CorruptRecord(StorageError):
    """A record (or segment header) failed its checks; it is never returned.

    ``path`` and ``position`` say where (``position`` is the log position of the
    record, or the segment's first position for a bad header); ``reason`` says what.
    """

    def __init__(self, path: str, position: int, reason: str) -> None:
        super().__init__(f"{path}: bad record at log position {position}: {reason}")
        self.path = path
        self.position = position
        self.reason = reason


class ForeignLog(StorageError):
    """A log directory holds what this Flux must not touch: not a Flux log, another
    owner's, or another format version. Nothing in it is changed."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}; move it away or point storage.dir elsewhere "
                         "(Flux never wipes data it did not write)")
        self.path = path
        self.reason = reason


class LogFailed(StorageError):
    """The log stopped writing: a write or fsync failed.

    After a failed fsync the page cache may have dropped what it could not write,
    so the fsync is never retried: every pending append fails with this error and
    the owner must run recovery before writing again (DESIGN.md G9). ``retryable``
    is true when the cause was a full disk (``ENOSPC``) and nothing on disk is in
    doubt: the owner may open a new writer at :attr:`written` once space is free.
    """

    def __init__(self, reason: str, *, cause: BaseException | None = None,
                 retryable: bool = False, written: int = 0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.cause = cause
        self.retryable = retryable
        self.written = written


class NotInLog(StorageError):
    """A read asked for a position the log does not hold (before its start, or not yet written)."""
