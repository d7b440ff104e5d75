"""Shared fixtures: ``broker`` runs a real ``flux serve`` (router + 2 shard processes).

The broker listens on 127.0.0.1 with free ports and small timeouts. Teardown sends
SIGTERM and asserts that the router and every shard process it ever reported are
gone (bounded waits, SIGKILL as a last resort, which fails the test).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flux import protocol
from flux.router.launcher import pid_alive

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT = 30.0
STOP_TIMEOUT = 20.0
BROKER_SETTINGS = (
    "subscriber.heartbeat=1",
    "subscriber.timeout=2",
    "subscriber.retry_interval=0.2",
    "router.adopt_window=5",
    "shard.orphan_timeout=30",
)
ROUTER_LINE = re.compile(r"^flux: router listening on (\S+):(\d+) with (\d+) shards$")
SHARD_LINE = re.compile(
    r"^flux: shard (\d+) listening on (\S+) \(pid (\d+), generation (0x[0-9a-f]+)\)")


@dataclasses.dataclass
class ShardLine:
    index: int
    address: str
    pid: int
    generation: int


class RouterProcess:
    """One ``flux serve`` process and what it printed."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("ab") as err:
            self.proc = subprocess.Popen(args, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=err, text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stdout: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        self.port = 0
        self.shards: dict[int, ShardLine] = {}
        try:
            self._read_banner()
        except BaseException:
            self.proc.terminate()  # the router drains whatever shards it started
            try:
                self.proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            raise

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def next_line(self, deadline: float) -> str:
        try:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(
                f"flux serve printed nothing in time; log:\n{self.log_text()}") from None
        if line is None:
            raise AssertionError(f"flux serve exited ({self.proc.poll()}); log:\n{self.log_text()}")
        self.stdout.append(line)
        return line

    def _read_banner(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        match = ROUTER_LINE.match(self.next_line(deadline))
        assert match, self.stdout
        self.port, count = int(match.group(2)), int(match.group(3))
        while len(self.shards) < count:
            line = self.next_line(deadline)
            shard = SHARD_LINE.match(line)
            if shard:
                index = int(shard.group(1))
                self.shards[index] = ShardLine(index, shard.group(2), int(shard.group(3)),
                                               int(shard.group(4), 16))
            elif "not registered" in line:
                raise AssertionError(f"a shard did not start: {line}\n{self.log_text()}")

    def log_text(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text()[-6000:]
        return ""


class Broker:
    """A running broker: its router process (restartable) and every pid it reported."""

    def __init__(self, tmp: Path, shards: int = 2, settings: tuple[str, ...] = (),
                 config: Path | None = None, args: tuple[str, ...] = ()) -> None:
        self.tmp = tmp
        self.shard_count = shards
        self.settings = BROKER_SETTINGS + settings
        self.config = config
        self.args = args
        self.env = dict(os.environ, FLUX_RUNTIME_DIR=str(tmp / "run"), PYTHONUNBUFFERED="1")
        self.pids: set[int] = set()
        self.router: RouterProcess = self.start_router(0)

    @property
    def url(self) -> str:
        return f"flux://127.0.0.1:{self.router.port}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.router.port}"

    @property
    def shards(self) -> dict[int, ShardLine]:
        return self.router.shards

    def start_router(self, port: int) -> RouterProcess:
        args = [sys.executable, "-m", "flux", "serve", "--host", "127.0.0.1",
                "--shards", str(self.shard_count), "--port", str(port)]
        if self.config is not None:
            args += ["--config", str(self.config)]
        args += self.args
        for item in self.settings:
            args += ["--set", item]
        router = RouterProcess(args, self.env, self.tmp / "broker.log")
        self.pids.add(router.proc.pid)
        self.pids.update(s.pid for s in router.shards.values())
        return router

    def kill_router(self) -> None:
        """SIGKILL the router (its shards keep running) and reap it."""
        self.router.proc.kill()
        self.router.proc.wait(timeout=STOP_TIMEOUT)

    def restart_router(self) -> RouterProcess:
        """Start a new router on the same public port (after kill_router)."""
        self.router = self.start_router(self.router.port)
        return self.router

    def stats(self) -> dict[str, Any]:
        """The router's STATS (shard pids, generations, restarts), over a plain socket."""
        with socket.create_connection(("127.0.0.1", self.router.port), timeout=10) as sock:
            sock.sendall(protocol.encode([protocol.STATS, 1]))
            decoder = protocol.FrameDecoder()
            while True:
                data = sock.recv(65536)
                assert data, "router closed the connection"
                frames = decoder.feed(data)
                if frames:
                    assert frames[0][0] == protocol.STATS_OK, frames[0]
                    reply: dict[str, Any] = frames[0][2]
                    return reply

    def note_pids(self) -> None:
        with contextlib.suppress(OSError, AssertionError):
            self.pids.update(s["pid"] for s in self.stats()["shards"] if s["pid"])

    def stop(self) -> int:
        """SIGTERM the router and wait for it; returns its exit status."""
        self.note_pids()
        proc = self.router.proc
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT)
            raise AssertionError(
                f"flux serve ignored SIGTERM; log:\n{self.router.log_text()}") from None

    def assert_all_gone(self) -> None:
        """Every process the broker ever reported has exited (SIGKILL survivors, then fail)."""
        deadline = time.monotonic() + STOP_TIMEOUT
        alive = sorted(p for p in self.pids if pid_alive(p))
        while alive and time.monotonic() < deadline:
            time.sleep(0.05)
            alive = [p for p in alive if pid_alive(p)]
        for pid in alive:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        assert not alive, f"processes left behind: {alive}\n{self.router.log_text()}"


class BrokerFactory:
    """Starts brokers with extra ``--set`` settings; stops and checks each on teardown."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.brokers: list[Broker] = []

    def __call__(self, *settings: str, shards: int = 2, config: str | None = None,
                 args: tuple[str, ...] = ()) -> Broker:
        """``settings``: ``--set`` items; ``config``: the text of a config file to serve with;
        ``args``: more command-line arguments (``--data-dir DIR``)."""
        tmp = self.tmp / f"broker{len(self.brokers)}"
        tmp.mkdir()
        path = None
        if config is not None:
            path = tmp / "flux.yaml"
            path.write_text(config)
        broker = Broker(tmp, shards, settings, path, args)
        self.brokers.append(broker)
        return broker

    def close(self) -> None:
        failures: list[BaseException] = []
        for broker in self.brokers:
            for step in (broker.stop, broker.assert_all_gone):
                try:
                    step()
                except BaseException as exc:
                    failures.append(exc)
        if failures:
            raise failures[0]


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[BrokerFactory]:
    """Call it with ``--set`` items to start a ``flux serve``; each is stopped and checked."""
    factory = BrokerFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture
def broker(broker_factory: BrokerFactory) -> Broker:
    """A running ``flux serve --shards 2`` on 127.0.0.1; stopped and checked on teardown."""
    return broker_factory()
