"""The per-run index of delayed messages (G12): firing in (due, offset) order, lookups by
offset, and the walks STATS and cleanup make, against a plain map of offset -> due."""

from __future__ import annotations

import math
import random
from array import array

from flux.shard.due_index import DueRun, TopicDelays

NAN = math.nan


def _dues(*values: float | None) -> array[float]:
    return array("d", [NAN if v is None else v for v in values])


def test_a_run_fires_its_delayed_messages_in_due_then_offset_order() -> None:
    run = DueRun("t", 10, _dues(5.0, None, 3.0, 5.0, 1.0))
    assert (run.first, run.end, run.last, run.last_due) == (10, 15, 14, 5.0)
    assert list(run.order) == [4, 2, 0, 3]  # equal dues (5.0) keep their offset order
    assert run.next_due() == 1.0
    assert run.fire(0.5) == []
    assert run.fire(3.0) == [4, 2]
    assert run.next_due() == 5.0
    assert run.fire(9.0) == [0, 3]
    assert run.next_due() is None


def test_a_run_with_no_delayed_message_is_not_indexed() -> None:
    delayed = TopicDelays()
    delayed.add(DueRun("t", 0, _dues(None, None)))
    assert not delayed and delayed.last == -1 and 0 not in delayed


def test_lookups_by_offset_and_the_highest_delayed_offset() -> None:
    delayed = TopicDelays()
    delayed.add(DueRun("t", 0, _dues(None, 7.0)))
    delayed.add(DueRun("t", 5, _dues(2.0, None, None)))
    assert delayed and delayed.last == 5
    assert [o for o in range(10) if o in delayed] == [1, 5]
    assert (delayed.due_of(1), delayed.due_of(0), delayed.due_of(3)) == (7.0, None, None)
    assert dict(delayed.items()) == {1: 7.0, 5: 2.0}
    assert [r.first for r in delayed.runs(2)] == [5]
    assert [delayed.undelayed_from(o) for o in (0, 1, 2, 5, 8)] == [0, 2, 2, 6, 8]
    delayed.forget_below(2)
    assert dict(delayed.items()) == {5: 2.0}
    delayed.forget_below(8)
    assert not delayed


def test_the_next_undelayed_offset_passes_wholly_delayed_runs_at_once() -> None:
    delayed = TopicDelays()
    delayed.add(DueRun("t", 8, _dues(1.0, 2.0)))
    delayed.add(DueRun("t", 10, _dues(3.0)))
    delayed.add(DueRun("t", 11, _dues(4.0, None)))
    assert [delayed.undelayed_from(o) for o in (0, 8, 9, 11, 12, 13)] == [0, 12, 12, 12, 12, 13]


def test_hold_moves_forward_past_runs_wholly_due() -> None:
    delayed = TopicDelays()
    delayed.add(DueRun("t", 0, _dues(1.0, 50.0)))
    delayed.add(DueRun("t", 2, _dues(2.0, None)))
    assert delayed.hold(0, 0.0) == 0
    assert delayed.hold(0, 10.0) == 1
    assert delayed.hold(0, 60.0) is None
    delayed.add(DueRun("t", 4, _dues(None, 70.0)))
    assert delayed.hold(0, 60.0) == 5


def test_pending_keep_and_hold_agree_with_a_plain_map() -> None:
    rng = random.Random(17)
    for _ in range(200):
        delayed = TopicDelays()
        model: dict[int, float] = {}
        offset = 0
        for _ in range(rng.randint(1, 6)):
            n = rng.randint(1, 8)
            values = [rng.choice([None, float(rng.randint(1, 20))]) for _ in range(n)]
            delayed.add(DueRun("t", offset, _dues(*values)))
            model.update((offset + i, v) for i, v in enumerate(values) if v is not None)
            offset += n
        limit = 0.0
        for now in sorted(rng.uniform(0, 25) for _ in range(4)):
            cursor = rng.randint(0, offset)
            acked = {o for o in range(cursor, offset) if rng.random() < 0.3}
            assert delayed.pending(cursor, acked, now) == sum(
                1 for o, d in model.items() if d > now and o >= cursor and o not in acked)
            start = rng.randint(0, offset)
            stop = rng.randint(start, offset)
            assert delayed.keep(start, stop, now) == sorted(
                o for o, d in model.items() if start <= o < stop and d > now)
            limit = max(limit, now - 5.0)
            assert delayed.hold(0, limit) == min(
                (o for o, d in model.items() if d > limit), default=None)
            for run in delayed.runs():
                run.fire(now)
            assert sum(len(r.order) - r.fired for r in delayed.runs()) == sum(
                1 for d in model.values() if d > now)
