"""The seams between broker code and the world: clock, network, randomness, disk.

Router, shard and client code reach the outside only through a :class:`Host`.
:class:`RealHost` uses trio's clock and TCP and seeds its randomness from
``os.urandom``; the simulator (``flux.sim``) provides a host with a fake network,
a seeded ``random.Random`` and a pause gate. No broker module calls
``time.time()``, ``time.monotonic()`` or the global ``random`` directly.

Storage is a seam too: :class:`Disk` and :class:`DiskFile`, with :class:`RealDisk`
(``os`` calls; fsync, and the ``a``-methods' writes and reads, in worker threads)
here and ``flux.sim.disk.SimDisk`` in the simulator. No other module opens, writes
or syncs a file for the broker.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import random
import secrets
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import trio

StreamHandler = Callable[[trio.abc.Stream], Awaitable[None]]
T = TypeVar("T")
SLOW_THREADS = 2   # worker threads one process gives run_slow at once
_ZEROS = bytes(1 << 20)   # what RealDiskFile writes ahead with (awrite_at's fill_to)


class Host(Protocol):
    """What a router, shard or client may use of the outside world."""

    name: str
    random: random.Random
    disk: Disk  # the file system disk topics keep their logs on
    # a directory (reached through ``disk``) on another file system than the data, that
    # outlives a process but need not outlive a reboot: where a log leaves the marker of
    # a failed fsync when its own directory takes no new file (G9)
    runtime_dir: str

    def now(self) -> float:
        """Seconds on the monotonic clock (trio's clock; fake in the simulator)."""
        ...

    def wall_time(self) -> float:
        """Seconds since the Unix epoch, for message timestamps only."""
        ...

    def token_bytes(self, n: int) -> bytes:
        """``n`` unpredictable bytes for secrets and nonces (from the OS in production;
        from the run's seed in the simulator, so a run replays)."""
        ...

    async def sleep_until(self, deadline: float) -> None:
        """Sleep until ``now() >= deadline``."""
        ...

    async def run_slow(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` for CPU-heavy work (a password hash) without stalling the loop:
        in a worker thread in production (``SLOW_THREADS`` at once), directly in the
        simulator."""
        ...

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        """Open a stream to ``host:port``; raises OSError when refused or unreachable."""
        ...

    def try_send(self, stream: trio.abc.Stream, data: bytes) -> int:
        """Send what of ``data`` can go at once on ``stream`` without waiting; returns
        the count (0 when it would wait, or on any error: the next ``send_all`` on the
        stream reports it). Only while no ``send_all`` on the stream is in progress."""
        ...

    async def serve(self, host: str, port: int, handler: StreamHandler, *,
                    task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Accept connections on ``host:port`` forever, running ``handler`` per stream.

        Reports the bound port through ``task_status.started(port)``.
        """
        ...


def runtime_dir() -> Path:
    """``$FLUX_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/flux``, else a per-user temp dir."""
    explicit = os.environ.get("FLUX_RUNTIME_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and Path(xdg).is_dir():
        return Path(xdg) / "flux"
    return Path(tempfile.gettempdir()) / f"flux-{os.getuid()}"


def wall_clock() -> float:
    """The one place Flux reads the wall clock."""
    return time.time()  # seam-ok: the host's wall-time seam itself


class RealHost:
    """The production host: trio's clock and TCP, randomness from ``os.urandom``."""

    def __init__(self, name: str = "flux", seed: int | None = None) -> None:
        self.name = name
        self.random = random.Random(seed if seed is not None else os.urandom(16))
        self.disk: Disk = RealDisk()
        self.runtime_dir = str(runtime_dir())
        self._slow: trio.CapacityLimiter | None = None

    def now(self) -> float:
        return trio.current_time()

    def wall_time(self) -> float:
        return wall_clock()

    def token_bytes(self, n: int) -> bytes:
        return secrets.token_bytes(n)

    async def sleep_until(self, deadline: float) -> None:
        await trio.sleep_until(deadline)

    async def run_slow(self, fn: Callable[..., T], *args: Any) -> T:
        if self._slow is None:
            self._slow = trio.CapacityLimiter(SLOW_THREADS)
        return await trio.to_thread.run_sync(fn, *args, limiter=self._slow)

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        stream = await trio.open_tcp_stream(host, port)
        _nodelay(stream)
        return stream

    def try_send(self, stream: trio.abc.Stream, data: bytes) -> int:
        sock = getattr(stream, "socket", None)  # a trio.SocketStream (non-blocking socket)
        if sock is None:
            return 0
        try:
            return os.write(sock.fileno(), data)
        except OSError:  # full (BlockingIOError), or broken: send_all will say how
            return 0

    async def serve(self, host: str, port: int, handler: StreamHandler, *,
                    task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound = listeners[0].socket.getsockname()[1]

        async def wrapped(stream: trio.SocketStream) -> None:
            _nodelay(stream)
            await handler(stream)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, wrapped, listeners)
            task_status.started(bound)


def _nodelay(stream: Any) -> None:
    sock = getattr(stream, "socket", None)
    if sock is not None:
        import socket

        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class ShardProcess(Protocol):
    """A running shard as its launcher sees it (an OS process, or a task in the simulator)."""

    index: int
    pid: int

    async def wait(self) -> int:
        """Return the exit status once the shard has exited."""
        ...

    def kill(self) -> None:
        """Stop it at once (SIGKILL, or a simulated crash)."""
        ...

    def terminate(self) -> None:
        """Ask it to drain and exit (SIGTERM)."""
        ...


class Launcher(Protocol):
    """How the router starts and watches shards (DESIGN.md §3, seam 4)."""

    async def launch(self, spec: ShardSpec) -> ShardProcess:
        """Start shard ``spec.index``; returns once it is started (not yet registered)."""
        ...

    def adopt(self, index: int, pid: int) -> ShardProcess:
        """Watch a shard that a previous router started (it registered with ``pid``)."""
        ...


@dataclasses.dataclass(frozen=True)
class ShardSpec:
    """Everything a shard needs to start: the config and its place in the shard map."""

    index: int
    shard_count: int
    port: int                 # where the shard listens (0: any free port)
    control: str              # host:port of the router's control listener
    advertise: str | None     # the address clients should use, if not host:port
    config: dict[str, Any]    # Config.to_dict() of the broker
    cpu: int | None = None    # CPU to pin the shard to, if the OS allows
    # the broker's secret (flux.control_proof): never on a command line
    secret: str = dataclasses.field(default="", repr=False)


class SyncFailed(OSError):
    """The fsync of :meth:`DiskFile.aappend` with ``sync`` failed; the data was written."""


class DiskFile(Protocol):
    """An open file of the log: appends at its end, positional writes and reads, fsync off the loop.

    Every method raises OSError on an I/O error (``ENOSPC`` when the disk is full,
    ``EIO``, ``EBADF`` once closed or once the process that opened it is gone).
    """

    path: str

    def size(self) -> int:
        """The file's length in bytes as the page cache sees it (written, synced or not)."""
        ...

    def append(self, data: bytes) -> None:
        """Write all of ``data`` at the end of the file (``write(2)`` until done).

        On an error some prefix of ``data`` may have been written: the caller
        truncates back to the length it knew.
        """
        ...

    async def aappend(self, data: bytes, *, sync: bool = False) -> None:
        """:meth:`append` without blocking the event loop (a worker thread): a write
        may wait on the kernel's writeback or the file system's journal. With ``sync``,
        then :meth:`sync`, in the same call; its error is raised as :class:`SyncFailed`
        (``data`` was written)."""
        ...

    def write_at(self, offset: int, data: bytes) -> None:
        """Write all of ``data`` at file offset ``offset`` (over what is there, or past the
        end: a gap reads as zeros). On an error some prefix may have been written."""
        ...

    async def awrite_at(self, offset: int, data: bytes, *, sync: bool = False,
                        fill_to: int = 0,
                        on_written: Callable[[], None] | None = None) -> None:
        """:meth:`write_at` in a worker thread. ``fill_to``: then write zeros from the
        file's end (or the end of ``data``, if later) up to that length, best effort (an
        error there leaves the file shorter, nothing else): space written ahead, so that
        a later write there changes no file metadata and its fsync needs no journal
        commit. With ``sync``, then make ``data`` and the zeros durable (``fdatasync``:
        the data and what reading it back needs, the file's length included; not its
        times), in the same call; its error is raised as :class:`SyncFailed`.
        ``on_written`` is called on the event loop once the writes took, while the
        fsync may still run (never if a write failed). Never while another call on the
        same file object is under way: overlapping fsyncs use files of their own
        (:meth:`Disk.open` again), so that each one learns of a write-back error (Linux
        reports one to each open file once)."""
        ...

    def read_at(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes from ``offset`` (fewer only at the end of the file)."""
        ...

    def read_into(self, offset: int, buffer: bytearray | memoryview) -> int:
        """Read up to ``len(buffer)`` bytes from ``offset`` into ``buffer``; returns how
        many (fewer only at the end of the file). A scan reuses one buffer: a new one
        per read cost the kernel a page fault every 4 KiB of it."""
        ...

    async def aread_at(self, offset: int, length: int) -> bytes:
        """:meth:`read_at` without blocking the event loop (a worker thread): for large
        reads off the serving path (compaction), which may wait on the disk."""
        ...

    async def sync(self) -> None:
        """Make everything written so far durable (fsync), without blocking the event loop."""
        ...

    def truncate(self, length: int) -> None:
        """Cut the file to ``length`` bytes (durable only after the next ``sync``)."""
        ...

    def close(self) -> None:
        """Release the file; idempotent."""
        ...

    async def aclose(self) -> None:
        """:meth:`close` without blocking the event loop: closing the last descriptor of a
        removed or replaced file frees its blocks (~20-30 ms for a 64 MiB segment here)."""
        ...


class Disk(Protocol):
    """The file system as the storage engine sees it (DESIGN.md §3: storage is a seam).

    Paths are plain strings. Creating, renaming or removing a directory entry is
    durable only after :meth:`sync_dir` of its directory. Every method raises
    OSError as the OS would (``FileNotFoundError``, ``ENOSPC``, ``EIO``).
    """

    def open(self, path: str, *, create: bool = False) -> DiskFile:
        """Open ``path`` for reading and writing; ``create`` makes it if missing."""
        ...

    def exists(self, path: str) -> bool:
        """Whether a file or directory is at ``path``."""
        ...

    def listdir(self, path: str) -> list[str]:
        """The names in directory ``path``, sorted."""
        ...

    def makedirs(self, path: str) -> None:
        """Make directory ``path`` and its parents if missing."""
        ...

    def remove(self, path: str) -> None:
        """Remove the file at ``path``."""
        ...

    async def discard(self, path: str) -> None:
        """:meth:`remove` without blocking the event loop (unlinking a large file frees its
        blocks: ~20-30 ms for a 64 MiB segment here, longer on a busy disk)."""
        ...

    def rename(self, src: str, dst: str) -> None:
        """Rename ``src`` to ``dst``, replacing ``dst`` (atomic)."""
        ...

    async def sync_dir(self, path: str) -> None:
        """Make the entries of directory ``path`` durable (fsync of the directory)."""
        ...

    def read_ahead(self, path: str) -> None:
        """A hint: the file at ``path`` is about to be read through; the disk may start
        reading it into memory meanwhile (recovery). Never raises, never waits."""
        ...

    def free_bytes(self, path: str) -> int:
        """Bytes free for this process on the file system holding ``path``."""
        ...

    def boot_id(self) -> str:
        """An id of the machine's current boot: it changes when the machine restarts."""
        ...


class RealDisk:
    """The production disk: ``os`` calls; fsync and the files' ``a``-methods run in worker
    threads (the calls release the GIL)."""

    def open(self, path: str, *, create: bool = False) -> RealDiskFile:
        # not O_APPEND: Linux's pwrite(2) on an O_APPEND descriptor appends anyway
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        fd = os.open(path, flags, 0o644)  # seam-ok: the disk seam itself
        return RealDiskFile(path, fd)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(path))

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def remove(self, path: str) -> None:
        os.remove(path)

    async def discard(self, path: str) -> None:
        await trio.to_thread.run_sync(os.remove, path)  # seam-ok: the disk seam itself

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    async def sync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # seam-ok
        try:
            await trio.to_thread.run_sync(os.fsync, fd)  # seam-ok
        finally:
            os.close(fd)

    def read_ahead(self, path: str) -> None:
        # a thread reads the file through (into the page cache) while the caller checks
        # what it has read already; posix_fadvise(WILLNEED) read nothing ahead on the
        # ext4 measured. It owns its descriptor and ends at the end of the file.
        threading.Thread(target=_read_through, args=(path,), name="flux-read-ahead",
                         daemon=True).start()

    def free_bytes(self, path: str) -> int:
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize

    def boot_id(self) -> str:
        try:
            with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:  # seam-ok
                return f.read().strip()
        except OSError:  # not Linux: no way to tell a reboot, so never claim one
            return "unknown"


def _read_through(path: str, chunk: int = 4 << 20) -> None:
    """Read the file at ``path`` to its end, keeping nothing (``RealDisk.read_ahead``)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)  # seam-ok: the disk seam itself
        try:
            buf = bytearray(chunk)
            while os.readv(fd, [buf]):
                pass
        finally:
            os.close(fd)


class RealDiskFile:
    """One open file of :class:`RealDisk` (a file descriptor; appends seek to the end first)."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd = fd

    def _check(self) -> int:
        if self._fd < 0:
            raise OSError(errno.EBADF, "file is closed", self.path)
        return self._fd

    def size(self) -> int:
        return os.fstat(self._check()).st_size

    def append(self, data: bytes) -> None:
        fd = self._check()
        os.lseek(fd, 0, os.SEEK_END)
        view = memoryview(data)
        while view:
            n = os.write(fd, view)  # seam-ok: the disk seam itself
            view = view[n:]

    async def aappend(self, data: bytes, *, sync: bool = False) -> None:
        self._check()
        # abandon_on_cancel=False (the default): a cancelled caller waits for the write
        await trio.to_thread.run_sync(self._append_synced if sync else self.append, data)

    def _append_synced(self, data: bytes) -> None:
        self.append(data)
        try:
            os.fsync(self._check())  # seam-ok: the disk seam itself
        except OSError as e:
            raise SyncFailed(e.errno, e.strerror, self.path) from e

    def write_at(self, offset: int, data: bytes | memoryview) -> None:
        fd = self._check()
        view = memoryview(data)
        while view:
            n = os.pwrite(fd, view, offset)  # seam-ok: the disk seam itself
            view = view[n:]
            offset += n

    async def awrite_at(self, offset: int, data: bytes, *, sync: bool = False,
                        fill_to: int = 0,
                        on_written: Callable[[], None] | None = None) -> None:
        self._check()
        token = trio.lowlevel.current_trio_token() if on_written is not None else None
        # abandon_on_cancel=False (the default): a cancelled caller waits for the call
        await trio.to_thread.run_sync(self._write_at_synced, offset, data, sync, fill_to,
                                      token, on_written)

    def _write_at_synced(self, offset: int, data: bytes, sync: bool, fill_to: int,
                         token: trio.lowlevel.TrioToken | None,
                         on_written: Callable[[], None] | None) -> None:
        self.write_at(offset, data)
        if fill_to:
            self._fill(max(offset + len(data), self.size()), fill_to)
        if token is not None and on_written is not None:
            token.run_sync_soon(on_written)   # the loop learns of the write; the fsync goes on
        if sync:
            try:
                os.fdatasync(self._check())  # seam-ok: the disk seam itself
            except OSError as e:
                raise SyncFailed(e.errno, e.strerror, self.path) from e

    def _fill(self, start: int, end: int) -> None:
        """Zeros over ``start..end`` (best effort: an error leaves the file shorter)."""
        zeros = memoryview(_ZEROS)
        with contextlib.suppress(OSError):
            while start < end:
                n = min(end - start, len(zeros))
                self.write_at(start, zeros[:n])
                start += n

    def read_at(self, offset: int, length: int) -> bytes:
        return os.pread(self._check(), length, offset)

    def read_into(self, offset: int, buffer: bytearray | memoryview) -> int:
        return os.preadv(self._check(), [buffer], offset)

    async def aread_at(self, offset: int, length: int) -> bytes:
        return await trio.to_thread.run_sync(os.pread, self._check(), length, offset)  # seam-ok

    async def sync(self) -> None:
        # abandon_on_cancel=False (the default): a cancelled caller still waits for
        # the fsync to end, so the descriptor is never closed under a running fsync.
        await trio.to_thread.run_sync(os.fsync, self._check())  # seam-ok

    def truncate(self, length: int) -> None:
        os.ftruncate(self._check(), length)

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    async def aclose(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            await trio.to_thread.run_sync(os.close, fd)  # seam-ok: the disk seam itself
