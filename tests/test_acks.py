"""Acks (flux.acks) against a plain set of offsets: every operation the shard and the
client use agrees, whatever the order of adds, and a stream of acks behind a stuck cursor is one run."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flux.acks import Acks, sorted_runs

_ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, 60)),
    st.tuples(st.just("take"), st.integers(0, 60)),
    st.tuples(st.just("drop"), st.integers(0, 70)),
    st.tuples(st.just("range"), st.tuples(st.integers(0, 60), st.integers(0, 12))),
), max_size=80)


@settings(max_examples=400, deadline=None)
@given(ops=_ops, probe=st.tuples(st.integers(-2, 70), st.integers(-2, 70)))
def test_acks_agree_with_a_set(ops: list[tuple[str, Any]], probe: tuple[int, int]) -> None:
    acks, model = Acks(), set[int]()
    for op, x in ops:
        if op == "add":
            acks.add(x)
            model.add(x)
        elif op == "take":  # a cursor, below every ack: the first run goes if it is there
            if model and x > min(model):
                x = min(model)
            want = x
            while want in model:
                model.remove(want)
                want += 1
            assert acks.take_run(x) == want
        elif op == "range":
            start, n = x
            acks.add_range(start, start + n)
            model.update(range(start, start + n))
        else:
            acks.drop_below(x)
            model = {o for o in model if o >= x}
        assert len(acks) == len(model) and bool(acks) == bool(model)
        assert list(acks) == sorted(model)
        assert acks == model and acks == Acks(model)
    start, stop = probe
    assert acks.any_in(start, stop) == any(start <= o < stop for o in model)
    assert acks.missing(start, stop) == [o for o in range(start, stop) if o not in model]
    assert all((o in acks) == (o in model) for o in range(-2, 72))
    if model:
        assert acks.max() == max(model) and acks.min() == min(model)
    for o in range(-2, 72):
        assert acks.first_missing(o) == next(m for m in range(o, 200) if m not in model)
        assert acks.first_held(o) == min((m for m in model if m >= o), default=None)
        assert acks.count_below(o) == sum(1 for m in model if m < o)
    twin = acks.copy()
    twin.add(1000)
    assert 1000 not in acks


def test_a_stream_of_acks_above_a_stuck_cursor_is_one_run() -> None:
    acks = Acks()
    for o in range(1, 100_001):
        acks.add(o)
    assert (len(acks), acks.runs) == (100_000, 1)
    assert acks.take_run(0) == 0 and acks.take_run(1) == 100_001 and not acks


@settings(max_examples=200, deadline=None)
@given(runs=st.lists(st.tuples(st.integers(0, 80), st.integers(0, 6)), max_size=20))
def test_runs_out_and_back_give_the_same_offsets(runs: list[tuple[int, int]]) -> None:
    """A flat [first, count, ...] list (what a disk topic's log holds) rebuilds the same
    set; runs in any order, overlapping or touching, merge as their offsets would."""
    flat = [x for run in runs for x in run]
    model = {o for first, count in runs for o in range(first, first + count)}
    acks = Acks.from_runs(flat)
    assert acks == model and len(acks) == len(model)
    out = acks.as_runs()
    assert len(out) == 2 * acks.runs and out[0::2] == sorted(out[0::2])
    assert Acks.from_runs(out) == acks and list(Acks.from_runs(out)) == sorted(model)


def test_a_million_offsets_in_two_runs_export_as_four_numbers() -> None:
    acks = Acks()
    acks.add_range(1, 500_001)
    acks.add_range(500_002, 1_000_002)
    assert acks.as_runs() == [1, 500_000, 500_002, 500_000]
    assert Acks.from_runs(acks.as_runs()) == acks


@pytest.mark.parametrize("bad", [[1], [1, 2, 3], [5, -1]])
def test_runs_of_odd_length_or_negative_count_are_refused(bad: list[int]) -> None:
    with pytest.raises(ValueError):
        Acks.from_runs(bad)


@settings(max_examples=300, deadline=None)
@given(st.sets(st.integers(0, 300), max_size=80), st.sets(st.integers(0, 300), max_size=20))
def test_sorted_offsets_add_as_their_runs(offsets: set[int], before: set[int]) -> None:
    """A key-ordered member's acks (distinct, a few runs) added a run at a time: the
    same set as adding each, the runs maximal."""
    ordered = sorted(offsets)
    runs = sorted_runs(ordered)
    assert [o for a, b in runs for o in range(a, b)] == ordered
    assert all(b < c for (_, b), (c, _) in pairwise(runs))
    acks, one_by_one = Acks(before), Acks(before)
    acks.add_sorted(ordered)
    for o in ordered:
        one_by_one.add(o)
    assert acks == one_by_one and len(acks) == len(offsets | before)
