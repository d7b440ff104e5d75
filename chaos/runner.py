"""One chaos run: start everything, inject the schedule, heal, stop, merge the histories.

Phases (recorded in the history as the simulator's ``phase`` events): *start*
(broker, proxies, workers), *faults* (the schedule), *heal* (every fault undone;
workers switch to liveness mode), *end* (workers stopped). Checking and the
report are :mod:`chaos.accounting` and :mod:`chaos.report`; this module only runs.
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import trio

from chaos.cluster import Cluster, ProcessGroup, read_lines
from chaos.faults import FaultExecutor, FaultRecord
from chaos.proxy import ShardProxy
from chaos.recording import monotonic
from chaos.schedule import PlannedFault, draw_schedule
from chaos.settings import DISK_PREFIX, MEMORY_PREFIX, SHARDS, ChaosSettings
from chaos.worker import WorkerSpec, asyncio_available
from flux.client.tls import client_context
from flux.hashing import dead_letter_topic, shard_for
from flux.sim import history as h
from flux.tls import throwaway_pki

READY_TIMEOUT = 40.0      # seconds for every worker to connect
WORKER_STOP_TIMEOUT = 10.0
HEAL_TIMEOUT = 45.0       # seconds for every shard to be registered after the heal
RUN_SLACK = 300.0         # seconds a run may overrun its phases before its processes are killed


@dataclass
class RunOutput:
    """What the run produced, for the checker and the report."""

    settings: ChaosSettings
    workdir: Path
    topics: list[str]
    workers: list[WorkerSpec]
    plan: list[PlannedFault]
    faults: list[FaultRecord]
    history: h.History                       # the runner's own events (faults, phases)
    phases: dict[str, float] = field(default_factory=dict)
    routers_started: int = 0
    killed_at_stop: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    crashes: list[str] = field(default_factory=list)   # processes that died on their own
    proxy_stats: list[dict[str, int]] = field(default_factory=list)
    storage: dict[str, str] = field(default_factory=dict)   # topic -> "memory" or "disk"
    data_dir: Path | None = None             # the broker's storage.dir (None: no disk topic)


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (bound together, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def topic_kinds(count: int, storage: str) -> list[str]:
    """The storage kind of each of ``count`` topics: all one kind, or (``mixed``) disk
    and memory alternating, disk first (about half on disk)."""
    if storage in ("memory", "disk"):
        return [storage] * count
    return ["disk" if i % 2 == 0 else "memory" for i in range(count)]


def pick_topics(count: int, shards: int, storage: str = "memory") -> dict[str, str]:
    """``count`` topic names and their storage kinds (see :func:`topic_kinds`); the
    k-th topic lives on shard ``k % shards``, so every shard owns a topic (when count
    >= shards) and, mixed, shards hold topics of both kinds wherever the count allows."""
    chosen: dict[str, str] = {}
    k = 0
    for i, kind in enumerate(topic_kinds(count, storage)):
        prefix = DISK_PREFIX if kind == "disk" else MEMORY_PREFIX
        while True:
            name = f"{prefix}.orders-{k}"
            k += 1
            if shard_for(name, shards) == i % shards:
                break
        chosen[name] = kind
    return chosen


def pool_topic(s: ChaosSettings, topics: list[str]) -> str | None:
    """The topic the worker pool shares (it has a dead-letter policy), if there is a pool."""
    return topics[0] if s.pool and topics else None


def worker_specs(s: ChaosSettings, url: str, topics: list[str], workdir: Path) -> list[WorkerSpec]:
    specs: list[WorkerSpec] = []
    flavours = [f for f in s.flavours if f != "asyncio" or asyncio_available()] or ["trio"]
    for i in range(s.producers):
        name = f"prod-{i}"
        specs.append(WorkerSpec(
            index=len(specs), role="producer", name=name, flavour=flavours[i % len(flavours)],
            url=url, topics=tuple(topics), seed=s.seed, out=str(workdir / f"{name}.jsonl"),
            request_timeout=s.request_timeout, retry_deadline=s.retry_deadline, rate=s.rate))
    for i in range(s.subscribers):
        name = f"sub-{i}"
        strict = i == 2  # the third subscriber runs strict mode (max_in_flight 1)
        specs.append(WorkerSpec(
            index=len(specs), role="subscriber", name=name,
            flavour=flavours[(i + 1) % len(flavours)] if i < 2 else "trio", url=url,
            topics=tuple(topics), seed=s.seed, out=str(workdir / f"{name}.jsonl"),
            request_timeout=s.request_timeout, retry_deadline=s.retry_deadline,
            max_in_flight=1 if strict else None, prefetch=1 if strict else None,
            slow_ack=s.slow_ack if i == 0 else 0.0, slow_ack_max=2.5,
            withhold=s.withhold if i == 1 else 0.0))
    for i in range(s.pool if topics else 0):
        name = f"pool-{i}"
        specs.append(WorkerSpec(
            index=len(specs), role="member", name=name, flavour=flavours[i % len(flavours)],
            url=url, topics=(topics[0],), seed=s.seed, out=str(workdir / f"{name}.jsonl"),
            request_timeout=s.request_timeout, retry_deadline=s.retry_deadline,
            max_in_flight=4, slow_ack=s.slow_ack, slow_ack_max=2.5, pool="pool"))
    pool = pool_topic(s, topics)
    if pool is not None:  # every push subscription of the pool's topic dead-letters (G11)
        dead = tuple(dead_letter_topic(pool, w.subscription(pool)) for w in specs
                     if w.role in ("subscriber", "member") and pool in w.topics)
        first = next(i for i, w in enumerate(specs) if w.role == "member")
        specs[first] = dataclasses.replace(specs[first], read_dead=tuple(dict.fromkeys(dead)))
    for i in range(s.pullers):
        name = f"pull-{i}"
        specs.append(WorkerSpec(
            index=len(specs), role="puller", name=name, flavour=flavours[i % len(flavours)],
            url=url, topics=tuple(topics), seed=s.seed, out=str(workdir / f"{name}.jsonl"),
            request_timeout=s.request_timeout, retry_deadline=s.retry_deadline))
    return specs


class _Workers:
    def __init__(self, group: ProcessGroup, specs: list[WorkerSpec], log: IO[bytes]) -> None:
        self.group = group
        self.specs = specs
        self.log = log
        self.processes: list[trio.Process] = []
        self.lines: list[list[str]] = []
        self.stopping = False
        self.crashes: list[str] = []   # workers that exited before they were stopped

    async def start(self, nursery: trio.Nursery) -> None:
        for spec in self.specs:
            process = await self.group.spawn(
                [sys.executable, "-m", "chaos.worker", "--spec", spec.to_json()],
                stdout=subprocess.PIPE, stderr=self.log)
            lines: list[str] = []
            assert process.stdout is not None
            nursery.start_soon(read_lines, process.stdout, lines)
            nursery.start_soon(self._watch, spec, process)
            self.processes.append(process)
            self.lines.append(lines)

    async def _watch(self, spec: WorkerSpec, process: trio.Process) -> None:
        status = await process.wait()
        if not self.stopping:
            self.crashes.append(f"client {spec.name} ({spec.flavour}) exited with status"
                                f" {status} before the end (see workers.log)")

    async def wait_ready(self) -> None:
        with trio.move_on_after(READY_TIMEOUT):
            while not all(any('"ready"' in line for line in lines) for lines in self.lines):
                for spec, process in zip(self.specs, self.processes, strict=True):
                    if process.poll() is not None:
                        raise RuntimeError(f"worker {spec.name} exited ({process.returncode})")
                await trio.sleep(0.05)
            return
        raise RuntimeError("workers did not connect in time")

    def signal(self, signum: int) -> None:
        for process in self.processes:
            if process.returncode is None:
                process.send_signal(signum)

    async def stop(self) -> None:
        self.stopping = True
        self.signal(signal.SIGTERM)
        with trio.move_on_after(WORKER_STOP_TIMEOUT):
            for process in self.processes:
                await process.wait()
        for process in self.processes:
            if process.returncode is None:
                process.kill()


async def run(s: ChaosSettings, workdir: Path, say: Any = print) -> RunOutput:
    """Run the whole schedule; every process started is stopped before this returns."""
    rng = random.Random(f"chaos:{s.seed}")
    plan = draw_schedule(rng, s.mix, s.faults, s.duration, SHARDS)
    ports = free_ports(1 + 2 * SHARDS)
    router_port, shard_ports, proxy_ports = ports[0], ports[1:1 + SHARDS], ports[1 + SHARDS:]
    storage = pick_topics(s.topics, SHARDS, s.storage)
    topics = list(storage)
    url = f"flux://127.0.0.1:{router_port}"
    tls_settings: list[str] = []
    tls_context = None
    if s.tls:  # a throwaway CA; the workers find it in the URL
        (workdir / "tls").mkdir(parents=True, exist_ok=True)
        pki = throwaway_pki(str(workdir / "tls"))
        tls_settings = [f"tls.cert={pki['cert']}", f"tls.key={pki['key']}"]
        url = f"flux+tls://127.0.0.1:{router_port}?ca={pki['ca']}"
        tls_context = client_context(url)
    specs = worker_specs(s, url, topics, workdir)
    history = h.History()
    data_dir = None if s.storage == "memory" else (workdir / "data").resolve()
    out = RunOutput(s, workdir, topics, specs, plan, [], history, storage=storage,
                    data_dir=data_dir)
    if "asyncio" in s.flavours and not asyncio_available():
        out.notes.append("flux.client.asyncio is not available: every worker ran the trio client")
    group = ProcessGroup(budget=s.warmup + s.duration + s.liveness + RUN_SLACK)
    cluster = Cluster(group, workdir, port=router_port, shard_ports=shard_ports,
                      proxy_ports=proxy_ports, settings=[*s.settings, *tls_settings],
                      plant=s.plant, tls=tls_context,
                      extra_args=s.serve_args(data_dir, pool_topic(s, topics)))
    proxies = [ShardProxy(i, proxy_ports[i], shard_ports[i]) for i in range(SHARDS)]
    executor: FaultExecutor | None = None
    worker_crashes: list[str] = []

    def phase(name: str) -> None:
        t = monotonic()
        out.phases[name] = t
        history.add(h.Phase(t, name))
        say(f"chaos: phase {name}")

    await group.start()
    try:
        with open(workdir / "workers.log", "ab") as worker_log:
            async with trio.open_nursery() as nursery:
                for proxy in proxies:
                    await nursery.start(proxy.run)
                phase("start")
                await cluster.start_router(nursery)
                say(f"chaos: broker on {url}, shards {shard_ports} behind proxies {proxy_ports}")
                workers = _Workers(group, specs, worker_log)
                worker_crashes = workers.crashes
                await workers.start(nursery)
                await workers.wait_ready()
                await trio.sleep(s.warmup)
                executor = FaultExecutor(cluster, proxies, history, nursery)
                phase("faults")
                say(f"chaos: {len(plan)} faults over {s.duration:g}s (seed {s.seed})")
                await executor.run(plan, monotonic())
                await executor.heal()
                await _wait_registered(cluster)
                phase("heal")
                workers.signal(signal.SIGUSR1)
                await trio.sleep(s.liveness)
                phase("end")
                await workers.stop()
                out.killed_at_stop = await cluster.stop()
                nursery.cancel_scope.cancel()
    finally:
        if executor is not None:
            executor.resume_all()
            out.faults = executor.records
        cluster.kill_shards()
        group.kill_all()
        with trio.CancelScope(shield=True):
            await group.reap()
        if data_dir is not None and not s.keep_data:
            remove_data_dir(data_dir, workdir)
    out.routers_started = cluster.routers_started
    out.crashes = cluster.crashes + worker_crashes
    out.proxy_stats = [vars(p.stats) for p in proxies]
    return out


async def _wait_registered(cluster: Cluster) -> None:
    with trio.move_on_after(HEAL_TIMEOUT):
        while not await cluster.all_registered():
            await trio.sleep(0.2)
        return
    raise RuntimeError("the broker did not recover after the heal: shards not registered")


def remove_data_dir(data_dir: Path, workdir: Path) -> None:
    """Remove the run's data directory once every broker process is gone; only ever a
    directory inside the run's own results directory."""
    if data_dir.resolve().parent != workdir.resolve():
        raise RuntimeError(f"refusing to remove {data_dir}: not inside {workdir}")
    shutil.rmtree(data_dir, ignore_errors=True)


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
