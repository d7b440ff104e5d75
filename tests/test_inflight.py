"""InFlight (flux/shard/inflight.py): a run held as its ends behaves as the dict it stands for."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from flux.shard.inflight import InFlight

_ops = st.lists(st.one_of(
    st.tuples(st.just("push"), st.integers(0, 3), st.integers(0, 5)),    # gap, count
    st.tuples(st.just("set"), st.integers(-2, 14), st.integers(1, 3)),   # offset, pushes
    st.tuples(st.just("pop"), st.integers(-2, 14), st.just(0)),
    st.tuples(st.just("del_first"), st.just(0), st.just(0)),
    st.tuples(st.just("del_last"), st.just(0), st.just(0)),
    st.tuples(st.just("drop_through"), st.integers(0, 6), st.just(0)),  # how many of a prefix
    st.tuples(st.just("clear"), st.just(0), st.just(0)),
), max_size=30)


@settings(max_examples=300, deadline=None)
@given(ops=_ops)
def test_in_flight_matches_an_ordered_dict(ops: list[tuple[str, int, int]]) -> None:
    """Every operation the shard uses gives the same contents, order, lookups and ends
    as a dict, whether it stays a run or turns into a dict."""
    real, model = InFlight(), {}
    top = 0  # first pushes go above every offset pushed so far
    for kind, a, b in ops:
        if kind == "push":
            start = max([top, *model]) + a
            offsets = range(start, start + b)
            real.push_first(offsets)
            model.update(dict.fromkeys(offsets, 1))
            top = max(top, start + b)
        elif kind == "set" and (a in model or a >= max([top, *model])):
            real[a] = b
            model[a] = b
            top = max(top, a + 1)
        elif kind == "pop":
            assert real.pop(a) == model.pop(a, None)
        elif kind in ("del_first", "del_last") and model:
            key = next(iter(model)) if kind == "del_first" else next(reversed(model))
            del real[key]
            del model[key]
        elif kind == "drop_through" and model:
            keys = list(model)
            prefix = keys[:a]
            if prefix and prefix == list(range(keys[0], keys[0] + len(prefix))):
                real.drop_through(prefix[-1])
                for k in prefix:
                    del model[k]
        elif kind == "clear":
            real.clear()
            model.clear()
        assert list(real.items()) == list(model.items())
        assert len(real) == len(model) and real == model and model == real
        assert bool(real) == bool(model)
        if model:
            assert (real.first(), real.last()) == (next(iter(model)), next(reversed(model)))
        for o in range(-2, 16):
            assert (o in real) == (o in model) and real.get(o) == model.get(o)


def test_a_run_pushed_and_acked_from_its_low_end_stays_two_integers() -> None:
    flight = InFlight()
    flight.push_first(range(10, 20))
    flight.push_first(range(20, 25))
    flight.drop_through(14)
    del flight[15]
    flight[25] = 1
    assert flight._map is None and list(flight) == list(range(16, 26))
    flight[18] = 2  # a re-push: now a dict, in the same order
    assert flight._map is not None and list(flight.items())[2] == (18, 2)
    flight.drop_through(25)
    assert flight._map is None and len(flight) == 0
