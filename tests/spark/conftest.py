"""Fixtures for the Spark tests: one local Spark session for the package, and sync
helpers that publish, read and inspect topics of the ``broker`` fixture.

Spark tests are synchronous (Spark blocks); they skip when pyspark, pyarrow or
Java is missing. The session's JVM is stopped when the package's tests end.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import trio

from flux.client.trio import connect

QUERY_TIMEOUT = 120.0  # seconds any one streaming query may run in a test


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "spark: runs a local Spark session (pyspark, Java 17)")


@pytest.fixture(scope="package")
def spark() -> Iterator[Any]:
    """A local[2] SparkSession with the ``flux`` format registered."""
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    if shutil.which("java") is None:
        pytest.skip("Spark needs Java 17 on PATH")
    from flux.spark.session import spark_session, stop_session

    # the workers must run this interpreter, whatever the environment says
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    session = spark_session("local[2]", app="flux-tests", settings={
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.sql.streaming.stopTimeout": "30s",
        "spark.ui.showConsoleProgress": "false",
    })
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        stop_session(session)


def run(fn: Callable[..., Any], *args: Any, timeout: float = 30.0) -> Any:
    """Run an async function to completion, bounded by ``timeout`` seconds."""

    async def bounded() -> Any:
        with trio.fail_after(timeout):
            return await fn(*args)

    return trio.run(bounded)


def publish(url: str, topic: str, payloads: list[bytes], ids: list[str] | None = None) -> list[Any]:
    async def go() -> list[Any]:
        async with connect(url) as client:
            return await client.publish_many(topic, payloads, ids=ids)

    return run(go)  # type: ignore[no-any-return]


def read_all(url: str, topic: str) -> list[Any]:
    """Every message held in ``topic`` (FetchedMessage), in offset order."""

    async def go() -> list[Any]:
        out: list[Any] = []
        async with connect(url) as client:
            offset = 0
            while True:
                got = await client.fetch(topic, offset, max_messages=1000)
                if not got.messages:
                    return out
                out.extend(got.messages)
                offset = got.messages[-1].offset + 1

    return run(go)  # type: ignore[no-any-return]


def topic_stats(url: str, topic: str) -> dict[str, Any]:
    """The STATS entry of ``topic`` on whichever shard holds it."""

    async def go() -> dict[str, Any]:
        async with connect(url) as client:
            for shard in (await client.stats()).values():
                if topic in shard["topics"]:
                    return dict(shard["topics"][topic], generation=shard["generation"])
        raise AssertionError(f"no shard holds {topic!r}")

    return run(go)  # type: ignore[no-any-return]


def duplicates(url: str) -> int:
    """How many publishes every shard answered as duplicates (G3), in all."""

    async def go() -> int:
        async with connect(url) as client:
            return sum(s["counters"]["duplicates"] for s in (await client.stats()).values())

    return run(go)  # type: ignore[no-any-return]


def generation_of(url: str, topic: str) -> int:
    async def go() -> int:
        async with connect(url) as client:
            return (await client.fetch(topic, 0, max_messages=1)).generation

    return run(go)  # type: ignore[no-any-return]


def wait_for_new_generation(url: str, topic: str, old: int, timeout: float = 40.0) -> int:
    """Poll until ``topic``'s shard answers with a generation other than ``old``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            generation = generation_of(url, topic)
        except Exception:  # the shard is restarting; the client may give up this round
            generation = old
        if generation != old:
            return generation
        time.sleep(0.2)
    raise AssertionError(f"the shard of {topic!r} did not come back with a new generation")


def finish(query: Any, timeout: float = QUERY_TIMEOUT) -> None:
    """Wait for a query (Trigger.AvailableNow) to end; stop it and fail if it does not.
    Re-raises the query's own error."""
    if not query.awaitTermination(timeout):
        query.stop()
        raise AssertionError(f"streaming query did not finish within {timeout:g}s")
