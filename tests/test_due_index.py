"""The per-run index of delayed messages (G12): firing in (due, offset) order, lookups by
offset, and the walks STATS and cleanup make, against a plain map of offset -> due."""

from __future__ import annotations

import math
import random

from flux.shard.due_index import RUN_GAP, RUN_ITEMS, DueRun, TopicDelays


def test_a_run_fires_its_delayed_messages_in_due_then_offset_order() -> None:
    run = DueRun("t", 10)
    assert run.append(10, [5.0, None, 3.0]) == 3.0
    assert run.append(13, [5.0, 1.0]) == 1.0
    assert (run.first, run.end, run.last, run.last_due, run.count) == (10, 15, 14, 5.0, 4)
    assert list(run.seal()) == [4, 2, 0, 3]  # equal dues (5.0) keep their offset order
    assert run.next_due() == 1.0
    assert run.fire(0.5) == []
    assert run.fire(3.0) == [4, 2]
    assert run.next_due() == 5.0
    assert run.fire(9.0) == [0, 3]
    assert run.next_due() is None


def test_messages_published_one_by_one_share_a_run_until_it_seals() -> None:
    delayed = TopicDelays()
    assert delayed.add("t", 0, [None, None]) == (None, math.inf)  # nothing delayed
    assert not delayed and delayed.last == -1 and 0 not in delayed
    run, soonest = delayed.add("t", 2, [9.0])
    assert run is not None and soonest == 9.0
    assert delayed.add("t", 3, [12.0, None]) == (run, 12.0)  # the same run
    assert delayed.add("t", 5 + RUN_GAP, [1.0]) == (run, 1.0)  # ordinary messages between
    assert delayed.due_of(5) is None and delayed.due_of(5 + RUN_GAP) == 1.0
    assert delayed.last == 5 + RUN_GAP and len(delayed) == 3
    assert delayed.add("t", 7 + 3 * RUN_GAP, [2.0])[0] is not run  # too wide a gap
    assert [r.first for r in delayed.runs()] == [2, 7 + 3 * RUN_GAP]
    later = TopicDelays()
    first = later.add("t", 0, [1.0] * RUN_ITEMS)[0]
    assert later.add("t", RUN_ITEMS, [1.0])[0] not in (None, first)  # a full one takes no more
    first.seal()  # (it fired) a sealed run takes no more
    assert later.add("t", RUN_ITEMS + 1, [1.0])[0] not in (None, first)


def test_lookups_by_offset_and_the_highest_delayed_offset() -> None:
    delayed = TopicDelays()
    delayed.add("t", 0, [None, 7.0])
    delayed.add("t", 5 + RUN_GAP, [2.0, None, None])
    assert delayed and delayed.last == 5 + RUN_GAP
    g = 5 + RUN_GAP
    assert [o for o in range(g + 5) if o in delayed] == [1, g]
    assert (delayed.due_of(1), delayed.due_of(0), delayed.due_of(3)) == (7.0, None, None)
    assert dict(delayed.items()) == {1: 7.0, g: 2.0}
    assert [r.first for r in delayed.runs(2)] == [g]
    assert [delayed.undelayed_from(o) for o in (0, 1, 2, g, g + 3)] == [0, 2, 2, g + 1, g + 3]
    delayed.forget_below(2)
    assert dict(delayed.items()) == {g: 2.0}
    delayed.forget_below(g + 3)
    assert not delayed


def test_the_next_undelayed_offset_passes_wholly_delayed_runs_at_once() -> None:
    delayed = TopicDelays()
    delayed.add("t", 8, [1.0, 2.0])
    delayed.add("t", 10, [3.0])
    delayed.add("t", 11, [4.0, None])
    assert [delayed.undelayed_from(o) for o in (0, 8, 9, 11, 12, 13)] == [0, 12, 12, 12, 12, 13]


def test_pending_and_keep_agree_with_a_plain_map() -> None:
    rng = random.Random(17)
    for _ in range(200):
        delayed = TopicDelays()
        model: dict[int, float] = {}
        offset = 0
        for _ in range(rng.randint(1, 6)):
            offset += rng.choice([0, 0, 3, RUN_GAP + 1])  # ordinary messages between
            n = rng.randint(1, 8)
            values = [rng.choice([None, float(rng.randint(1, 20))]) for _ in range(n)]
            delayed.add("t", offset, values)
            model.update((offset + i, v) for i, v in enumerate(values) if v is not None)
            offset += n
        for now in sorted(rng.uniform(0, 25) for _ in range(4)):
            cursor = rng.randint(0, offset)
            acked = {o for o in range(cursor, offset) if rng.random() < 0.3}
            assert delayed.pending(cursor, acked, now) == sum(
                1 for o, d in model.items() if d > now and o >= cursor and o not in acked)
            start = rng.randint(0, offset)
            stop = rng.randint(start, offset)
            assert delayed.keep(start, stop, now) == sorted(
                o for o, d in model.items() if start <= o < stop and d > now)
            for run in delayed.runs():
                run.fire(now)
            assert sum(r.count - r.fired for r in delayed.runs()) == sum(
                1 for d in model.values() if d > now)
