"""A large dedup window's index of hashes -> serials (G3), alone and inside the window:
hits are only ever candidates (hashes collide, forced here with tiny tables and
injected hashes), expiry runs across table boundaries, ids come back after their
window, and the bulk path agrees with the one-by-one path.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flux.shard import serial_index
from flux.shard.dedup import EXPIRE_SLICE, SCALAR_IDS, DedupWindow
from flux.shard.serial_index import MASK64, PAD, SerialIndex, fingerprints

_BUILT = serial_index.fast


@pytest.fixture(autouse=True, scope="module", params=["c", "numpy"])
def walks(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """Every test here twice: with the C walks, and with numpy's (Flux without a C
    compiler)."""
    serial_index.fast = _BUILT if request.param == "c" else None
    yield request.param
    serial_index.fast = _BUILT


def test_the_c_walks_are_built() -> None:
    """``make venv`` builds them (a C compiler is part of the supported set-up): a run
    that fell back to numpy unnoticed would be ten times slower."""
    assert _BUILT is not None


def _bulk(index: SerialIndex, hashes: list[int], first: int) -> None:
    unsigned = np.array(hashes, np.uint64)
    index.add_all(unsigned, fingerprints(unsigned), np.arange(first, first + len(hashes)))


def _found(index: SerialIndex, h: int, serial: int) -> bool:
    """Whether ``serial`` is found under ``h`` (accept: only that serial)."""
    return index.find(h, lambda s, _key: s == serial, "") == serial


@given(hashes=st.lists(st.sampled_from([0, 1, 7, 1 << 48, MASK64, (1 << 63) + 5, 12345]),
                       min_size=1, max_size=300),
       min_room=st.sampled_from([1, 2, 8, 256]), bulk=st.booleans())
@settings(max_examples=80, deadline=None)
def test_every_placed_serial_is_found_however_hashes_collide(hashes: list[int], min_room: int,
                                                             bulk: bool) -> None:
    """A handful of hash values for hundreds of serials: long clusters, probes that run
    into a table's padding, tables that fill up early; every serial is still found, and
    the batch check never says "absent" for a placed hash."""
    index = SerialIndex(min_room)
    if bulk:
        for first in range(0, len(hashes), 50):
            _bulk(index, hashes[first:first + 50], first)
    else:
        for serial, h in enumerate(hashes):
            index.add(h, serial)
    for serial, h in enumerate(hashes):
        assert _found(index, h, serial), serial
    unsigned = np.array(hashes, np.uint64)
    assert index.maybe(unsigned, fingerprints(unsigned)).all()


def test_a_cluster_longer_than_the_padding_opens_a_new_table() -> None:
    """One hash placed more often than a table's padding can take past its home: the
    table closes and the rest go to the next one, all found."""
    index = SerialIndex(1 << 12)
    h = 0xFFFFFFFF  # home slot: the table's last one, so a probe runs into its padding
    _bulk(index, [h] * (PAD + 40), 0)
    assert index.tables == 2
    for serial in range(PAD + 40):
        assert _found(index, h, serial)


def test_dead_serials_are_not_found_and_dead_tables_are_dropped() -> None:
    index = SerialIndex(4)
    rng = random.Random(3)
    hashes = [rng.getrandbits(64) for _ in range(40)]
    for serial, h in enumerate(hashes):
        index.add(h, serial)
    tables = index.tables
    assert tables >= 3  # small tables: a new one each time the newest is full
    index.drop_before(17)
    assert index.tables < tables
    for serial, h in enumerate(hashes):
        assert _found(index, h, serial) == (serial >= 17)
    index.remove(hashes[20], 20)
    assert not _found(index, hashes[20], 20) and _found(index, hashes[21], 21)
    index.drop_before(40)
    assert index.tables <= 1  # the newest one may stay (it has room left)


def test_dead_tables_give_their_pages_back_a_slice_at_a_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Freeing a big table's pages at once would stall the shard: a dead table's pages
    go back a slice a call, and the live tables keep theirs."""
    monkeypatch.setattr(serial_index, "RELEASE_BYTES", 4096)
    index = SerialIndex(1000)  # tables of some 4 + 8 KB of slots
    rng = random.Random(9)
    hashes = [rng.getrandbits(64) for _ in range(2500)]
    for first in range(0, 2500, 500):
        _bulk(index, hashes[first:first + 500], first)
    assert index.tables >= 2
    index.drop_before(1000)  # the first table (serials 0-999) is dead
    assert len(index.dying) == 1
    calls = 1
    while index.dying:
        index.release()
        calls += 1
    assert calls > 3  # (12 KB and more, 4 KB a call)
    for serial in range(1000, 2500):
        assert _found(index, hashes[serial], serial)
    index.clear()
    assert index.tables == 0 and index.dying


def test_the_batch_check_says_absent_for_hashes_never_placed() -> None:
    """Not a speed test: with real 64-bit hashes, ids never placed come back absent
    from the batch check (without it every group would take the slow path)."""
    index = SerialIndex()
    rng = random.Random(5)
    placed = np.array([rng.getrandbits(64) for _ in range(20000)], np.uint64)
    index.add_all(placed, fingerprints(placed), np.arange(len(placed)))
    others = np.array([rng.getrandbits(64) for _ in range(1000)], np.uint64)
    assert index.maybe(others, fingerprints(others)).sum() < 20
    assert index.maybe(placed[:500], fingerprints(placed[:500])).all()


def test_a_hash_collision_never_makes_a_new_id_a_duplicate() -> None:
    """G3: every id shares one hash: lookups compare the packed ids, so a new id is new
    and a remembered one has its own offset (one by one and in bulk)."""
    dedup = DedupWindow(10.0, compact_ids=2, hasher=lambda s: 42, min_room=4)
    groups = [[f"g{g}-{i}" for i in range(n)] for g, n in enumerate([3, 1, SCALAR_IDS + 5, 2])]
    offset = 0
    for group in groups:
        keys = dedup.keys_for(group)
        assert not dedup.known_any(keys)
        dedup.remember_all(tuple(group), offset, 0.0, len("".join(group)), keys)
        offset += len(group)
    assert dedup.compact
    flat = [i for group in groups for i in group]
    for offset, message_id in enumerate(flat):
        assert dedup.get(message_id, 1.0) == offset
    assert dedup.get("g0-9", 1.0) is None and dedup.get("g2-0x", 1.0) is None
    fresh = [f"new-{i}" for i in range(SCALAR_IDS + 3)]
    assert not dedup.known_any(dedup.keys_for(fresh))
    assert dedup.known_any(dedup.keys_for([*fresh, flat[7]]))


def test_expiry_across_tables_keeps_offsets_and_bytes_exact() -> None:
    """Marks of mixed id lengths spread over many small tables, forgotten in slices
    that cut marks and tables: what is left keeps its offsets, counts and bytes."""
    window = 10.0
    dedup = DedupWindow(window, compact_ids=10, min_room=8)
    model: dict[str, tuple[int, float]] = {}
    offset = 0
    for step in range(60):
        now = float(step)
        ids = [f"s{step}-{'x' * (i % 3)}{i}" for i in range(7 + step % 5)]
        dedup.remember_all(ids, offset, now)
        model.update((m, (offset + i, now)) for i, m in enumerate(ids))
        offset += len(ids) + step % 2  # some offsets skipped
        dedup.expire(now, 5)
        for message_id, (original, at) in model.items():
            assert dedup.get(message_id, now) == (original if now < at + window else None)
        assert dedup.live_bytes(now) == sum(len(m) for m, (_, at) in model.items()
                                            if now < at + window)
    assert dedup.compact and dedup._serials._tables[0].first > 0  # older tables went
    while dedup.expire(100.0, EXPIRE_SLICE):
        pass
    assert len(dedup) == 0 and dedup.held_bytes == 0 and not dedup.compact


def test_an_id_accepted_again_in_a_compact_window() -> None:
    """G3: an id past its window but not forgotten yet is accepted again: its new offset
    is found, its old bytes and count go at once, and forgetting its old mark later
    leaves the new one."""
    dedup = DedupWindow(10.0, compact_ids=2, min_room=2)
    old = [f"m{i}" for i in range(EXPIRE_SLICE + 76)]
    dedup.remember_all(old, 0, 0.0)
    dedup.remember_all(["d", "e"], 5000, 5.0)
    assert dedup.compact and len(dedup) == len(old) + 2
    assert dedup.known_any(dedup.keys_for(["m1050", "f"]))  # past its window: still known
    assert dedup.get("m1050", 11.0) is None
    # remember_all forgets a slice first: the rest of the old mark stays, past its window
    dedup.remember_all(["m1050", "f"], 6000, 11.0)
    assert dedup.get("m1050", 11.0) == 6000 and dedup.get("m1050") == 6000
    assert dedup.get("m1049") == 1049 and dedup.get("m1049", 11.0) is None
    assert len(dedup) == 75 + 2 + 2
    assert dedup.held_bytes == 75 * 5 + 2 + 5 + 1
    assert dedup.live_bytes(11.0) == 2 + 5 + 1
    assert dedup.expire(11.0) == 76  # the hole counts as a place forgotten
    assert len(dedup) == 4 and dedup.held_bytes == dedup.live_bytes(11.0) == 8
    assert dedup.get("m1050") == 6000 and dedup.get("e") == 5001


def test_an_id_twice_in_one_group_keeps_its_first_offset() -> None:
    """A recovered run may hold an id twice (stored with no window): a compact window
    remembers its first offset, counts it once, and forgets both places."""
    dedup = DedupWindow(10.0, compact_ids=1, min_room=2)
    dedup.remember_all(["x", "y"], 0, 0.0)
    dedup.remember_all(["p", "q", "p", "r"], 2, 1.0)
    assert dedup.compact and len(dedup) == 5
    assert dedup.get("p") == 2 and dedup.get("r") == 5
    assert dedup.held_bytes == 6
    assert dedup.expire(20.0) == 6 and len(dedup) == 0 and dedup.held_bytes == 0
