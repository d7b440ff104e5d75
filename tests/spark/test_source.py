"""The ``flux`` source against a real ``flux serve`` and a local Spark session."""

from __future__ import annotations

import os
import signal
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from flux.hashing import shard_for

from .conftest import finish, generation_of, publish, topic_stats, wait_for_new_generation

if TYPE_CHECKING:
    from tests.conftest import Broker, BrokerFactory

pytestmark = pytest.mark.spark


def stream(spark: Any, broker: Broker, topics: str, **options: str) -> Any:
    reader = (spark.readStream.format("flux").option("url", broker.url).option("topics", topics)
              .option("startingOffsets", "earliest"))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_batch_read_returns_every_held_message(spark: Any, broker: Broker) -> None:
    publish(broker.url, "orders.eu", [b"e0", b"e1", b"e2"], ids=["a", "b", "c"])
    publish(broker.url, "orders.us", [b"u0"], ids=["d"])
    df = (spark.read.format("flux").option("url", broker.url)
          .option("topics", "orders.eu,orders.us").option("maxMessagesPerPartition", "2").load())
    rows = sorted((r.topic, r.offset, r.id, bytes(r.payload), r.generation) for r in df.collect())
    eu, us = generation_of(broker.url, "orders.eu"), generation_of(broker.url, "orders.us")
    assert rows == [("orders.eu", 0, "a", b"e0", f"{eu:#x}"), ("orders.eu", 1, "b", b"e1", f"{eu:#x}"),
                    ("orders.eu", 2, "c", b"e2", f"{eu:#x}"), ("orders.us", 0, "d", b"u0", f"{us:#x}")]
    assert df.schema.simpleString() == (
        "struct<topic:string,offset:bigint,generation:string,id:string,payload:binary,"
        "timestamp:timestamp,key:string,headers:map<string,string>>")


def test_rerun_batch_is_identical_and_restart_neither_loses_nor_repeats(
        spark: Any, broker: Broker, tmp_path: Path) -> None:
    topic = "events"
    publish(broker.url, topic, [f"m{i}".encode() for i in range(25)])
    attempts: dict[int, list[list[tuple[int, bytes]]]] = defaultdict(list)
    fail_batch = {1}

    def collect(df: Any, batch_id: int) -> None:
        attempts[batch_id].append(sorted((r.offset, bytes(r.payload)) for r in df.collect()))
        if batch_id in fail_batch:
            fail_batch.clear()
            raise RuntimeError("injected failure after reading batch 1")

    def start() -> Any:
        return (stream(spark, broker, topic, maxMessagesPerTrigger="10", subscription="replay")
                .writeStream.foreachBatch(collect).trigger(availableNow=True)
                .option("checkpointLocation", str(tmp_path / "ck")).start())

    with pytest.raises(Exception, match="injected failure"):
        finish(start())
    # batch 1 failed: its messages must still be held for the subscription (G5)
    assert topic_stats(broker.url, topic)["subscriptions"]["replay"]["cursor"] <= 10

    publish(broker.url, topic, [f"m{i}".encode() for i in range(25, 30)])
    finish(start())

    assert len(attempts[1]) == 2 and attempts[1][0] == attempts[1][1], "a re-run batch differs"
    final = [row for batch in sorted(attempts) for row in attempts[batch][-1]]
    assert final == [(i, f"m{i}".encode()) for i in range(30)]
    assert all(len(rows) <= 10 for runs in attempts.values() for rows in runs)


def test_generation_change_fails_the_query_or_skips_ahead(
        spark: Any, broker: Broker, tmp_path: Path) -> None:
    topic = "resets"
    publish(broker.url, topic, [b"before-0", b"before-1"])
    old = generation_of(broker.url, topic)
    seen: list[tuple[str, int, bytes]] = []

    def collect(df: Any, batch_id: int) -> None:
        seen.extend((r.generation, r.offset, bytes(r.payload)) for r in df.collect())

    def start(**options: str) -> Any:
        return (stream(spark, broker, topic, subscription="resets", **options)
                .writeStream.foreachBatch(collect).trigger(availableNow=True)
                .option("checkpointLocation", str(tmp_path / "ck")).start())

    finish(start())
    assert [s[2] for s in seen] == [b"before-0", b"before-1"]

    index = shard_for(topic, broker.shard_count)
    os.kill(broker.shards[index].pid, signal.SIGKILL)
    new = wait_for_new_generation(broker.url, topic, old)
    broker.note_pids()
    publish(broker.url, topic, [b"after-0", b"after-1", b"after-2"])

    with pytest.raises(Exception, match=r"was reset .*failOnDataLoss=false"):
        finish(start())
    finish(start(failOnDataLoss="false"))
    assert seen[2:] == [(f"{new:#x}", i, f"after-{i}".encode()) for i in range(3)]


def test_a_disk_topic_bigger_than_shard_memory_replays_through_the_source(
        spark: Any, broker_factory: BrokerFactory, tmp_path: Path) -> None:
    """G9 "Space": a disk topic holding about four times ``shard.max_memory`` of payloads
    (most of them evicted to the log) replays whole and intact through the source."""
    broker = broker_factory("shard.max_memory=2097152", "storage.cache_bytes=262144",
                            "message.ttl=600", shards=1,
                            args=("--data-dir", str(tmp_path / "data")))
    topic = "replay.big"
    count = 8000

    def payload(i: int) -> bytes:
        return (b"%08d" % i) * 125  # 1000 bytes

    for start in range(0, count, 500):
        publish(broker.url, topic, [payload(i) for i in range(start, start + 500)],
                ids=[f"m{i}" for i in range(start, start + 500)])
    seen: list[tuple[int, str, bytes]] = []

    def collect(df: Any, batch_id: int) -> None:
        seen.extend((r.offset, r.id, bytes(r.payload)) for r in df.collect())

    query = (stream(spark, broker, topic, maxMessagesPerTrigger="2000")
             .writeStream.foreachBatch(collect).trigger(availableNow=True)
             .option("checkpointLocation", str(tmp_path / "ck")).start())
    finish(query)
    assert sorted(seen) == [(i, f"m{i}", payload(i)) for i in range(count)]
    stats = topic_stats(broker.url, topic)
    assert stats["held"] == count and stats["held_bytes"] < 2097152
    assert stats["storage"]["log_bytes"] > 3 * 2097152
