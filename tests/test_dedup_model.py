"""The dedup window against a plain dict model (G3): remembering groups of ids through
the publish path's two ways (the fast path's ``known_any`` then ``remember_all`` with
keys, and the per-item path's ``remember_all``), lookups, forgetting in slices, and
ids accepted again after their window; with a small ``compact_ids`` and tiny hash
tables, so that the window turns compact (packed ids, hash -> serial tables) and back
often, and with hashers that make ids collide, so that every hit must be checked
against the packed id. A compact window's small publishes join its newest mark, so an
id may be remembered up to ``merge_span`` past its window (never less): the model
takes either answer in that band.
"""

from __future__ import annotations

import gc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from flux.shard import serial_index
from flux.shard.dedup import EXPIRE_SLICE, MERGE_CHARS, SCALAR_IDS, DedupWindow

WINDOW = 5.0
POOL = [f"id-{i}" for i in range(60)] + ["x" * 32, "y" * 255]
# hashers: Python's own, and ones under which many or all ids share a hash
HASHERS = {"hash": hash, "one": lambda s: 7, "by-length": lambda s: len(s) << 20,
           "few": lambda s: hash(s) % 3 - (1 << 63)}


class DedupModel(RuleBasedStateMachine):
    """Every id ever accepted -> (offset, end of its window), beside a DedupWindow."""

    def __init__(self) -> None:
        super().__init__()
        self.model: dict[str, tuple[int, float]] = {}
        self.now = 0.0
        self.next_offset = 0
        self.dedup = DedupWindow(WINDOW)

    @initialize(compact_ids=st.integers(1, 6), min_room=st.sampled_from([1, 2, 8, 64]),
                hasher=st.sampled_from(sorted(HASHERS)))
    def start(self, compact_ids: int, min_room: int, hasher: str) -> None:
        self.dedup = DedupWindow(WINDOW, compact_ids=compact_ids, hasher=HASHERS[hasher],
                                 min_room=min_room)

    def live(self, message_id: str) -> int | None:
        entry = self.model.get(message_id)
        return entry[0] if entry is not None and entry[1] > self.now else None

    def answers(self, message_id: str) -> set[int | None]:
        """What the window may answer for ``message_id`` now: its offset in its window,
        None after, either in the ``merge_span`` after its window ends."""
        entry = self.model.get(message_id)
        if entry is None or entry[1] + self.dedup.merge_span <= self.now:
            return {None}
        return {entry[0]} if entry[1] > self.now else {entry[0], None}

    def banded(self) -> list[str]:
        """Ids past their window by less than ``merge_span`` (either answer goes)."""
        return [i for i, (_, end) in self.model.items()
                if end <= self.now < end + self.dedup.merge_span]

    def _accepted(self, ids: list[str]) -> None:
        for i, message_id in enumerate(ids):
            self.model[message_id] = (self.next_offset + i, self.now + WINDOW)
        self.next_offset += len(ids)

    @rule(step=st.sampled_from([0.0, 0.01, 0.02, 0.25, 1.0, 2.5, 4.97, 4.99, 5.0, 7.0]))
    def advance(self, step: float) -> None:
        self.now += step

    @rule(count=st.integers(1, 3))
    def gap(self, count: int) -> None:
        """Offsets taken by messages without an id (their publish remembers nothing)."""
        self.next_offset += count

    @rule(ids=st.lists(st.sampled_from(POOL), min_size=1, max_size=SCALAR_IDS + 12, unique=True))
    def publish_fast(self, ids: list[str]) -> None:
        """The fast path: a slice of expiry, then the group only if none is known."""
        self.dedup.expire(self.now, EXPIRE_SLICE)
        keys = self.dedup.keys_for(ids)
        if self.dedup.known_any(keys):
            assert any(message_id in self.model for message_id in ids)
            return
        assert all(self.live(message_id) is None for message_id in ids)
        chunk = tuple(ids)
        self.dedup.remember_all(chunk, self.next_offset, self.now, len("".join(ids)), keys)
        self._accepted(ids)

    @rule(ids=st.lists(st.sampled_from(POOL), min_size=1, max_size=12, unique=True))
    def publish_per_item(self, ids: list[str]) -> None:
        """The per-item path: duplicates get their original offset, the rest is stored."""
        find = self.dedup.finder(self.now)
        self.dedup.expire(self.now, EXPIRE_SLICE)
        new = []
        for message_id in ids:
            found = find(message_id)
            assert found in self.answers(message_id)
            if found is None:
                new.append(message_id)
        if new:
            self.dedup.remember_all(tuple(new), self.next_offset, self.now)
            self._accepted(new)

    @rule(message_id=st.sampled_from(POOL))
    def lookup(self, message_id: str) -> None:
        assert self.dedup.lookup(message_id, self.now) in self.answers(message_id)

    @rule(most=st.integers(1, 8))
    def expire_slice(self, most: int) -> None:
        before = len(self.dedup)
        forgotten = self.dedup.expire(self.now, most)
        assert 0 <= forgotten <= most
        assert len(self.dedup) <= before

    @rule()
    def expire_all(self) -> None:
        self.dedup.expire(self.now)
        live = sorted(i for i in self.model if self.live(i) is not None)
        banded = self.banded()
        assert len(live) <= len(self.dedup) <= len(live) + len(banded)
        for message_id in live:
            assert self.dedup.get(message_id) == self.live(message_id)
        if not live and not banded:
            assert self.dedup.held_bytes == 0
        if not self.dedup.due_at() < float("inf"):  # no mark left: a dict again
            serials = self.dedup._serials  # (None: never compact yet)
            assert not self.dedup.compact and (serials is None or serials.tables == 0)

    @invariant()
    def agrees(self) -> None:
        now = self.now
        for message_id in POOL:
            assert self.dedup.get(message_id, now) in self.answers(message_id)
        exact = sum(len(i) for i in self.model if self.live(i) is not None)
        assert exact <= self.dedup.live_bytes(now) <= exact + sum(map(len, self.banded()))
        assert not gc.is_tracked(self.dedup._index)  # the GC never walks the index


TestDedupModel = DedupModel.TestCase
TestDedupModel.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)

_BUILT = serial_index.fast


class DedupModelNumpy(DedupModel):
    """The same, with the index walked by numpy (Flux built without a C compiler)."""

    def __init__(self) -> None:
        serial_index.fast = None
        super().__init__()

    def teardown(self) -> None:
        serial_index.fast = _BUILT


TestDedupModelNumpy = DedupModelNumpy.TestCase
TestDedupModelNumpy.settings = settings(max_examples=150, stateful_step_count=60,
                                        deadline=None)


@pytest.fixture(params=["c", "numpy"])
def walks(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    serial_index.fast = _BUILT if request.param == "c" else None
    yield request.param
    serial_index.fast = _BUILT


@given(n=st.integers(0, 3000), compact_ids=st.integers(1, 64), seed=st.integers(0, 2**32),
       min_room=st.sampled_from([1, 16, 1024]), group=st.sampled_from([7, SCALAR_IDS + 40]))
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # (one toggle a run)
@pytest.mark.usefixtures("walks")
def test_many_ids_turn_the_window_compact_and_each_keeps_its_offset(
        n: int, compact_ids: int, seed: int, min_room: int, group: int) -> None:
    dedup = DedupWindow(WINDOW, compact_ids=compact_ids, min_room=min_room)
    ids = [f"{seed:x}-{i}" for i in range(n)]
    for first in range(0, n, group):  # groups, as the fast path stores them
        chunk = ids[first:first + group]
        keys = dedup.keys_for(chunk)
        assert not dedup.known_any(keys)
        dedup.remember_all(tuple(chunk), first, 0.0, len("".join(chunk)), keys)
    assert len(dedup) == n
    assert dedup.compact == (n > compact_ids)
    for offset, message_id in enumerate(ids):
        assert dedup.get(message_id, 1.0) == offset
    assert dedup.get("not-an-id", 1.0) is None
    forgotten = 0
    while True:
        got = dedup.expire(WINDOW, EXPIRE_SLICE)
        if not got:
            break
        forgotten += got
    assert forgotten == n and len(dedup) == 0 and not dedup.compact
    for message_id in ids[:50]:
        assert dedup.get(message_id) is None


@pytest.mark.usefixtures("walks")
@pytest.mark.parametrize("length", ["fixed", "mixed"])
def test_a_window_of_single_publishes_turns_compact_in_a_few_calls(length: str) -> None:
    """Marks of one id each (single publishes) packed at once: every id keeps
    its offset, a known id is known, and the window goes on remembering."""
    dedup = DedupWindow(WINDOW, compact_ids=64)
    ids = [f"{i:08x}" if length == "fixed" else f"id-{i}" for i in range(200)]
    for offset, message_id in enumerate(ids):
        dedup.remember_all((message_id,), offset, 0.0)
    assert dedup.compact and len(dedup) == 200
    assert [dedup.get(i, 1.0) for i in ids] == list(range(200))
    assert dedup.known_any(dedup.keys_for(ids[5:40])) and not dedup.known_any(["nope"])
    dedup.remember_all(("later",), 200, 0.5)
    assert dedup.get("later", 1.0) == 200 and dedup.get(ids[-1], 1.0) == 199


@pytest.mark.usefixtures("walks")
def test_single_publishes_of_a_compact_window_share_its_newest_mark() -> None:
    """Single publishes close in time join the newest mark (a mark's own cost is shared,
    not paid by each id), ids of other lengths too: a gap in the offsets, a full mark or
    a mark begun more than ``merge_span`` before starts the next one. Each id keeps its
    offset, and is remembered at least its window, at most ``merge_span`` longer."""
    dedup = DedupWindow(WINDOW, compact_ids=4)
    span = dedup.merge_span
    ids = [f"{i:032x}" for i in range(400)]
    offsets = {}
    now, offset = 0.0, 0
    for i, message_id in enumerate(ids):
        if i == 100:
            offset += 3  # messages without an id took these
        if i == 200:
            now += 2 * span  # a new mark, later
        dedup.remember_all((message_id,), offset, now)
        offsets[message_id] = offset
        offset += 1
        now += span / 1000
    marks = len(dedup._ids)
    dedup.remember_all(("short",), offset, now)
    dedup.remember_all(("a-bit-longer", "", "x" * 40), offset + 1, now)
    assert dedup.compact and len(dedup) == 404 and len(dedup._ids) == marks
    per_mark = MERGE_CHARS // 32
    # the 5 tuples made compact, then marks of up to per_mark ids: a new one at the gap
    # and at the pause
    assert marks <= 5 + 400 // per_mark + 2
    assert all(dedup.get(i, now) == o for i, o in offsets.items())
    assert [dedup.get(i, now) for i in ("short", "a-bit-longer", "", "x" * 40)] == list(
        range(offset, offset + 4))
    first_end = WINDOW  # the first id's window (accepted at 0)
    assert dedup.get(ids[10], first_end - 1e-6) == offsets[ids[10]]
    assert dedup.get(ids[10], first_end + span + 1e-6) is None
    dedup.expire(first_end + span + 1e-6)
    assert dedup.get(ids[10]) is None and dedup.get(ids[-1]) == offsets[ids[-1]]


def test_a_compact_window_run_with_an_id_twice_or_one_still_held_is_exact(
        walks: None) -> None:
    """A run remembered without keys (a recovery's, into a compact window): an id twice
    keeps its first place, an id past its window but not forgotten yet is taken out of
    its old mark."""
    dedup = DedupWindow(WINDOW, compact_ids=4)
    dedup.remember_all(tuple(f"a{i}" for i in range(2000)), 0, 0.0)
    assert dedup.compact and len(dedup) == 2000
    dedup.remember_all((*(f"b{i}" for i in range(30)), "b3", "b31"), 2000, 1.0)
    assert (dedup.get("b3"), dedup.get("b29"), dedup.get("b31")) == (2003, 2029, 2031)
    later = WINDOW + 0.5  # every a* is past its window; a slice of them is forgotten
    dedup.remember_all(("c0", "a1999", "c1", "a5"), 3000, later)
    assert (dedup.get("a1999", later), dedup.get("a5", later)) == (3001, 3003)
    assert dedup.get("c1", later) == 3002 and dedup.get("a1998", later) is None
    assert dedup.get("b0", later) == 2000
