"""Reading a PUBLISH record's payload lengths from its MessagePack headers (recovery's
fast path) agrees with unpacking the payloads, for any body."""

from __future__ import annotations

from array import array

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flux.shard.packed_ids import PackedIds
from flux.shard.publish_record import packed_ids, packed_lengths, read_publish
from flux.shard.topic import lengths_sum, payload_lengths

_pack = msgpack.Packer(use_bin_type=True).pack
@st.composite
def id_lists(draw: st.DrawFn) -> list[str]:
    n = draw(st.integers(0, 30))
    if draw(st.booleans()):  # generated ids: one length, ASCII (kept packed)
        size = draw(st.sampled_from([1, 5, 31, 32, 33, 255, 256, 300]))
        alphabet = st.characters(max_codepoint=127 if draw(st.booleans()) else None,
                                 exclude_categories=["Cs"])
        return [draw(st.text(alphabet, min_size=size, max_size=size)) for _ in range(n)]
    return draw(st.lists(st.text(st.characters(exclude_categories=["Cs"]), min_size=1,
                                 max_size=40), max_size=n))


ids_st = id_lists()
# around the bin8/bin16 boundaries and the one-byte lengths' limit
lengths_st = st.sampled_from([0, 1, 31, 100, 255, 256, 257, 4096, 65535, 65536])


@st.composite
def payload_lists(draw: st.DrawFn) -> list[bytes]:
    n = draw(st.integers(0, 30))
    if draw(st.booleans()):  # every payload the same length: the fast path's case
        size = draw(lengths_st)
        return [draw(st.binary(min_size=size, max_size=size)) for _ in range(n)]
    return draw(st.lists(st.one_of(st.binary(max_size=300),
                                   lengths_st.map(lambda k: b"x" * k)), max_size=n))


def body_of(first: int, wall: float, ids: list[str], payloads: list[bytes]) -> bytes:
    return bytes(_pack([first, wall, ids, payloads]))


def damaged(packed: bytes, data: st.DataObject) -> bytes:
    """``packed`` as is, cut short, with bytes after it, or with one byte changed."""
    variant = data.draw(st.sampled_from(["as is", "cut", "extra", "flip"]))
    if variant == "cut" and packed:
        return packed[:data.draw(st.integers(0, len(packed) - 1))]
    if variant == "extra":
        return packed + data.draw(st.binary(min_size=1, max_size=4))
    if variant == "flip" and packed:
        i = data.draw(st.integers(0, len(packed) - 1))
        return packed[:i] + bytes((packed[i] ^ data.draw(st.integers(1, 255)),)) + packed[i + 1:]
    return packed


@given(first=st.integers(0, 2**63), wall=st.floats(allow_nan=False), ids=ids_st,
       payloads=payload_lists())
def test_read_publish_agrees_with_unpacking_the_whole_body(
        first: int, wall: float, ids: list[str], payloads: list[bytes]) -> None:
    body = body_of(first, wall, ids, payloads)
    got_first, got_wall, got_ids, size, lens, meta = read_publish(body)
    assert meta is None
    assert (got_first, got_wall, len(got_ids), size) == (first, wall, len(ids), len("".join(ids)))
    if isinstance(got_ids, PackedIds):  # only ASCII ids of one length stay packed
        assert len({len(i) for i in ids}) <= 1 and all(i.isascii() for i in ids)
        k = len(ids) // 2
        assert got_ids[k:] == tuple(ids[k:]) and (not ids or got_ids[k - 1] == ids[k - 1])
    else:
        assert type(got_ids) is tuple
    assert list(got_ids) == ids and got_ids == tuple(ids)
    assert list(lens) == list(payload_lengths(payloads)) == [len(p) for p in payloads]
    assert type(lens) is type(payload_lengths(payloads)) or len(payloads) <= 1


@given(payloads=payload_lists(), data=st.data())
def test_packed_lengths_is_exact_or_declines(payloads: list[bytes], data: st.DataObject) -> None:
    """On the packed array itself, cut short, extended or with one byte changed: either
    the lengths unpacking gives, or None (never a wrong answer)."""
    packed = damaged(bytes(_pack(payloads)), data)
    count = data.draw(st.sampled_from([len(payloads), len(payloads) + 1]))
    got = packed_lengths(packed, 0, count)
    if got is None:
        return
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(packed)
    items = unpacker.unpack()
    assert unpacker.tell() == len(packed)  # the whole buffer was exactly that array
    assert isinstance(items, list) and len(items) == count
    assert all(isinstance(p, bytes) for p in items)
    assert list(got) == [len(p) for p in items]


@given(ids=ids_st, data=st.data())
def test_packed_ids_are_exact_or_decline(ids: list[str], data: st.DataObject) -> None:
    """On the packed ids array, cut short, with bytes after it or with one byte changed:
    either ids that unpack to what the bytes say, or None (never ids that fail later)."""
    packed = damaged(bytes(_pack(ids)), data)
    got = packed_ids(packed, 0)
    if got is None:
        return
    kept, size, end = got
    unpacker = msgpack.Unpacker(raw=False, use_list=False)
    unpacker.feed(packed)
    expected = unpacker.unpack()
    assert unpacker.tell() == end
    assert isinstance(expected, tuple) and all(isinstance(i, str) for i in expected)
    assert tuple(kept) == expected and len(kept) == len(expected)
    assert size == len("".join(expected))


def test_mixed_lengths_fall_back_to_unpacking() -> None:
    body = body_of(7, 1.5, ["a", "b"], [b"xy", b"xyz"])
    assert packed_lengths(body, len(body) - len(_pack([b"xy", b"xyz"])), 2) is None
    assert list(read_publish(body)[4]) == [2, 3]


def test_a_body_that_is_not_a_publish_record_raises() -> None:
    with pytest.raises(ValueError):
        read_publish(bytes(_pack([1, 2, 3])))
    with pytest.raises(ValueError):
        read_publish(bytes(_pack([1, 2.0, ["a"], [b"x"]])) + b"\x01")


def test_unpacked_ids_leave_the_log_s_copy_packed() -> None:
    """Recovery hands a record's ids to the dedup window as str without the log keeping
    them so (a str each costs some 80 bytes); once the log unpacked them for good,
    the same tuple serves."""
    ids = PackedIds(msgpack.packb(["a1", "b2", "c3"]), 3)
    assert ids.unpacked() == ("a1", "b2", "c3")
    assert ids._ids is None and ids._packed  # still packed
    assert list(ids) == ["a1", "b2", "c3"]  # (wanted for good: unpacked once, kept)
    assert ids.unpacked() is ids._ids


@given(first=st.integers(-2**63, 2**64 - 1), wall=st.one_of(
    st.floats(allow_nan=False), st.integers(-2**63, 2**64 - 1)))
def test_read_publish_reads_any_first_offset_and_wall_time(first: int, wall: float) -> None:
    """The head's fast path (a uint offset, a float64 wall time: what Flux writes) and
    the Unpacker it falls back to for any other agree with unpacking the body."""
    got = read_publish(body_of(first, wall, ["a", "b"], [b"x", b"y"]))
    assert got[:2] == (first, wall) and type(got[1]) is type(wall)
    assert list(got[2]) == ["a", "b"] and list(got[4]) == [1, 1]


@given(lens=st.one_of(st.binary(max_size=300), st.lists(st.integers(0, 2**32 - 1),
                                                        max_size=40).map(lambda v: array("I", v)),
                      st.tuples(st.integers(0, 255), st.integers(0, 300)).map(
                          lambda t: bytes((t[0],)) * t[1])))
def test_lengths_sum_is_the_sum(lens: bytes | array[int]) -> None:
    assert lengths_sum(lens) == sum(lens)
