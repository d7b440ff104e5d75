"""A simulated disk: the Disk seam (flux.host) in memory, with storage faults from the seed.

:class:`SimDisk` keeps, per file, what the page cache holds and what an fsync has
made durable, and per directory which entries a directory fsync has made durable.
Faults: :meth:`SimDisk.crash` (a process dies: everything written survives),
:meth:`SimDisk.power_loss` (unsynced bytes and entries are lost; a file's unsynced
tail may survive cut at a random byte, with zeros after the cut, and past that what
the medium held before: an unsynced overwrite of space written ahead is lost or torn,
never the space), :meth:`SimDisk.flip_bit`
(in a synced block), a capacity (``ENOSPC``), slow fsyncs and failing fsyncs
(``EIO``), and a part of the namespace that takes no new file (``EIO``: a dying
disk, :meth:`SimDisk.refuse_new_files`). A failed fsync behaves as Linux's: the
pages it could not write are marked clean anyway (a later fsync succeeds and
writes nothing of them) yet still read back from the page cache, until a power
loss drops them (they never reached the medium). Every delay is a trio sleep, so
the simulator's clock drives it; there
are no threads. Directories themselves are durable as soon as they are made.
"""

from __future__ import annotations

import dataclasses
import errno
import posixpath
import random
from collections.abc import Callable

import trio

from flux.host import SyncFailed


@dataclasses.dataclass(frozen=True)
class DiskFaults:
    """How a simulated disk misbehaves (every draw comes from the disk's seed)."""

    sync_delay: tuple[float, float] = (0.002, 0.010)   # seconds an fsync takes, uniform
    slow_sync_chance: float = 0.0                      # chance an fsync takes slow_sync_delay
    slow_sync_delay: tuple[float, float] = (0.2, 2.0)
    sync_failure_chance: float = 0.0                   # chance an fsync fails with EIO
    capacity: int | None = None                        # bytes of file data before ENOSPC
    torn_tail_chance: float = 0.5      # at power loss: a file's unsynced tail survives cut short
    zero_fill_chance: float = 0.5      # ... and a random stretch after the cut reads as zeros


_NOTHING_LOST = 1 << 62


class _Flush:
    """The write-back of one fsync under way: later fsyncs of the file wait for it."""

    __slots__ = ("done", "fail", "overlapped")

    def __init__(self, fail: bool) -> None:
        self.done = trio.Event()
        self.fail = fail          # its write-back fails (EIO)
        self.overlapped = False   # another fsync of the file ran beside it


class _Inode:
    __slots__ = ("data", "dirty_from", "durable", "errors", "flushes", "lost_from", "shrunk")

    def __init__(self) -> None:
        self.data = bytearray()      # what reads see (the page cache)
        self.durable = bytearray()   # what the medium holds since the last fsync
        self.dirty_from = 0          # data[:dirty_from] equals durable[:dirty_from] ...
        # ... except from here on: pages a failed fsync marked clean without writing them
        self.lost_from = _NOTHING_LOST
        # write-back errors so far: each open file reports each one to one fsync (errseq)
        self.errors = 0
        self.flushes: list[_Flush] = []   # fsyncs under way, oldest first
        self.shrunk = False   # cut below its durable length since the last fsync

    def touched(self, offset: int) -> None:
        """Bytes from ``offset`` on were written or cut off."""
        self.dirty_from = min(self.dirty_from, offset)
        if offset <= self.lost_from:   # what was lost is cut off (appends never rewrite it)
            self.lost_from = _NOTHING_LOST


def _ebadf(path: str) -> OSError:
    return OSError(errno.EBADF, "file handle is closed or its process is gone", path)


class SimDisk:
    """The Disk protocol in memory, deterministic from ``seed``.

    One SimDisk is one machine's disk: it outlives the processes that use it (a
    crash invalidates their open files, not the data) and counts boots.
    """

    def __init__(self, seed: int, faults: DiskFaults | None = None) -> None:
        self.random = random.Random(seed)
        self.faults = faults or DiskFaults()
        self.boots = 0
        self.events: list[str] = []            # faults injected, for traces and failing tests
        self._files: dict[str, _Inode] = {}    # the namespace processes see
        self._durable: dict[str, _Inode] = {}  # the namespace as of the last directory fsyncs
        self._dirs: set[str] = {"/"}
        self._epoch = 0
        self._fail_syncs = 0
        self._fail_joined: float | None = None   # a joined failure's deadline (fail_next_syncs)
        self._full = False
        self._no_new_files: str | None = None   # a directory in which no file can be made
        self.slow = 0            # slow spells under way (see :meth:`_sync_delay`)

    # -- the Disk protocol -----------------------------------------------------------

    def open(self, path: str, *, create: bool = False) -> SimDiskFile:
        path = posixpath.normpath(path)
        inode = self._files.get(path)
        if inode is None:
            if not create:
                raise FileNotFoundError(errno.ENOENT, "no such file", path)
            if posixpath.dirname(path) not in self._dirs:
                raise FileNotFoundError(errno.ENOENT, "no such directory", path)
            dead = self._no_new_files
            if dead is not None and (path + "/").startswith(dead + "/"):
                self.events.append(f"{path}: not made (EIO)")
                raise OSError(errno.EIO, "the disk takes no new file", path)
            inode = self._files[path] = _Inode()
        return SimDiskFile(self, path, inode, self._epoch)

    def exists(self, path: str) -> bool:
        path = posixpath.normpath(path)
        return path in self._files or path in self._dirs

    def listdir(self, path: str) -> list[str]:
        path = posixpath.normpath(path)
        if path not in self._dirs:
            raise FileNotFoundError(errno.ENOENT, "no such directory", path)
        names = {posixpath.basename(p) for p in self._files if posixpath.dirname(p) == path}
        names |= {posixpath.basename(d) for d in self._dirs if d != path and posixpath.dirname(d) == path}
        return sorted(names)

    def makedirs(self, path: str) -> None:
        path = posixpath.normpath(path)
        while path not in self._dirs:
            if path in self._files:
                raise FileExistsError(errno.EEXIST, "a file is in the way", path)
            self._dirs.add(path)
            path = posixpath.dirname(path)

    def remove(self, path: str) -> None:
        path = posixpath.normpath(path)
        if self._files.pop(path, None) is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)

    async def discard(self, path: str) -> None:
        self.remove(path)
        await trio.lowlevel.checkpoint()

    def rename(self, src: str, dst: str) -> None:
        src, dst = posixpath.normpath(src), posixpath.normpath(dst)
        inode = self._files.pop(src, None)
        if inode is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", src)
        self._files[dst] = inode

    async def sync_dir(self, path: str) -> None:
        path = posixpath.normpath(path)
        epoch = self._epoch
        await trio.sleep(self._sync_delay())
        if epoch != self._epoch:
            raise _ebadf(path)
        for p in [p for p in self._durable if posixpath.dirname(p) == path]:
            del self._durable[p]
        for p, inode in self._files.items():
            if posixpath.dirname(p) == path:
                self._durable[p] = inode

    def read_ahead(self, path: str) -> None:
        pass   # a hint: nothing to read ahead into (and no threads in the simulator)

    def free_bytes(self, path: str) -> int:
        if self._full:
            return 0
        if self.faults.capacity is None:
            return 1 << 40
        return max(0, self.faults.capacity - self.used_bytes())

    def boot_id(self) -> str:
        return f"sim-boot-{self.boots}"

    # -- faults ------------------------------------------------------------------------

    def used_bytes(self) -> int:
        inodes = {id(i): i for i in [*self._files.values(), *self._durable.values()]}
        return sum(len(i.data) for i in inodes.values())

    def crash(self) -> None:
        """A process crash (kill -9): its open files die; everything written stays."""
        self._epoch += 1
        self.events.append("crash")

    def power_loss(self) -> None:
        """The machine loses power and reboots: open files die, unsynced data and
        directory entries are lost, an unsynced tail may survive torn or zero-filled."""
        self._epoch += 1
        self.boots += 1
        survivors: dict[int, _Inode] = {}
        for path in sorted(self._durable):
            inode = self._durable[path]
            if id(inode) not in survivors:
                self._settle(path, inode)
                survivors[id(inode)] = inode
        self._files = dict(self._durable)
        self.events.append(f"power loss (boot {self.boots})")

    def _settle(self, path: str, inode: _Inode) -> None:
        base = inode.durable[:inode.dirty_from]
        tail = inode.data[inode.dirty_from:]
        if tail:   # pages a failed fsync lost before it read as a hole (zeros)
            base += bytes(inode.dirty_from - len(base))
        content = inode.durable
        if tail and self.random.random() < self.faults.torn_tail_chance:
            cut = self.random.randint(0, len(tail))
            content = base + tail[:cut]
            if self.random.random() < self.faults.zero_fill_chance:
                content += bytes(self.random.randint(0, len(tail) - cut))
            if not inode.shrunk and len(content) < len(inode.durable):
                # an overwrite of synced bytes (space written ahead): past the cut, the
                # medium still holds what the last fsync left there
                content += inode.durable[len(content):]
            self.events.append(f"{path}: unsynced tail torn at byte {len(base) + cut}")
        inode.data = bytearray(content)
        inode.durable = bytearray(content)
        inode.dirty_from = len(content)
        inode.lost_from = _NOTHING_LOST
        inode.shrunk = False

    def synced_files(self, suffix: str = "") -> list[str]:
        """The files ending in ``suffix`` that hold synced bytes, sorted."""
        return [p for p in sorted(self._files) if p.endswith(suffix)
                and self._synced_len(self._files[p]) > 0]

    def flip_bit(self, path: str | None = None, offset: int | None = None, *,
                 suffix: str = "", skip: int = 0, recent: int = 0,
                 limit: int | None = None) -> tuple[str, int] | None:
        """Flip one bit of a synced byte (of ``path`` at ``offset``, or drawn from the seed
        among files ending in ``suffix``, past their first ``skip`` bytes, and within the
        last ``recent`` synced bytes if given). Returns where, or None if nothing is
        synced yet. ``limit``: flip before this file offset."""
        if path is None:
            candidates = [p for p in sorted(self._files) if p.endswith(suffix)
                          and self._synced_len(self._files[p]) > skip]
            if not candidates:
                return None
            path = self.random.choice(candidates)
        inode = self._files[posixpath.normpath(path)]
        synced = self._synced_len(inode)
        limit = synced if limit is None else min(limit, synced)
        if limit <= skip:
            return None
        if offset is None:
            low = max(skip, limit - recent) if recent else skip
            offset = self.random.randrange(low, limit)
        bit = 1 << self.random.randrange(8)
        inode.data[offset] ^= bit
        if offset < len(inode.durable):
            inode.durable[offset] ^= bit
        self.events.append(f"{path}: bit flipped at byte {offset}")
        return path, offset

    @staticmethod
    def _synced_len(inode: _Inode) -> int:
        return min(inode.dirty_from, inode.lost_from, len(inode.durable), len(inode.data))

    def fail_next_syncs(self, count: int = 1, *, cancel: bool = False,
                        joined_within: float | None = None) -> None:
        """Make the next ``count`` file fsyncs fail with EIO (``cancel``: instead of those
        armed before and not met yet). ``joined_within``: instead, one failure that waits
        up to that many seconds for an fsync to start while another of its file is under
        way, and fails the write-back of the one under way (the next fsync fails if none
        comes): errors under load, which overlapping fsyncs must each report."""
        if joined_within is not None:
            self._fail_joined = trio.current_time() + joined_within
            return
        self._fail_syncs = count if cancel else self._fail_syncs + count
        if cancel:
            self._fail_joined = None

    def refuse_new_files(self, directory: str | None) -> None:
        """Make every file creation under ``directory`` fail with EIO (None: none does)."""
        self._no_new_files = None if directory is None else posixpath.normpath(directory)

    def set_full(self, full: bool) -> None:
        """Make every write fail with ENOSPC (True) or follow the capacity again (False)."""
        self._full = full

    def contents(self, path: str) -> bytes:
        """What a read of the whole file sees now."""
        return bytes(self._files[posixpath.normpath(path)].data)

    def _sync_delay(self) -> float:
        f = self.faults
        if self.slow:
            return self.random.uniform(*f.slow_sync_delay)
        if f.slow_sync_chance and self.random.random() < f.slow_sync_chance:
            return self.random.uniform(*f.slow_sync_delay)
        return self.random.uniform(*f.sync_delay)

    def _room(self) -> int:
        if self._full:
            return 0
        if self.faults.capacity is None:
            return 1 << 62
        return max(0, self.faults.capacity - self.used_bytes())

    def _alive(self, epoch: int) -> bool:
        return epoch == self._epoch


class SimDiskFile:
    """An open file of a :class:`SimDisk`."""

    def __init__(self, disk: SimDisk, path: str, inode: _Inode, epoch: int) -> None:
        self.path = path
        self._disk = disk
        self._inode = inode
        self._epoch = epoch
        self._closed = False
        self._seen_errors = inode.errors   # as Linux samples the file's errseq at open

    def _check(self) -> _Inode:
        if self._closed or not self._disk._alive(self._epoch):
            raise _ebadf(self.path)
        return self._inode

    def size(self) -> int:
        return len(self._check().data)

    def append(self, data: bytes) -> None:
        self.write_at(len(self._check().data), data)

    async def aappend(self, data: bytes, *, sync: bool = False) -> None:
        await self.awrite_at(len(self._check().data), data, sync=sync)

    def write_at(self, offset: int, data: bytes | memoryview) -> None:
        inode = self._check()
        room = self._disk._room()
        inode.touched(min(offset, len(inode.data)))
        if offset > len(inode.data):   # a gap reads as zeros
            grow = min(offset - len(inode.data), room)
            inode.data += bytes(grow)
            room -= grow
            if len(inode.data) < offset:
                raise OSError(errno.ENOSPC, "no space left on device", self.path)
        end = offset + len(data)
        new = max(0, end - len(inode.data))   # bytes past the end take room
        if new > room:   # a short write, then ENOSPC
            inode.data[offset:] = data[:len(data) - new + room]
            raise OSError(errno.ENOSPC, "no space left on device", self.path)
        inode.data[offset:end] = data

    async def awrite_at(self, offset: int, data: bytes, *, sync: bool = False,
                        fill_to: int = 0,
                        on_written: Callable[[], None] | None = None) -> None:
        self.write_at(offset, data)
        inode = self._inode
        if fill_to > len(inode.data):   # best effort: as much as the disk has room for
            inode.touched(len(inode.data))
            inode.data += bytes(min(fill_to - len(inode.data), self._disk._room()))
        if on_written is not None:
            on_written()
        if not sync:
            await trio.lowlevel.checkpoint()
            return
        try:
            await self.sync()
        except OSError as e:
            raise SyncFailed(e.errno, e.strerror, self.path) from e

    def read_at(self, offset: int, length: int) -> bytes:
        return bytes(self._check().data[offset:offset + length])

    def read_into(self, offset: int, buffer: bytearray | memoryview) -> int:
        data = self._check().data[offset:offset + len(buffer)]
        buffer[:len(data)] = data
        return len(data)

    async def aread_at(self, offset: int, length: int) -> bytes:
        await trio.lowlevel.checkpoint()
        return self.read_at(offset, length)

    async def sync(self) -> None:
        """Write back what is dirty, after the write-back of every fsync of the file
        already under way (as Linux waits on pages under write-back); then report a
        write-back error this open file has not reported yet (errseq: each open file
        learns of each error once, so of two fsyncs on one open file only the first to
        look sees it; they look in an order drawn from the seed)."""
        inode = self._check()
        disk = self._disk
        start = inode.dirty_from
        tail = bytes(inode.data[start:])
        inode.dirty_from = len(inode.data)
        earlier = list(inode.flushes)
        joined = disk._fail_joined
        if joined is not None and (earlier or trio.current_time() >= joined):
            disk._fail_joined = None
            if earlier:   # the write-back this fsync joins fails
                earlier[-1].fail = True
                joined = None
        fail = joined is not None or disk._fail_syncs > 0 or (
            disk.faults.sync_failure_chance > 0 and disk.random.random() < disk.faults.sync_failure_chance)
        if joined is None and disk._fail_syncs > 0:
            disk._fail_syncs -= 1
        flush = _Flush(fail)
        for e in earlier:
            e.overlapped = flush.overlapped = True
        inode.flushes.append(flush)
        try:
            try:
                await trio.sleep(disk._sync_delay())
                for e in earlier:
                    await e.done.wait()
            except BaseException:
                inode.touched(start)
                raise
            if not disk._alive(self._epoch):
                inode.touched(start)
                raise _ebadf(self.path)
            if flush.fail:
                # Linux marks the pages it could not write clean: they stay readable, a
                # later fsync does not write them, and a power loss loses them
                if tail:
                    inode.lost_from = min(inode.lost_from, start)
                inode.errors += 1
                disk.events.append(f"{self.path}: fsync failed (EIO)")
            else:
                del inode.durable[start:]
                inode.durable += bytes(start - len(inode.durable))   # a hole where pages were lost
                inode.durable += tail
                inode.shrunk = len(inode.data) < len(inode.durable)   # (a cut meanwhile)
        finally:
            inode.flushes.remove(flush)
            flush.done.set()
        overlapped = flush.overlapped
        if overlapped:   # the threads of overlapping fsyncs wake in any order ...
            await trio.sleep(disk.random.uniform(0.0, 0.001))
        failed = inode.errors != self._seen_errors
        self._seen_errors = inode.errors
        if overlapped:   # ... and get back to the event loop in any order
            await trio.sleep(disk.random.uniform(0.0, 0.001))
        if not disk._alive(self._epoch):
            raise _ebadf(self.path)
        if failed:
            raise OSError(errno.EIO, "input/output error", self.path)

    def truncate(self, length: int) -> None:
        inode = self._check()
        inode.touched(min(length, len(inode.data)))
        if length < len(inode.durable):
            inode.shrunk = True
        if length <= len(inode.data):
            del inode.data[length:]
        else:
            inode.data += bytes(length - len(inode.data))

    def close(self) -> None:
        self._closed = True

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()
