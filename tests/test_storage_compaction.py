"""Compaction over SimDisk: records kept in place keep their positions, smaller ones
stand in for others, the rest go; recovery reads the result; a crash leaves a whole log."""

from __future__ import annotations

import itertools

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flux.shard.compaction_pace import CompactionPace
from flux.sim.disk import SimDisk
from flux.storage import CorruptRecord, LogReader, LogWriter, Record, recover
from flux.storage.compaction import compact_segment
from flux.storage.segment import COMPACTING
from flux.storage.table import SegmentTable

DIR = "/data/orders"
KEEP, SHRINK, DROP = 1, 2, 3


def _judge(rec: Record) -> bool | tuple[int, bytes]:
    if rec.type == KEEP:
        return True
    if rec.type == SHRINK:
        return (SHRINK, rec.body[: len(rec.body) // 3])
    return False


async def _write(disk: SimDisk, records: list[tuple[int, bytes]],
                 segment_bytes: int = 4096) -> tuple[SegmentTable, list[int]]:
    """Write ``records`` into a fresh log; returns its table and each record's position."""
    table, _ = await recover(disk, DIR, owner="orders")
    writer = LogWriter(disk, table, owner="orders", generation=7, boot_id=disk.boot_id(),
                       segment_bytes=segment_bytes)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        positions = [writer.append(t, b).position for t, b in records]
        await writer.sync()
        nursery.cancel_scope.cancel()
    return table, positions


def _expected(records: list[tuple[int, bytes]], positions: list[int],
              compacted: set[int], table: SegmentTable) -> list[tuple[int | None, int, bytes]]:
    """What a scan should see after compacting the segments starting at ``compacted``:
    (position or None for a record that may sit anywhere, type, body)."""
    out: list[tuple[int | None, int, bytes]] = []
    for (rtype, body), position in zip(records, positions, strict=True):
        if table.find(position).first not in compacted or rtype == KEEP:
            out.append((position, rtype, body))
        elif rtype == SHRINK and len(body) // 3 + 9 < len(body) + 9:
            out.append((None, SHRINK, body[: len(body) // 3]))
        elif rtype == SHRINK:
            out.append((position, rtype, body))
    return out


def _matches(seen: list[Record], expected: list[tuple[int | None, int, bytes]]) -> bool:
    return [(None if p is None else r.position, r.type, r.body)
            for r, (p, _, _) in zip(seen, expected, strict=True)] == expected


async def test_compaction_keeps_positions_of_what_it_keeps_and_recovery_reads_it_back(
        autojump_clock: trio.testing.MockClock) -> None:
    disk = SimDisk(3)
    records = [((KEEP, SHRINK, DROP)[i % 3], bytes([i % 251]) * (40 + i % 50)) for i in range(300)]
    table, positions = await _write(disk, records)
    assert len(table.segments) > 3
    before = sum(s.offset_of(s.end) for s in table.segments)   # (not the zeros written ahead)
    end = table.end
    compacted = {s.first for s in table.segments[:-1]}
    for segment in list(table.segments[:-1]):
        done = await compact_segment(disk, table, segment, _judge)
        assert done.rewritten and done.after < done.before
    after = sum(s.offset_of(s.end) for s in table.segments)
    assert after < before * 0.6 and table.end == end
    assert table.saved == before - after
    # reads by position find every record kept in place
    reader = LogReader(table)
    for (rtype, body), position in zip(records, positions, strict=True):
        if rtype == KEEP:
            assert reader.read(position) == Record(position, rtype, body)
    expected = _expected(records, positions, compacted, table)
    assert _matches(list(reader.scan()), expected)
    # ... and so does recovery, which ends the log where it ended
    table.close()
    seen: list[Record] = []
    again, report = await recover(disk, DIR, owner="orders", on_record=seen.append)
    assert report.damage is None and again.end == end and _matches(seen, expected)
    assert LogReader(again).read(positions[-3]).body == records[-3][1]


async def test_a_compaction_cut_short_leaves_the_old_segment_whole(
        autojump_clock: trio.testing.MockClock) -> None:
    disk = SimDisk(4)
    records = [(SHRINK, b"x" * 300) for _ in range(40)]
    table, _ = await _write(disk, records)
    first = table.segments[0]
    original = disk.contents(first.path)
    leftover = disk.open(first.path + COMPACTING, create=True)
    leftover.append(b"half a rewrite")   # a crash before the rename
    disk.crash()
    seen: list[Record] = []
    again, report = await recover(disk, DIR, owner="orders", on_record=seen.append)
    assert not disk.exists(first.path + COMPACTING)
    assert report.damage is None and len(seen) == 40 and disk.contents(first.path) == original
    assert [r.body for r in seen] == [b for _, b in records]
    again.close()


async def test_a_segment_compaction_would_not_shrink_by_a_quarter_is_left_alone(
        autojump_clock: trio.testing.MockClock) -> None:
    disk = SimDisk(5)
    records = [(KEEP, b"k" * 100)] * 30 + [(DROP, b"d")] * 3
    table, _ = await _write(disk, records, segment_bytes=1 << 20)
    await _write_more(disk, table)
    segment = table.segments[0]
    done = await compact_segment(disk, table, segment, _judge)
    assert not done.rewritten and table.segments[0] is segment
    assert not disk.exists(segment.path + COMPACTING)


async def _write_more(disk: SimDisk, table: SegmentTable) -> None:
    """Roll the log to a second segment, so the first is sealed."""
    writer = LogWriter(disk, table, owner="orders", generation=8, boot_id=disk.boot_id())
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        writer.append(KEEP, b"next generation")
        await writer.sync()
        nursery.cancel_scope.cancel()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kinds=st.lists(st.tuples(st.sampled_from((KEEP, SHRINK, DROP)), st.integers(0, 400)),
                      min_size=10, max_size=120),
       skip=st.sets(st.integers(0, 8)), seed=st.integers(0, 1000))
def test_any_mix_of_verdicts_reads_back_in_order_at_the_positions_kept(
        kinds: list[tuple[int, int]], skip: set[int], seed: int) -> None:
    async def main() -> None:
        disk = SimDisk(seed)
        records = [(t, bytes([n % 256]) * n) for t, n in kinds]
        table, positions = await _write(disk, records)
        end = table.end
        chosen = [s for i, s in enumerate(table.segments[:-1]) if i not in skip]
        compacted = set()
        for segment in chosen:
            if (await compact_segment(disk, table, segment, _judge, min_saving=0.0)).rewritten:
                compacted.add(segment.first)
        expected = _expected(records, positions, compacted, table)
        assert _matches(list(LogReader(table).scan()), expected)
        table.close()
        seen: list[Record] = []
        again, report = await recover(disk, DIR, owner="orders", on_record=seen.append)
        assert report.damage is None and again.end == end and _matches(seen, expected)
        again.close()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


async def test_bytes_after_the_last_record_of_a_sealed_segment_are_damage_not_compacted_away(
        autojump_clock: trio.testing.MockClock) -> None:
    """A torn tail nobody cut (a bug) must reach recovery as damage, not vanish."""
    disk = SimDisk(6)
    table, _ = await _write(disk, [(SHRINK, b"x" * 300) for _ in range(40)])
    first = table.segments[0]
    first.file.append(b"\x17garbage")
    original = disk.contents(first.path)
    with pytest.raises(CorruptRecord, match="after the last record"):
        await compact_segment(disk, table, first, _judge)
    assert disk.contents(first.path) == original and table.segments[0] is first
    assert not disk.exists(first.path + COMPACTING)


async def test_a_paced_compaction_reads_no_faster_than_its_budget_and_pauses_each_slice(
        autojump_clock: trio.testing.MockClock) -> None:
    disk = SimDisk(7)
    table, _ = await _write(disk, [(SHRINK, b"s" * 200) for _ in range(400)],
                            segment_bytes=64 * 1024)
    segment = table.segments[0]
    pace = CompactionPace(_ClockHost(), rate=16 * 1024)
    spent: list[tuple[float, int]] = []

    async def spend(n: int) -> None:
        spent.append((trio.current_time(), n))
        await pace.spend(n)

    started = trio.current_time()
    done = await compact_segment(disk, table, segment, _judge, slice_bytes=4096, pace=spend)
    assert done.rewritten
    assert len(spent) >= done.before // 4096 - 1
    assert all(4096 <= n < 4096 + 300 for _, n in spent)  # a slice ends at a record's end
    read = sum(n for _, n in spent)
    # each slice starts once the budget paid for the ones before it
    assert trio.current_time() - started >= read / (16 * 1024) - 1e-9
    assert all(b - a >= n / (16 * 1024) - 1e-9 for (a, n), (b, _) in itertools.pairwise(spent))


async def test_a_rewrite_not_worth_it_stops_reading_once_that_is_plain(
        autojump_clock: trio.testing.MockClock) -> None:
    disk = SimDisk(8)
    table, _ = await _write(disk, [(KEEP, b"k" * 100) for _ in range(300)],
                            segment_bytes=1 << 20)
    await _write_more(disk, table)
    segment = table.segments[0]
    judged: list[int] = []

    def judge(rec: Record) -> bool | tuple[int, bytes]:
        judged.append(rec.position)
        return True

    done = await compact_segment(disk, table, segment, judge)
    assert not done.rewritten and table.segments[0] is segment
    assert 0.7 * 300 < len(judged) < 0.8 * 300   # it would save nothing: stopped at 3/4
    assert not disk.exists(segment.path + COMPACTING)


async def test_a_compaction_cancelled_between_slices_leaves_the_old_segment_and_no_rewrite(
        autojump_clock: trio.testing.MockClock) -> None:
    disk = SimDisk(9)
    table, _ = await _write(disk, [(SHRINK, b"x" * 300) for _ in range(300)],
                            segment_bytes=64 * 1024)
    segment = table.segments[0]
    original = disk.contents(segment.path)
    pace = CompactionPace(_ClockHost(), rate=1024)   # a slice of 4 KiB: 4 s each
    with trio.move_on_after(10):
        await compact_segment(disk, table, segment, _judge, slice_bytes=4096, pace=pace.spend)
    assert table.segments[0] is segment and disk.contents(segment.path) == original
    assert not disk.exists(segment.path + COMPACTING)


class _ClockHost:
    """What a CompactionPace uses of a host: trio's clock."""

    def now(self) -> float:
        return trio.current_time()

    async def sleep_until(self, deadline: float) -> None:
        await trio.sleep_until(deadline)
