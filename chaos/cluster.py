"""The processes of a chaos run: ``flux serve`` (restartable), its shards, the workers.

Every process the runner starts joins one process group, led by an idle
placeholder process, so one ``killpg`` ends them all whatever happened. Shards are
the router's children in sessions of their own: :class:`Cluster` learns each pid
(router STATS, the router's adoption state file) and kills survivors by pid.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import ssl
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import trio

from flux import protocol
from flux.router.launcher import is_shard_process, pid_alive

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT = 40.0       # seconds a router may take to print its banner
STOP_TIMEOUT = 25.0        # seconds a drained router may take to exit
STATS_TIMEOUT = 2.0
ROUTER_LINE = re.compile(r"^flux: router listening on (\S+):(\d+) with (\d+) shards$")
SHARD_LINE = re.compile(r"^flux: shard (\d+) listening on (\S+) \(pid (\d+), generation (0x[0-9a-f]+)\)")


# The group's leader: idle, but if the runner dies without cleaning up (SIGKILL) or the
# run outlives its budget, it kills the whole group (orphaned shards then exit after
# shard.orphan_timeout, as designed).
_LEADER = """
import os, signal, sys, time
parent, deadline = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
while os.getppid() == parent and time.monotonic() < deadline:
    time.sleep(0.5)
os.killpg(0, signal.SIGKILL)
"""


class ProcessGroup:
    """A process group that every child of the run joins (see the module docstring)."""

    def __init__(self, budget: float) -> None:
        self.budget = budget
        self.leader: trio.Process | None = None
        self.children: list[trio.Process] = []

    @property
    def pgid(self) -> int:
        assert self.leader is not None, "start() the group first"
        return self.leader.pid

    async def start(self) -> None:
        self.leader = await trio.lowlevel.open_process(
            [sys.executable, "-c", _LEADER, str(os.getpid()), str(self.budget)],
            process_group=0, stdin=subprocess.DEVNULL)

    async def spawn(self, args: list[str], **options: Any) -> trio.Process:
        process = await trio.lowlevel.open_process(args, process_group=self.pgid, cwd=ROOT,
                                                   stdin=subprocess.DEVNULL, **options)
        self.children.append(process)
        return process

    def kill_all(self) -> None:
        """SIGKILL every process still in the group (the leader included)."""
        if self.leader is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, signal.SIGKILL)

    async def reap(self) -> None:
        """Wait for every child (after :meth:`kill_all` this is quick)."""
        with trio.move_on_after(10):
            for process in [*self.children, *([self.leader] if self.leader else [])]:
                await process.wait()


async def read_lines(stream: trio.abc.ReceiveStream, into: list[str]) -> None:
    """Append each line of ``stream`` to ``into`` until it closes."""
    buffer = b""
    while True:
        try:
            data = await stream.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        if not data:
            return
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        into.extend(line.decode(errors="replace") for line in lines)


@dataclass
class RouterRun:
    """One ``flux serve`` process and what it printed."""

    process: trio.Process
    lines: list[str] = field(default_factory=list)
    shard_pids: dict[int, int] = field(default_factory=dict)
    stopping: bool = False      # killed or stopped by the runner: its exit is expected


class Cluster:
    """``flux serve --shards N`` on 127.0.0.1:``port``, its shards on ``shard_ports``,
    advertised as ``proxy_ports`` (the fault proxy); ``extra_args`` go last (storage).
    A restarted router gets the same arguments, so its shards reuse the data directory."""

    def __init__(self, group: ProcessGroup, workdir: Path, *, port: int, shard_ports: list[int],
                 proxy_ports: list[int], settings: list[str], plant: str | None,
                 extra_args: list[str] | None = None,
                 tls: ssl.SSLContext | None = None,
                 hello: dict[str, Any] | None = None) -> None:
        self.group = group
        self.tls = tls  # the router's public port speaks TLS (its STATS too)
        self.hello = hello  # credential fields of a HELLO before STATS (a broker with auth)
        self.workdir = workdir
        self.port = port
        self.shard_ports = shard_ports
        self.proxy_ports = proxy_ports
        self.settings = settings
        self.extra_args = list(extra_args or [])   # e.g. the run's storage (--data-dir)
        self.runtime = workdir / "run"
        self.runtime.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ, FLUX_RUNTIME_DIR=str(self.runtime), PYTHONUNBUFFERED="1")
        if plant:
            # read only by chaos/planted/sitecustomize.py, in the broker's processes
            self.env["CHAOS_PLANT"] = plant
            self.env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(ROOT / "chaos" / "planted"), str(ROOT), self.env.get("PYTHONPATH"))
                if p)
        self.router: RouterRun | None = None
        self.pids: dict[int, set[int]] = {i: set() for i in range(len(shard_ports))}
        self.routers_started = 0
        self.crashes: list[str] = []   # routers that exited when nobody stopped them
        self._log: IO[bytes] | None = None

    @property
    def shard_count(self) -> int:
        return len(self.shard_ports)

    def args(self) -> list[str]:
        args = [sys.executable, "-m", "flux", "serve", "--host", "127.0.0.1",
                "--shards", str(self.shard_count), "--port", str(self.port),
                "--set", f"shard.ports={json.dumps(self.shard_ports)}",
                "--set", "shard.advertise="
                + json.dumps([f"127.0.0.1:{p}" for p in self.proxy_ports])]
        for item in self.settings:
            args += ["--set", item]
        return args + self.extra_args

    @property
    def router_alive(self) -> bool:
        return self.router is not None and self.router.process.returncode is None

    async def start_router(self, nursery: trio.Nursery) -> RouterRun:
        """Start ``flux serve`` and wait for its banner. Raises RuntimeError if it fails."""
        if self._log is None:
            self._log = open(self.workdir / "broker.log", "ab")  # noqa: SIM115
        process = await self.group.spawn(self.args(), env=self.env, stdout=subprocess.PIPE,
                                         stderr=self._log)
        run = RouterRun(process)
        self.router = run
        self.routers_started += 1
        assert process.stdout is not None
        nursery.start_soon(read_lines, process.stdout, run.lines)
        nursery.start_soon(self._watch, run)
        with trio.move_on_after(START_TIMEOUT):
            while True:
                banner = self._parse_banner(run)
                if banner:
                    return run
                if process.returncode is not None or process.poll() is not None:
                    break
                await trio.sleep(0.02)
        raise RuntimeError(f"flux serve did not start (status {process.poll()}); see "
                           f"{self.workdir / 'broker.log'}; stdout: {run.lines}")

    async def _watch(self, run: RouterRun) -> None:
        status = await run.process.wait()
        if not run.stopping:
            self.crashes.append(f"router pid {run.process.pid} exited with status {status}")

    def _parse_banner(self, run: RouterRun) -> bool:
        if not run.lines or not ROUTER_LINE.match(run.lines[0]):
            return False
        for line in run.lines[1:]:
            found = SHARD_LINE.match(line)
            if found:
                index, pid = int(found.group(1)), int(found.group(3))
                run.shard_pids[index] = pid
                self.pids[index].add(pid)
        return len(run.shard_pids) == self.shard_count or any(
            "not registered" in line for line in run.lines)

    def kill_router(self) -> None:
        if self.router is not None:
            self.router.stopping = True
            with contextlib.suppress(ProcessLookupError):
                self.router.process.kill()

    async def wait_router_dead(self) -> None:
        if self.router is not None:
            await self.router.process.wait()

    async def stats(self) -> dict[str, Any] | None:
        """The router's STATS reply, or None if it cannot be had quickly."""
        if not self.router_alive:
            return None
        with trio.move_on_after(STATS_TIMEOUT):
            try:
                stream: trio.abc.Stream = await trio.open_tcp_stream("127.0.0.1", self.port)
                if self.tls is not None:
                    stream = trio.SSLStream(stream, self.tls, server_hostname="127.0.0.1")
                    await stream.do_handshake()
            except (OSError, trio.BrokenResourceError):
                return None
            async with stream:
                try:
                    hello = b""
                    if self.hello is not None:
                        hello = protocol.encode([protocol.HELLO, 2, {
                            "version": protocol.VERSION, "role": "client", **self.hello}])
                    await stream.send_all(hello + protocol.encode([protocol.STATS, 1]))
                    decoder = protocol.FrameDecoder()
                    while True:
                        data = await stream.receive_some(65536)
                        if not data:
                            return None
                        for frame in decoder.feed(data):
                            if frame[0] == protocol.STATS_OK:
                                reply: dict[str, Any] = frame[2]
                                self._note(reply)
                                return reply
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    return None
        return None

    def _note(self, stats: dict[str, Any]) -> None:
        for shard in stats.get("shards", []):
            if isinstance(shard.get("pid"), int):
                self.pids[shard["index"]].add(shard["pid"])

    def _state_file_pids(self) -> dict[int, int]:
        path = self.runtime / f"router-127.0.0.1-{self.port}.json"
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        out = {}
        for entry in state.get("shards", []):
            if isinstance(entry, dict) and isinstance(entry.get("pid"), int):
                out[entry["index"]] = entry["pid"]
                self.pids[entry["index"]].add(entry["pid"])
        return out

    async def shard_pid(self, index: int) -> int | None:
        """The running process serving shard ``index`` (None: none right now)."""
        stats = await self.stats()
        if stats is not None:
            pid = next((s["pid"] for s in stats["shards"] if s["index"] == index), None)
        else:
            pid = self._state_file_pids().get(index)
        if isinstance(pid, int) and pid_alive(pid) and is_shard_process(pid, index):
            return pid
        return None

    async def shard_generation(self, index: int) -> tuple[int | None, bool]:
        """(generation, registered) of shard ``index`` as the router sees it."""
        stats = await self.stats()
        if stats is None:
            return None, False
        for shard in stats["shards"]:
            if shard["index"] == index:
                return shard.get("generation"), bool(shard.get("registered"))
        return None, False

    async def all_registered(self) -> bool:
        stats = await self.stats()
        return stats is not None and all(s.get("registered") for s in stats["shards"])

    async def stop(self) -> list[int]:
        """SIGTERM the router (it drains its shards), then SIGKILL every shard process
        left; returns the pids that had to be killed."""
        router = self.router
        if router is not None and router.process.returncode is None:
            router.stopping = True
            await self.stats()
            with contextlib.suppress(ProcessLookupError):
                router.process.send_signal(signal.SIGTERM)
            with trio.move_on_after(STOP_TIMEOUT):
                await router.process.wait()
            if router.process.returncode is None:
                router.process.kill()
                await router.process.wait()
        killed = self.kill_shards()
        if self._log is not None:
            self._log.close()
            self._log = None
        return killed

    def kill_shards(self) -> list[int]:
        """SIGKILL every shard process of this run still alive (sync: usable in a finally)."""
        self._state_file_pids()
        suspects = {(i, p) for i, pids in self.pids.items() for p in pids}
        suspects |= set(self._scan_proc())
        killed = []
        for index, pid in sorted(suspects):
            if pid_alive(pid) and is_shard_process(pid, index):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
        return killed

    def _scan_proc(self) -> list[tuple[int, int]]:
        """Shard processes whose spec names one of our ports (even if never reported)."""
        found = []
        marks = [f'"port": {p},'.encode() for p in self.shard_ports]
        with contextlib.suppress(OSError):
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                try:
                    cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"flux.shard" not in cmdline:
                    continue
                for index, mark in enumerate(marks):
                    if mark in cmdline:
                        found.append((index, int(entry)))
        return found
