"""Carrying out a fault schedule against the real processes and the proxy.

:class:`FaultExecutor` starts each :class:`~chaos.schedule.PlannedFault` at its
time, records it in the run's history as ``fault`` events (``begin``/``end`` for
faults that last, one event for an instant one) and keeps a :class:`FaultRecord`
per fault for the report. Every fault undoes itself; :meth:`FaultExecutor.heal`
undoes whatever is still in force.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass, field

import trio

from chaos.cluster import Cluster
from chaos.proxy import ShardProxy
from chaos.recording import monotonic
from chaos.schedule import PlannedFault
from flux.router.launcher import is_shard_process, pid_alive
from flux.sim import history as h

REGISTER_WAIT = 40.0     # seconds a killed shard may take to come back registered
TARGET_WAIT = 5.0        # seconds a process fault waits for its shard to be running
POLL = 0.05


@dataclass
class FaultRecord:
    """What happened to one planned fault (times on the monotonic clock)."""

    planned: PlannedFault
    began: float | None = None
    ended: float | None = None
    skipped: str | None = None
    detail: str = ""
    ready_after: float | None = None  # router-kill: restart -> serving; shard-kill: kill -> registered
    old_generation: int | None = None  # shard-kill: the generation killed
    replaced: list[int] = field(default_factory=list)  # router-kill: shards not adopted
    adopted: int = 0                                   # router-kill: shards adopted

    @property
    def kind(self) -> str:
        return self.planned.kind

    @property
    def target(self) -> str:
        return self.planned.target_name


@dataclass
class FaultExecutor:
    cluster: Cluster
    proxies: list[ShardProxy]
    history: h.History
    nursery: trio.Nursery
    records: list[FaultRecord] = field(default_factory=list)
    _paused: dict[int, int] = field(default_factory=dict)   # pid -> shard index
    _router_lock: trio.Lock = field(default_factory=trio.Lock)

    def _event(self, kind: str, target: str, detail: str) -> float:
        t = monotonic()
        self.history.add(h.FaultInjected(t, kind, target, detail))
        return t

    async def run(self, plan: list[PlannedFault], start: float) -> None:
        """Start each fault at ``start + fault.at``; return once all of them ended."""
        async with trio.open_nursery() as running:
            for fault in plan:
                await trio.sleep_until(start + fault.at)
                record = FaultRecord(fault)
                self.records.append(record)
                running.start_soon(self._carry_out, record)

    async def _carry_out(self, record: FaultRecord) -> None:
        fault = record.planned
        kind = fault.kind
        if kind == "shard-kill":
            await self._shard_kill(record)
        elif kind == "shard-pause":
            await self._shard_pause(record)
        elif kind == "router-kill":
            await self._router_kill(record)
        else:
            await self._network(record)

    # -- processes ---------------------------------------------------------------------

    async def _target_pid(self, index: int) -> int | None:
        """The running, unpaused process of shard ``index``; waits a little for one (a
        shard being restarted), None if there is none by then."""
        with trio.move_on_after(TARGET_WAIT):
            while True:
                pid = await self.cluster.shard_pid(index)
                if pid is not None and pid not in self._paused:
                    return pid
                await trio.sleep(POLL * 4)
        return None

    async def _shard_kill(self, record: FaultRecord) -> None:
        index = record.planned.target
        pid = await self._target_pid(index)
        if pid is None:
            record.skipped = "no running shard process"
            return
        old, _ = await self.cluster.shard_generation(index)
        record.old_generation = old
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        record.began = self._event("shard-kill", record.target, "begin")
        record.detail = f"pid {pid}"
        await self._wait_registered(index, old, record)

    async def _wait_registered(self, index: int, old: int | None, record: FaultRecord) -> None:
        assert record.began is not None
        with trio.move_on_after(REGISTER_WAIT):
            while True:
                await trio.sleep(POLL * 4)
                generation, registered = await self.cluster.shard_generation(index)
                if registered and generation is not None and generation != old:
                    record.ready_after = monotonic() - record.began
                    break
        record.ended = self._event("shard-kill", record.target, "end")

    async def _shard_pause(self, record: FaultRecord) -> None:
        index = record.planned.target
        pid = await self._target_pid(index)
        if pid is None:
            record.skipped = "no running shard process"
            return
        old, _ = await self.cluster.shard_generation(index)
        os.kill(pid, signal.SIGSTOP)
        self._paused[pid] = index
        record.began = self._event("shard-pause", record.target, "begin")
        record.detail = f"pid {pid}"
        try:
            await trio.sleep(record.planned.duration)
        finally:
            replaced = not self._resume(pid)
        if replaced:
            # the router's watchdog killed the silent shard: wait for its successor
            record.detail += ", replaced by the router"
            await self._wait_registered(index, old, record)
        else:
            record.ended = self._event("shard-pause", record.target, "end")

    def _resume(self, pid: int) -> bool:
        """SIGCONT a paused shard; False if it is no longer there."""
        index = self._paused.pop(pid, None)
        if index is None or not pid_alive(pid) or not is_shard_process(pid, index):
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        return True

    async def _router_kill(self, record: FaultRecord) -> None:
        async with self._router_lock:
            if not self.cluster.router_alive:
                record.skipped = "router not running"
                return
            stats = await self.cluster.stats()
            before = {s["index"]: s["pid"] for s in (stats or {}).get("shards", [])
                      if s.get("registered")}
            self.cluster.kill_router()
            await self.cluster.wait_router_dead()
            record.began = self._event("router-kill", "router", "begin")
            await trio.sleep(record.planned.duration)
            restarted = monotonic()
            run = await self.cluster.start_router(self.nursery)
            record.ready_after = monotonic() - restarted
            record.ended = self._event("router-kill", "router", "end")
            record.replaced = sorted(i for i, pid in before.items()
                                     if run.shard_pids.get(i) != pid)
            record.adopted = len(before) - len(record.replaced)
            record.detail = (f"adopted {record.adopted}/{len(before)}"
                             + (f", replaced shards {record.replaced}" if record.replaced else ""))

    # -- network -----------------------------------------------------------------------

    async def _network(self, record: FaultRecord) -> None:
        fault = record.planned
        proxy = self.proxies[fault.target]
        if fault.kind == "reset":
            n = proxy.reset()
            record.began = record.ended = self._event("reset", record.target, "")
            record.detail = f"{n} connections"
            return
        if fault.kind == "latency":
            proxy.set_latency(fault.amount)
            record.detail = f"+{fault.amount * 1000:.0f}ms"
        elif fault.kind == "stall":
            proxy.stall()
        elif fault.kind == "blackhole":
            proxy.blackhole()
        record.began = self._event(fault.kind, record.target, "begin")
        try:
            await trio.sleep(fault.duration)
        finally:
            if fault.kind == "latency":
                proxy.set_latency(0.0)
            elif fault.kind == "stall":
                proxy.unstall()
            elif fault.kind == "blackhole":
                record.detail = f"{proxy.unblackhole()} connections reset"
        record.ended = self._event(fault.kind, record.target, "end")

    # -- healing -----------------------------------------------------------------------

    async def heal(self) -> None:
        """Undo every fault still in force and make sure the router runs."""
        for proxy in self.proxies:
            proxy.heal()
        for pid in list(self._paused):
            self._resume(pid)
        async with self._router_lock:
            if not self.cluster.router_alive:
                await self.cluster.start_router(self.nursery)

    def resume_all(self) -> None:
        """Synchronous last resort (a failing run): SIGCONT every paused shard."""
        for pid in list(self._paused):
            self._resume(pid)
