"""A failed fsync over SimDisk (Linux's "fsyncgate"): the writer leaves a marker, and
recovery never counts as durable what the page cache still shows past the synced mark."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from flux.sim.disk import DiskFaults, SimDisk
from flux.storage import FsyncMode, LogFailed, LogWriter, Record, RecoveryReport, recover
from flux.storage.segment import DAMAGED, UNSYNCED, fsync_failed_name, parse_fsync_failed

DIR = "/data/orders"


def _disk() -> SimDisk:
    return SimDisk(3, DiskFaults(sync_delay=(0.01, 0.01), torn_tail_chance=0.0))


async def _recover(disk: SimDisk) -> tuple[list[Record], LogWriter, RecoveryReport]:
    records: list[Record] = []
    table, report = await recover(disk, DIR, owner="orders", on_record=records.append,
                                  boot_id=disk.boot_id())
    return records, LogWriter(disk, table, owner="orders", generation=7,
                              boot_id=disk.boot_id()), report


async def _after_power_loss(disk: SimDisk) -> list[bytes]:
    """The bodies a recovery finds after the machine loses its power."""
    disk.power_loss()
    records, writer, _ = await _recover(disk)
    writer.table.close()
    return [r.body for r in records]


async def _fail_a_group(disk: SimDisk) -> int:
    """Make one record durable, then fail the fsync of the next group, and the process
    dies (the page cache keeps the group); returns the synced mark."""
    _, writer, _ = await _recover(disk)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        kept = writer.append(1, b"kept")
        await writer.wait_durable(kept.end)
        disk.fail_next_syncs(1)
        group = [writer.append(1, b"lost") for _ in range(5)]
        with pytest.raises(LogFailed, match="recovery cuts the log"):
            await writer.wait_durable(group[-1].end)
    writer.table.close()
    disk.crash()
    return kept.end


async def _unsynced_records() -> SimDisk:
    """A disk whose log holds three records written, never synced, by a process that
    crashed (recovery fsyncs them)."""
    disk = _disk()
    table, _ = await recover(disk, DIR, owner="orders")
    writer = LogWriter(disk, table, owner="orders", generation=7, boot_id=disk.boot_id(),
                       fsync=FsyncMode.NEVER)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        await writer.sync()
        for _ in range(3):
            await writer.wait_durable(writer.append(1, b"written").end)
        nursery.cancel_scope.cancel()
    writer.table.close()
    disk.crash()
    return disk


def test_the_marker_name_says_both_marks() -> None:
    name = fsync_failed_name(120, 340)
    assert parse_fsync_failed(name) == (120, 340)
    assert parse_fsync_failed("fsync-failed.x.1") is None
    assert parse_fsync_failed("00000000000000000000.log") is None


async def test_recovery_cuts_what_a_failed_fsync_left_in_the_page_cache_and_a_power_loss_loses_nothing(
        autojump_clock: trio.testing.MockClock) -> None:
    disk = _disk()
    mark = await _fail_a_group(disk)
    assert [n for n in disk.listdir(DIR) if parse_fsync_failed(n)] == \
        [fsync_failed_name(mark, mark)]
    records, writer, report = await _recover(disk)
    assert [r.body for r in records] == [b"kept"]
    assert writer.table.end == mark
    assert report.synced_mark == mark and not report.exposed_past_mark
    assert report.unsynced_bytes == 5 * (9 + len(b"lost"))   # the records, not the zeros after
    names = disk.listdir(DIR)
    assert any(n.endswith(UNSYNCED) for n in names)  # set aside, not wiped
    assert not any(parse_fsync_failed(n) for n in names)   # the cut is durable: it went
    async with trio.open_nursery() as nursery:   # a retry of a lost record is stored again
        await nursery.start(writer.run)
        retry = writer.append(1, b"retry")
        await writer.wait_durable(retry.end)
        assert retry.position == mark
        await writer.close()
    disk.power_loss()
    records, writer, report = await _recover(disk)
    writer.table.close()
    assert [r.body for r in records] == [b"kept", b"retry"]
    assert report.damage is None and report.synced_mark is None


async def test_without_the_marker_recovery_would_trust_the_page_cache(
        autojump_clock: trio.testing.MockClock) -> None:
    # what the marker guards against: the lost group reads back, and the fsync that
    # recovery makes succeeds without writing it
    disk = _disk()
    await _fail_a_group(disk)
    for name in disk.listdir(DIR):
        if parse_fsync_failed(name):
            disk.remove(f"{DIR}/{name}")
    records, writer, _ = await _recover(disk)
    writer.table.close()
    assert [r.body for r in records].count(b"lost") == 5
    assert await _after_power_loss(disk) == [b"kept"]


async def test_with_fsync_interval_the_marker_says_acked_records_were_past_the_mark(
        autojump_clock: trio.testing.MockClock) -> None:
    disk = _disk()
    table, _ = await recover(disk, DIR, owner="orders")
    writer = LogWriter(disk, table, owner="orders", generation=7, boot_id=disk.boot_id(),
                       fsync=FsyncMode.INTERVAL, fsync_interval=1.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        await writer.sync()
        written = writer.append(1, b"acked once written")
        assert await writer.wait_durable(written.end) == written.end
        disk.fail_next_syncs(1)
        with pytest.raises(LogFailed):
            await writer.sync()
    writer.table.close()
    disk.crash()
    records, writer, report = await _recover(disk)
    writer.table.close()
    assert report.exposed_past_mark
    assert b"acked once written" not in [r.body for r in records]
    # set aside as damage: its generation calls for a new one, at this recovery or the next
    assert any(n.endswith(DAMAGED) for n in disk.listdir(DIR))
    assert report.damaged_generations == {7}


async def test_a_failed_fsync_of_a_new_segment_sets_that_segment_aside(
        autojump_clock: trio.testing.MockClock) -> None:
    disk = _disk()
    table, _ = await recover(disk, DIR, owner="orders")
    writer = LogWriter(disk, table, owner="orders", generation=7, boot_id=disk.boot_id(),
                       segment_bytes=4096)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        first = writer.append(1, b"a" * 3000)
        await writer.wait_durable(first.end)
        disk.fail_next_syncs(1)   # the new segment's header
        rolled = writer.append(1, b"b" * 2000)
        with pytest.raises(LogFailed, match="starting segment"):
            await writer.wait_durable(rolled.end)
    writer.table.close()
    disk.crash()
    records, writer, report = await _recover(disk)
    writer.table.close()
    assert [r.body for r in records] == [b"a" * 3000]
    assert len(writer.table.segments) == 1 and writer.table.end == first.end
    assert report.unsynced_bytes > 0


async def test_a_crash_in_recovery_before_the_cut_is_made_finds_the_marker_again(
        autojump_clock: trio.testing.MockClock) -> None:
    disk = _disk()
    mark = await _fail_a_group(disk)
    disk.fail_next_syncs(1)   # recovery's copy of what it sets aside
    with pytest.raises(OSError):
        await _recover(disk)
    disk.crash()
    records, writer, report = await _recover(disk)
    writer.table.close()
    assert [r.body for r in records] == [b"kept"] and writer.table.end == mark
    assert report.fsync_failed and report.unsynced_bytes > 0


async def test_after_recovery_s_own_fsync_fails_the_next_copies_the_last_segment_to_fresh_pages(
        autojump_clock: trio.testing.MockClock) -> None:
    disk = await _unsynced_records()
    disk.fail_next_syncs(1)   # recovery's fsync of what the crash left unsynced
    with pytest.raises(OSError):
        await _recover(disk)
    disk.crash()
    records, writer, report = await _recover(disk)
    writer.table.close()
    assert report.rewritten and [r.body for r in records].count(b"written") == 3
    assert not any(n.startswith("fsync-failed") for n in disk.listdir(DIR))
    disk.power_loss()   # what the rewrite synced is on disk: nothing is lost
    records, writer, report = await _recover(disk)
    writer.table.close()
    assert [r.body for r in records].count(b"written") == 3 and not report.rewritten


SPARE = "/run/flux/fsync-failed/orders"


async def _fail_a_group_on_a_dead_disk(disk: SimDisk, spare: str | None) -> tuple[int, LogWriter]:
    """As :func:`_fail_a_group`, but the log's directory takes no new file when the
    fsync fails (the marker cannot be made there); the disk recovers after the crash."""
    _, writer, _ = await _recover(disk)
    writer.spare = spare
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        kept = writer.append(1, b"kept")
        await writer.wait_durable(kept.end)
        disk.fail_next_syncs(1)
        disk.refuse_new_files("/data")
        group = [writer.append(1, b"lost") for _ in range(5)]
        with pytest.raises(LogFailed) as failed:
            await writer.wait_durable(group[-1].end)
    writer.table.close()
    disk.crash()
    disk.refuse_new_files(None)
    marked = "recovery in this boot cuts the log at" if spare else "leaving the marker"
    assert marked in str(failed.value), failed.value
    return kept.end, writer


async def test_a_marker_the_log_directory_cannot_take_goes_to_the_spare_one_and_is_honoured(
        autojump_clock: trio.testing.MockClock) -> None:
    """A dead disk takes no marker: the writer leaves it in its spare directory (another
    file system, kept for the boot), and a restart in the same boot cuts the log there
    as it would for the marker in the log's directory, then removes it."""
    disk = _disk()
    mark, failed = await _fail_a_group_on_a_dead_disk(disk, SPARE)
    assert not failed.unmarked
    assert not any(parse_fsync_failed(n) for n in disk.listdir(DIR))
    assert disk.listdir(SPARE) == [fsync_failed_name(mark, mark)]
    records: list[Record] = []
    table, report = await recover(disk, DIR, owner="orders", on_record=records.append,
                                  boot_id=disk.boot_id(), spare=SPARE)
    table.close()
    assert [r.body for r in records] == [b"kept"] and table.end == mark
    assert report.synced_mark == mark and report.unsynced_bytes > 0
    assert disk.listdir(SPARE) == []   # the cut is durable: the marker went
    assert await _after_power_loss(disk) == [b"kept"]


async def test_without_a_spare_directory_a_dead_disk_leaves_the_log_unmarked(
        autojump_clock: trio.testing.MockClock) -> None:
    disk = _disk()
    _, failed = await _fail_a_group_on_a_dead_disk(disk, None)
    assert failed.unmarked   # the shard logs CRITICAL: a restart would trust the page cache
    records, writer, _ = await _recover(disk)
    writer.table.close()
    assert [r.body for r in records].count(b"lost") == 5


async def test_recovery_s_own_marker_goes_to_the_spare_directory_on_a_dead_disk(
        autojump_clock: trio.testing.MockClock) -> None:
    disk = await _unsynced_records()
    disk.fail_next_syncs(1)   # recovery's fsync of what the crash left unsynced
    disk.refuse_new_files(DIR)
    with pytest.raises(OSError):
        await recover(disk, DIR, owner="orders", boot_id=disk.boot_id(), spare=SPARE)
    assert disk.listdir(SPARE) == ["fsync-failed.recovery"]
    disk.crash()
    disk.refuse_new_files(None)
    table, report = await recover(disk, DIR, owner="orders", boot_id=disk.boot_id(),
                                  spare=SPARE)
    table.close()
    assert report.rewritten and disk.listdir(SPARE) == []
