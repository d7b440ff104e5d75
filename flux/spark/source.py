"""The ``flux`` Spark source: a replayable stream reader and a batch reader.

Both read through the pull path (FETCH ranges of offsets pinned to a generation),
so a re-run batch returns the same rows. The stream reader keeps one named pull
subscription per topic and COMMITs its cursor only when Spark commits a batch,
which is what lets cleanup (G5) free those messages. Offset arithmetic lives in
:mod:`flux.spark.offsets`; broker calls in :mod:`flux.spark.link`.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from flux.spark import link, offsets
from flux.spark.options import SourceOptions

log = logging.getLogger("flux.spark")

SCHEMA = ("topic string, offset long, generation string, id string, payload binary,"
          " timestamp timestamp, key string, headers map<string,string>")


class FluxPartition(InputPartition):
    """One Spark task's share of a batch: offsets ``start``..``end - 1`` of one topic
    generation. Plain data, so it pickles. ``subscription`` (streaming only) is
    named in each FETCH so that a long batch keeps its subscription active."""

    def __init__(self, rng: offsets.Range, opts: SourceOptions, subscription: str | None
                 ) -> None:
        super().__init__(None)
        self.topic = rng.topic
        self.generation = rng.generation
        self.start = rng.start
        self.end = rng.end
        self.url = opts.url
        self.subscription = subscription
        self.fail_on_data_loss = opts.fail_on_data_loss
        self.timeout = opts.timeout
        self.credentials = opts.credentials

    def __repr__(self) -> str:
        return (f"FluxPartition({self.topic!r}, generation={self.generation:#x},"
                f" {self.start}..{self.end})")


def read_partition(partition: FluxPartition) -> Iterator[tuple[Any, ...]]:
    """Rows of exactly the partition's range (fewer only if data was lost and
    ``failOnDataLoss`` is false). Raises :class:`~flux.spark.offsets.DataLoss`."""
    rng = offsets.Range(partition.topic, partition.generation, partition.start, partition.end)
    messages = link.call(partition.url, partition.timeout, link.fetch_range, rng,
                         partition.subscription, partition.fail_on_data_loss, _warn,
                         credentials=partition.credentials)
    generation = f"{partition.generation:#x}"
    utc = datetime.UTC
    for offset, message_id, payload, timestamp, key, headers in messages:
        yield (partition.topic, offset, generation, message_id, payload,
               datetime.datetime.fromtimestamp(timestamp, utc), key, headers)


def _warn(message: str) -> None:
    log.warning("flux: %s", message)


class FluxStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Streaming reads of ``topics``; a Spark offset is a generation and next offset per topic.

    Runs in one long-lived Python process per query (offsets, partitions,
    commit); :meth:`read` runs in executors.
    """

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.topics = opts.topics
        self.target: offsets.Offsets | None = None

    def initialOffset(self) -> dict[str, Any]:
        """Where a new query starts: ``startingOffsets``, after creating (or
        resuming) the pull subscription of every topic."""
        opts = self.opts
        starts = offsets.parse_starting(opts.starting_offsets, self.topics, offsets.LATEST)
        first = self._call(link.open_subscriptions, self.topics, opts.subscription, starts)
        return offsets.encode(first, self.topics)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_messages_per_trigger is not None:
            return ReadMaxRows(self.opts.max_messages_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Record what is held now: an AvailableNow query reads up to there and stops."""
        status = self._call(link.statuses, self.topics, None, None)
        self.target = {t: offsets.Position(s.generation, s.next) for t, s in status.items()}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """The end of the next batch: what is held now, capped by ``limit`` and, under
        Trigger.AvailableNow, by what was held when the query started. Raises
        :class:`~flux.spark.offsets.DataLoss` (``failOnDataLoss``)."""
        begin = offsets.decode(start)
        status = self._call(link.statuses, self.topics, self.opts.subscription, begin)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = offsets.plan_end(begin, status, self.topics, max_messages=max_rows,
                               target=self.target, fail_on_data_loss=self.opts.fail_on_data_loss,
                               warn=_warn)
        return offsets.encode(end, self.topics)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        batch = offsets.ranges(offsets.decode(start), offsets.decode(end), self.topics)
        pieces = offsets.split(batch, self.opts.max_messages_per_partition,
                               self.opts.min_partitions)
        return [FluxPartition(p, self.opts, self.opts.subscription) for p in pieces]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, FluxPartition)
        return read_partition(partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark processed everything before ``end``: move each subscription's cursor there."""
        self._call(link.commit_all, self.opts.subscription, offsets.decode(end))

    def stop(self) -> None:
        """Nothing to release: every call opens and closes its own connection."""

    def _call(self, fn: Any, *args: Any) -> Any:
        return link.call(self.opts.url, self.opts.timeout, fn, *args,
                         credentials=self.opts.credentials)


class FluxBatchReader(DataSourceReader):
    """``spark.read.format("flux")``: the messages held between ``startingOffsets``
    (default earliest) and ``endingOffsets`` (default latest), without a subscription."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        """Raises ValueError for an offset past a topic's end, and
        :class:`~flux.spark.offsets.DataLoss` (``failOnDataLoss``)."""
        opts = self.opts
        starts = offsets.parse_starting(opts.starting_offsets, opts.topics, offsets.EARLIEST)
        ends = offsets.parse_starting(opts.ending_offsets, opts.topics, offsets.LATEST,
                                      option="endingOffsets")
        status = link.call(opts.url, opts.timeout, link.statuses, opts.topics, None, None,
                           credentials=opts.credentials)
        batch = offsets.batch_ranges(starts, ends, status, opts.topics,
                                     fail_on_data_loss=opts.fail_on_data_loss, warn=_warn)
        pieces = offsets.split(batch, opts.max_messages_per_partition, opts.min_partitions)
        return [FluxPartition(p, opts, None) for p in pieces]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, FluxPartition)
        return read_partition(partition)
