"""Recovery over SimDisk: any appends and syncs, then a crash, a power loss or a flipped bit.

Properties (DESIGN.md G9): after a process crash every written record comes back;
after a power loss every synced one does; what comes back is always a prefix of
what was appended, so nothing after a bad spot and nothing failing its checksum is
returned; the damage is reported; and appends continue cleanly after recovery.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from flux.sim.disk import DiskFaults, SimDisk
from flux.storage import ForeignLog, FsyncMode, LogFailed, LogWriter, Record, recover, recovery
from flux.storage.record import encode
from flux.storage.segment import SegmentHeader, encode_header, segment_name
from flux.storage.table import SegmentTable

DIR = "/var/flux/t"
OWNER = "orders.eu"


@dataclasses.dataclass(frozen=True)
class Entry:
    position: int
    end: int
    type: int
    body: bytes


ops = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(1, 9), st.integers(0, 300)),
    st.tuples(st.just("sync"), st.just(0), st.just(0)),
    st.tuples(st.just("wait"), st.just(0), st.just(0)),
    st.tuples(st.just("sleep"), st.integers(0, 30), st.just(0)),
), max_size=40)
modes = st.sampled_from(list(FsyncMode))
segment_sizes = st.sampled_from([4096, 8192, 1 << 20])
# bytes a scan reads at once: small ones cut records (and headers) at every read
chunks = st.sampled_from([recovery.CHUNK, 7, 64, 333])
prop = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _run(main: Callable[[], Awaitable[Any]], chunk: int = recovery.CHUNK) -> Any:
    saved, recovery.CHUNK = recovery.CHUNK, chunk
    try:
        return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    finally:
        recovery.CHUNK = saved


def _body(i: int, size: int) -> bytes:
    return (i.to_bytes(4, "little") * (size // 4 + 1))[:size]


def _writer(disk: SimDisk, table: SegmentTable, mode: FsyncMode, segment_bytes: int) -> LogWriter:
    return LogWriter(disk, table, owner=OWNER, generation=99, boot_id=disk.boot_id(), fsync=mode,
                     fsync_interval=0.05, segment_bytes=segment_bytes)


async def _play(disk: SimDisk, writer: LogWriter, script: list[tuple[str, int, int]],
                entries: list[Entry]) -> None:
    """Run ``script`` against a running writer; the caller cancels it mid-flight (the crash).
    Stops early when the log fails (a failed fsync), or when a full disk keeps what it
    waits for from becoming durable (the writer tries again and again meanwhile)."""
    try:
        with trio.move_on_after(30):
            await _play_until_failed(writer, script, entries)
    except LogFailed:
        assert writer.failed is not None


async def _play_until_failed(writer: LogWriter, script: list[tuple[str, int, int]],
                             entries: list[Entry]) -> None:
    for op, a, b in script:
        if op == "append":
            body = _body(len(entries), b)
            where = writer.append(a, body)
            entries.append(Entry(where.position, where.end, a, body))
        elif op == "sync":
            await writer.sync()
        elif op == "wait" and entries:
            await writer.wait_durable(entries[-1].end)
        elif op == "sleep":
            await trio.sleep(a / 1000)


async def _recover(disk: SimDisk) -> tuple[SegmentTable, Any, list[Entry]]:
    seen: list[Record] = []
    table, report = await recover(disk, DIR, owner=OWNER, on_record=seen.append)
    return table, report, [Entry(r.position, r.end, r.type, r.body) for r in seen]


async def _written(disk: SimDisk, appends: int, size: int, segment_bytes: int = 1 << 20
                   ) -> tuple[SegmentTable, list[Entry]]:
    """A new log on ``disk`` with ``appends`` records of ``size`` bytes, fsync always,
    its writer closed: the table and what was written."""
    table, _, _ = await _recover(disk)
    writer = _writer(disk, table, FsyncMode.ALWAYS, segment_bytes)
    entries: list[Entry] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        await _play(disk, writer, [("append", 1, size)] * appends, entries)
        await writer.close()
    return table, entries


async def _continue_cleanly(disk: SimDisk, table: SegmentTable, got: list[Entry], mode: FsyncMode,
                            segment_bytes: int) -> None:
    """Appends after recovery land right after what was recovered, and read back whole."""
    writer = _writer(disk, table, mode, segment_bytes)
    more: list[Entry] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for i in range(5):
            body = b"after-%d" % i
            where = writer.append(3, body)
            more.append(Entry(where.position, where.end, 3, body))
        await writer.close()
    assert more[0].position == (got[-1].end if got else table.start)
    disk.crash()
    _, report, again = await _recover(disk)
    assert again == got + more
    assert report.damage is None


faults = st.one_of(
    st.just(DiskFaults(sync_delay=(0.001, 0.02))),
    st.builds(DiskFaults, sync_delay=st.just((0.001, 0.02)),
              sync_failure_chance=st.sampled_from([0.0, 0.1, 0.3]),
              capacity=st.one_of(st.none(), st.integers(0, 20_000)),
              slow_sync_chance=st.sampled_from([0.0, 0.2])),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mode=modes, segment_bytes=segment_sizes, script=ops, power=st.booleans(), seed=st.integers(0, 2**32),
       disk_faults=faults, chunk=chunks)
def test_recovery_after_a_crash_or_power_loss_keeps_what_it_must_and_nothing_else(
        mode: FsyncMode, segment_bytes: int, script: list[tuple[str, int, int]], power: bool,
        seed: int, disk_faults: DiskFaults, chunk: int) -> None:
    async def main() -> None:
        disk = SimDisk(seed, disk_faults)
        table, _, _ = await _recover(disk)
        writer = _writer(disk, table, mode, segment_bytes)
        entries: list[Entry] = []
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            await _play(disk, writer, script, entries)
            nursery.cancel_scope.cancel()          # the process dies here, mid-group or not
        written, synced, durable = writer.written, writer.synced, writer.durable
        if power:
            disk.power_loss()
        else:
            disk.crash()
        disk.faults = DiskFaults(sync_delay=(0.001, 0.02))   # the disk works again
        table, report, got = await _recover(disk)
        event(f"log failed: {writer.failed.reason.split(':')[0] if writer.failed else 'no'}")
        event(f"damage: {report.damage.kind if report.damage else 'none'}")
        event(f"records lost: {'some' if len(got) < len(entries) else 'none'}")
        assert got == entries[:len(got)], "recovered records must be a prefix of the appended ones"
        assert report.end == (got[-1].end if got else 0)
        assert report.records == len(got)
        if power:
            assert len(got) >= sum(e.end <= synced for e in entries), "a synced record was lost"
            if mode is FsyncMode.ALWAYS:
                assert len(got) >= sum(e.end <= durable for e in entries), "an acked record was lost"
            assert report.damage is None or report.damage.kind == "torn-tail"
        elif report.synced_mark is not None:   # an fsync failed: nothing past it counts
            assert got == [e for e in entries if e.end <= synced], "a synced record was lost"
            assert report.damage is None and report.synced_mark == synced
        else:   # (a write under way in its thread when the process died may be there too)
            assert len(got) >= sum(e.end <= written for e in entries), "a written record was lost"
            assert report.damage is None
        await _continue_cleanly(disk, table, got, mode, segment_bytes)

    _run(main, chunk)


@prop
@given(segment_bytes=segment_sizes, sizes=st.lists(st.integers(0, 400), min_size=1, max_size=60),
       seed=st.integers(0, 2**32), chunk=chunks)
# a flip in the last segment's header length read as a header cut short: the segment
# was removed as one that held nothing, and its synced records lost unreported
@example(segment_bytes=4096, sizes=[0, 176], seed=97, chunk=recovery.CHUNK)
def test_a_flipped_bit_in_synced_data_is_never_returned_and_is_reported(
        segment_bytes: int, sizes: list[int], seed: int, chunk: int) -> None:
    async def main() -> None:
        disk = SimDisk(seed, DiskFaults(sync_delay=(0.001, 0.002)))
        table, _, _ = await _recover(disk)
        writer = _writer(disk, table, FsyncMode.ALWAYS, segment_bytes)
        entries: list[Entry] = []
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            await _play(disk, writer, [("append", 1, n) for n in sizes], entries)
            await writer.close()
        flipped = disk.flip_bit()
        assert flipped is not None
        path, _ = flipped
        disk.crash()
        table, report, got = await _recover(disk)   # never ForeignLog: the log is ours
        assert got == entries[:len(got)]
        assert report.damage is not None
        assert got == [e for e in entries if e.end <= report.damage.position]
        assert report.damage.path == path
        await _continue_cleanly(disk, table, got, FsyncMode.ALWAYS, segment_bytes)

    _run(main, chunk)


def test_corruption_in_the_middle_is_set_aside_not_wiped_and_says_where() -> None:
    async def main() -> None:
        disk = SimDisk(3, DiskFaults(sync_delay=(0.001, 0.002)))
        table, entries = await _written(disk, 120, 100, 4096)
        assert len(table.segments) >= 3
        victim = entries[5]
        segment = table.segments[0]
        before = disk.contents(segment.path)
        disk.flip_bit(segment.path, segment.offset_of(victim.position) + 20)
        disk.crash()
        table, report, got = await _recover(disk)
        assert got == entries[:5]
        damage = report.damage
        assert damage is not None
        assert (damage.kind, damage.path, damage.position) == ("corrupt", segment.path, victim.position)
        assert "checksum" in damage.reason
        assert len(damage.set_aside) == len(disk.listdir(DIR)) - 1
        copy = damage.set_aside[0]
        assert copy == segment.path + ".damaged"
        assert disk.contents(copy) != before and len(disk.contents(copy)) == len(before)
        assert report.end == victim.position
    _run(main)


def test_a_torn_tail_is_cut_and_the_cut_is_reported() -> None:
    async def main() -> None:
        disk = SimDisk(4)
        table, entries = await _written(disk, 3, 50)
        path = table.segments[0].path
        file = disk.open(path)
        end = table.segments[0].offset_of(entries[-1].end)
        file.write_at(end, encode(1, b"z" * 200)[:120])   # a write cut by the crash
        size = len(disk.contents(path))   # (zeros written ahead follow it)
        disk.crash()
        table, report, got = await _recover(disk)
        assert got == entries
        assert report.damage is not None and report.damage.kind == "torn-tail"
        assert (report.damage.position, report.damage.cut_bytes) == (entries[-1].end, size - end)
        assert len(disk.contents(path)) == end
    _run(main)


def test_what_a_crash_left_unsynced_is_durable_once_recovered() -> None:
    """A record written but not fsynced when the process died is read back from the page
    cache; the writer recovery hands the log to counts it durable (fsync always: a
    duplicate's ack or a FETCH may expose it at once), so a power loss right after the
    recovery must not lose it (storage-faults seed 406: an acked offset used again)."""
    async def main() -> None:
        disk = SimDisk(5, DiskFaults(sync_delay=(0.001, 0.002), torn_tail_chance=0.0))
        table, entries = await _written(disk, 2, 50)
        path = table.segments[0].path
        body = b"written, never synced"
        disk.open(path).write_at(table.segments[0].offset_of(entries[-1].end),
                                 encode(1, body))   # the crash came before its fsync
        entries.append(Entry(entries[-1].end, entries[-1].end + 9 + len(body), 1, body))
        disk.crash()
        table, _, got = await _recover(disk)
        assert got == entries
        assert _writer(disk, table, FsyncMode.ALWAYS, 1 << 20).durable == entries[-1].end
        table.close()
        disk.power_loss()
        _, report, again = await _recover(disk)
        assert again == entries and report.damage is None
    _run(main)


def test_a_segment_whose_directory_entry_a_crash_left_unsynced_is_durable_once_recovered(
        ) -> None:
    """A crash in a roll after the new segment's header was fsynced, before its
    directory was: recovery reads the segment and the writer goes on in it, so a power
    loss after the recovery must not take it away with what was written to it since
    (delays-disk seed 185: a confirmed cursor lost, offsets used again)."""
    async def main() -> None:
        disk = SimDisk(5, DiskFaults(sync_delay=(0.001, 0.002), torn_tail_chance=0.0))
        table, entries = await _written(disk, 2, 50)
        end = entries[-1].end
        path = table.path_for(segment_name(end))
        header = encode_header(SegmentHeader(OWNER, 99, end, disk.boot_id()))
        new = disk.open(path, create=True)
        new.append(header)
        await new.sync()   # ... and the crash came before the directory's fsync
        table.close()
        disk.crash()
        table, _, got = await _recover(disk)
        assert got == entries and len(table.segments) == 2
        writer = _writer(disk, table, FsyncMode.ALWAYS, 1 << 20)
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            await _play(disk, writer, [("append", 1, 30), ("wait", 0, 0)], entries)
            await writer.close()
        disk.power_loss()
        _, report, again = await _recover(disk)
        assert again == entries and report.damage is None
    _run(main)


def test_a_directory_of_another_owner_or_program_is_refused_and_left_alone() -> None:
    async def main() -> None:
        disk = SimDisk(5)
        disk.makedirs(DIR)
        f = disk.open(DIR + "/00000000000000000000.log", create=True)
        f.append(encode_header(SegmentHeader("payments", 1, 0, "b")))
        with pytest.raises(ForeignLog, match="payments"):
            await recover(disk, DIR, owner=OWNER)
        f.truncate(0)
        f.append(b"PK\x03\x04 a zip file, not a log" + bytes(100))
        with pytest.raises(ForeignLog, match="not a Flux log") as info:
            await recover(disk, DIR, owner=OWNER)
        assert info.value.path.endswith("00000000000000000000.log")
        assert disk.contents(DIR + "/00000000000000000000.log").startswith(b"PK")
    _run(main)


@pytest.mark.parametrize("offset", [0, 7, 8, 9])
def test_a_flipped_bit_in_the_first_segments_magic_or_version_is_damage_set_aside(
        offset: int) -> None:
    """Not a foreign file: the log's segments are set aside (renamed, not wiped), the
    report says why, and the log continues where they began."""
    async def main() -> None:
        disk = SimDisk(6, DiskFaults(sync_delay=(0.001, 0.002)))
        table, _ = await _written(disk, 60, 100, 4096)
        paths = [segment.path for segment in table.segments]
        assert len(paths) >= 2
        before = [disk.contents(path) for path in paths]
        table.close()
        disk.flip_bit(paths[0], offset)
        disk.crash()
        table, report, got = await _recover(disk)
        assert got == [] and report.generation is None and report.start == 0
        damage = report.damage
        assert damage is not None and damage.kind == "corrupt" and damage.path == paths[0]
        assert "magic or version damaged" in damage.reason
        assert damage.set_aside == tuple(path + ".damaged" for path in paths)
        for path, was in zip(paths, before, strict=True):
            assert len(disk.contents(path + ".damaged")) == len(was)
        await _continue_cleanly(disk, table, got, FsyncMode.ALWAYS, 4096)
    _run(main)


@pytest.mark.parametrize("offset", [3, 9, 40])   # the magic, the version, the boot id
def test_a_segment_set_aside_for_its_header_still_tells_its_generation(offset: int) -> None:
    """A crash after recovery set a last segment aside for a damaged header, before a new
    generation began, must not let the next recovery keep the old generation: the
    header's generation field, unchecked, still names it."""
    async def main() -> None:
        disk = SimDisk(9, DiskFaults(sync_delay=(0.001, 0.002)))
        table, _ = await _written(disk, 60, 100, 4096)
        last = table.segments[-1].path
        assert len(table.segments) >= 2
        table.close()
        disk.flip_bit(last, offset)
        disk.crash()
        table, report, _ = await _recover(disk)
        assert report.damage is not None and report.damage.set_aside == (last + ".damaged",)
        assert report.generation == 99 and report.damaged_generations == set()
        table.close()
        disk.crash()   # before the owner's new generation reached the disk
        _, again, _ = await _recover(disk)
        assert again.generation == 99 and again.damaged_generations == {99}
    _run(main)


def test_a_first_segment_of_another_format_version_is_refused_and_left_alone() -> None:
    async def main() -> None:
        disk = SimDisk(7)
        disk.makedirs(DIR)
        path = DIR + "/00000000000000000000.log"
        raw = encode_header(SegmentHeader(OWNER, 1, 0, "b", version=2)) + encode(1, b"v2")
        disk.open(path, create=True).append(raw)
        with pytest.raises(ForeignLog, match="format version 2") as info:
            await recover(disk, DIR, owner=OWNER)
        assert info.value.path == path
        assert disk.listdir(DIR) == ["00000000000000000000.log"]
        assert disk.contents(path) == raw
    _run(main)


def test_the_owner_of_a_log_is_read_past_a_damaged_first_header() -> None:
    async def main() -> None:
        disk = SimDisk(8, DiskFaults(sync_delay=(0.001, 0.002)))
        table, _ = await _written(disk, 60, 100, 4096)
        first = table.segments[0].path
        table.close()
        assert recovery.owner_of_log(disk, DIR) == OWNER
        disk.flip_bit(first, 3)
        assert recovery.owner_of_log(disk, DIR) == OWNER
        disk.open(first).truncate(0)
        disk.open(first).append(b"PK\x03\x04 not a log")
        assert recovery.owner_of_log(disk, DIR) == OWNER   # a later segment's header says
        for name in disk.listdir(DIR):
            disk.remove(f"{DIR}/{name}")
        assert recovery.owner_of_log(disk, DIR) is None
    _run(main)


def test_files_that_are_not_segments_are_listed_and_kept() -> None:
    async def main() -> None:
        disk = SimDisk(6)
        disk.makedirs(DIR)
        disk.open(DIR + "/README", create=True).append(b"hello")
        _, report, _ = await _recover(disk)
        assert report.ignored == ["README"] and disk.exists(DIR + "/README")
    _run(main)


LOST = ("a block in the middle", "the last record's header")


async def _lose_a_header(disk: SimDisk, lost: str) -> tuple[list[Entry], Entry]:
    """A log of 40 synced records whose records' header ``lost`` now reads as zeros (a
    write the disk lost), with zeros written ahead after the records; the victim."""
    table, entries = await _written(disk, 40, 100)
    segment = table.segments[0]
    assert len(disk.contents(segment.path)) > segment.offset_of(entries[-1].end)   # zeros ahead
    victim = entries[20] if lost == LOST[0] else entries[-1]
    file = disk.open(segment.path)
    file.write_at(segment.offset_of(victim.position), bytes(9))
    await file.sync()
    table.close()
    disk.crash()
    return entries, victim


async def _zeros_then_data_is_damage(lost: str) -> None:
    disk = SimDisk(6, DiskFaults(sync_delay=(0.001, 0.002)))
    entries, victim = await _lose_a_header(disk, lost)
    seen: list[Record] = []
    table, report = await recover(disk, DIR, owner=OWNER, on_record=seen.append,
                                  boot_id=disk.boot_id())
    table.close()
    assert [r.position for r in seen] == [e.position for e in entries if e.end <= victim.position]
    assert report.damage is not None and report.damage.kind == "corrupt", \
        "zeros with data after them were taken for the end: acked records cut silently"
    assert report.damage.position == victim.position and report.damage.set_aside


@pytest.mark.parametrize("lost", LOST)
def test_zeros_with_data_after_them_are_damage_never_the_end(lost: str) -> None:
    """Zeros from the last record to the end of the file are space the writer wrote
    ahead: the end. Zeros with anything but zeros after them (a block the disk lost,
    even the last record's header with its body after it) are damage, reported and set
    aside, never an end that cuts acked records silently."""
    _run(lambda: _zeros_then_data_is_damage(lost))


@pytest.mark.parametrize("lost", LOST)
def test_planted_bug_recovery_that_stops_at_the_first_zeros_is_caught(
        lost: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted bug: recovery that takes a zero-filled record header for the end of
    the log without looking at what follows it. The test above catches it either way."""
    monkeypatch.setattr(recovery, "_zeros_to_end",
                        lambda file, rest, offset: not bytes(rest[:9]).strip(b"\0"))
    with pytest.raises(AssertionError, match="taken for the end"):
        _run(lambda: _zeros_then_data_is_damage(lost))


def test_zeros_after_the_records_are_the_end_in_this_boot_and_after_a_reboot() -> None:
    async def main() -> None:
        for reboot in (False, True):
            disk = SimDisk(7, DiskFaults(sync_delay=(0.001, 0.002)))
            table, entries = await _written(disk, 30, 77, segment_bytes=1 << 20)
            path = table.segments[0].path
            table.close()
            disk.power_loss() if reboot else disk.crash()
            table, report = await recover(disk, DIR, owner=OWNER, boot_id=disk.boot_id())
            assert report.damage is None and report.end == entries[-1].end
            assert len(disk.contents(path)) > table.segments[0].offset_of(report.end)
            table.close()
    _run(main)
