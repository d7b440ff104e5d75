"""The ``flux`` Spark sink: publishes each row with a deterministic message id.

A row's id is its ``id`` column when it has one; otherwise it is derived from
the write (query id + batch id, or a batch job's write id), the Spark partition
and a hash of the row, so Spark's retries are deduplicated by the broker (G3).
Id rules live in :mod:`flux.spark.ids`; broker calls in :mod:`flux.spark.link`.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark import TaskContext
from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from flux.spark import ids, link
from flux.spark.options import SinkOptions

log = logging.getLogger("flux.spark")

QUERY_ID = "sql.streaming.queryId"
BATCH_ID = "streaming.sql.batchId"


@dataclass
class FluxCommitMessage(WriterCommitMessage):
    """What one write task did: rows published, and how many the broker already had."""

    partition: int
    published: int
    duplicates: int


def to_items(rows: Iterator[Row], opts: SinkOptions, scope: str) -> Iterator[link.Item]:
    """``(topic, id, payload, key, headers)`` per row. The ``topic`` option wins over a
    ``topic`` column (as in Kafka's sink); an ``id`` column wins over a derived id; a
    ``key`` column (string or binary) and a ``headers`` column (a map, or as Kafka's
    connector writes it an array of ``(key, value)`` structs) travel with the message.
    Raises ValueError for a row without a payload or topic, or with a payload that is
    neither binary nor a string."""
    row_ids = ids.RowIds(scope)
    for row in rows:
        fields: list[str] = list(getattr(row, "__fields__", []))
        values = dict(zip(fields, row, strict=True))
        payload = values.get("payload")
        if isinstance(payload, str):
            payload = payload.encode()
        elif isinstance(payload, (bytearray, memoryview)):
            payload = bytes(payload)
        if not isinstance(payload, bytes):
            raise ValueError(f"payload must be binary or a string, not {type(payload).__name__}"
                             f" (row {row!r})")
        topic = opts.topic or values.get("topic")
        if not topic:
            raise ValueError(f"row has no topic and the 'topic' option is not set: {row!r}")
        message_id = values.get("id")
        if message_id is None:
            message_id = row_ids.next_id(fields, list(row))
        yield (str(topic), str(message_id), payload, _text(values.get("key")),
               _headers(values.get("headers")))


def _text(value: Any) -> str | None:
    """A key or header value as text (binary ones as UTF-8)."""
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def _headers(value: Any) -> dict[str, str] | None:
    """A ``headers`` column as a map of str to str: a map, or (Kafka's form) pairs."""
    if not value:
        return None
    pairs = value.items() if isinstance(value, dict) else value
    out: dict[str, str] = {}
    for pair in pairs:
        name, text = (pair[0], pair[1]) if isinstance(pair, (tuple, list)) else \
            (getattr(pair, "key", None), getattr(pair, "value", None))
        if name is not None and text is not None:
            out[str(_text(name))] = str(_text(text))
    return out or None


def _write(rows: Iterator[Row], opts: SinkOptions, scope: str, partition: int
           ) -> FluxCommitMessage:
    items = to_items(rows, opts, scope)
    first = next(items, None)
    if first is None:  # an empty partition: no connection needed
        return FluxCommitMessage(partition, 0, 0)
    published, duplicates = link.call(opts.url, opts.timeout, link.publish_all,
                                      itertools.chain([first], items), opts.batch_size,
                                      credentials=opts.credentials)
    return FluxCommitMessage(partition, published, duplicates)


def _summary(messages: list[WriterCommitMessage | None]) -> tuple[int, int]:
    done = [m for m in messages if isinstance(m, FluxCommitMessage)]
    return sum(m.published for m in done), sum(m.duplicates for m in done)


class FluxStreamWriter(DataSourceStreamWriter):
    """Streaming writes; ids derive from the query id and batch id Spark gives each task."""

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        """Publish this task's rows. Raises RuntimeError outside a streaming query task,
        where no batch id would make the ids unique, and FluxError when a publish fails."""
        ctx = TaskContext.get()
        query_id = ctx.getLocalProperty(QUERY_ID) if ctx is not None else None
        batch_id = ctx.getLocalProperty(BATCH_ID) if ctx is not None else None
        if ctx is None or not query_id or batch_id is None:
            raise RuntimeError("the flux stream sink found no streaming query id or batch id in"
                               " the task's local properties; cannot derive message ids")
        partition = ctx.partitionId()
        return _write(iterator, self.opts, ids.stream_scope(query_id, batch_id, partition),
                      partition)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        published, duplicates = _summary(messages)
        log.info("flux: batch %d published %d rows (%d were duplicates)", batchId, published,
                 duplicates)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Rows already published stay (a broker has no transactions); the re-run of
        # this batch publishes the same ids, which the broker deduplicates.
        published, _ = _summary(messages)
        log.warning("flux: batch %d aborted after publishing %d rows", batchId, published)


class FluxBatchWriter(DataSourceWriter):
    """``df.write.format("flux")``: ids derive from ``writeId`` (random per write
    unless the option is set), so retried tasks are deduplicated."""

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx is not None else 0
        return _write(iterator, self.opts, ids.batch_scope(self.opts.write_id, partition),
                      partition)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        published, duplicates = _summary(messages)
        log.info("flux: write %s published %d rows (%d were duplicates)", self.opts.write_id,
                 published, duplicates)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        published, _ = _summary(messages)
        log.warning("flux: write %s aborted after publishing %d rows", self.opts.write_id,
                    published)
