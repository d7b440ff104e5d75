"""Stall warnings: a shard process logs what held its event loop for long.

Nothing else runs while one task step or a garbage collection runs, so a step of
100 ms is 100 ms added to every delivery waiting behind it. :class:`StallWatch`
is a trio instrument (and a ``gc`` callback) that times each task step and each
collection on the process's own monotonic clock and logs those at or over
:data:`STALL` with the task's name (at most one line a second, counting the
rest), so an operator, or a soak run's log, can say where a latency spike came
from. :func:`watch_lag` logs the other kind of stall: many short steps in a row
that keep a sleeper waiting (how late a short sleep on the host's clock wakes).
Only the shard's real process runs them; the simulator never does.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

import trio

from flux.host import Host

log = logging.getLogger("flux.shard")

# seconds a step or collection may hold the loop before it is logged (the soak's goal
# for the worst publish-to-delivery latency is 25 ms)
STALL = 0.02
EVERY = 1.0        # at most one stall line a second (the others are counted in it)
TICK = 0.01        # the loop-lag probe's sleep


class StallWatch(trio.abc.Instrument):
    """Times task steps and garbage collections; logs the long ones."""

    def __init__(self, index: int, threshold: float = STALL) -> None:
        self.index = index
        self.threshold = threshold
        self._step = 0.0
        self._gc = 0.0
        self._next_line = 0.0
        self._unlogged = 0
        self.full_collections = 0  # generation-2 collections since install
        self.last_full = 0.0       # seconds the last one held the loop
        self.longest_full = 0.0    # ... and the longest

    def install(self) -> None:
        """Also time garbage collections (call once; :meth:`uninstall` undoes it)."""
        gc.callbacks.append(self._on_gc)

    def uninstall(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def stats(self) -> dict[str, Any]:
        """STATS ``gc``: the objects the collector tracks now (counted when asked: a
        pass over them, about a millisecond for the tens of thousands a shard has) and
        those frozen out of its view at start-up, the full collections since the shard
        started and how long the last and the longest held the loop (ms)."""
        return {"tracked": len(gc.get_objects()), "frozen": gc.get_freeze_count(),
                "full_collections": self.full_collections,
                "last_full_ms": round(self.last_full * 1000, 3),
                "longest_full_ms": round(self.longest_full * 1000, 3)}

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._step = time.perf_counter()  # seam-ok: this process's own loop, not the broker's time

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        held = time.perf_counter() - self._step  # seam-ok
        if held >= self.threshold:
            self._report(f"task {task.name!r}", held)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc = time.perf_counter()  # seam-ok
            return
        held = time.perf_counter() - self._gc  # seam-ok
        if info.get("generation") == 2:
            self.full_collections += 1
            self.last_full = held
            self.longest_full = max(self.longest_full, held)
        if held >= self.threshold:
            self._report(f"a generation-{info.get('generation')} garbage collection"
                         f" ({info.get('collected', 0)} objects freed)", held)

    def _report(self, what: str, held: float) -> None:
        now = time.perf_counter()  # seam-ok
        if now < self._next_line:
            self._unlogged += 1
            return
        more = f"; {self._unlogged} more since the last line" if self._unlogged else ""
        log.warning("shard %d: %s held the event loop for %.0f ms%s", self.index, what,
                    held * 1000, more)
        self._next_line = now + EVERY
        self._unlogged = 0


async def watch_lag(host: Host, index: int, threshold: float = STALL, tick: float = TICK) -> None:
    """Sleep ``tick`` at a time on the host's clock, forever, and log each wake-up that
    came ``threshold`` or more late, at most one line a second (with the worst lag of
    those it counted meanwhile), saying how much CPU the loop's thread used while it
    slept: about the lag when the loop was busy, far less when the machine kept the
    process waiting for a CPU."""
    next_line = -1.0
    unlogged = 0
    worst = (0.0, 0.0)
    while True:
        due = host.now() + tick
        cpu = time.thread_time()  # seam-ok: this thread's CPU time, not the broker's clock
        await host.sleep_until(due)
        now = host.now()
        late = now - due
        if late < threshold:
            continue
        worst = max(worst, (late, time.thread_time() - cpu))  # seam-ok
        if now < next_line:
            unlogged += 1
            continue
        more = f"; {unlogged} more since the last line" if unlogged else ""
        log.warning("shard %d: the event loop woke a %.0f ms sleep %.0f ms late (%.0f ms of"
                    " CPU meanwhile)%s", index, tick * 1000, worst[0] * 1000, worst[1] * 1000,
                    more)
        next_line = now + EVERY
        unlogged = 0
        worst = (0.0, 0.0)
