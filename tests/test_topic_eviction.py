"""A placed TopicLog (a disk topic's): payloads of chunks whose records are durable may be
evicted and are read back through its ChunkStore; reads, trims and byte counts agree with
a log that never evicts (flux/shard/topic.py, flux/shard/cache.py)."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flux import errors
from flux.shard.kept import Resident
from flux.shard.topic import TopicLog


class Store:
    """A ChunkStore over records kept in a dict: position -> packed payloads."""

    def __init__(self) -> None:
        self.records: dict[int, bytes] = {}
        self.keeps: dict[int, dict[int, Resident]] = {}  # KEEP records: position -> rows
        self.durable_mark = 0
        self.resident: dict[int, int] = {}
        self.reads = 0

    def read(self, position: int, end: int, first: int) -> bytes:
        self.reads += 1
        return self.records[position]

    def read_kept(self, position: int, offsets: Any) -> dict[int, Resident]:
        self.reads += 1
        rows = self.keeps.get(position, {})
        if any(o not in rows for o in offsets):
            raise errors.StorageUnavailable(f"no KEEP record of {offsets} at {position}")
        return {o: rows[o] for o in offsets}

    def durable(self) -> int:
        return self.durable_mark

    def add(self, first: int, size: int, read: bool = False) -> None:
        self.resident[first] = size

    def touch(self, first: int) -> None:
        assert first in self.resident

    def drop(self, first: int) -> None:
        self.resident.pop(first, None)


def _placed(store: Store) -> TopicLog:
    log = TopicLog(placed=True)
    log.store = store
    return log


def _extend(log: TopicLog, store: Store, ids: list[str], payloads: list[bytes]) -> int:
    first = log.extend(ids, payloads, 0.0)
    position = len(store.records)
    store.records[position] = msgpack.packb(payloads, use_bin_type=True)
    log.place(position, position + 1)
    return first


def test_an_evicted_chunk_is_read_back_once_and_counted_again() -> None:
    store = Store()
    log = _placed(store)
    _extend(log, store, ["a", "b"], [b"xx", b"yyy"])
    assert log.held_bytes == 2 + 5 and store.resident == {0: 5}
    assert log.evict(0) == 0  # its record is not durable yet
    store.durable_mark = 1
    assert log.evict(0) == 5 and log.held_bytes == 2 and store.resident == {}
    assert not log.resident(0)
    assert log.get(1) == ("b", b"yyy", 0.0)
    assert store.reads == 1 and log.resident(0) and log.held_bytes == 7
    assert log.get(0) == ("a", b"xx", 0.0) and store.reads == 1  # cached now


def test_a_record_that_does_not_hold_the_chunk_is_refused() -> None:
    store = Store()
    log = _placed(store)
    _extend(log, store, ["a", "b"], [b"xx", b"yyy"])
    store.durable_mark = 1
    log.evict(0)
    store.records[0] = msgpack.packb([b"xx", b"yy"], use_bin_type=True)  # one byte short
    try:
        log.get(0)
    except errors.StorageUnavailable as exc:
        assert "does not hold" in str(exc)
    else:
        raise AssertionError("a wrong record was read back")


def test_a_trim_that_keeps_a_message_of_an_evicted_chunk_reads_it_back_and_counts_it() -> None:
    store = Store()
    log = _placed(store)
    _extend(log, store, ["a", "b", "c"], [b"xx", b"yyy", b"z"])
    store.durable_mark = 1
    log.evict(0)
    assert log.trim(3, 0.0, keep=lambda start, stop: [1]) == 3
    assert store.reads == 1 and store.resident == {}  # read back, then the chunk went
    assert (log.lowest, log.oldest) == (1, 3)
    assert log.get(1) == ("b", b"yyy", 0.0)
    assert log.held_bytes == 1 + 3  # the kept message alone, payload included


def test_a_trim_whose_kept_message_cannot_be_read_back_stops_before_its_chunk() -> None:
    store = Store()
    log = _placed(store)
    _extend(log, store, ["a"], [b"x"])
    _extend(log, store, ["b", "c"], [b"yy", b"z"])
    store.durable_mark = 2
    log.evict(1)
    del store.records[1]  # damage: the read fails
    store.read = lambda position, end, first: (_ for _ in ()).throw(  # type: ignore[method-assign]
        errors.StorageUnavailable("damaged"))
    assert log.trim(3, 0.0, keep=lambda start, stop: [o for o in (2,) if start <= o < stop]) == 1
    assert (log.lowest, log.oldest) == (1, 1)


def _kept_on_disk(store: Store) -> TopicLog:
    """A placed log whose message 1 a trim kept, written in a KEEP record at position 100
    .. 150 (not durable yet)."""
    log = _placed(store)
    _extend(log, store, ["a", "bb", "c"], [b"x", b"yyyy", b"z"])
    assert log.trim(3, 0.0, keep=lambda start, stop: [1]) == 3
    store.keeps[100] = {1: log.kept(1)}
    log.kept_written([1], 100, 150)
    return log


def test_a_kept_message_leaves_memory_once_its_keep_record_is_durable() -> None:
    """G12 on a disk topic: only its key, size and where its KEEP record is stay in memory
    (:mod:`flux.shard.kept`); reads bring the rest back from the record."""
    store = Store()
    log = _kept_on_disk(store)
    assert log.held_bytes == 2 + 4
    assert not log.settle_kept(149)  # the record not durable yet: it stays whole
    assert log.settle_kept(150) and log.held_bytes == 0
    assert log.kept_size(1) == 6 and log.keys_of([1]) == [None] and store.reads == 0
    assert log.get(1) == ("bb", b"yyyy", 0.0) and store.reads == 1
    assert log.columns([1])[:2] == (["bb"], [b"yyyy"])
    assert store.reads == 1  # (what a read brought back stays at hand for the push)
    log.recall_kept([1])  # about to be written again: whole in memory until that is durable
    assert log.held_bytes == 6 and store.reads == 1
    store.keeps[200] = {1: log.kept(1)}
    log.kept_written([1], 160, 180)
    log.kept_written([1], 200, 250)  # written again before the first became durable
    assert not log.settle_kept(180)  # an older record places nothing
    assert log.held_bytes == 6
    assert log.settle_kept(250) and log.held_bytes == 0
    del store.keeps[100]
    log.release(lambda o: False)
    assert log.get(1) == ("bb", b"yyyy", 0.0)  # from the latest record
    assert log.release(lambda o: True) == [1] and log.held_bytes == 0 and log.lowest == 3


def test_a_kept_message_that_cannot_be_read_back_is_never_served() -> None:
    store = Store()
    log = _kept_on_disk(store)
    log.settle_kept(150)
    del store.keeps[100]  # damage: the read fails
    with pytest.raises(errors.StorageUnavailable):
        log.columns([1])
    with pytest.raises(errors.StorageUnavailable):
        log.recall_kept([1])
    assert log.held_bytes == 0 and log.holds(1)


def test_a_memory_topics_kept_message_stays_whole() -> None:
    log = TopicLog()
    log.extend(["a", "bb"], [b"x", b"yyyy"], 0.0)
    log.trim(2, 0.0, keep=lambda start, stop: [1])
    log.kept_written([1], 0, 10)  # (no store: nothing to read it back from)
    assert not log.settle_kept(10) and log.held_bytes == 6


def test_a_chunk_without_a_position_is_never_evicted() -> None:
    store = Store()
    log = _placed(store)
    log.extend(["a"], [b"x"], 0.0)  # no record placed (its append failed)
    store.durable_mark = 10
    assert log.evict(0) == 0 and log.resident(0)


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(st.one_of(
    st.tuples(st.just("extend"), st.integers(1, 4), st.sampled_from([1, 300, 2000])),
    st.tuples(st.just("durable")),
    st.tuples(st.just("evict"), st.integers(0, 40)),
    st.tuples(st.just("trim"), st.integers(0, 40)),
    st.tuples(st.just("read"), st.integers(0, 40), st.integers(1, 8)),
), max_size=50))
def test_a_placed_log_reads_like_one_that_keeps_everything(ops: list[tuple[Any, ...]]) -> None:
    store = Store()
    log = _placed(store)
    plain = TopicLog()
    for op in ops:
        if op[0] == "extend":
            n, size = op[1], op[2]
            base = plain.next_offset
            ids = [f"m{base + i}" for i in range(n)]
            payloads = [bytes([(base + i) % 251]) * size for i in range(n)]
            assert _extend(log, store, ids, payloads) == plain.extend(ids, payloads, 0.0)
        elif op[0] == "durable":
            store.durable_mark = len(store.records)
        elif op[0] == "evict":
            log.evict(op[1])
        elif op[0] == "trim":
            assert log.trim(op[1], 0.0) == plain.trim(op[1], 0.0)
        else:
            start = max(op[1], plain.oldest)
            stop = min(plain.next_offset, start + op[2])
            if start < stop:
                ids, payloads, times = log.span(start, stop)
                want = plain.span(start, stop)
                assert ids == want[0] and list(payloads) == list(want[1]) and times == want[2]
        assert log.oldest == plain.oldest and log.next_offset == plain.next_offset
        ids_bytes = sum(len(e.id) for e in map(plain.get, range(plain.oldest, plain.next_offset))
                        if e is not None)
        assert ids_bytes <= log.held_bytes <= plain.held_bytes
        assert sum(store.resident.values()) >= log.held_bytes - ids_bytes
    for offset in range(plain.oldest, plain.next_offset):
        assert log.get(offset) == plain.get(offset)
    assert log.held_bytes == plain.held_bytes  # every chunk read back: all resident again


def test_an_evicted_chunk_keeps_its_ids_packed_and_reads_them_back() -> None:
    """Ids as str cost ~80 bytes each; an evicted chunk's are kept as one packed array
    (their bytes and a header byte each) until a read wants them."""
    import tracemalloc

    tracemalloc.start()
    try:
        store = Store()
        log = _placed(store)
        for start in range(0, 20_000, 100):
            _extend(log, store, [f"{i:032x}" for i in range(start, start + 100)], [b"p"] * 100)
        store.durable_mark = len(store.records)
        held = tracemalloc.get_traced_memory()[0]
        for first in range(0, 20_000, 100):
            log.evict(first)
        evicted = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held - evicted > 20_000 * 40  # the str objects went: the log held the only copy
    assert log.get(12_345)[0] == f"{12_345:032x}" and log.get(0)[0] == "0" * 32
