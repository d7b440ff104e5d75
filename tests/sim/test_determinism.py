"""The simulator replays: trio's private scheduler knobs, the sim clock, digests."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
from pathlib import Path

import trio

from flux.sim import determinism
from flux.sim.determinism import SimClock, seed_scheduler

ROOT = Path(__file__).resolve().parents[2]


def test_trio_still_has_the_private_scheduler_knobs() -> None:
    # If this fails, a trio upgrade moved the knobs: update flux.sim.determinism.
    from trio._core import _run

    assert isinstance(_run._r, random.Random)
    assert hasattr(_run, "_ALLOW_DETERMINISTIC_SCHEDULING")
    seed_scheduler(7)
    assert _run._ALLOW_DETERMINISTIC_SCHEDULING is True
    first = _run._r.random()
    seed_scheduler(7)
    assert _run._r.random() == first


def test_seeded_scheduler_runs_tasks_in_the_same_order_every_time() -> None:
    async def main(order: list[int]) -> None:
        async def worker(i: int) -> None:
            for _ in range(3):
                order.append(i)
                await trio.sleep(0)

        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(worker, i)

    runs = []
    for _ in range(2):
        order: list[int] = []
        seed_scheduler(42)
        trio.run(main, order, clock=SimClock())
        runs.append(order)
    assert runs[0] == runs[1]
    assert runs[0] != sorted(runs[0])  # it is shuffled, just reproducibly


def test_sim_clock_jumps_to_the_next_deadline_at_once() -> None:
    async def main() -> float:
        await trio.sleep(3600)
        return trio.current_time()

    clock = SimClock()
    assert trio.run(main, clock=clock) == 3600.0
    assert clock.jumps >= 1


def test_sim_clock_call_at_runs_callbacks_in_time_order() -> None:
    seen: list[tuple[str, float]] = []

    async def main() -> None:
        clock = trio.lowlevel.current_clock()
        assert isinstance(clock, SimClock)
        clock.call_at(5.0, lambda: seen.append(("b", trio.current_time())))
        clock.call_at(2.0, lambda: seen.append(("a", trio.current_time())))
        await trio.sleep(10)

    trio.run(main, clock=SimClock())
    assert seen == [("a", 2.0), ("b", 5.0)]


def test_sim_clock_reports_a_deadlock_instead_of_hanging() -> None:
    reported: list[float] = []

    async def main() -> None:
        clock = trio.lowlevel.current_clock()
        assert isinstance(clock, SimClock)
        token = trio.lowlevel.current_trio_token()
        with trio.CancelScope() as scope:

            def deadlock() -> None:
                reported.append(trio.current_time())
                assert any("main" in line for line in determinism.task_tree())
                scope.cancel()

            clock.on_deadlock = lambda: token.run_sync_soon(deadlock)
            await trio.sleep(1.5)
            await trio.Event().wait()  # nobody will ever set it

    trio.run(main, clock=SimClock())
    assert reported == [1.5]


def test_wall_watchdog_stops_a_run_that_never_lets_time_advance() -> None:
    async def main() -> bool:
        with trio.CancelScope() as scope:
            dog = determinism.WallWatchdog(0.2, scope.cancel)
            dog.start()
            try:
                while True:  # a busy loop: simulated time stands still
                    await trio.sleep(0)
            finally:
                dog.stop()
        return dog.expired

    assert trio.run(main, clock=SimClock()) is True


def _digest(seed: int, scenario: str, hashseed: str) -> str:
    code = f"from flux.sim.runner import run; r = run({seed}, {scenario!r}); print(r.digest, r.ok)"
    env = {**os.environ, "PYTHONHASHSEED": hashseed, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    return out.stdout.split()[0]


def test_same_seed_gives_the_same_digest_in_separate_processes() -> None:
    digests = {_digest(5, "default", hashseed) for hashseed in ("1", "2")}
    assert len(digests) == 1
    assert len(next(iter(digests))) == 64


def test_seed_and_run_both_matter() -> None:
    from flux.sim.runner import run

    a, b = run(1, "no-faults"), run(2, "no-faults")
    assert a.digest != b.digest
    assert math.isfinite(a.sim_time) and a.sim_time > 30


def test_pull_readers_replay_by_seed() -> None:
    """Pull readers (FETCH, COMMIT, resubscribes after crashes) keep a run a function of
    its seed: the same digest in another process, with another hash seed."""
    from flux.sim import history as h
    from flux.sim.runner import run, workload_for

    assert any(s.behaviour == "puller" for s in workload_for(1, "crashes").subscribers)
    result = run(1, "crashes", keep_history=True)
    assert result.history is not None
    assert result.history.of(h.Fetched) and result.history.of(h.Committed)
    assert {_digest(1, "crashes", hashseed) for hashseed in ("3", "4")} == {result.digest}
