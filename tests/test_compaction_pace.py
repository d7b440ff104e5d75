"""A shard's compaction pace: a budget of bytes a second, one compaction at a time."""

from __future__ import annotations

import trio
import trio.testing

from flux.shard.compaction_pace import CompactionPace


class _ClockHost:
    def now(self) -> float:
        return trio.current_time()

    async def sleep_until(self, deadline: float) -> None:
        await trio.sleep_until(deadline)


def _pace(rate: int) -> CompactionPace:
    return CompactionPace(_ClockHost(), rate)  # type: ignore[arg-type]


def test_each_slice_waits_until_the_budget_paid_for_what_was_read() -> None:
    pace = _pace(1000)
    assert pace.charge(500, now=10.0) == 10.5
    assert pace.charge(500, now=10.1) == 11.0    # the second slice came early: it waits
    assert pace.charge(2000, now=11.0) == 13.0


def test_time_left_idle_earns_no_credit_for_a_burst() -> None:
    pace = _pace(1000)
    assert pace.charge(100, now=0.0) == 0.1
    assert pace.charge(1000, now=60.0) == 61.0   # not 60.1: a minute idle buys nothing


def test_a_rate_of_zero_never_waits() -> None:
    pace = _pace(0)
    assert pace.charge(1 << 30, now=5.0) == 5.0


async def test_compactions_of_one_shard_take_turns_in_the_order_they_asked(
        autojump_clock: trio.testing.MockClock) -> None:
    pace = _pace(1 << 20)
    running: list[str] = []
    order: list[tuple[str, str]] = []

    async def compaction(name: str, slices: int) -> None:
        async with pace.turn:
            running.append(name)
            assert running == [name], running   # never two at once
            order.append((name, "start"))
            for _ in range(slices):
                await pace.spend(1 << 19)       # half a second each
            running.remove(name)

    async with trio.open_nursery() as nursery:
        for name in ("a", "b", "c"):
            nursery.start_soon(compaction, name, 4)
            await trio.sleep(0.01)
    assert [name for name, _ in order] == ["a", "b", "c"]
    assert trio.current_time() >= 6.0   # 3 x 4 slices of half a second
