"""Unit tests of TopicLog and DedupWindow (flux/shard/topic.py): offsets, trims, id windows."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flux import protocol as P
from flux.acks import sorted_runs
from flux.shard.dedup import COMPACT_IDS, DedupWindow
from flux.shard.topic import TopicLog


def _log_with(n: int, start_time: float = 0.0, step: float = 1.0) -> TopicLog:
    log = TopicLog()
    for i in range(n):
        log.append(f"id{i}", b"p" * i, start_time + i * step)
    return log


# -- TopicLog ------------------------------------------------------------------------------


def test_offsets_start_at_zero_and_are_consecutive() -> None:
    """G1: a topic's offsets are 0, 1, 2, ... in append order."""
    log = TopicLog()
    assert (log.oldest, log.next_offset, len(log)) == (0, 0, 0)
    assert [log.append(f"m{i}", b"x", 0.0) for i in range(5)] == [0, 1, 2, 3, 4]
    assert (log.oldest, log.next_offset, len(log)) == (0, 5, 5)


def test_offsets_are_never_reused_after_trimming_everything() -> None:
    """G1: cleanup never makes an offset available again."""
    log = _log_with(3)
    assert log.trim(below=3, stored_before=100.0) == 3
    assert len(log) == 0
    assert log.oldest == log.next_offset == 3
    assert log.append("again", b"x", 200.0) == 3
    assert log.get(3) is not None and log.get(3).id == "again"  # type: ignore[union-attr]
    assert log.get(0) is None


def test_get_returns_only_held_offsets() -> None:
    log = _log_with(4)
    log.trim(below=2, stored_before=100.0)
    assert log.get(1) is None
    assert log.get(-1) is None
    assert log.get(4) is None
    entry = log.get(2)
    assert entry is not None and entry.id == "id2" and entry.payload == b"pp"


def test_trim_stops_at_the_first_message_younger_than_the_cutoff() -> None:
    """G2/G5: a message stored after ``stored_before`` stays, and so does all after it."""
    log = _log_with(5)  # stored at 0, 1, 2, 3, 4
    assert log.trim(below=5, stored_before=1.0) == 2  # offsets 0 and 1 (stored at <= 1.0)
    assert log.oldest == 2


def test_trim_never_drops_at_or_above_below() -> None:
    """G5: ``below`` (the lowest cursor) protects every offset at or above it."""
    log = _log_with(5)
    assert log.trim(below=2, stored_before=1000.0) == 2
    assert log.oldest == 2
    assert log.trim(below=2, stored_before=1000.0) == 0
    assert log.trim(below=0, stored_before=1000.0) == 0
    assert log.oldest == 2


def test_held_bytes_count_payload_and_id_and_drop_on_trim() -> None:
    """G5: payload and id bytes count toward the topic's size."""
    log = TopicLog()
    log.append("abc", b"12345", 0.0)
    log.append("de", b"", 0.0)
    assert log.held_bytes == 3 + 5 + 2
    log.trim(below=1, stored_before=0.0)
    assert log.held_bytes == 2


def test_read_returns_a_range_from_start_bounded_by_count() -> None:
    log = _log_with(6)
    assert list(log.fit(2, 3, 1 << 20)) == [2, 3, 4]
    assert list(log.fit(5, 10, 1 << 20)) == [5]
    assert list(log.fit(6, 10, 1 << 20)) == []
    assert list(log.fit(100, 10, 1 << 20)) == []


def test_read_from_a_trimmed_offset_starts_at_the_oldest_held() -> None:
    log = _log_with(6)
    log.trim(below=3, stored_before=100.0)
    assert list(log.fit(0, 2, 1 << 20)) == [3, 4]


def test_read_is_bounded_by_bytes_but_returns_at_least_one() -> None:
    log = TopicLog()
    for i in range(4):
        log.append(f"i{i}", b"x" * 100, 0.0)  # 102 bytes each with the id
    assert list(log.fit(0, 10, 250)) == [0, 1]
    assert list(log.fit(0, 10, 1)) == [0]


def test_log_compacts_after_many_trims_without_changing_offsets() -> None:
    log = TopicLog()
    for i in range(3000):
        log.append(f"m{i}", b"", float(i))
    assert log.trim(below=2500, stored_before=10_000.0) == 2500
    assert (log.oldest, log.next_offset, len(log)) == (2500, 3000, 500)
    assert log.get(2499) is None
    entry = log.get(2500)
    assert entry is not None and entry.id == "m2500"
    assert log.append("new", b"", 0.0) == 3000
    assert list(log.fit(0, 3, 1 << 20)) == [2500, 2501, 2502]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(0, 5)),
    st.tuples(st.just("trim"), st.integers(0, 60), st.integers(0, 60)),
), max_size=60))
def test_log_matches_a_dict_model(ops: list[tuple[object, ...]]) -> None:
    """G1/G5: random appends and trims agree with a plain dict of offset -> message."""
    log = TopicLog()
    model: dict[int, tuple[str, bytes, float]] = {}
    next_offset = 0
    now = 0.0
    for op in ops:
        if op[0] == "append":
            size = int(op[1])  # type: ignore[call-overload]
            now += 1.0
            mid = f"m{next_offset}"
            assert log.append(mid, b"x" * size, now) == next_offset
            model[next_offset] = (mid, b"x" * size, now)
            next_offset += 1
        else:
            below, cutoff = int(op[1]), float(op[2])  # type: ignore[call-overload]
            expected = 0
            for off in sorted(model):
                if off < below and model[off][2] <= cutoff:
                    del model[off]
                    expected += 1
                else:
                    break
            assert log.trim(below, cutoff) == expected
        assert log.next_offset == next_offset
        assert len(log) == len(model)
        assert log.oldest == (min(model) if model else next_offset)
        assert log.held_bytes == sum(len(m[0]) + len(m[1]) for m in model.values())
        for off in range(next_offset + 1):
            entry = log.get(off)
            if off in model:
                assert entry is not None and tuple(entry) == model[off]
            else:
                assert entry is None


# -- DedupWindow ---------------------------------------------------------------------------


def test_dedup_remembers_the_original_offset_within_the_window() -> None:
    """G3: an id accepted less than ``window`` ago maps to its first offset."""
    dedup = DedupWindow(10.0)
    dedup.remember("a", 7, 0.0)
    assert dedup.lookup("a", 0.0) == 7
    assert dedup.lookup("a", 9.999) == 7
    assert dedup.lookup("b", 1.0) is None


def test_dedup_forgets_an_id_once_the_window_has_passed() -> None:
    """G3: after ``dedup_window`` the id may be stored anew."""
    dedup = DedupWindow(10.0)
    dedup.remember("a", 7, 0.0)
    assert dedup.lookup("a", 10.0) is None
    assert len(dedup) == 0
    assert dedup.held_bytes == 0


def test_dedup_window_counts_from_acceptance_not_from_lookups() -> None:
    """G3: a duplicate does not extend the window of the original."""
    dedup = DedupWindow(10.0)
    dedup.remember("a", 1, 0.0)
    assert dedup.lookup("a", 9.0) == 1
    assert dedup.lookup("a", 10.5) is None


def test_dedup_remembers_a_re_accepted_id_with_its_new_offset() -> None:
    """G3: once forgotten, an id stored again maps to the new offset for a new window."""
    dedup = DedupWindow(10.0)
    dedup.remember("a", 1, 0.0)
    assert dedup.lookup("a", 12.0) is None
    dedup.remember("a", 5, 12.0)
    assert dedup.lookup("a", 21.0) == 5
    assert dedup.lookup("a", 22.0) is None


def test_dedup_expire_forgets_in_acceptance_order_and_counts_bytes() -> None:
    """G5: remembered ids count toward the topic's bytes until they expire."""
    dedup = DedupWindow(10.0)
    dedup.remember("aa", 0, 0.0)
    dedup.remember("bbb", 1, 5.0)
    assert dedup.held_bytes == 5
    assert dedup.expire(9.0) == 0
    assert dedup.expire(10.0) == 1
    assert dedup.held_bytes == 3
    assert dedup.lookup("aa", 10.0) is None
    assert dedup.lookup("bbb", 10.0) == 1
    assert dedup.expire(100.0) == 1
    assert (len(dedup), dedup.held_bytes) == (0, 0)


def test_dedup_with_a_zero_window_remembers_nothing() -> None:
    dedup = DedupWindow(0.0)
    dedup.remember("a", 1, 0.0)
    assert dedup.lookup("a", 0.0) is None
    assert dedup.held_bytes == 0


# -- model tests with batches and shared store times ----------------------------------------

_log_ops = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(0, 3), st.booleans()),
    st.tuples(st.just("extend"), st.integers(0, 700), st.booleans()),
    st.tuples(st.just("trim"), st.integers(0, 3000), st.integers(0, 40)),
), max_size=25)


@settings(max_examples=150, deadline=None)
@given(ops=_log_ops)
def test_log_with_batches_matches_a_dict_model(ops: list[tuple[object, ...]]) -> None:
    """G1/G2/G5: appends and batch extends (several per store time), trims and compaction
    agree with a dict of offset -> (id, payload, stored_at) on get, read, span and bytes."""
    log = TopicLog()
    model: dict[int, tuple[str, bytes, float]] = {}
    next_offset = 0
    now = 0.0
    for op in ops:
        kind = op[0]
        if kind in ("append", "extend"):
            n, same_time = int(op[1]), bool(op[2])  # type: ignore[call-overload]
            if not same_time:
                now += 1.0
            batch = [(f"m{next_offset + k}", bytes(k % 3)) for k in range(n if kind == "extend"
                                                                          else 1)]
            if kind == "append":
                assert log.append(batch[0][0], batch[0][1], now) == next_offset
            else:
                assert log.extend([b[0] for b in batch], [b[1] for b in batch], now) == next_offset
            for mid, payload in batch:
                model[next_offset] = (mid, payload, now)
                next_offset += 1
        else:
            below, cutoff = int(op[1]), float(op[2])  # type: ignore[call-overload]
            expected = 0
            for off in sorted(model):
                if off < below and model[off][2] <= cutoff:
                    del model[off]
                    expected += 1
                else:
                    break
            assert log.trim(below, cutoff) == expected
        assert (log.next_offset, len(log)) == (next_offset, len(model))
        oldest = min(model) if model else next_offset
        assert log.oldest == oldest
        assert log.held_bytes == sum(len(m[0]) + len(m[1]) for m in model.values())
        for off in (oldest - 1, oldest, (oldest + next_offset) // 2, next_offset - 1, next_offset):
            entry = log.get(off)
            assert (tuple(entry) if entry is not None else None) == model.get(off)
        assert list(log.fit(oldest, 5, 1 << 20)) == \
            list(range(oldest, min(oldest + 5, next_offset)))
        if model:
            stop = min(next_offset, oldest + 700)
            ids, payloads, runs = log.span(oldest, stop)
            assert list(zip(ids, payloads, P.times_of(runs), strict=True)) == \
                [model[o] for o in range(oldest, stop)]
            _, _, wall = log.span(oldest, stop, 1000.0)
            assert list(P.times_of(wall)) == [1000.0 + t for t in P.times_of(runs)]


_compact_ids = st.sampled_from([1, 2, 5, COMPACT_IDS])


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["remember", "remember_all", "lookup", "expire"]),
                              st.integers(0, 6), st.integers(0, 4), st.booleans()),
                    max_size=40), compact_ids=_compact_ids)
def test_dedup_window_matches_a_dict_model(ops: list[tuple[str, int, int, bool]],
                                           compact_ids: int) -> None:
    """G3: an id maps to its offset from acceptance until exactly ``window`` later
    (whether or not the window is compact)."""
    window = 5.0
    dedup = DedupWindow(window, compact_ids, min_room=2)
    model: dict[str, tuple[int, float]] = {}  # id -> (offset, accepted at)
    now, offset, expired_up_to = 0.0, 0, 0.0

    def alive(mid: str, t: float) -> bool:
        return mid in model and t < model[mid][1] + window

    for kind, k, n, later in ops:
        if later:
            now += 1.0
        mid = f"id{k}"
        if kind == "lookup":
            assert dedup.lookup(mid, now) == (model[mid][0] if alive(mid, now) else None)
            expired_up_to = now
        elif kind == "expire":
            dedup.expire(now)
            expired_up_to = now
        else:
            dedup.expire(now)  # as the core does before accepting ids
            expired_up_to = now
            fresh = {f"id{(k + j) % 7}": 0 for j in range(n + 1 if kind == "remember_all" else 1)}
            fresh = {i: 0 for i in fresh if not alive(i, now)}
            for i in fresh:
                fresh[i] = offset
                model[i] = (offset, now)
                offset += 1
            if kind == "remember":
                for i, o in fresh.items():
                    dedup.remember(i, o, now)
            elif fresh:
                dedup.remember_all(list(fresh), next(iter(fresh.values())), now)
        for i in [f"id{j}" for j in range(7)]:
            assert dedup.get(i) == (model[i][0] if alive(i, expired_up_to) else None), i
            assert dedup.known_any({i: 0, "never": 0}) == alive(i, expired_up_to), i
        live = [i for i in model if alive(i, expired_up_to)]
        assert len(dedup) == len(live)
        assert dedup.held_bytes == sum(len(i) for i in live)


def test_dedup_finds_offsets_across_marks_far_back_and_after_compaction() -> None:
    """G3: a duplicate's original offset is exact wherever the id sits in the window,
    also once expired ids were compacted away and for runs that skip offsets."""
    dedup = DedupWindow(10.0)
    expected: dict[str, int] = {}
    offset = 0
    for batch in range(40):  # 40 runs of 100 ids, one second apart, some offsets skipped
        ids = [f"m{batch}-{i}" for i in range(100)]
        dedup.remember_all(ids, offset, float(batch))
        expected.update((mid, offset + i) for i, mid in enumerate(ids))
        offset += 100 + batch % 3
    # remembering at t=39 forgot runs 0-29 (their window ended by then) and compacted them
    assert dedup.expire(39.0) == 0 and dedup.expire(40.0) == 100
    for mid, original in expected.items():
        batch = int(mid[1:].split("-")[0])
        assert dedup.get(mid) == (original if batch > 30 else None), mid
    assert len(dedup) == 900
    assert dedup.held_bytes == sum(len(mid) for mid in expected if int(mid[1:].split("-")[0]) > 30)


def test_dedup_expire_with_a_limit_forgets_the_oldest_ids_and_keeps_offsets_of_the_rest() -> None:
    """G3: a sliced expiry (at most ``most`` ids) may cut a run of ids in two; the
    rest keep their exact offsets and expire later."""
    dedup = DedupWindow(10.0)
    dedup.remember_all([f"a{i}" for i in range(10)], 100, 0.0)
    dedup.remember_all([f"b{i}" for i in range(5)], 110, 1.0)
    assert dedup.expire(20.0, 3) == 3
    assert [dedup.get(f"a{i}") for i in range(5)] == [None, None, None, 103, 104]
    assert dedup.expire(20.0, 9) == 9
    assert dedup.get("a9") is None and dedup.get("b2") == 112
    assert dedup.held_bytes == 2 * 3 and len(dedup) == 3
    assert dedup.expire(20.0) == 3 and len(dedup) == 0


# -- payloads held packed --------------------------------------------------------------------

_sizes = st.one_of(st.integers(0, 300), st.sampled_from([255, 256, 1500, 65535, 65536]))


@settings(max_examples=60, deadline=None)
@given(chunks=st.lists(st.lists(_sizes, min_size=1, max_size=20), min_size=1, max_size=6),
       data=st.data())
def test_spans_of_packed_payloads_encode_exactly_as_plain_payloads(
        chunks: list[list[int]], data: st.DataObject) -> None:
    """Payloads are held as MessagePack and spliced into DELIVER: any span of held
    messages (across chunks, parts of chunks, after a trim) is the same on the wire,
    and get, read and held bytes see the same payloads."""
    log = TopicLog()
    payloads: list[bytes] = []
    for sizes in chunks:
        batch = [bytes([len(payloads) % 251]) * size for size in sizes]
        log.extend([f"m{len(payloads) + i}" for i in range(len(batch))], batch, 0.0)
        payloads += batch
    trimmed = data.draw(st.integers(0, len(payloads) - 1))
    assert log.trim(trimmed, 0.0) == trimmed
    start = data.draw(st.integers(trimmed, len(payloads) - 1))
    stop = data.draw(st.integers(start + 1, len(payloads)))
    ids, packed, times = log.span(start, stop, 5.0)
    if type(packed) is P.PackedPayloads:
        assert packed.size == sum(map(len, payloads[start:stop]))
    frame = [P.DELIVER, 1, 7, 1, start, ids, packed, times]
    assert P.encode(frame) == P.encode([*frame[:6], payloads[start:stop], times])
    assert packed == payloads[start:stop]
    entry = log.get(start)
    assert entry is not None and entry.payload == payloads[start]
    assert log.fit(start, stop - start, 1 << 30) == range(start, stop)
    assert log.held_bytes == sum(len(f"m{i}") + len(payloads[i])
                                 for i in range(trimmed, len(payloads)))


def test_small_payloads_are_held_packed_and_large_ones_as_they_came() -> None:
    log = TopicLog()
    log.extend(["a", "b"], [b"x" * 100, b"y" * 300], 0.0)
    log.extend(["c", "d"], [b"z" * 4096, b"w" * 4096], 0.0)
    _, small, _ = log.span(0, 2)
    assert type(small) is P.PackedPayloads and small == [b"x" * 100, b"y" * 300]
    _, mixed, _ = log.span(1, 4)
    assert type(mixed) is list and mixed == [b"y" * 300, b"z" * 4096, b"w" * 4096]


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["remember_all", "lookup", "expire"]),
                              st.integers(0, 6), st.integers(0, 4), st.integers(0, 3)),
                    max_size=50), compact_ids=_compact_ids)
def test_dedup_forgetting_in_small_slices_still_answers_exactly(
        ops: list[tuple[str, int, int, int]], compact_ids: int) -> None:
    """G3/G5 with lazy forgetting: whatever is left unforgotten past its window (each
    call forgets only a few ids), lookups, held bytes and ids accepted again are exact."""
    window = 3.0
    dedup = DedupWindow(window, compact_ids, min_room=2)
    model: dict[str, tuple[int, float]] = {}  # id -> (offset, accepted at)
    now, offset = 0.0, 0

    def alive(mid: str) -> bool:
        return mid in model and now < model[mid][1] + window

    for kind, k, n, step in ops:
        now += step * 0.5
        if kind == "lookup":
            mid = f"id{k}"
            assert dedup.get(mid, now) == (model[mid][0] if alive(mid) else None), mid
        elif kind == "expire":
            dedup.expire(now, n)
        else:
            dedup.expire(now, n)  # a publish forgets a slice on its way, like the shard
            fresh = [i for i in dict.fromkeys(f"id{(k + j) % 7}" for j in range(n + 1))
                     if not alive(i)]
            for i in fresh:
                model[i] = (offset, now)
                offset += 1
            if fresh:
                dedup.remember_all(fresh, offset - len(fresh), now)
        assert dedup.live_bytes(now) == sum(len(i) for i in model if alive(i))
        for i in (f"id{j}" for j in range(7)):
            assert dedup.get(i, now) == (model[i][0] if alive(i) else None), i
    dedup.expire(now)
    assert len(dedup) == sum(1 for i in model if alive(i))
    assert dedup.held_bytes == dedup.live_bytes(now)


def test_dedup_long_run_with_lazy_forgetting_re_acceptance_and_compaction() -> None:
    """G3 over hundreds of marks (so the marks are compacted many times), forgetting a
    few ids a step and accepting ids again after their window: every lookup is exact."""
    import random

    rng = random.Random(7)
    window = 10.0
    dedup = DedupWindow(window, compact_ids=8, min_room=4)  # compact, a dict when empty
    model: dict[str, tuple[int, float]] = {}
    offset = 0
    for step in range(600):
        now = step * 0.5
        dedup.expire(now, rng.randrange(4))
        fresh = [i for i in dict.fromkeys(f"id{rng.randrange(60)}" for _ in range(5))
                 if not (i in model and now < model[i][1] + window)]
        if fresh:
            dedup.remember_all(fresh, offset, now)
            for i in fresh:
                model[i] = (offset, now)
                offset += 1
        for i in (f"id{j}" for j in range(60)):
            alive = i in model and now < model[i][1] + window
            assert dedup.get(i, now) == (model[i][0] if alive else None), (step, i)
        assert dedup.live_bytes(now) == sum(len(i) for i, (_, t) in model.items()
                                            if now < t + window)
        # the window holds the ids of remembered marks only: about 20 s of 5 ids a step
        # (two windows at most, as forgetting lags), each once
        assert len(dedup) <= 2 * 20 * 5
        assert len(dedup) == (len(dedup._index) if not dedup.compact else
                              dedup._next_serial - dedup._oldest - len(dedup._holes))


@pytest.mark.parametrize("compact_ids", [4, 1000])
def test_dedup_structures_are_not_walked_by_the_cycle_collector(compact_ids: int) -> None:
    """A full collection must not walk millions of ids: the window's dict, its marks
    (tuples of strings, or packed strings) and its hash tables stay untracked through
    remembering, forgetting and blanking."""
    import gc
    import platform

    if platform.python_implementation() != "CPython":
        pytest.skip("untracking is a CPython matter")
    dedup = DedupWindow(10.0, compact_ids=compact_ids)
    for step in range(20):
        dedup.remember_all([f"m{step}-{i}" for i in range(3)], 3 * step, float(step))
        dedup.expire(float(step), 2)
    dedup.remember_all(["m0-0"], 60, 20.0)  # an id past its window, accepted again
    gc.collect()  # marks (tuples of strings) are untracked by the collector's first pass
    assert dedup.compact == (compact_ids == 4)
    assert not gc.is_tracked(dedup._index)
    assert not any(map(gc.is_tracked, dedup._ids))
    for table in dedup._serials._tables if dedup._serials is not None else ():
        assert not gc.is_tracked(table.fps) and not gc.is_tracked(table.rels)
    assert dedup.get("m0-0", 20.0) == 60 and dedup.get("m19-2", 20.0) == 59


@given(st.lists(st.lists(st.tuples(st.integers(1, 40), st.integers(0, 300)), min_size=1,
                         max_size=6), min_size=1, max_size=6),
       st.integers(0, 40), st.integers(0, 40), st.integers(0, 12), st.integers(0, 900))
def test_fit_takes_what_the_budgets_allow_and_at_least_one(
        chunks: list[list[tuple[int, int]]], trimmed: int, start: int, max_messages: int,
        max_bytes: int) -> None:
    """FETCH's range: from max(start, oldest), at most max_messages, at most max_bytes of
    payloads and ids, but one message at least when any is held there."""
    log = TopicLog()
    sizes: list[int] = []
    for chunk in chunks:
        ids = [f"{len(sizes) + i}".rjust(id_len, "i") for i, (id_len, _) in enumerate(chunk)]
        log.extend(ids, [b"p" * n for _, n in chunk], 0.0)
        sizes += [len(i) + n for i, (_, n) in zip(ids, chunk, strict=True)]
    log.trim(min(trimmed, len(sizes)), 0.0)
    first = max(start, log.oldest)
    stop, used = first, 0
    while stop < min(len(sizes), first + max_messages):
        if used + sizes[stop] > max_bytes and stop > first:
            break
        used += sizes[stop]
        stop += 1
    assert log.fit(start, max_messages, max_bytes) == range(first, max(first, stop))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=6), st.integers(0, 60),
       st.lists(st.integers(0, 200), max_size=60), st.booleans(), st.data())
def test_columns_read_together_match_reading_one_by_one(
        runs: list[int], below: int, kept: list[int], large: bool, data: st.DataObject) -> None:
    log = TopicLog()
    size = 300 if large else 20   # held as they came, or packed
    for n, at in zip(runs, range(len(runs)), strict=False):
        first = log.next_offset
        log.extend([f"id{first + i}" for i in range(n)],
                   [bytes([(first + i) % 256]) * size for i in range(n)], float(at))
    log.trim(below, float(len(runs)),
             keep=lambda a, b: [o for o in sorted(set(kept)) if a <= o < min(b, below)])
    held = [o for o in range(log.next_offset) if log.holds(o)]
    if not held:
        return
    offsets = data.draw(st.lists(st.sampled_from(held), min_size=1, max_size=40))
    ids, payloads, times = log.columns(offsets, 100.0)
    entries = [log.get(o) for o in offsets]
    assert ids == [e.id for e in entries if e is not None]
    assert payloads == [e.payload for e in entries if e is not None]
    assert times == P.time_runs([100.0 + e.stored_at for e in entries if e is not None])


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=6), st.integers(0, 60), st.booleans(),
       st.data())
def test_spans_of_runs_match_reading_one_by_one(
        runs: list[int], below: int, large: bool, data: st.DataObject) -> None:
    """A key-ordered member's push (a few runs of offsets) read as spans joined: the
    same ids, payloads and times as the messages one by one, the payloads packed; or
    None (then columns) for offsets out of order, below the oldest or in many runs."""
    log = TopicLog()
    size = 300 if large else 20
    for at, n in enumerate(runs):
        first = log.next_offset
        log.extend([f"id{first + i}" for i in range(n)],
                   [bytes([(first + i) % 256]) * size for i in range(n)], float(at))
    log.trim(min(below, log.next_offset), float(len(runs)))
    held = list(range(log.oldest, log.next_offset))
    if not held:
        return
    if data.draw(st.booleans()):  # a few runs (what a key-ordered member gets)
        starts = data.draw(st.lists(st.sampled_from(held), min_size=1, max_size=4))
        offsets = sorted({o for a in starts for o in range(a, min(a + 12, held[-1] + 1))})
    else:
        offsets = data.draw(st.lists(st.sampled_from(held), min_size=1, max_size=60,
                                     unique=True))
    got = log.spans(offsets, 100.0)
    if got is None:
        assert not offsets or offsets != sorted(offsets) or len(sorted_runs(offsets)) * 4 > len(
            offsets) or any(type(p) is tuple for p in log._packed)
        return
    ids, payloads, times = got
    assert type(payloads) is P.PackedPayloads and len(payloads) == len(offsets)
    entries = [log.get(o) for o in offsets]
    assert ids == [e.id for e in entries if e is not None]
    assert list(payloads) == [e.payload for e in entries if e is not None]
    assert payloads.size == sum(len(e.payload) for e in entries if e is not None)
    assert times == P.time_runs([100.0 + e.stored_at for e in entries if e is not None])
