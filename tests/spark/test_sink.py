"""The ``flux`` sink and the example pipeline against a real ``flux serve`` and local Spark."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from flux.sim.command import run_one
from flux.spark.sweep import run_on_spark

from .conftest import duplicates, finish, publish, read_all

if TYPE_CHECKING:
    from tests.conftest import Broker

pytestmark = pytest.mark.spark
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark_pipeline.py"


def copy_query(spark: Any, broker: Broker, source: str, sink: str, checkpoint: Path) -> Any:
    return (spark.readStream.format("flux").option("url", broker.url).option("topics", source)
            .option("startingOffsets", "earliest").option("maxMessagesPerTrigger", "5").load()
            .select("payload")
            .writeStream.format("flux").option("url", broker.url).option("topic", sink)
            .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())


def test_sink_writes_each_row_once_when_a_batch_is_rerun(
        spark: Any, broker: Broker, tmp_path: Path) -> None:
    # identical rows inside a batch and across batches must all arrive, once each
    words = [b"x", b"x", b"y", b"x", b"z", b"y", b"x", b"x", b"w", b"z"]
    publish(broker.url, "words", words)
    checkpoint = tmp_path / "ck"
    finish(copy_query(spark, broker, "words", "copies", checkpoint))
    assert [m.payload for m in read_all(broker.url, "copies")] == words

    # forget that the last batch was committed: Spark re-runs it with the same batch id
    commits = sorted((checkpoint / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    last = commits[-1]
    last.unlink()
    (last.parent / f".{last.name}.crc").unlink(missing_ok=True)
    before = duplicates(broker.url)
    finish(copy_query(spark, broker, "words", "copies", checkpoint))

    assert [m.payload for m in read_all(broker.url, "copies")] == words
    assert duplicates(broker.url) - before == 5   # the re-run last batch: words[5:10]


def test_batch_write_with_an_id_column_is_idempotent(spark: Any, broker: Broker) -> None:
    df = spark.createDataFrame([("k1", "one"), ("k2", "two"), ("k3", "three")], "id string, payload string")
    for _ in range(2):
        df.write.format("flux").option("url", broker.url).option("topic", "keyed").mode("append").save()
    held = read_all(broker.url, "keyed")
    assert sorted((m.id, m.payload) for m in held) == [("k1", b"one"), ("k2", b"two"), ("k3", b"three")]
    assert duplicates(broker.url) == 3


def test_example_pipeline_writes_one_count_per_closed_window(
        spark: Any, broker: Broker, tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("spark_pipeline", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)

    example.publish_demo(broker.url, "clicks")
    query = example.start_query(spark, url=broker.url, source="clicks", sink="click-counts",
                                window=10, lateness=0, checkpoint=str(tmp_path / "ck"), once=True)
    finish(query)

    base = int(example.DEMO_BASE)
    counts = sorted((c["key"], c["start"] - base, c["end"] - base, c["count"])
                    for c in example.read_counts(broker.url, "click-counts"))
    # the window [20, 30) is still open: the watermark (latest event, 21) has not passed it
    assert counts == [("page-a", 0, 10, 2), ("page-a", 10, 20, 1),
                      ("page-b", 0, 10, 1), ("page-b", 10, 20, 2)]
    ids = sorted(m.id for m in read_all(broker.url, "click-counts"))
    assert ids == sorted(f"{k}@{base + s}" for k, s, _, _ in counts)
    assert all(json.loads(m.payload)["count"] > 0 for m in read_all(broker.url, "click-counts"))


def test_sim_seeds_fan_out_over_spark_with_the_same_results_as_locally(spark: Any) -> None:
    # builtins:bool stands in for a simulator whose seed 0 fails
    assert list(run_on_spark(range(40), entry="builtins:bool", wave=16, spark=spark)) == (
        [False] + [True] * 39)
    jobs = [(seed, "no-faults", None, False) for seed in (0, 1)]
    remote = list(run_on_spark(jobs, spark=spark))
    local = [run_one(job) for job in jobs]
    assert [(o.seed, o.ok, o.digest) for o in remote] == [(o.seed, o.ok, o.digest) for o in local]


def test_key_and_headers_columns_round_trip_through_sink_and_source(
        spark: Any, broker: Broker) -> None:
    df = spark.createDataFrame(
        [("a", "one", "user-1", {"trace": "t1"}), ("b", "two", None, None)],
        "id string, payload string, key string, headers map<string,string>")
    df.write.format("flux").option("url", broker.url).option("topic", "meta").mode("append").save()
    # the rows may be written by two tasks at once: compare them in id order
    held = sorted(read_all(broker.url, "meta"), key=lambda m: m.id)
    assert [(m.id, m.key, m.headers) for m in held] == [
        ("a", "user-1", {"trace": "t1"}), ("b", None, {})]
    rows = (spark.read.format("flux").option("url", broker.url).option("topics", "meta")
            .load().select("id", "key", "headers").orderBy("id").collect())
    assert [(r.id, r.key, r.headers) for r in rows] == [
        ("a", "user-1", {"trace": "t1"}), ("b", None, None)]
