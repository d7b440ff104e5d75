"""The simulated world: hosts, the network, the router and shards, and faults on them.

:class:`World` makes hosts (each process incarnation its own), runs the real
router under a :class:`RouterSupervisor` (crash, restart) and the real shards
through :class:`SimLauncher` (a ``TaskLauncher`` whose nursery the simulator
owns, so shards outlive the router), and carries out :class:`~flux.sim.faults.Fault`\\ s.
"""

from __future__ import annotations

import functools
import logging
import traceback
from typing import Any

import trio

from flux.config import Config
from flux.router.launcher import TaskLauncher, TaskShard
from flux.router.router import run_router
from flux.router.state import MemoryStateStore
from flux.shard.server import ShardServer, StorageFailed, run_shard
from flux.sim import history as h
from flux.sim.disk import SimDisk
from flux.sim.faults import Fault
from flux.sim.network import Network, SimStream
from flux.sim.simhost import SimHost, derive_seed
from flux.sim.tap import Recorder, TappedHost
from flux.storage.record import Bad, Record, Torn, decode_run
from flux.storage.segment import MAX_HEADER, decode_header

log = logging.getLogger("flux.sim")
HEADER_FLIPS = 8   # one flipped bit of a segment in this many hits its header


class World:
    """Everything one simulated run owns, except the workload."""

    def __init__(self, seed: int, config: Config, history: h.History,
                 nursery: trio.Nursery) -> None:
        self.seed = seed
        self.config = config
        self.history = history
        self.network = Network(seed)
        self.recorder = Recorder(history)
        self.failures: list[str] = []
        self.tracebacks: list[str] = []
        self._incarnations: dict[str, int] = {}
        self.disks: dict[str, SimDisk] = {}
        self._full_spells: dict[str, int] = {}   # machine -> "disk full" faults under way
        self.shards: dict[int, tuple[SimHost, TaskShard]] = {}
        self.launcher = SimLauncher(nursery, self)
        self.router = RouterSupervisor(self, nursery)
        self._faults: trio.Nursery | None = None
        self._healed = False  # no fault starts after the heal
        # (generation, topic, key) -> (connection, sid) of each live ephemeral subscription
        self._ephemeral: dict[tuple[int, str, str], tuple[int, int]] = {}

    def new_host(self, name: str) -> SimHost:
        n = self._incarnations.get(name, 0)
        self._incarnations[name] = n + 1
        return SimHost(self.network, name, seed=self.seed, incarnation=n,
                       disk=self.disk_of(name))

    def disk_of(self, name: str) -> SimDisk:
        """The disk of the machine ``name`` runs on: it outlives every incarnation."""
        disk = self.disks.get(name)
        if disk is None:
            disk = self.disks[name] = SimDisk(derive_seed(self.seed, name, "disk"))
        return disk

    def client_host(self, name: str) -> TappedHost:
        n = self._incarnations.get(name, 0)
        self._incarnations[name] = n + 1
        return TappedHost(self.network, name, seed=self.seed, incarnation=n,
                          recorder=self.recorder)

    def record(self, event: h.Event) -> None:
        self.recorder.add(event)

    def failed(self, what: str, exc: BaseException) -> None:
        self.failures.append(f"{what} at t={trio.current_time():.6f}: {leaf_errors(exc)}")
        self.tracebacks.append("".join(traceback.format_exception(exc)).rstrip())

    def oracle(self, shard: int, generation: int, server: ShardServer,
               event: tuple[Any, ...]) -> None:
        """The shard core's observer hook: cleanup facts for the G5/G6 checks."""
        now = trio.current_time()
        held = server.core.topics.get(event[1]) if len(event) > 1 else None
        if held is not None:
            generation = held.generation  # a disk topic's own, which outlives the shard's
        if event[0] == "trimmed":
            self.record(h.Trimmed(now, shard, generation, event[1], event[2], event[3]))
        elif event[0] == "created":
            made = _ephemeral_key(event[2])
            if made is not None:
                # which connection made it: once the shard deletes it, it may be gone
                connection = _connection_id(server, made[0])
                if connection is not None:
                    self._ephemeral[(generation, event[1], event[2])] = (connection, made[1])
        elif event[0] == "deleted_subscription":
            if not str(event[2]).startswith("~"):
                self.record(h.SubscriptionGone(now, shard, generation, event[1], event[2]))
                return
            made = self._ephemeral.pop((generation, event[1], event[2]), None)
            # no session if its SUBSCRIBED reply has not reached the client (yet): the
            # checker counts an ephemeral subscription as held only from that reply on
            session = self.recorder.ephemeral.get(made) if made is not None else None
            if session is not None:
                self.record(h.EphemeralGone(now, shard, generation, event[1], session))

    # -- faults ------------------------------------------------------------------------

    async def run_plan(self, faults: list[Fault]) -> None:
        """Carry out ``faults`` at their times; :meth:`heal` cancels what is still going on."""
        async with trio.open_nursery() as nursery:
            self._faults = nursery
            for fault in sorted(faults):
                await trio.sleep_until(fault.at)
                nursery.start_soon(self._apply, fault, name=f"fault {fault.encode()}")
            await trio.sleep_forever()

    async def _apply(self, fault: Fault) -> None:
        if self._healed:
            return  # due at the very moment of the heal, and started after it: too late
        kind, target, net = fault.kind, fault.target, self.network
        if kind in ("eio", "full", "slowdisk", "rot", "nofiles"):
            await self._disk_fault(fault)
            return
        if kind in ("crash", "pause", "power", "flip"):
            index = int(target.rsplit("-", 1)[1])
            entry = self.shards.get(index)
            if entry is None:
                return  # not running right now (being restarted)
            host, shard = entry
            if kind in ("crash", "power", "flip"):
                detail = "instant"
                disk = self.disk_of(host.name)
                if kind == "power":
                    disk.power_loss()  # its open files die with the unsynced data
                elif kind == "flip":
                    flipped = _flip_in_a_record(disk)
                    detail = "nothing synced" if flipped is None else f"{flipped[0]}@{flipped[1]}"
                self.record(h.FaultInjected(trio.current_time(), kind, target, detail))
                net.crash(host)
                shard.kill()
                return
            self.record(h.FaultInjected(trio.current_time(), "pause", target, "begin"))
            host.gate.close()
            await trio.sleep(fault.duration)
            host.gate.open()
        elif kind == "router":
            self.record(h.FaultInjected(trio.current_time(), "router", target, "begin"))
            self.router.crash()
            await trio.sleep(fault.duration)
            self.router.restart()
        elif kind == "reset":
            a, b = target.split("<->")
            net.reset_between(a, b)
            self.record(h.FaultInjected(trio.current_time(), "reset", target, "instant"))
            return
        else:
            pairs = _directions(target)
            self.record(h.FaultInjected(trio.current_time(), kind, target, "begin"))
            for a, b in pairs:
                if kind == "slow":
                    net.set_slow(a, b, fault.factor)
                else:
                    net.block(a, b)
            await trio.sleep(fault.duration)
            for a, b in pairs:
                if kind == "slow":
                    net.set_slow(a, b, 1.0)
                else:
                    net.unblock(a, b)
        self.record(h.FaultInjected(trio.current_time(), kind, target, "end"))

    async def _disk_fault(self, fault: Fault) -> None:
        """A storage fault of a shard machine's disk (the shard itself keeps running)."""
        disk = self.disk_of(fault.target)
        now = trio.current_time
        if fault.kind == "eio":
            if fault.duration:   # joined to overlapping fsyncs (scenario busy-disk)
                disk.fail_next_syncs(joined_within=fault.duration)
            else:
                disk.fail_next_syncs(1)
            self.record(h.FaultInjected(now(), "eio", fault.target, "instant"))
            return
        if fault.kind == "rot":
            flipped = _flip_in_a_record(disk)
            self.record(h.FaultInjected(now(), "rot", fault.target, "nothing synced"
                                        if flipped is None else f"{flipped[0]}@{flipped[1]}"))
            return
        self.record(h.FaultInjected(now(), fault.kind, fault.target, "begin"))
        if fault.kind == "nofiles":
            try:   # the data directory only: the host's runtime directory still takes files
                disk.refuse_new_files(self.config.storage.dir)
                await trio.sleep(fault.duration)
            finally:   # a heal ends it too
                disk.refuse_new_files(None)
            self.record(h.FaultInjected(now(), fault.kind, fault.target, "end"))
            return
        full = fault.kind == "full"
        spells = self._full_spells
        try:
            if full:
                spells[fault.target] = spells.get(fault.target, 0) + 1
                disk.set_full(True)
            else:
                disk.slow += 1
            await trio.sleep(fault.duration)
        finally:   # a heal ends it too (overlapping spells end with the last of them)
            if full:
                spells[fault.target] -= 1
                disk.set_full(spells[fault.target] > 0)
            else:
                disk.slow -= 1
        self.record(h.FaultInjected(now(), fault.kind, fault.target, "end"))

    def heal(self) -> None:
        """End every fault at once: links healed, shards resumed, the router running, and
        an fsync error no fsync met yet dropped (it would stop a shard long after the
        heal, at its clean stop with fsync never)."""
        self._healed = True
        if self._faults is not None:
            self._faults.cancel_scope.cancel()
        for disk in self.disks.values():
            disk.fail_next_syncs(0, cancel=True)
        self.network.heal_all()
        for host, _shard in self.shards.values():
            host.gate.open()
        if not self.router.running:
            self.router.restart()


def leaf_errors(exc: BaseException) -> str:
    """The innermost exceptions of a (possibly grouped) error, with where they were raised."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(leaf_errors(e) for e in exc.exceptions)
    tb = exc.__traceback__
    where = ""
    while tb is not None:  # the innermost frame in broker or client code, if any
        path = tb.tb_frame.f_code.co_filename
        if not where or ("/flux/" in path and "/flux/sim/" not in path):
            where = f" ({'/'.join(path.rsplit('/', 2)[-2:])}:{tb.tb_lineno})"
        tb = tb.tb_next
    return f"{type(exc).__name__}: {exc}{where}"


def _ephemeral_key(key: Any) -> tuple[int, int] | None:
    """(shard connection, client sid) of an ephemeral subscription's key ``~conn.sid``;
    None for a named subscription."""
    if not isinstance(key, str) or not key.startswith("~"):
        return None
    conn, _, sid = key[1:].partition(".")
    return (int(conn), int(sid)) if conn.isdigit() and sid.isdigit() else None


def _connection_id(server: ShardServer, conn: int) -> int | None:
    """The simulated network's number of shard connection ``conn`` (the client's end of
    it, which the wire tap sees, has the same)."""
    c = server.conns.get(conn)
    return c.stream.conn_id if c is not None and isinstance(c.stream, SimStream) else None


def _directions(target: str) -> list[tuple[str, str]]:
    if "<->" in target:
        a, b = target.split("<->")
        return [(a, b), (b, a)]
    a, b = target.split("->")
    return [(a, b)]


def _flip_in_a_record(disk: SimDisk) -> tuple[str, int] | None:
    """Flip a bit in a record of a log segment, where the checksums must find it; two
    times in three in the most recently written block. One flip in HEADER_FLIPS hits
    the segment's header instead (its magic and version included: damage, PROTOCOL.md
    §14.2, set aside by the next recovery).

    Never in a segment's last record: after a reboot a damaged last record cannot be
    told from a torn write, and recovery cuts it as one (PROTOCOL.md §14.3 says so; with
    fsync interval or never the reboot starts a new generation anyway). Only a flip
    with a whole record after it is damage recovery must find."""
    logs = disk.synced_files(".log")
    if not logs:
        return None
    path = disk.random.choice(logs)
    data = disk.contents(path)
    try:
        _, header_size = decode_header(data[:MAX_HEADER])
    except (Bad, Torn):
        return None
    if disk.random.randrange(HEADER_FLIPS) == 0:
        return disk.flip_bit(path, limit=header_size)
    records: list[Record] = []
    jumps: list[tuple[int, int]] = []
    decode_run(data, header_size, header_size, records, jumps)
    if len(records) < 2:
        return None
    last = records[-1].position  # (positions here are file offsets, but for jumps)
    if jumps:  # a compacted segment: its records were never the last one written
        last = len(data)
    return disk.flip_bit(path, skip=header_size, recent=disk.random.choice((0, 4096, 4096)),
                         limit=last)


class SimLauncher(TaskLauncher):
    """Shards as tasks in the simulator's nursery, each incarnation on a fresh host.

    Runs the production start path (:func:`~flux.shard.server.run_shard`), whose
    ``on_start`` hook attaches the oracle to the new core's ``on_event``.
    """

    def __init__(self, nursery: trio.Nursery, world: World) -> None:
        super().__init__(nursery, lambda spec: world.new_host(f"shard-{spec.index}"))
        self.world = world

    async def run_shard(self, shard: TaskShard, task_status: Any) -> None:
        world = self.world
        index = shard.spec.index
        host = world.new_host(f"shard-{index}")
        started: list[int] = []   # the generation run_shard drew, once it built the server

        def attach(server: ShardServer) -> None:
            generation = server.core.generation
            started.append(generation)
            server.core.on_event = functools.partial(world.oracle, index, generation, server)
            world.shards[index] = (host, shard)

        try:
            await run_shard(host, shard.spec, pid=shard.pid, stop=shard.stop, on_start=attach,
                            task_status=task_status)
        except StorageFailed as exc:
            # a log failed (an fsync or write error, damage read back): the shard exits
            # so that the router restarts it and recovery runs, as designed (G9); the
            # checker asks a storage fault on this machine to explain it
            world.record(h.FaultInjected(trio.current_time(), "storage-failed", f"shard-{index}",
                                         str(exc)[:300]))
            raise
        except Exception as exc:
            what = f" (generation {started[0]:#x})" if started else ""
            world.failed(f"shard {index}{what} raised", exc)
            raise
        finally:
            world.network.crash(host)  # a dead process's sockets close with it
            world.disk_of(host.name).crash()  # ... and its open files (written data stays)
            if started:
                world.record(h.ShardStopped(trio.current_time(), index, started[0]))
            if world.shards.get(index, (None, None))[1] is shard:
                del world.shards[index]


class RouterSupervisor:
    """Runs the router, kills it on demand and restarts it (as ``systemd`` would)."""

    def __init__(self, world: World, nursery: trio.Nursery) -> None:
        self.world = world
        self.nursery = nursery
        self.store = MemoryStateStore()
        self.host: SimHost | None = None
        self.scope: trio.CancelScope | None = None

    @property
    def running(self) -> bool:
        return self.scope is not None

    async def start(self) -> Any:
        """Start the first router; returns once its shards registered."""
        return await self.nursery.start(self._run)

    def restart(self) -> None:
        if self.scope is None:
            self.nursery.start_soon(self._run)

    def crash(self) -> None:
        if self.scope is not None and self.host is not None:
            self.world.network.crash(self.host)
            self.scope.cancel()
            self.scope = None

    async def _run(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        world = self.world
        host = world.new_host("router")
        scope = trio.CancelScope()
        self.host, self.scope = host, scope
        try:
            with scope:
                await run_router(host, world.config, world.launcher,
                                 state=lambda port: self.store, task_status=task_status)
        except Exception as exc:
            world.failed("router raised", exc)
        finally:
            world.network.crash(host)
            if self.scope is scope:
                self.scope = None
