"""The on-disk formats: records (length, CRC32C, type, body) and segment headers."""

from __future__ import annotations

import random

import google_crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flux.storage import record
from flux.storage.record import HEADER_SIZE, Bad, Torn, decode, encode
from flux.storage.segment import (
    VERSION,
    Foreign,
    SegmentHeader,
    decode_header,
    encode_header,
    parse_name,
    segment_name,
)

bodies = st.binary(max_size=2000)
types = st.integers(1, record.MAX_TYPE)


@given(rtype=types, body=bodies, position=st.integers(0, 2**62))
def test_record_round_trips_with_its_position(rtype: int, body: bytes, position: int) -> None:
    data = encode(rtype, body)
    assert len(data) == HEADER_SIZE + len(body) == record.encoded_size(len(body))
    rec = decode(b"junk" + data + b"more", 4, position)
    assert (rec.position, rec.type, rec.body) == (position, rtype, body)
    assert rec.end == position + len(data)


def test_record_layout_is_crc_length_type_body_little_endian() -> None:
    data = encode(7, b"abc")
    assert data[:4] == record.checksum(3, 7, b"abc").to_bytes(4, "little")
    assert data[:4] == google_crc32c.value(data[4:]).to_bytes(4, "little")
    assert data[4:8] == (3).to_bytes(4, "little")
    assert data[8] == 7
    assert data[9:] == b"abc"


@given(rtype=types, body=bodies, data=st.data())
def test_any_flipped_bit_is_caught(rtype: int, body: bytes, data: st.DataObject) -> None:
    raw = bytearray(encode(rtype, body))
    bit = data.draw(st.integers(0, len(raw) * 8 - 1))
    raw[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises((Bad, Torn)):
        decode(bytes(raw), 0, 0)


@given(rtype=types, body=st.binary(min_size=1, max_size=500), data=st.data())
def test_a_record_cut_short_is_torn(rtype: int, body: bytes, data: st.DataObject) -> None:
    raw = encode(rtype, body)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(Torn):
        decode(raw[:cut], 0, 0)


def test_a_length_past_the_end_is_torn_and_an_impossible_length_is_bad() -> None:
    raw = bytearray(encode(1, b"x" * 10))
    raw[4:8] = (11).to_bytes(4, "little")
    with pytest.raises(Torn):
        decode(bytes(raw), 0, 0)
    raw[4:8] = (record.MAX_BODY + 1).to_bytes(4, "little")
    with pytest.raises(Bad, match="over"):
        decode(bytes(raw), 0, 0)


def test_zero_filled_bytes_never_parse_as_a_record() -> None:
    with pytest.raises(Bad, match="type 0"):
        decode(bytes(64), 0, 0)


@pytest.mark.parametrize("rtype", [0, 256, -1, record.JUMP])
def test_record_types_outside_1_to_254_are_refused(rtype: int) -> None:
    """Type 255 is the storage layer's own (JUMP): owners cannot write it."""
    with pytest.raises(ValueError, match="type"):
        encode(rtype, b"")


def test_segment_names_sort_by_first_position() -> None:
    assert segment_name(0) == "00000000000000000000.log"
    assert parse_name(segment_name(123456789)) == 123456789
    assert sorted([segment_name(10**12), segment_name(99)]) == [segment_name(99), segment_name(10**12)]
    for other in ["123.log", "x0000000000000000000.log", "00000000000000000000.log.damaged", "notes"]:
        assert parse_name(other) is None


@given(owner=st.text(max_size=100), generation=st.integers(0, 2**64 - 1),
       first=st.integers(0, 2**63), boot=st.text(max_size=60), created=st.floats(0, 2e9))
def test_segment_header_round_trips(owner: str, generation: int, first: int, boot: str,
                                    created: float) -> None:
    header = SegmentHeader(owner, generation, first, boot, created)
    raw = encode_header(header)
    assert decode_header(raw + b"records follow") == (header, len(raw))


@given(data=st.data())
def test_segment_header_damage_is_caught(data: st.DataObject) -> None:
    raw = bytearray(encode_header(SegmentHeader("orders.eu", 42, 0, "boot-1")))
    bit = data.draw(st.integers(0, len(raw) * 8 - 1))
    raw[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises((Bad, Torn)):
        decode_header(bytes(raw))


def test_a_flipped_bit_anywhere_in_a_header_is_damage_never_foreign() -> None:
    """A header this Flux wrote stays ours whatever single bit flips: the magic and the
    version included (set aside as damage, G9, not refused as another program's file)."""
    raw = encode_header(SegmentHeader("orders.eu", 42, 0, "boot-1"))
    for bit in range(len(raw) * 8):
        damaged = bytearray(raw)
        damaged[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises((Bad, Torn)) as info:
            decode_header(bytes(damaged) + b"records follow")
        assert not isinstance(info.value, Foreign), bit
        if bit < 80:   # the magic and the version
            assert "magic or version damaged" in str(info.value)


def test_a_damaged_magic_and_a_damaged_field_besides_are_foreign() -> None:
    """Two spots of damage cannot be told from a foreign file: refused, left untouched."""
    raw = bytearray(encode_header(SegmentHeader("orders.eu", 42, 0, "boot-1")))
    raw[0] ^= 1
    raw[20] ^= 1
    with pytest.raises(Foreign, match="magic"):
        decode_header(bytes(raw))


def test_a_header_of_another_format_version_is_foreign() -> None:
    for version in (0, VERSION + 1, 0xFFFF):
        raw = encode_header(SegmentHeader("orders.eu", 42, 0, "boot-1", version=version))
        with pytest.raises(Foreign, match=f"format version {version}"):
            decode_header(raw + b"records follow")
    # a later version with another layout: a longer fixed part before the same fields
    later = bytearray(encode_header(SegmentHeader("orders.eu", 42, 0, "boot-1")))
    later[8:10] = (VERSION + 1).to_bytes(2, "little")
    later[12:12] = bytes(16)
    later[-4:] = google_crc32c.value(bytes(later[:-4])).to_bytes(4, "little")
    with pytest.raises(Foreign, match="version"):
        decode_header(bytes(later))


def test_files_of_other_programs_are_foreign_and_zeros_are_torn() -> None:
    rng = random.Random(7)
    for size in (1, 9, 35, 36, 100, 4096):
        for _ in range(200):
            with pytest.raises(Foreign, match="magic"):
                decode_header(b"\xff" + rng.randbytes(size - 1))
    with pytest.raises(Foreign, match="magic"):
        decode_header(b"SQLite format 3\x00" + bytes(100))
    with pytest.raises(Foreign, match="magic"):
        decode_header(b"PK\x03\x04" + bytes(4092))
    for size in (1, 36, 4096):
        with pytest.raises(Torn):
            decode_header(bytes(size))


def test_a_header_that_never_reached_the_disk_is_torn() -> None:
    raw = encode_header(SegmentHeader("t", 1, 0, "b"))
    for cut in (0, 5, len(raw) - 1):
        with pytest.raises(Torn):
            decode_header(raw[:cut])
    with pytest.raises(Torn):
        decode_header(bytes(len(raw)))


def test_the_example_bytes_in_protocol_md_are_what_the_code_writes() -> None:
    header = encode_header(SegmentHeader("orders.eu", 0x2A, 0, "b", 1.5))
    assert header.hex(" ") == (
        "46 4c 55 58 4c 4f 47 0a 01 00 35 00 2a 00 00 00 00 00 00 00 "
        "00 00 00 00 00 00 00 00 00 00 00 00 00 00 f8 3f 01 62 09 00 "
        "6f 72 64 65 72 73 2e 65 75 bd b4 5c 9e")
    assert encode(1, b"hi").hex(" ") == "93 0f 85 ca 02 00 00 00 01 68 69"


@given(records=st.lists(st.tuples(types, bodies), max_size=20), damage=st.data())
def test_decode_run_reads_the_whole_valid_records_and_stops_where_decode_fails(
        records: list[tuple[int, bytes]], damage: st.DataObject) -> None:
    raw = bytearray(b"".join(encode(t, b) for t, b in records))
    if raw and damage.draw(st.booleans()):
        bit = damage.draw(st.integers(0, len(raw) * 8 - 1))
        raw[bit // 8] ^= 1 << (bit % 8)
    if damage.draw(st.booleans()):
        del raw[damage.draw(st.integers(0, len(raw))):]
    buf = b"xyz" + bytes(raw)
    out: list[record.Record] = []
    stop, end = record.decode_run(buf, 3, 1000, out)
    at, position, expected = 3, 1000, []
    while True:
        try:
            rec = decode(buf, at, position)
        except (Bad, Torn):
            break
        expected.append(rec)
        at += rec.end - position
        position = rec.end
    assert out == expected and stop == at and end == position


@given(records=st.lists(st.tuples(types, bodies, st.integers(0, 500)), max_size=20))
def test_jumps_move_positions_on_and_are_noted_not_returned(
        records: list[tuple[int, bytes, int]]) -> None:
    """A compacted segment: records with JUMPs between them (skipping what was left
    out) decode at the positions the jumps give, and each jump is noted with where
    it leaves the buffer."""
    raw, expected, noted = bytearray(), [], []
    position = 1000
    for rtype, body, skip in records:
        if skip:
            position += skip
            raw += record.encode_jump(position)
            noted.append((position, len(raw)))
        expected.append(record.Record(position, rtype, body))
        raw += encode(rtype, body)
        position += record.HEADER_SIZE + len(body)
    out: list[record.Record] = []
    jumps: list[tuple[int, int]] = []
    stop, end = record.decode_run(bytes(raw), 0, 1000, out, jumps)
    assert out == expected and jumps == noted and stop == len(raw) and end == position


def test_a_jump_backwards_is_damage() -> None:
    buf = encode(1, b"a") + record.encode_jump(5)
    out: list[record.Record] = []
    assert record.decode_run(buf, 0, 100, out) == (len(encode(1, b"a")), 110)
    with pytest.raises(Bad, match="forward"):
        decode(buf, 10, 110)
