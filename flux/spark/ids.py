"""Deterministic message ids for rows a Spark job writes, and the rows' content hash.

Pure, no pyspark: an id is ``<scope>:<row hash>:<occurrence>``, where the scope
names the write (query id + batch id, or a batch job's write id) and the Spark
partition, so a retried task or re-run batch produces the same ids and G3
deduplicates them. Nothing here talks to the broker.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Sequence
from typing import Any

import msgpack
import xxhash

from flux import protocol


def canonical(value: Any) -> Any:
    """``value`` as plain MessagePack-able data that is equal whenever the value is."""
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    fields = getattr(value, "__fields__", None)
    if isinstance(value, tuple) and fields is not None:  # a pyspark Row
        return ["row", list(fields), [canonical(v) for v in value]]
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if isinstance(value, dict):
        items = [(_pack(canonical(k)), canonical(v)) for k, v in value.items()]
        return ["map", [[k, v] for k, v in sorted(items, key=lambda kv: kv[0])]]
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return ["time", value.isoformat()]
    if isinstance(value, datetime.timedelta):
        return ["delta", value.days, value.seconds, value.microseconds]
    if isinstance(value, decimal.Decimal):
        return ["decimal", str(value)]
    return [type(value).__name__, str(value)]


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]


def row_hash(fields: Sequence[str], values: Sequence[Any]) -> str:
    """A stable 64-bit hash (16 hex digits) of a row's column names and values."""
    data = _pack([list(fields), [canonical(v) for v in values]])
    return xxhash.xxh3_64_hexdigest(data)


class RowIds:
    """Ids for the rows of one Spark partition of one write, in the order they come.

    Identical rows get ``...:1``, ``...:2``, … in the order seen, so a re-run that
    sees the same rows (in any order) makes the same set of ids.
    """

    def __init__(self, scope: str) -> None:
        self.scope = scope
        self._seen: dict[str, int] = {}

    def next_id(self, fields: Sequence[str], values: Sequence[Any]) -> str:
        digest = row_hash(fields, values)
        n = self._seen.get(digest, 0) + 1
        self._seen[digest] = n
        message_id = f"{self.scope}:{digest}:{n}"
        if len(message_id.encode()) > protocol.MAX_ID_BYTES:  # an unusually long scope
            message_id = xxhash.xxh3_128_hexdigest(message_id.encode())
        return message_id


def stream_scope(query_id: str, batch_id: str | int, partition: int) -> str:
    """The id scope of a streaming write: stable across retries and restarts of the query."""
    return f"{query_id}:{batch_id}:{partition}"


def batch_scope(write_id: str, partition: int) -> str:
    """The id scope of a batch write: stable across retries of its tasks."""
    return f"{write_id}:{partition}"
