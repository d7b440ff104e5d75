"""The wire codec: framing round trips, corrupt input, validation rules and error frames.

One Hypothesis strategy per frame kind (PROTOCOL.md's layouts); a test fails if
a kind is added to flux.protocol without one.
"""

from __future__ import annotations

import itertools
import re
import struct
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flux import errors
from flux import protocol as P

# -- strategies ------------------------------------------------------------------------


def remote_error_classes() -> list[type[errors.RemoteError]]:
    out, stack = [], [errors.RemoteError]
    while stack:
        cls = stack.pop()
        out.append(cls)
        stack.extend(cls.__subclasses__())
    return sorted(out, key=lambda c: c.code)


u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
rid = u32
sid = u32
generation = u64
offset = st.integers(0, 2**53)
token = st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-", min_size=1, max_size=12)
topic = st.lists(token, min_size=1, max_size=4).map(".".join)
message_id = st.text(min_size=1, max_size=24)
payload = st.binary(max_size=64)
timestamp = st.floats(allow_nan=False, allow_infinity=False)
text = st.text(max_size=40)
code = st.sampled_from([c.code for c in remote_error_classes()])
maybe = st.none
plain = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | timestamp | text
         | st.binary(max_size=8))


def fixed(*parts: Any) -> st.SearchStrategy[list[Any]]:
    return st.tuples(*parts).map(list)


def body(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(fields)


k = st.just
router_hello_ok = body(
    version=k(P.VERSION), shard_count=st.integers(1, 64),
    shards=st.lists(fixed(st.integers(0, 63), k("127.0.0.1:7071"), generation), max_size=4))
shard_hello_ok = body(
    version=k(P.VERSION), role=k("shard"), index=st.integers(0, 63), shard_count=st.integers(1, 64),
    generation=generation, heartbeat=st.floats(0.01, 60), max_frame_bytes=u32)
publish_group = fixed(topic, st.lists(message_id, max_size=4), st.lists(payload, max_size=4))
publish_result = fixed(offset | st.lists(offset | k(P.REFUSED), max_size=4),
                       st.lists(st.integers(0, 3), max_size=2),
                       st.lists(fixed(st.integers(0, 3), code, text), max_size=2))
subscribe_options = body(
    topic=topic, name=maybe() | token, mode=st.sampled_from(["push", "pull"]), read_old=st.booleans(),
    from_offset=maybe() | offset, max_in_flight=maybe() | st.integers(1, 10_000),
    credit=maybe() | st.integers(0, 10_000), generation=maybe() | generation,
    on_reset=st.sampled_from(["earliest", "raise"]))
subscribed_reply = body(
    created=st.booleans(), start_offset=offset, cursor=offset, generation=generation,
    clamped=st.booleans(), reset=st.booleans(), next_offset=offset,
    max_in_flight=st.integers(1, 10_000))
fetch_options = body(
    topic=topic, name=maybe() | token, generation=maybe() | generation, offset=offset,
    max_messages=st.integers(0, 10_000), max_bytes=u32)
fetched_reply = body(generation=generation, oldest=offset, next=offset)
nonce = st.binary(min_size=16, max_size=16)
proof = body(proof=st.binary(min_size=32, max_size=32))
register_body = body(
    index=st.integers(0, 63), pid=st.integers(1, 2**22), generation=generation,
    address=k("127.0.0.1:7071"), advertise=maybe() | k("10.0.0.5:7071"), shard_count=st.integers(1, 64),
    control=k("127.0.0.1:7072"), nonce=nonce, proof=st.binary(min_size=32, max_size=32))
stats = st.dictionaries(text, plain | st.dictionaries(text, plain), max_size=4)

FRAMES: dict[int, st.SearchStrategy[list[Any]]] = {
    P.HELLO: fixed(k(P.HELLO), rid, body(version=k(P.VERSION), role=k("client"))),
    P.HELLO_OK: fixed(k(P.HELLO_OK), rid, router_hello_ok | shard_hello_ok),
    P.ERROR: fixed(k(P.ERROR), rid, code, text, st.dictionaries(text, plain, max_size=3)),
    P.PING: fixed(k(P.PING), rid),
    P.PONG: fixed(k(P.PONG), rid),
    P.PUBLISH: fixed(k(P.PUBLISH), rid, st.lists(publish_group, max_size=3)),
    P.PUBLISHED: fixed(k(P.PUBLISHED), rid, generation, st.lists(publish_result, max_size=3)),
    P.SUBSCRIBE: fixed(k(P.SUBSCRIBE), rid, sid, subscribe_options),
    P.SUBSCRIBED: fixed(k(P.SUBSCRIBED), rid, sid, subscribed_reply),
    P.UNSUBSCRIBE: fixed(k(P.UNSUBSCRIBE), rid, sid),
    P.UNSUBSCRIBED: fixed(k(P.UNSUBSCRIBED), rid, sid),
    P.CREDIT: fixed(k(P.CREDIT), sid, st.integers(0, 2**30)),
    P.DELIVER: fixed(k(P.DELIVER), sid, generation, st.integers(1, 10),
                     offset | st.lists(offset, max_size=4), st.lists(message_id, max_size=4),
                     st.lists(payload, max_size=4),
                     st.lists(fixed(timestamp, st.integers(1, 4)), max_size=2).map(
                         lambda runs: [x for run in runs for x in run])),
    P.SUB_ENDED: fixed(k(P.SUB_ENDED), sid, st.sampled_from([61, 62, 80]), text),
    P.ACK: fixed(k(P.ACK), rid, sid, generation, st.lists(offset, max_size=5), offset | k(-1)),
    P.ACKED: fixed(k(P.ACKED), rid, sid, offset, st.lists(fixed(offset, code, text), max_size=3)),
    P.FETCH: fixed(k(P.FETCH), rid, fetch_options),
    P.FETCHED: fixed(k(P.FETCHED), rid, fetched_reply, offset, st.lists(message_id, max_size=4),
                     st.lists(payload, max_size=4),
                     st.lists(fixed(timestamp, st.integers(1, 4)), max_size=2).map(
                         lambda runs: [x for run in runs for x in run])),
    P.COMMIT: fixed(k(P.COMMIT), rid, body(
        topic=topic, name=token, generation=maybe() | generation, offset=offset)),
    P.COMMITTED: fixed(k(P.COMMITTED), rid, body(cursor=offset)),
    P.STATS: fixed(k(P.STATS), rid),
    P.STATS_OK: fixed(k(P.STATS_OK), rid, stats),
    P.REGISTER: fixed(k(P.REGISTER), rid, register_body),
    P.REGISTERED: fixed(k(P.REGISTERED), rid, proof),
    P.DRAIN: fixed(k(P.DRAIN), rid) | fixed(k(P.DRAIN), rid, proof),
    P.ADOPT: fixed(k(P.ADOPT), rid, body(control=k("127.0.0.1:39001"), nonce=nonce,
                                         proof=st.binary(min_size=32, max_size=32))),
    P.CHALLENGE: fixed(k(P.CHALLENGE), k(0), body(nonce=nonce)),
    P.ADOPTED: fixed(k(P.ADOPTED), rid, proof),
    P.AUTH: fixed(k(P.AUTH), k(0), body(auth=st.fixed_dictionaries(
        {"users": st.just([]), "session_ttl": st.floats(1, 1e4), "logins_per_minute":
         st.integers(1, 100)}))),
    P.READY: fixed(k(P.READY), k(0)),
}
any_frame = st.one_of(*FRAMES.values())


def decode_all(data: bytes, chunks: list[int] | None = None, **kw: Any) -> list[list[Any]]:
    """Feed ``data`` to a fresh decoder, cut at ``chunks`` sizes (then the rest)."""
    decoder = P.FrameDecoder(**kw)
    frames: list[list[Any]] = []
    pos = 0
    for size in chunks or []:
        frames += decoder.feed(data[pos:pos + size])
        pos += size
    frames += decoder.feed(data[pos:])
    assert decoder.pending == 0
    return frames


def framed(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


# -- frame kinds -----------------------------------------------------------------------


def test_every_frame_kind_has_a_strategy() -> None:
    assert set(FRAMES) == set(P.KIND_NAMES)


def test_frame_kind_numbers_are_the_published_ones() -> None:
    published = {"HELLO": 1, "HELLO_OK": 2, "ERROR": 3, "PING": 4, "PONG": 5, "PUBLISH": 10, "PUBLISHED": 11,
                 "SUBSCRIBE": 20, "SUBSCRIBED": 21, "UNSUBSCRIBE": 22, "UNSUBSCRIBED": 23, "CREDIT": 24,
                 "DELIVER": 30, "SUB_ENDED": 31, "ACK": 40, "ACKED": 41, "FETCH": 50, "FETCHED": 51,
                 "COMMIT": 52, "COMMITTED": 53, "STATS": 60, "STATS_OK": 61, "REGISTER": 80,
                 "REGISTERED": 81, "DRAIN": 82, "ADOPT": 83, "CHALLENGE": 84, "ADOPTED": 85,
                 "AUTH": 86, "READY": 87}
    assert {P.KIND_NAMES[n]: n for n in P.KIND_NAMES} == published


# -- round trips -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(FRAMES), ids=lambda kd: P.KIND_NAMES[kd])
@given(data=st.data())
def test_each_frame_kind_round_trips_through_encode_and_decoder(kind: int, data: st.DataObject) -> None:
    frame = data.draw(FRAMES[kind])
    assert decode_all(P.encode(frame)) == [frame]


@given(frame=any_frame)
def test_frame_fed_one_byte_at_a_time_comes_out_once_on_its_last_byte(frame: list[Any]) -> None:
    wire = P.encode(frame)
    decoder = P.FrameDecoder()
    for i in range(len(wire) - 1):
        assert decoder.feed(wire[i:i + 1]) == []
        assert decoder.pending == i + 1
    assert decoder.feed(wire[-1:]) == [frame]
    assert decoder.pending == 0


@given(frames=st.lists(any_frame, min_size=1, max_size=8), data=st.data())
def test_frames_survive_arbitrary_chunking(frames: list[list[Any]], data: st.DataObject) -> None:
    wire = b"".join(P.encode(f) for f in frames)
    chunks = data.draw(st.lists(st.integers(0, len(wire)), max_size=20))
    assert decode_all(wire, chunks) == frames


@given(frames=st.lists(any_frame, max_size=10))
def test_encode_many_equals_concatenated_encodes_and_decodes_in_order(frames: list[list[Any]]) -> None:
    wire = P.encode_many(frames)
    assert wire == b"".join(P.encode(f) for f in frames)
    assert decode_all(wire) == frames


def test_many_frames_in_one_buffer_beyond_the_compaction_threshold() -> None:
    frames = [[P.PUBLISH, i, [["t", f"id-{i}", bytes(200)]]] for i in range(1000)]
    wire = P.encode_many(frames)
    decoder = P.FrameDecoder()
    # all but the last 3 bytes: the consumed prefix (> 64 KiB) is dropped, the tail kept
    assert decoder.feed(wire[:-3]) == frames[:-1]
    assert decoder.pending == len(P.encode(frames[-1])) - 3
    assert decoder.feed(wire[-3:]) == frames[-1:]
    assert decoder.feed(P.encode([P.PING, 7])) == [[P.PING, 7]]


def test_decoder_accepts_bytearray_and_memoryview() -> None:
    wire = P.encode([P.PING, 1]) + P.encode([P.PONG, 2])
    assert P.FrameDecoder().feed(bytearray(wire)) == [[P.PING, 1], [P.PONG, 2]]
    assert P.FrameDecoder().feed(memoryview(wire)) == [[P.PING, 1], [P.PONG, 2]]


def test_length_prefix_is_4_byte_big_endian_body_size() -> None:
    wire = P.encode([P.PING, 1])
    body = msgpack.packb([P.PING, 1])
    assert wire == len(body).to_bytes(4, "big") + body == b"\x00\x00\x00\x03\x92\x04\x01"


def test_strings_encode_as_msgpack_str_and_payloads_as_bin() -> None:
    wire = P.encode([P.PUBLISH, 1, [["t", ["i"], [b"p"]]]])
    assert wire[4:] == b"\x93\x0a\x01\x91\x93\xa1t\x91\xa1i\x91\xc4\x01p"
    (frame,) = P.FrameDecoder().feed(wire)
    name, [mid], [data] = frame[2][0]
    assert type(name) is str and type(mid) is str and type(data) is bytes


def test_protocol_md_example_bytes_are_what_encode_produces() -> None:
    """The hex dumps of PROTOCOL.md §13 are the real encodings of the frames shown."""
    text = PROTOCOL_MD.read_text()
    examples = {
        "PING [4, 1]": [P.PING, 1],
        'HELLO [1, 1, {"version": 6, "role": "client"}]':
            [P.HELLO, 1, {"version": P.VERSION, "role": "client"}],
        'PUBLISH [10, 2, [["orders.eu", ["order-17"], [b"hi"]]]]':
            [P.PUBLISH, 2, [["orders.eu", ["order-17"], [b"hi"]]]],
        "PUBLISHED [11, 2, 0xfedcba9876543210, [[0, [], []]]]":
            [P.PUBLISHED, 2, 0xFEDCBA9876543210, [[0, [], []]]],
        'DELIVER [30, 1, 0xfedcba9876543210, 1, 5, ["a", "b"], [b"x", b"y"], [1764000000.5, 2]]':
            [P.DELIVER, 1, 0xFEDCBA9876543210, 1, 5, ["a", "b"], [b"x", b"y"], [1764000000.5, 2]],
        "ACK [40, 3, 1, 0xfedcba9876543210, [0], -1]":
            [P.ACK, 3, 1, 0xFEDCBA9876543210, [0], -1],
    }
    for title, frame in examples.items():
        start = text.index(title)
        end = text.find("\n\n", start)
        dump = text[start + len(title):end if end != -1 else None].split("\n", 1)[1]
        hex_bytes = "".join(dump.replace("`", "").split())
        assert bytes.fromhex(hex_bytes) == P.encode(frame), title


def test_maps_with_integer_keys_decode() -> None:
    assert decode_all(framed(msgpack.packb([P.STATS_OK, 1, {1: "x"}]))) == [[P.STATS_OK, 1, {1: "x"}]]


# -- corrupt input ---------------------------------------------------------------------


def test_length_prefix_over_max_frame_bytes_raises_frame_too_large_before_the_body_arrives() -> None:
    decoder = P.FrameDecoder(max_frame_bytes=1024)
    with pytest.raises(errors.FrameTooLarge) as info:
        decoder.feed(struct.pack(">I", 1025))
    assert info.value.details == {"size": 1025, "limit": 1024}
    assert isinstance(info.value, errors.ProtocolError)


def test_largest_length_prefix_is_rejected_by_the_default_limit() -> None:
    with pytest.raises(errors.FrameTooLarge):
        P.FrameDecoder().feed(b"\xff\xff\xff\xff")


def test_frame_of_exactly_max_frame_bytes_is_accepted() -> None:
    frame = [P.PUBLISH, 1, [["t", "i", bytes(1000)]]]
    wire = P.encode(frame)
    assert P.FrameDecoder(max_frame_bytes=len(wire) - 4).feed(wire) == [frame]
    with pytest.raises(errors.FrameTooLarge):
        P.FrameDecoder(max_frame_bytes=len(wire) - 5).feed(wire)


def test_oversized_frame_after_good_ones_is_still_refused() -> None:
    decoder = P.FrameDecoder(max_frame_bytes=64)
    assert decoder.feed(P.encode([P.PING, 1])) == [[P.PING, 1]]
    with pytest.raises(errors.FrameTooLarge):
        decoder.feed(P.encode([P.PING, 2, "x" * 100]))


def test_frames_before_corruption_in_the_same_input_are_handed_over_with_the_error() -> None:
    # a PUBLISH that arrives in the same read as garbage must still be answered (G8: loses nothing)
    decoder = P.FrameDecoder()
    good = [[P.PUBLISH, 1, [["t", "id-1", b"x"]]], [P.PING, 2]]
    with pytest.raises(errors.ProtocolError) as info:
        decoder.feed(P.encode_many(good) + struct.pack(">I", 1) + b"\xc1")
    assert info.value.complete_frames == good


def test_oversized_prefix_after_good_frames_hands_the_good_frames_over() -> None:
    decoder = P.FrameDecoder(max_frame_bytes=64)
    with pytest.raises(errors.FrameTooLarge) as info:
        decoder.feed(P.encode([P.PING, 1]) + struct.pack(">I", 65))
    assert info.value.complete_frames == [[P.PING, 1]]


BAD_BODIES = {
    "empty body": b"",
    "reserved byte 0xc1": b"\xc1",
    "truncated array": b"\x92\x01",
    "trailing bytes after the array": b"\x91\x01\x01",
    "invalid utf-8 in a str": b"\x92\x01\xa1\xff",
    "array claiming 2**32-1 items": b"\xdd\xff\xff\xff\xff",
    "map claiming 2**32-1 pairs": b"\xdf\xff\xff\xff\xff",
    "bin claiming 2**32-1 bytes": b"\xc6\xff\xff\xff\xff",
    "arrays nested 100000 deep": b"\x91" * 100_000 + b"\x01",
    "not an array: int": msgpack.packb(5),
    "not an array: str": msgpack.packb("hello"),
    "not an array: map": msgpack.packb({"kind": 1}),
    "not an array: bin": msgpack.packb(b"\x01"),
    "empty array": msgpack.packb([]),
    "str kind": msgpack.packb(["HELLO", 1]),
    "float kind": msgpack.packb([1.0, 1]),
    "bool kind": msgpack.packb([True, 1]),
    "nil kind": msgpack.packb([None, 1]),
    "array kind": msgpack.packb([[1], 1]),
}


@pytest.mark.parametrize("body", BAD_BODIES.values(), ids=BAD_BODIES.keys())
def test_undecodable_or_misshapen_body_raises_protocol_error(body: bytes) -> None:
    with pytest.raises(errors.ProtocolError) as info:
        P.FrameDecoder().feed(framed(body))
    assert type(info.value) is errors.ProtocolError


def test_unknown_kind_number_is_not_a_framing_error() -> None:
    # an unknown kind is a request error (answered, connection kept), not corruption
    assert decode_all(framed(msgpack.packb([999, 1]))) == [[999, 1]]


@settings(max_examples=300, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=600), chunks=st.lists(st.integers(0, 64), max_size=12),
       limit=st.sampled_from([16, 256, P.DEFAULT_MAX_FRAME_BYTES]))
def test_random_bytes_only_ever_raise_protocol_errors(data: bytes, chunks: list[int], limit: int) -> None:
    decoder = P.FrameDecoder(max_frame_bytes=limit)
    pos = 0
    try:
        for size in [*chunks, len(data)]:
            for frame in decoder.feed(data[pos:pos + size]):
                assert isinstance(frame, list) and frame and type(frame[0]) is int
            pos += size
    except errors.ProtocolError:
        pass


@settings(max_examples=300, deadline=2000)
@given(frames=st.lists(any_frame, min_size=1, max_size=4), data=st.data())
def test_corrupted_valid_streams_only_ever_raise_protocol_errors(
        frames: list[list[Any]], data: st.DataObject) -> None:
    wire = bytearray(P.encode_many(frames))
    for _ in range(data.draw(st.integers(1, 4))):
        wire[data.draw(st.integers(0, len(wire) - 1))] = data.draw(st.integers(0, 255))
    try:
        for frame in P.FrameDecoder(max_frame_bytes=4096).feed(bytes(wire)):
            assert isinstance(frame, list) and frame and type(frame[0]) is int
    except errors.ProtocolError:
        pass


# -- topic names and message ids -------------------------------------------------------

GOOD_TOPICS = ["a", "Z", "0", "_", "-", "orders", "orders.eu", "a-b_c.D9", "a.b.c.d.e", "x" * 255,
               ".".join(["ab"] * 85)]
BAD_TOPICS = ["", "x" * 256, ".a", "a.", "a..b", ".", "a b", " a", "a\n", "a\t", "a/b", "a:b",
              "*", ">", "a.*", "a.>", "orders.*.eu", "a*", "é", "orders.é", "\ud800", "a\x00"]


@pytest.mark.parametrize("name", GOOD_TOPICS)
def test_check_topic_accepts_valid_names(name: str) -> None:
    assert P.check_topic(name) == name


@pytest.mark.parametrize("name", BAD_TOPICS)
def test_check_topic_rejects_invalid_names(name: str) -> None:
    with pytest.raises(errors.InvalidTopic):
        P.check_topic(name)


@pytest.mark.parametrize("name", [b"orders", None, 5, ["a"]])
def test_check_topic_rejects_non_strings(name: object) -> None:
    with pytest.raises(errors.InvalidTopic, match="must be a string"):
        P.check_topic(name)


def test_check_topic_counts_utf8_bytes_not_characters() -> None:
    with pytest.raises(errors.InvalidTopic, match="got 256"):
        P.check_topic("é" * 128)  # 128 characters, 256 bytes


def test_check_topic_error_says_what_is_allowed() -> None:
    with pytest.raises(errors.InvalidTopic, match=r"\[A-Za-z0-9_-\].*reserved"):
        P.check_topic("orders.*")


GOOD_IDS = ["x", "x" * 128, "é" * 64, "\U0001f642" * 32, "any chars: *> ./\n\x00"]
BAD_IDS = ["", "x" * 129, "é" * 65, "\U0001f642" * 33, "\ud800"]


@pytest.mark.parametrize("mid", GOOD_IDS)
def test_check_message_id_accepts_1_to_128_utf8_bytes(mid: str) -> None:
    assert P.check_message_id(mid) == mid


@pytest.mark.parametrize("mid", BAD_IDS)
def test_check_message_id_rejects_empty_oversized_or_unencodable_ids(mid: str) -> None:
    with pytest.raises(errors.InvalidMessageId):
        P.check_message_id(mid)


@pytest.mark.parametrize("mid", [b"id", None, 17])
def test_check_message_id_rejects_non_strings(mid: object) -> None:
    with pytest.raises(errors.InvalidMessageId, match="must be a string"):
        P.check_message_id(mid)


@given(mid=st.text(min_size=1, max_size=40))
def test_every_accepted_message_id_can_be_encoded(mid: str) -> None:
    try:
        P.check_message_id(mid)
    except errors.InvalidMessageId:
        return
    assert decode_all(P.encode([P.PUBLISH, 1, [["t", mid, b""]]]))[0][2][0][1] == mid


# -- addresses -------------------------------------------------------------------------

GOOD_ADDRESSES = {
    "127.0.0.1:7070": ("127.0.0.1", 7070),
    "localhost:0": ("localhost", 0),
    "example.com:65535": ("example.com", 65535),
    "flux://127.0.0.1:7070": ("127.0.0.1", 7070),
    "flux://10.0.0.1:7070/": ("10.0.0.1", 7070),
    "[::1]:7070": ("::1", 7070),
    "flux://[::1]:7071": ("::1", 7071),
    ":7070": ("127.0.0.1", 7070),
}
BAD_ADDRESSES = ["localhost", "flux://localhost", "host:", "host:http", "host:-1", "host: 80", "host:65536",
                 "host:99999", "host:\u0663", ""]


@pytest.mark.parametrize(("address", "expected"), GOOD_ADDRESSES.items())
def test_parse_address_splits_host_and_port(address: str, expected: tuple[str, int]) -> None:
    assert P.parse_address(address) == expected


@pytest.mark.parametrize("address", BAD_ADDRESSES)
def test_parse_address_rejects_addresses_without_a_valid_port(address: str) -> None:
    with pytest.raises(ValueError, match="host:port"):
        P.parse_address(address)


# -- error frames ----------------------------------------------------------------------


@pytest.mark.parametrize("cls", remote_error_classes(), ids=lambda c: c.__name__)
def test_error_frame_round_trips_every_remote_error_class(cls: type[errors.RemoteError]) -> None:
    exc = cls("it broke", topic="orders", size=3)
    frame = P.error_frame(42, exc)
    assert frame[:4] == [P.ERROR, 42, cls.code, "it broke"]
    (decoded,) = decode_all(P.encode(frame))
    back = P.error_from_frame(decoded)
    assert type(back) is cls
    assert str(back) == "it broke"
    assert back.details["topic"] == "orders" and back.details["size"] == 3


def test_error_frame_keeps_topic_reset_generations() -> None:
    exc = errors.TopicReset("reset", old=2**64 - 1, new=5)
    (decoded,) = decode_all(P.encode(P.error_frame(1, exc)))
    back = P.error_from_frame(decoded)
    assert isinstance(back, errors.TopicReset)
    assert (back.old, back.new) == (2**64 - 1, 5)


def test_error_frame_without_message_sends_the_class_description() -> None:
    frame = P.error_frame(1, errors.Busy())
    assert frame[3] == errors.Busy.__doc__


def test_error_frame_drops_details_msgpack_could_not_carry_plainly() -> None:
    frame = P.error_frame(1, errors.InvalidRequest("x", ok=1, nested={"a": 1}, items=[1], obj=object()))
    assert frame[4] == {"ok": 1}
    P.encode(frame)


@pytest.mark.parametrize("frame", [
    [P.ERROR], [P.ERROR, 1], [P.ERROR, 1, "20", "x"], [P.ERROR, 1, 20, b"x", None],
    [P.ERROR, 1, 12345, "x", {}], [P.ERROR, 1, 20, "x", {"message": "y", 1: 2, "self": 3}],
    [P.ERROR, 1, 50, "x", {"old": "a", "new": None}], [P.ERROR, 1, 20, "x", [1, 2]],
])
def test_error_from_frame_tolerates_malformed_error_frames(frame: list[Any]) -> None:
    assert isinstance(P.error_from_frame(frame), errors.RemoteError)


@given(rest=st.lists(plain | st.dictionaries(plain.filter(lambda v: v is not None), plain), max_size=5))
def test_error_from_frame_never_raises(rest: list[Any]) -> None:
    assert isinstance(P.error_from_frame([P.ERROR, *rest]), errors.RemoteError)


# -- PROTOCOL.md stays in step with the code ---------------------------------------------

PROTOCOL_MD = Path(__file__).resolve().parents[1] / "PROTOCOL.md"


def test_protocol_md_frame_table_lists_every_kind_with_its_number() -> None:
    rows = re.findall(r"^\| (\d+) \| ([A-Z_]+) \|", PROTOCOL_MD.read_text(), re.MULTILINE)
    assert {int(n): name for n, name in rows} == P.KIND_NAMES


def test_protocol_md_error_table_matches_the_error_classes() -> None:
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \| (yes|no) \|", PROTOCOL_MD.read_text(), re.MULTILINE)
    documented = {int(code): (name, flag == "yes") for code, name, flag in rows}
    actual = {c.code: (c.__name__, c.retryable) for c in remote_error_classes()
              if c is not errors.RemoteError}
    assert documented == actual


def test_decoder_keeps_a_partial_frame_across_feeds_after_a_whole_one() -> None:
    whole, partial = P.encode([P.PING, 1]), P.encode([P.PING, 2, "x" * 100])
    decoder = P.FrameDecoder()
    assert decoder.feed(whole + partial[:7]) == [[P.PING, 1]]
    assert decoder.pending == 7
    assert decoder.feed(partial[7:50]) == []
    assert decoder.feed(bytearray(partial[50:]) + whole) == [[P.PING, 2, "x" * 100], [P.PING, 1]]
    assert decoder.pending == 0


def test_decoder_stays_usable_after_an_undecodable_frame_in_its_buffer() -> None:
    decoder = P.FrameDecoder()
    assert decoder.feed(P.encode([P.PING, 1])[:3]) == []
    bad = P.HEADER.pack(1) + b"\xc1"  # 0xc1 is never used in MessagePack
    with pytest.raises(errors.ProtocolError) as caught:
        decoder.feed(P.encode([P.PING, 1])[3:] + bad)
    assert caught.value.complete_frames == [[P.PING, 1]]
    with pytest.raises(errors.ProtocolError):  # still corrupt, and no BufferError: the
        decoder.feed(b"more")                  # buffer the frame was read from can grow


# -- offsets as a first offset or an array, store times as runs --------------------------


@given(st.lists(st.sampled_from([0.0, 1.5, 2.5, 1e9 + 0.25]), max_size=40))
def test_time_runs_give_back_every_time_in_order(times: list[float]) -> None:
    runs = P.time_runs(times)
    assert list(P.times_of(runs)) == times
    counts = runs[1::2]
    assert all(type(c) is int and c >= 1 for c in counts) and sum(counts) == len(times)
    # maximal runs: no two neighbours share a time
    assert all(a != b for a, b in itertools.pairwise(runs[0::2]))


@given(st.integers(0, 2**40), st.integers(0, 300))
def test_a_contiguous_run_goes_as_its_first_offset_and_comes_back_whole(first: int, n: int) -> None:
    offsets = range(first, first + n)
    field = P.offsets_field(offsets)
    assert field == first
    assert list(P.offsets_of(field, n)) == list(offsets)
    assert P.offsets_field([first, first + 2]) == [first, first + 2]
    assert P.offsets_of([first, first + 2], 2) == [first, first + 2]


@given(st.integers(1, 300), st.integers(1, 4))
def test_check_deliver_counts_the_messages_of_either_form(n: int, runs: int) -> None:
    cut = sorted({0, n, *range(1, n, max(1, n // runs))})
    times = [x for a, b in itertools.pairwise(cut) for x in (float(a), b - a)]
    ids = [f"m{i}" for i in range(n)]
    payloads = [b"p"] * n
    assert P.check_deliver([P.DELIVER, 1, 7, 1, 5, ids, payloads, times]) == n
    assert P.check_deliver([P.DELIVER, 1, 7, 2, list(range(0, 2 * n, 2)), ids, payloads,
                            times]) == n
    with pytest.raises(ValueError, match="runs"):
        P.check_deliver([P.DELIVER, 1, 7, 1, 5, ids, payloads, [*times, 9.0, 1]])
