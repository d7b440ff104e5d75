"""Deterministic trio runs: the scheduler seed, the simulated clock, the deadlock watchdog.

The only module that touches trio's private scheduler knobs (:func:`seed_scheduler`);
a test fails loudly if a trio upgrade moves them. :class:`SimClock` jumps straight
to the next deadline whenever no task can run. Nothing here knows about Flux.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import math
import random
import threading
from collections.abc import Callable
from typing import Any

import trio


class SchedulerKnobsMissing(RuntimeError):
    """trio no longer has the private knobs that make its scheduler deterministic."""


def seed_scheduler(seed: int) -> None:
    """Make trio run runnable tasks in an order fixed by ``seed`` (private trio API).

    trio shuffles each batch of runnable tasks with ``trio._core._run._r``; with
    ``_ALLOW_DETERMINISTIC_SCHEDULING`` set it sorts the batch by spawn order
    before shuffling, so the order depends on the seed alone. Call it right
    before ``trio.run``. Raises :class:`SchedulerKnobsMissing` if trio moved them.
    """
    try:
        from trio._core import _run
    except ImportError as exc:  # pragma: no cover - depends on the trio version
        raise SchedulerKnobsMissing("trio._core._run is gone; update flux.sim.determinism") from exc
    rng = getattr(_run, "_r", None)
    if not isinstance(rng, random.Random) or not hasattr(_run, "_ALLOW_DETERMINISTIC_SCHEDULING"):
        raise SchedulerKnobsMissing(
            "trio._core._run._r / _ALLOW_DETERMINISTIC_SCHEDULING moved; the simulator cannot"
            " replay runs until flux.sim.determinism.seed_scheduler is updated")
    setattr(_run, "_ALLOW_DETERMINISTIC_SCHEDULING", True)  # noqa: B010 - a Final in trio
    rng.seed(seed)


class Deadlock(Exception):
    """Every task waits and none has a deadline: the run can never make progress."""


class SimClock(trio.abc.Clock):
    """A virtual clock that jumps to the next deadline as soon as no task can run.

    When no deadline is left at all (every task waits for something that will
    never happen), it calls ``on_deadlock`` once instead of sleeping forever.
    """

    # How many consecutive idle passes with no deadline count as a deadlock; more
    # than one so a wake-up already queued through trio's wakeup socket is seen.
    IDLE_PASSES = 3

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._idle = 0
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.jumps = 0
        self.on_deadlock: Callable[[], None] | None = None

    def call_at(self, at: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` (synchronously, inside the run loop) once time reaches ``at``.

        Cheaper than a sleeping task: the simulated network delivers bytes this way.
        The callback may only reschedule tasks (e.g. unpark a ``ParkingLot``).
        """
        heapq.heappush(self._events, (at, next(self._seq), callback))

    def start_clock(self) -> None:
        pass

    def current_time(self) -> float:
        return self._now

    def deadline_to_sleep_time(self, deadline: float) -> float:
        events = self._events
        if events and events[0][0] <= deadline:
            # the next thing to happen is one of ours: jump there and run all due now
            at = events[0][0]
            if at > self._now:
                self._now = at
                self.jumps += 1
            while events and events[0][0] <= self._now:
                heapq.heappop(events)[2]()
            self._idle = 0
            return 0.0
        if deadline == math.inf:
            self._idle += 1
            if self._idle >= self.IDLE_PASSES and self.on_deadlock is not None:
                callback, self.on_deadlock = self.on_deadlock, None
                callback()
            return 0.001
        self._idle = 0
        if deadline > self._now:
            self._now = deadline
            self.jumps += 1
        return 0.0


def task_tree() -> list[str]:
    """Where every task of the current run waits, one line each (for deadlock reports)."""
    lines: list[str] = []

    def walk(task: trio.lowlevel.Task, depth: int) -> None:
        lines.append(f"{'  ' * depth}{task.name} @ {_innermost(task.coro)}")
        for nursery in task.child_nurseries:
            for child in sorted(nursery.child_tasks, key=lambda t: t.name):
                walk(child, depth + 1)

    root = trio.lowlevel.current_root_task()
    if root is not None:
        walk(root, 0)
    return lines


def _innermost(coro: Any) -> str:
    where = "?"
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None and "/trio/" not in frame.f_code.co_filename:
            where = f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno}"
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return where


class WallWatchdog:
    """A real-time budget for one run: past it, ``on_expire`` runs inside the trio run.

    It reads real time only by waiting on a thread event (no clock reads), and
    catches what the :class:`SimClock` cannot: busy loops that never let
    simulated time advance.
    """

    def __init__(self, budget: float, on_expire: Callable[[], None]) -> None:
        self.budget = budget
        self.on_expire = on_expire
        self.expired = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        token = trio.lowlevel.current_trio_token()

        def watch() -> None:
            if self._stop.wait(self.budget):  # seam-ok: a real-time budget, by design
                return
            self.expired = True
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self.on_expire)

        self._thread = threading.Thread(target=watch, name="flux-sim-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
