"""Spark ships readers, partitions, writers and commit messages between processes by pickle."""

from __future__ import annotations

import pickle

import pytest

pytest.importorskip("pyspark")

from flux.spark.offsets import Position, Range
from flux.spark.options import SinkOptions, SourceOptions
from flux.spark.sink import FluxCommitMessage, FluxStreamWriter
from flux.spark.source import FluxPartition, FluxStreamReader


def test_spark_objects_survive_pickling_with_their_state() -> None:
    reader = FluxStreamReader(SourceOptions.parse({"topics": "a,b", "maxMessagesPerTrigger": "7"}))
    reader.target = {"a": Position(3, 9)}
    partition = FluxPartition(Range("a", 3, 0, 9), reader.opts, "sub")
    writer = FluxStreamWriter(SinkOptions.parse({"topic": "out"}, ["payload"]))
    message = FluxCommitMessage(partition=2, published=5, duplicates=1)

    again = pickle.loads(pickle.dumps(reader))
    assert (again.opts, again.target) == (reader.opts, reader.target)
    assert vars(pickle.loads(pickle.dumps(partition))) == vars(partition)
    assert pickle.loads(pickle.dumps(writer)).opts == writer.opts
    assert pickle.loads(pickle.dumps(message)) == message


def test_options_are_checked_when_the_query_is_defined() -> None:
    with pytest.raises(ValueError, match="maxMessagesPerTrigger"):
        SourceOptions.parse({"topics": "a", "maxMessagesPerTrigger": "many"})
    with pytest.raises(ValueError, match="failOnDataLoss"):
        SourceOptions.parse({"topics": "a", "FAILONDATALOSS": "perhaps"})
    with pytest.raises(ValueError, match="payload"):
        SinkOptions.parse({"topic": "out"}, ["value"])
    with pytest.raises(ValueError, match="topic"):
        SinkOptions.parse({}, ["payload"])
    assert SourceOptions.parse({"Topics": "a", "SUBSCRIPTION": "mine"}).subscription == "mine"
