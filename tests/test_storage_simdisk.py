"""SimDisk: the simulated disk keeps the Disk seam's promises and injects storage faults from its seed."""

from __future__ import annotations

import errno

import pytest
import trio
import trio.testing

from flux.sim.disk import DiskFaults, SimDisk, SimDiskFile

D = "/d"


def _disk(seed: int = 1, **faults: object) -> SimDisk:
    disk = SimDisk(seed, DiskFaults(**faults))  # type: ignore[arg-type]
    disk.makedirs(D)
    return disk


async def test_a_crash_keeps_every_written_byte_synced_or_not(autojump_clock: trio.testing.MockClock) -> None:
    disk = _disk()
    f = disk.open(D + "/a", create=True)
    f.append(b"synced")
    await f.sync()
    await disk.sync_dir(D)
    f.append(b"+unsynced")
    disk.open(D + "/b", create=True).append(b"never dir-synced")
    disk.crash()
    assert disk.contents(D + "/a") == b"synced+unsynced"
    assert disk.listdir(D) == ["a", "b"]
    with pytest.raises(OSError) as info:
        f.append(b"from a dead process")
    assert info.value.errno == errno.EBADF


async def test_a_power_loss_keeps_what_was_synced_and_drops_entries_never_dir_synced(
        autojump_clock: trio.testing.MockClock) -> None:
    for seed in range(40):
        disk = _disk(seed)
        f = disk.open(D + "/a", create=True)
        f.append(b"synced")
        await f.sync()
        await disk.sync_dir(D)
        f.append(b"+unsynced")
        disk.open(D + "/b", create=True).append(b"never dir-synced")
        disk.rename(D + "/a", D + "/c")
        before = disk.boot_id()
        disk.power_loss()
        assert disk.boot_id() != before
        assert disk.listdir(D) == ["a"]           # the rename and the new file were not durable
        content = disk.contents(D + "/a")
        assert content.startswith(b"synced")
        tail = content[len(b"synced"):]
        assert len(tail) <= len(b"+unsynced")
        cut = len(tail.rstrip(b"\0"))
        assert tail[:cut] == b"+unsynced"[:cut] and not tail[cut:].strip(b"\0")


async def test_power_losses_tear_and_zero_fill_tails_as_the_seed_says(
        autojump_clock: trio.testing.MockClock) -> None:
    outcomes: set[str] = set()
    for seed in range(60):
        disk = _disk(seed)
        f = disk.open(D + "/a", create=True)
        await disk.sync_dir(D)
        f.append(b"x" * 100)
        disk.power_loss()
        content = disk.contents(D + "/a")
        if not content:
            outcomes.add("lost")
        elif content.endswith(b"\0"):
            outcomes.add("zero-filled")
        else:
            outcomes.add("torn" if len(content) < 100 else "whole")
    assert {"lost", "zero-filled", "torn"} <= outcomes


async def test_the_same_seed_gives_the_same_faults(autojump_clock: trio.testing.MockClock) -> None:
    async def run(seed: int) -> tuple[bytes, float, list[str]]:
        disk = _disk(seed, sync_delay=(0.001, 0.5))
        f = disk.open(D + "/a", create=True)
        await disk.sync_dir(D)
        started = trio.current_time()
        for i in range(20):
            f.append(bytes([i]) * 37)
            if i % 3 == 0:
                await f.sync()
        took = round(trio.current_time() - started, 6)
        disk.power_loss()
        disk.flip_bit()
        return disk.contents(D + "/a"), took, disk.events
    assert await run(7) == await run(7)
    assert await run(7) != await run(8)


async def test_a_bit_flip_lands_in_synced_bytes_only(autojump_clock: trio.testing.MockClock) -> None:
    disk = _disk()
    f = disk.open(D + "/a", create=True)
    assert disk.flip_bit() is None
    f.append(b"\0" * 64)
    await f.sync()
    f.append(b"\0" * 64)
    for _ in range(20):
        where = disk.flip_bit()
        assert where is not None and where[0] == D + "/a" and where[1] < 64
    assert not disk.contents(D + "/a")[64:].strip(b"\0")


async def test_fsync_takes_time_on_the_trio_clock_and_can_be_slow(
        autojump_clock: trio.testing.MockClock) -> None:
    disk = _disk(sync_delay=(0.008, 0.008), slow_sync_chance=1.0, slow_sync_delay=(3.0, 3.0))
    f = disk.open(D + "/a", create=True)
    started = trio.current_time()
    await f.sync()
    assert trio.current_time() - started == pytest.approx(3.0)


async def test_a_failing_fsync_raises_eio_and_leaves_the_data_unsynced(
        autojump_clock: trio.testing.MockClock) -> None:
    disk = _disk(torn_tail_chance=0.0)
    f = disk.open(D + "/a", create=True)
    await disk.sync_dir(D)
    f.append(b"data")
    disk.fail_next_syncs(1)
    with pytest.raises(OSError) as info:
        await f.sync()
    assert info.value.errno == errno.EIO
    disk.power_loss()
    assert disk.contents(D + "/a") == b""


async def _lose_a_write(disk: SimDisk) -> SimDiskFile:
    """A file holding b"kept" synced, then b"LOST" whose fsync failed."""
    f = disk.open(D + "/a", create=True)
    await disk.sync_dir(D)
    f.append(b"kept")
    await f.sync()
    f.append(b"LOST")
    disk.fail_next_syncs(1)
    with pytest.raises(OSError):
        await f.sync()
    return f


async def test_a_failed_fsync_marks_its_pages_clean_they_read_back_until_a_power_loss(
        autojump_clock: trio.testing.MockClock) -> None:
    # Linux (PostgreSQL's "fsyncgate"): the error is reported once, the pages it could
    # not write are marked clean, so a later fsync succeeds without writing them
    disk = _disk(torn_tail_chance=1.0)
    f = await _lose_a_write(disk)
    assert f.read_at(0, 8) == b"keptLOST"      # the page cache still has them
    await f.sync()                              # succeeds: nothing is dirty
    disk.power_loss()   # that fsync made the size durable, never the bytes: a hole
    assert disk.contents(D + "/a") == b"kept\0\0\0\0"


async def test_bytes_synced_after_a_failed_fsync_leave_a_hole_where_its_pages_were(
        autojump_clock: trio.testing.MockClock) -> None:
    disk = _disk()
    f = await _lose_a_write(disk)
    f.append(b"next")
    await f.sync()
    assert disk.contents(D + "/a") == b"keptLOSTnext"
    disk.power_loss()
    assert disk.contents(D + "/a") == b"kept\0\0\0\0next"


async def test_cutting_a_file_below_what_a_failed_fsync_lost_makes_it_whole_again(
        autojump_clock: trio.testing.MockClock) -> None:
    disk = _disk()
    f = await _lose_a_write(disk)
    f.truncate(4)
    f.append(b"more")
    await f.sync()
    disk.power_loss()
    assert disk.contents(D + "/a") == b"keptmore"


async def test_a_full_disk_writes_what_fits_then_raises_enospc(
        autojump_clock: trio.testing.MockClock) -> None:
    disk = _disk(capacity=10)
    f = disk.open(D + "/a", create=True)
    f.append(b"12345678")
    with pytest.raises(OSError) as info:
        f.append(b"abcdef")
    assert info.value.errno == errno.ENOSPC
    assert disk.contents(D + "/a") == b"12345678ab"
    assert disk.free_bytes(D) == 0
    f.truncate(4)
    assert disk.free_bytes(D) == 6
    disk.set_full(True)
    with pytest.raises(OSError):
        f.append(b"x")


def test_seam_methods_behave_like_the_file_system() -> None:
    disk = _disk()
    with pytest.raises(FileNotFoundError):
        disk.open(D + "/missing")
    with pytest.raises(FileNotFoundError):
        disk.open("/nowhere/x", create=True)
    f = disk.open(D + "/a", create=True)
    f.append(b"hello world")
    assert f.read_at(6, 100) == b"world" and f.read_at(50, 5) == b"" and f.size() == 11
    disk.rename(D + "/a", D + "/b")
    assert disk.listdir(D) == ["b"] and f.read_at(0, 5) == b"hello"
    disk.makedirs(D + "/sub/deeper")
    assert disk.listdir(D) == ["b", "sub"]
    disk.remove(D + "/b")
    assert not disk.exists(D + "/b")
    f.close()
    with pytest.raises(OSError):
        f.size()


async def test_a_power_loss_tears_an_unsynced_overwrite_of_synced_zeros_never_the_zeros(
        autojump_clock: trio.testing.MockClock) -> None:
    """Space written ahead (synced zeros) keeps its length through a power loss; what
    was written over it and not synced is lost, or survives cut short at a byte drawn
    from the seed, with the synced zeros after it."""
    outcomes: set[str] = set()
    for seed in range(60):
        disk = _disk(seed)
        f = disk.open(D + "/a", create=True)
        await f.awrite_at(0, b"head", fill_to=1000, sync=True)
        await disk.sync_dir(D)
        assert disk.contents(D + "/a") == b"head" + bytes(996)
        f.write_at(4, b"y" * 100)
        assert f.size() == 1000
        disk.power_loss()
        content = disk.contents(D + "/a")
        assert len(content) == 1000 and content.startswith(b"head")
        kept = content[4:].rstrip(b"\0")
        assert kept == b"y" * len(kept) and not content[4 + len(kept):].strip(b"\0")
        outcomes.add("lost" if not kept else "whole" if len(kept) == 100 else "torn")
    assert {"lost", "torn"} <= outcomes


def test_positional_writes_overwrite_and_a_gap_reads_as_zeros() -> None:
    disk = _disk()
    f = disk.open(D + "/a", create=True)
    f.write_at(0, b"hello world")
    f.write_at(6, b"WORLD!")
    assert disk.contents(D + "/a") == b"hello WORLD!"
    f.write_at(15, b"x")
    assert disk.contents(D + "/a") == b"hello WORLD!\0\0\0x"
    f.append(b"y")
    assert f.read_at(15, 5) == b"xy"
    disk.faults = DiskFaults(capacity=disk.used_bytes() + 5)
    f.write_at(0, b"HELLO")   # an overwrite takes no room
    with pytest.raises(OSError) as info:
        f.write_at(20, b"abcd")   # the gap (3 bytes) and 2 of these fit, then ENOSPC
    assert info.value.errno == errno.ENOSPC
    assert disk.contents(D + "/a") == b"HELLO WORLD!\0\0\0xy\0\0\0ab"
