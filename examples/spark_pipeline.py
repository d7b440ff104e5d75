"""Windowed counts with Spark Structured Streaming, from one Flux topic to another.

Reads JSON events ``{"key": "page-a", "ts": 1700000000.5}`` from a topic,
counts them per key in tumbling event-time windows, and writes one message per
closed window to another topic, e.g. ``{"key": "page-a", "start": 1700000000,
"end": 1700000010, "count": 3}``, with the id ``page-a@1700000000`` (a re-run
batch republishes the same ids, which Flux deduplicates).

    make serve                                    # in another terminal
    python examples/spark_pipeline.py --demo      # publish sample events, run once, print
    python examples/spark_pipeline.py             # run until Ctrl-C

A window is written once the watermark (latest event time seen minus
``--lateness``) passes its end, so the newest windows wait for later events.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from typing import Any

DEMO_EVENTS = [("page-a", 3.0), ("page-b", 4.0), ("page-a", 7.5), ("page-a", 12.0),
               ("page-b", 15.0), ("page-b", 19.9), ("page-a", 21.0)]
DEMO_BASE = 1_700_000_000.0


def start_query(spark: Any, *, url: str, source: str, sink: str, window: int, lateness: int,
                checkpoint: str, once: bool, subscription: str | None = None) -> Any:
    """Start the streaming query and return it (a ``StreamingQuery``)."""
    from pyspark.sql import functions as F

    reader = (spark.readStream.format("flux").option("url", url).option("topics", source)
              .option("startingOffsets", "earliest"))
    if subscription:
        reader = reader.option("subscription", subscription)
    events = (reader.load()
              .select(F.from_json(F.col("payload").cast("string"), "key string, ts double")
                      .alias("e"))
              .where(F.col("e.key").isNotNull() & F.col("e.ts").isNotNull())
              .select(F.col("e.key").alias("key"),
                      F.timestamp_seconds(F.col("e.ts")).alias("event_time")))
    counts = (events.withWatermark("event_time", f"{lateness} seconds")
              .groupBy(F.window("event_time", f"{window} seconds"), "key").count())
    start = F.unix_timestamp(F.col("window.start"))
    out = counts.select(
        F.to_json(F.struct(F.col("key"), start.alias("start"),
                           F.unix_timestamp(F.col("window.end")).alias("end"),
                           F.col("count"))).alias("payload"),
        F.concat_ws("@", F.col("key"), start.cast("string")).alias("id"))
    writer = (out.writeStream.format("flux").option("url", url).option("topic", sink)
              .option("checkpointLocation", checkpoint).outputMode("append"))
    writer = writer.trigger(availableNow=True) if once else writer.trigger(processingTime="2 seconds")
    return writer.start()


def publish_demo(url: str, topic: str) -> None:
    """Publish the demo events (fixed ids: running the demo twice stores them once)."""
    import trio

    from flux.client.trio import connect

    async def run() -> None:
        async with connect(url) as client:
            for i, (key, ts) in enumerate(DEMO_EVENTS):
                body = json.dumps({"key": key, "ts": DEMO_BASE + ts}).encode()
                await client.publish(topic, body, id=f"demo-{i}")

    trio.run(run)


def read_counts(url: str, topic: str) -> list[dict[str, Any]]:
    """Every window count held in ``topic``, in offset order."""
    import trio

    from flux.client.trio import connect

    async def run() -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        async with connect(url) as client:
            offset = 0
            while True:
                got = await client.fetch(topic, offset, max_messages=1000)
                if not got.messages:
                    return out
                out.extend(json.loads(m.payload) for m in got.messages)
                offset = got.messages[-1].offset + 1

    return trio.run(run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="flux://127.0.0.1:7070", help="the Flux router")
    parser.add_argument("--source", default="clicks", help="topic of JSON events")
    parser.add_argument("--sink", default="click-counts", help="topic for window counts")
    parser.add_argument("--window", type=int, default=10, help="window length, seconds")
    parser.add_argument("--lateness", type=int, default=0, help="allowed lateness, seconds")
    parser.add_argument("--checkpoint", default=None, help="checkpoint directory (default: temp)")
    parser.add_argument("--master", default="local[2]", help="Spark master")
    parser.add_argument("--once", action="store_true", help="process what is there, then stop")
    parser.add_argument("--demo", action="store_true",
                        help="publish sample events first, run once and print the counts")
    args = parser.parse_args(argv)

    from flux.spark.session import spark_session, stop_session

    if args.demo:
        publish_demo(args.url, args.source)
    spark = spark_session(args.master, app="flux-spark-pipeline",
                          settings={"spark.sql.shuffle.partitions": "2",
                                    "spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory(prefix="flux-pipeline-") as tmp:
        query = start_query(spark, url=args.url, source=args.source, sink=args.sink,
                            window=args.window, lateness=args.lateness,
                            checkpoint=args.checkpoint or tmp, once=args.once or args.demo)
        try:
            query.awaitTermination()
        except KeyboardInterrupt:
            query.stop()
        finally:
            stop_session(spark)
    if args.demo:
        for count in read_counts(args.url, args.sink):
            print(json.dumps(count))
    return 0


if __name__ == "__main__":
    sys.exit(main())
