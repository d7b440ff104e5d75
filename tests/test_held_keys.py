"""A shared subscription member's held offsets and keys, a batch at a time: the C
functions and the Python ones do the same to the same maps, hand back the same keys
(or the same refusal), and the C ones keep no reference they should not.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flux.shard import held_keys

_BUILT = held_keys.fast
KEYS = ["a", "b", "c", "d", "e"]


def test_the_c_functions_are_built() -> None:
    """``make venv`` builds them (a C compiler is part of the supported set-up)."""
    assert _BUILT is not None


def _both(name: str, *args: Any) -> tuple[Any, Any, tuple[Any, ...], tuple[Any, ...]]:
    """``name`` run by C and by Python, each on its own copy of ``args``: the results
    (or exception types) and the arguments as each left them."""
    out = []
    for fast in (_BUILT, None):
        mine = copy.deepcopy(args)
        held_keys.fast = fast
        try:
            result: Any = getattr(held_keys, name)(*mine)
        except Exception as exc:  # (compared below, not hidden)
            result = type(exc)
        finally:
            held_keys.fast = _BUILT
        out.append((result, mine))
    (c, c_args), (py, py_args) = out
    return c, py, c_args, py_args


@st.composite
def _members(draw: st.DrawFn) -> tuple[dict[int, int], dict[int, str], dict[str, int]]:
    """A member's in-flight offsets, the keys of some of them, and each key's count."""
    offsets = draw(st.lists(st.integers(0, 40), unique=True, max_size=20))
    in_flight = {o: draw(st.integers(1, 3)) for o in offsets}
    key_of = {o: draw(st.sampled_from(KEYS)) for o in offsets if draw(st.booleans())}
    keys: dict[str, int] = {}
    for key in key_of.values():
        keys[key] = keys.get(key, 0) + 1
    return in_flight, key_of, keys


_OFFSETS = st.lists(st.one_of(st.integers(-2, 45), st.sampled_from([1.0, True, "3"])),
                    max_size=12)


@settings(max_examples=400)
@given(member=_members(), pick=st.lists(st.integers(0, 40), max_size=12),
       other=_OFFSETS, use_other=st.booleans(), shuffle=st.randoms())
def test_let_go_c_and_python_agree(member: tuple[dict[int, int], dict[int, str],
                                                 dict[str, int]],
                                   pick: list[int], other: list[Any], use_other: bool,
                                   shuffle: Any) -> None:
    in_flight, key_of, keys = member
    held = sorted(in_flight)
    offsets: list[Any] = other if use_other or not held else \
        [held[i % len(held)] for i in pick]  # held ones, perhaps twice, any order
    shuffle.shuffle(offsets)
    c, py, c_args, py_args = _both("let_go", in_flight, key_of, keys, offsets)
    assert c == py
    assert c_args == py_args
    if c is not None:
        left = c_args[1]
        assert all(o not in c_args[0] and o not in left for o in offsets)
        assert set(c) == {key_of[o] for o in set(offsets) if o in key_of} - set(left.values())


@settings(max_examples=400)
@given(member=_members(), new=st.lists(st.integers(0, 60), max_size=12),
       keyed=st.lists(st.one_of(st.none(), st.sampled_from(KEYS)), max_size=60))
def test_hold_keys_c_and_python_agree(member: tuple[dict[int, int], dict[int, str],
                                                    dict[str, int]],
                                      new: list[int], keyed: list[str | None]) -> None:
    _, key_of, keys = member
    key_at = {o: k for o, k in zip(new, keyed, strict=False) if o % 7 != 3}
    c, py, c_args, py_args = _both("hold_keys", key_of, keys, new, key_at)
    assert c is py is None
    assert c_args == py_args
    key_of_after, keys_after = c_args[0], c_args[1]
    counted: dict[str, int] = {}
    for key in key_of_after.values():
        counted[key] = counted.get(key, 0) + 1
    assert counted == keys_after


def test_let_go_refuses_without_changing_anything() -> None:
    for fast in (_BUILT, None):
        held_keys.fast = fast
        try:
            in_flight, key_of, keys = {1: 1, 2: 1}, {1: "a"}, {"a": 1}
            for offsets in ([], [1, 3], [1, 1], [1.0], [True], ["1"]):
                assert held_keys.let_go(in_flight, key_of, keys, offsets) is None
                assert (in_flight, key_of, keys) == ({1: 1, 2: 1}, {1: "a"}, {"a": 1})
            assert held_keys.let_go(in_flight, key_of, keys, [2, 1]) == ["a"]
            assert (in_flight, key_of, keys) == ({}, {}, {})
        finally:
            held_keys.fast = _BUILT


@pytest.mark.skipif(_BUILT is None, reason="built without a C compiler")
def test_the_c_functions_keep_no_stray_references() -> None:
    """Each path (holding, letting go with a key emptied, a refusal, an error), run many
    times, leaves every object it touched with the references it had."""
    fast = _BUILT
    assert fast is not None
    key_a, key_b = "".join(["k", "a"]), "".join(["k", "b"])  # (not interned)
    offsets = [10_000 + i for i in range(6)]
    key_at = {o: (key_a if i % 2 else key_b) for i, o in enumerate(offsets)}

    def cycle() -> None:
        in_flight = dict.fromkeys(offsets, 1)
        key_of: dict[int, str] = {}
        keys: dict[str, int] = {}
        fast.hold_keys(key_of, keys, offsets, key_at)
        fast.hold_keys(key_of, keys, offsets, key_at)  # (held already: nothing)
        assert fast.let_go(in_flight, key_of, keys, offsets + offsets[:1]) is None
        assert fast.let_go(in_flight, key_of, keys, offsets[::2]) == [key_b]
        assert fast.let_go(in_flight, key_of, keys, offsets[1::2]) == [key_a]
        with pytest.raises(KeyError):
            fast.let_go({1: 1}, {1: key_a}, {}, [1])
        with pytest.raises(TypeError):
            fast.hold_keys(key_of, keys, offsets, [])

    cycle()  # (anything made lazily is made now)
    objects: list[Any] = [key_a, key_b, offsets, key_at, *offsets]
    before = [sys.getrefcount(o) for o in objects]
    for _ in range(5000):
        cycle()
    assert [sys.getrefcount(o) for o in objects] == before
