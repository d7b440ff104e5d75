"""The brokers a bench runs against: Flux, NATS (core and JetStream) and Redis.

Each is started on free loopback ports with a temporary directory and a pinned,
printed configuration, and stopped at the end. NATS and Redis come from Debian's
``nats-server`` and ``redis-server`` packages, installed with apt-get when missing.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from flux.bench.measure import free_port

START_TIMEOUT = 30.0

# Flux settings pinned for every bench run. A short ttl and cleanup interval keep
# held messages from filling topic.max_bytes at full speed; the dedup window is
# short for the same reason (clients stop retrying at retry_deadline, well before).
FLUX_SETTINGS: dict[str, Any] = {
    "message.ttl": 1,
    "message.cleanup_time": 0.5,
    "message.dedup_window": 10,
    "topic.max_bytes": 8 << 30,
    "topic.buffer": 1024,
    "subscriber.max_in_flight": 1000,
    "subscriber.timeout": 30,
}
FLUX_CLIENT = {"retry_deadline": 5.0, "prefetch": 1000}
NATS_SETTINGS = {"jetstream": "memory storage", "duplicate_window": "10s", "ack_policy": "explicit",
                 "max_ack_pending": 1000, "max_pending (client)": "unbounded"}
REDIS_SETTINGS = {"save": "''", "appendonly": "no", "stream": "XADD (no trim), XREADGROUP COUNT 256",
                  "acks": "XACK per batch read"}


class BenchError(Exception):
    """The bench cannot run a system (not installed, would not start)."""


@dataclass
class Broker:
    """A started broker: where clients go, and the pids whose CPU and memory count."""

    name: str
    url: str
    pids: list[int]
    process: subprocess.Popen[bytes]
    settings: dict[str, Any]
    version: str = ""
    tmpdir: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def stop(self) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after 10 s) and remove its directory."""
        proc = self.process
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pid in self.pids:  # flux shards: their router drains them; make sure
            if pid != proc.pid:
                _wait_gone(pid, 10.0)
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def start_flux(shards: int, settings: dict[str, Any] | None = None) -> Broker:
    """``flux serve --shards N --port 0`` with :data:`FLUX_SETTINGS` (plus ``settings``)."""
    pinned = {**FLUX_SETTINGS, **(settings or {})}
    args = [sys.executable, "-m", "flux", "serve", "--shards", str(shards), "--port", "0"]
    for key, value in pinned.items():
        args += ["--set", f"{key}={value}"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    assert proc.stdout is not None
    url, pids = "", list[int]()
    deadline = time.monotonic() + START_TIMEOUT
    try:
        while len(pids) < shards:
            if time.monotonic() > deadline:
                raise BenchError("flux serve did not announce its shards in time")
            line = proc.stdout.readline().decode()
            if not line:
                raise BenchError(f"flux serve exited with status {proc.wait()}")
            if m := re.match(r"flux: router listening on (\S+) with", line):
                url = f"flux://{m.group(1)}"
            elif m := re.match(r"flux: shard \d+ listening on \S+ \(pid (\d+),", line):
                pids.append(int(m.group(1)))
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return Broker("flux", url, pids, proc, pinned, version=_flux_version())


def _flux_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("flux")
    except PackageNotFoundError:
        return "dev"


_MODULES = {"matplotlib": "matplotlib", "nats-py": "nats", "redis": "redis"}


def ensure_python_packages(names: list[str]) -> None:
    """Install the ``bench`` extra's packages with pip when they are missing.

    Raises BenchError if pip fails.
    """
    import importlib.util

    missing = [n for n in names if importlib.util.find_spec(_MODULES.get(n, n)) is None]
    if not missing:
        return
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                           "--disable-pip-version-check", *missing],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if done.returncode != 0:
        raise BenchError(f"pip install {' '.join(missing)} failed (the bench extra:"
                         f" pip install 'flux[bench]'): {done.stderr.decode()[-300:]}")
    importlib.invalidate_caches()


_apt_updated = [False]


def ensure_debian_package(binary: str, package: str) -> str:
    """The path of ``binary``, installing Debian's ``package`` with apt-get if it is missing.

    Raises BenchError if it is missing and cannot be installed (not root, no apt-get).
    """
    path = shutil.which(binary) or next(
        (p for p in (f"/usr/sbin/{binary}", f"/usr/bin/{binary}") if os.path.exists(p)), None)
    if path:
        return path
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        raise BenchError(f"{binary} is not installed; install the Debian package {package}"
                         " (apt-get install -y " + package + ")")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if not _apt_updated[0]:
        subprocess.run(["apt-get", "update", "-q"], env=env, check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _apt_updated[0] = True
    done = subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", package],
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    path = shutil.which(binary) or next(
        (p for p in (f"/usr/sbin/{binary}", f"/usr/bin/{binary}") if os.path.exists(p)), None)
    if done.returncode != 0 or path is None:
        raise BenchError(f"apt-get install {package} failed: {done.stderr.decode()[-300:]}")
    return path


def _version_of(args: list[str]) -> str:
    try:
        out = subprocess.run(args, capture_output=True, timeout=10).stdout.decode()
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    m = re.search(r"v?(\d+\.\d+\.\d+)", out)
    return m.group(1) if m else out.strip()[:40]


def _wait_listening(port: int, proc: subprocess.Popen[bytes], name: str) -> None:
    import socket

    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"{name} exited with status {proc.returncode} at start")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    proc.kill()
    raise BenchError(f"{name} did not listen on port {port} in time")


def start_nats() -> Broker:
    """nats-server with JetStream (used for both NATS core and JetStream figures)."""
    binary = ensure_debian_package("nats-server", "nats-server")
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="flux-bench-nats-")
    proc = subprocess.Popen([binary, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", tmp],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_listening(port, proc, "nats-server")
    except BaseException:
        proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Broker("nats", f"nats://127.0.0.1:{port}", [proc.pid], proc,
                  {"args": f"-a 127.0.0.1 -p {port} -js -sd TMP", **NATS_SETTINGS},
                  version=_version_of([binary, "--version"]), tmpdir=tmp)


def start_redis() -> Broker:
    """redis-server with persistence off, on a free port and a temporary directory."""
    binary = ensure_debian_package("redis-server", "redis-server")
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="flux-bench-redis-")
    proc = subprocess.Popen([binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                             "--appendonly", "no", "--dir", tmp],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_listening(port, proc, "redis-server")
    except BaseException:
        proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Broker("redis", f"redis://127.0.0.1:{port}", [proc.pid], proc,
                  {"args": f"--bind 127.0.0.1 --port {port} --save '' --appendonly no",
                   **REDIS_SETTINGS},
                  version=_version_of([binary, "--version"]), tmpdir=tmp)
