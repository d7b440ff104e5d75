"""The production disk seam (RealDisk) and the log on a real file system, in a temporary directory."""

from __future__ import annotations

import errno
import re
from pathlib import Path

import pytest
import trio

from flux.host import RealDisk
from flux.storage import FsyncMode, LogReader, LogWriter, Record, recover
from flux.storage.record import encode

ROOT = Path(__file__).resolve().parents[1]


async def test_real_disk_seam_appends_reads_syncs_renames_and_lists(tmp_path: Path) -> None:
    disk = RealDisk()
    d = str(tmp_path / "log")
    disk.makedirs(d)
    f = disk.open(d + "/a", create=True)
    f.append(b"hello ")
    f.append(b"world")
    await f.sync()
    await disk.sync_dir(d)
    assert f.size() == 11 and f.read_at(6, 100) == b"world"
    f.truncate(5)
    assert f.read_at(0, 100) == b"hello"
    f.append(b"!")                      # appends go to the end, even after a truncate
    assert f.read_at(0, 100) == b"hello!"
    disk.rename(d + "/a", d + "/b")
    assert disk.listdir(d) == ["b"] and disk.exists(d + "/b") and not disk.exists(d + "/a")
    assert disk.free_bytes(d) > 0
    assert disk.boot_id()
    f.close()
    f.close()
    with pytest.raises(OSError) as info:
        f.size()
    assert info.value.errno == errno.EBADF
    disk.remove(d + "/b")
    assert disk.listdir(d) == []
    with pytest.raises(FileNotFoundError):
        disk.open(d + "/missing")


async def test_discarding_a_file_and_closing_a_replaced_one_run_off_the_event_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Freeing a 64 MiB segment's blocks took 20-30 ms here (a soak logged 100-140 ms
    loop stalls from segment drops): the unlink and the last close go to a thread."""
    import os
    import threading

    main = threading.current_thread()
    seen: list[str] = []
    real_remove, real_close = os.remove, os.close

    def remove(path: str) -> None:
        seen.append("remove off loop" if threading.current_thread() is not main else "remove")
        real_remove(path)

    def close(fd: int) -> None:
        seen.append("close off loop" if threading.current_thread() is not main else "close")
        real_close(fd)

    disk = RealDisk()
    d = str(tmp_path)
    f = disk.open(d + "/old", create=True)
    f.append(b"x" * 4096)
    disk.open(d + "/gone", create=True).close()
    monkeypatch.setattr(os, "remove", remove)
    monkeypatch.setattr(os, "close", close)
    await disk.discard(d + "/gone")
    await f.aclose()
    await f.aclose()                     # idempotent, like close
    monkeypatch.undo()
    assert seen == ["remove off loop", "close off loop"]
    assert disk.listdir(d) == ["old"]
    with pytest.raises(OSError):
        f.size()


async def test_a_compaction_on_a_real_disk_reads_and_writes_only_in_worker_threads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dozen compactions writing tens of MB on the loop stalled every topic's
    deliveries: the new segment's writes (and syncs) go to a thread, and so do the
    old segment's reads (after a restart they wait on the disk)."""
    import os
    import threading

    from flux.storage.compaction import compact_segment

    disk = RealDisk()
    table, _ = await recover(disk, str(tmp_path / "log"), owner="t")
    writer = LogWriter(disk, table, owner="t", generation=1, boot_id=disk.boot_id(),
                       fsync=FsyncMode.NEVER, segment_bytes=1 << 20)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for i in range(3000):
            writer.append(1 + i % 2, bytes([i % 256]) * 600)
        await writer.sync()
        nursery.cancel_scope.cancel()
    assert len(table.segments) > 1
    main = threading.current_thread()
    writes: list[bool] = []
    real_write = os.write

    def write(fd: int, data: bytes) -> int:
        writes.append(threading.current_thread() is main)
        return real_write(fd, data)

    reads: list[bool] = []
    real_pread = os.pread

    def pread(fd: int, length: int, offset: int) -> bytes:
        reads.append(threading.current_thread() is main)
        return real_pread(fd, length, offset)

    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(os, "pread", pread)
    segment = table.segments[0]
    done = await compact_segment(disk, table, segment,
                                 lambda rec: rec.type == 1, slice_bytes=64 * 1024)
    monkeypatch.undo()
    assert done.rewritten and writes and not any(writes)   # none on the loop's thread
    assert len(reads) > 8 and not any(reads)   # a slice at a time, none on the loop
    kept = [r for r in LogReader(table).scan() if r.position < table.segments[1].first]
    assert kept and all(r.type == 1 for r in kept)
    table.close()


async def test_the_log_writer_writes_only_in_worker_threads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write(2) may wait on the file system's journal while another log's fsync
    commits it (a soak's shards: writes of 13 bytes to 26 KB that took 3-32 ms): the
    writer task writes off the loop, small writes too, a megabyte at a time at most."""
    import os
    import threading

    from flux.storage.writer import WRITE_SLICE_BYTES

    disk = RealDisk()
    table, _ = await recover(disk, str(tmp_path / "log"), owner="t")
    writer = LogWriter(disk, table, owner="t", generation=1, boot_id=disk.boot_id(),
                       fsync=FsyncMode.ALWAYS, segment_bytes=2 << 20)
    main = threading.current_thread()
    writes: list[tuple[bool, int]] = []   # (on the loop's thread, bytes), zeros written ahead aside
    real_write, real_pwrite = os.write, os.pwrite

    def note(data: bytes) -> None:
        if bytes(data).strip(b"\0"):
            writes.append((threading.current_thread() is main, len(data)))

    def write(fd: int, data: bytes) -> int:
        note(data)
        return real_write(fd, data)

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        note(data)
        return real_pwrite(fd, data, offset)

    bodies = [bytes([i % 256]) * 900 for i in range(4000)]   # 3.6 MB: a roll
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        first = writer.append(1, b"small")
        await writer.wait_durable(first.end)   # (the segment's header, then the record)
        monkeypatch.setattr(os, "write", write)
        monkeypatch.setattr(os, "pwrite", pwrite)
        small = writer.append(1, b"small too")
        await writer.wait_durable(small.end)
        assert writes == [(False, small.end - small.position)]
        writes.clear()
        ends = [writer.append(2, body) for body in bodies]
        await writer.wait_durable(ends[-1].end)
        monkeypatch.undo()
        assert [r.body for r in LogReader(table).scan() if r.type == 2] == bodies
        await writer.close()
    big = [n for on_loop, n in writes if n > 1024]   # (not the new segments' headers)
    assert len(big) >= 4 and not any(on_loop for on_loop, n in writes)
    assert sum(big) <= ends[-1].end - small.end and max(big) <= WRITE_SLICE_BYTES
    assert writer.stats.rolls == 2   # the first segment and one roll


async def test_with_fsync_always_a_group_is_written_and_fsynced_in_one_thread_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each round trip to a worker thread costs some 150-200 us of wake-ups here: the
    write moved off the loop rides with the group's fsync, so a publish's ack waits
    for one round trip, as when the write was on the loop."""
    import flux.host

    disk = RealDisk()
    table, _ = await recover(disk, str(tmp_path / "log"), owner="t")
    writer = LogWriter(disk, table, owner="t", generation=1, boot_id=disk.boot_id(),
                       fsync=FsyncMode.ALWAYS)
    calls: list[str] = []
    real_run_sync = trio.to_thread.run_sync

    async def run_sync(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(getattr(fn, "__name__", "?"))
        return await real_run_sync(fn, *args, **kwargs)

    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        await writer.wait_durable(writer.append(1, b"first").end)   # (the segment made)
        syncs = writer.stats.syncs
        monkeypatch.setattr(flux.host.trio.to_thread, "run_sync", run_sync)
        end = writer.append(1, b"second").end
        await writer.wait_durable(end)
        monkeypatch.undo()
        assert len(calls) == 1 and writer.stats.syncs == syncs + 1 and writer.synced == end
        await writer.close()


async def test_with_fsync_always_groups_are_fsynced_at_once_each_on_its_own_descriptor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a group's fsync runs, the next group is written and fsynced beside it,
    on another open file of the segment (each open file is told of a write-back error
    once: two fsyncs on one could each miss it); every record lands in order."""
    import os
    import threading
    import time

    lanes = 2   # (one by default, SYNC_LANES: the overlap is kept for a writer that asks)
    disk = RealDisk()
    table, _ = await recover(disk, str(tmp_path / "log"), owner="t")
    writer = LogWriter(disk, table, owner="t", generation=1, boot_id=disk.boot_id(),
                       fsync=FsyncMode.ALWAYS, sync_lanes=lanes)
    real_fsync = os.fsync
    lock = threading.Lock()
    running: list[int] = []
    overlaps: list[tuple[int, ...]] = []

    def slow_fsync(fd: int) -> None:
        with lock:
            running.append(fd)
            if len(running) > 1:
                overlaps.append(tuple(running))
        try:
            time.sleep(0.005)   # seam-ok: a slow disk, in a worker thread
            real_fsync(fd)
        finally:
            with lock:
                running.remove(fd)

    bodies = [b"r%d" % i for i in range(200)]
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        await writer.wait_durable(writer.append(1, b"first").end)   # (the segment made)
        monkeypatch.setattr(os, "fsync", slow_fsync)
        monkeypatch.setattr(os, "fdatasync", slow_fsync)   # (what a group's fsync is)
        ends = []
        for body in bodies:
            ends.append(writer.append(2, body).end)
            await trio.sleep(0.0005)
        await writer.wait_durable(ends[-1])
        monkeypatch.undo()
        await writer.close()
    assert overlaps and all(len(set(fds)) == len(fds) for fds in overlaps)
    assert max(len(fds) for fds in overlaps) <= lanes
    seen: list[bytes] = []
    await recover(disk, str(tmp_path / "log"), owner="t",
                         on_record=lambda r: seen.append(r.body) if r.type == 2 else None)
    assert seen == bodies


async def test_log_on_a_real_disk_survives_reopening_and_cuts_a_torn_tail(tmp_path: Path) -> None:
    disk = RealDisk()
    d = str(tmp_path / "orders")
    table, report = await recover(disk, d, owner="orders")
    assert report.end == 0 and report.damage is None
    writer = LogWriter(disk, table, owner="orders", generation=1, boot_id=disk.boot_id(),
                       fsync=FsyncMode.ALWAYS, segment_bytes=64 * 1024)
    bodies = [b"message %d " % i * 10 for i in range(2000)]
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        where = [writer.append(1 + i % 3, body) for i, body in enumerate(bodies)]
        await writer.wait_durable(where[-1].end)
        assert writer.durable == writer.synced == where[-1].end
        assert LogReader(table).read(where[1234].position).body == bodies[1234]
        await writer.close()
    assert len(table.segments) > 2
    last = table.segments[-1]
    end = last.offset_of(where[-1].end)
    with open(last.path, "r+b") as f:   # what a crash mid-write leaves (zeros written ahead follow)
        f.seek(end)
        f.write(encode(1, b"half")[:7])
        size = f.seek(0, 2)
    seen: list[Record] = []
    table, report = await recover(disk, d, owner="orders", on_record=seen.append)
    assert [r.body for r in seen] == bodies
    assert [r.type for r in seen] == [1 + i % 3 for i in range(2000)]
    assert report.damage is not None and report.damage.kind == "torn-tail"
    assert report.damage.cut_bytes == size - end and report.end == where[-1].end
    assert report.records == 2000 and report.seconds >= 0
    table.close()


STORAGE_CALLS = re.compile(r"\bos\.(open|write|pwrite|fsync|fdatasync|ftruncate)\(|(?<![.\w])(?<!def )open\(")


def test_only_the_seam_touches_files_on_the_data_path() -> None:
    for call in ("with open(p) as f:", "os.fsync(fd)", "x = os.open(p, flags)"):
        assert STORAGE_CALLS.search(call)
    for fine in ("disk.open(path)", "def open(self, path: str) -> F:"):
        assert not STORAGE_CALLS.search(fine)
    offenders = []
    for base in ("flux/storage", "flux/shard", "flux/sim/disk.py"):
        path = ROOT / base
        for source in ([path] if path.is_file() else sorted(path.rglob("*.py"))):
            for n, line in enumerate(source.read_text().splitlines(), 1):
                if STORAGE_CALLS.search(line) and "seam-ok" not in line:
                    offenders.append(f"{source.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "file I/O outside flux.host's Disk seam:\n" + "\n".join(offenders)


async def test_with_fsync_always_groups_are_fdatasynced_into_zeros_written_ahead(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A group's fsync is an fdatasync of a write over zeros the file already has: no
    length change, so no journal commit; the zeros are refilled as they are used."""
    import os

    from flux.storage.writer import PREWRITE_FIRST

    disk = RealDisk()
    table, _ = await recover(disk, str(tmp_path / "log"), owner="t")
    writer = LogWriter(disk, table, owner="t", generation=1, boot_id=disk.boot_id(),
                       fsync=FsyncMode.ALWAYS)
    real_fdatasync = os.fdatasync
    sizes: list[int] = []   # the file's length at each group's fdatasync

    def fdatasync(fd: int) -> None:
        sizes.append(os.fstat(fd).st_size)
        real_fdatasync(fd)

    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        await writer.wait_durable(writer.append(1, b"first").end)   # (the segment made)
        segment = table.segments[0]
        ahead = os.path.getsize(segment.path)
        assert ahead == segment.header_size + PREWRITE_FIRST
        monkeypatch.setattr(os, "fdatasync", fdatasync)
        for i in range(50):
            await writer.wait_durable(writer.append(1, b"r%d" % i).end)
        for _ in range(3):   # past what was written ahead: the zeros are refilled
            await writer.wait_durable(writer.append(2, b"x" * PREWRITE_FIRST).end)
        monkeypatch.undo()
        await writer.close()
    assert sizes[:50] == [ahead] * 50
    assert sizes[-1] > ahead and os.path.getsize(segment.path) >= segment.offset_of(table.end)
    seen: list[bytes] = []
    await recover(disk, str(tmp_path / "log"), owner="t", boot_id=disk.boot_id(),
                  on_record=lambda r: seen.append(r.body) if r.type == 1 else None)
    assert seen == [b"first"] + [b"r%d" % i for i in range(50)]
