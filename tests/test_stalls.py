"""Stall warnings (flux.shard.stalls): a task step or a garbage collection that holds
a shard's event loop past the threshold is logged with what it was, one line a
second at most."""

from __future__ import annotations

import gc
import logging
import time

import pytest
import trio

from flux.shard.stalls import StallWatch


def test_a_task_step_that_blocks_the_loop_is_logged_with_its_name(
        caplog: pytest.LogCaptureFixture) -> None:
    watch = StallWatch(3, threshold=0.05)

    async def main() -> None:
        async def hog() -> None:
            time.sleep(0.08)  # holds the loop: nothing else runs meanwhile
            await trio.sleep(0)

        async def quick() -> None:
            await trio.sleep(0)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(hog, name="hog")
            nursery.start_soon(quick, name="quick")

    with caplog.at_level(logging.WARNING, logger="flux.shard"):
        trio.run(main, instruments=[watch])
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("shard 3: task 'hog' held the event loop")


def test_a_long_collection_is_logged_and_lines_are_rate_limited(
        caplog: pytest.LogCaptureFixture) -> None:
    watch = StallWatch(1, threshold=0.0)  # every collection counts as long here
    watch.install()
    try:
        with caplog.at_level(logging.WARNING, logger="flux.shard"):
            gc.collect()
            gc.collect()  # within the second: counted, not logged
    finally:
        watch.uninstall()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "generation-2 garbage collection" in lines[0]
    assert watch._unlogged == 1


def test_the_lag_probe_logs_a_loop_kept_busy_by_many_short_steps(
        caplog: pytest.LogCaptureFixture) -> None:
    """No single step reaches the stall line, yet the loop is busy for 60 ms in a row
    (30 tasks woken at once, 2 ms each): the probe's sleep wakes that late and says so."""
    from flux.host import RealHost
    from flux.shard.stalls import watch_lag

    async def main() -> None:
        go = trio.Event()

        async def busy() -> None:
            await go.wait()
            time.sleep(0.002)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_lag, RealHost("t"), 5, 0.03, 0.001)
            async with trio.open_nursery() as tasks:
                for _ in range(30):
                    tasks.start_soon(busy)
                await trio.sleep(0.01)
                go.set()
            await trio.sleep(0.01)
            nursery.cancel_scope.cancel()

    with caplog.at_level(logging.WARNING, logger="flux.shard"):
        trio.run(main)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("shard 5: the event loop woke a 1 ms sleep")
    assert "ms of CPU meanwhile)" in lines[0]   # (little: the tasks slept, a busy loop would not)


def test_stats_count_full_collections_and_time_the_last_and_the_longest() -> None:
    watch = StallWatch(0)
    watch.install()
    try:
        gc.collect(0)  # a young collection is not counted
        gc.collect()
        gc.collect()
    finally:
        watch.uninstall()
    figures = watch.stats()
    assert figures["full_collections"] == 2
    assert 0 < figures["last_full_ms"] <= figures["longest_full_ms"]
    assert figures["tracked"] > 0 and figures["frozen"] == gc.get_freeze_count()


def test_a_shards_stats_carry_the_collector_figures_its_process_gives() -> None:
    from flux.config import Config
    from flux.shard.driver import LocalShard

    shard = LocalShard(Config())
    assert "gc" not in shard.stats()  # (the simulator's shards: nothing of the process)
    shard.core.process_stats = lambda: {"full_collections": 3}
    assert shard.stats()["gc"] == {"full_collections": 3}
