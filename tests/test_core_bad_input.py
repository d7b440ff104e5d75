"""ShardCore and bad input (G8): typed errors, per-item results, nothing changed, nothing raised."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_core_support import GEN, OK, TOPIC, Shard, fetched_messages, item_rows

from flux import errors
from flux import protocol as P
from flux.hashing import shard_for

KNOWN_CODES = {cls.code for cls in [
    errors.ProtocolError, errors.FrameTooLarge, errors.UnsupportedVersion, errors.InvalidRequest,
    errors.InvalidTopic, errors.InvalidMessageId, errors.MessageTooLarge, errors.WrongShard,
    errors.TopicFull, errors.Busy, errors.TopicReset, errors.UnknownSubscription,
    errors.SubscriptionInactive, errors.SubscriptionTakenOver, errors.NotDelivered,
    errors.OffsetOutOfRange, errors.ShuttingDown, errors.NotAuthorized,
    errors.TooManySubscriptions]}


def _topic_of_shard(index: int, count: int) -> str:
    for i in range(1000):
        name = f"t{i}.x"
        if shard_for(name, count) == index:
            return name
    raise AssertionError("no topic found")


def _prepared() -> tuple[Shard, Any]:
    """A shard with data: two messages, a named subscription with one of them in flight."""
    shard = Shard()
    client = shard.connect()
    client.subscribe(1, name="s", max_in_flight=1, credit=10)
    client.subscribe(2, name="p", mode="pull", read_old=True)
    client.publish("a", "b")
    client.take()
    return shard, client


def _snapshot(shard: Shard) -> dict[str, Any]:
    stats = copy.deepcopy(shard.stats())
    stats.pop("uptime")
    return stats


BAD_SUBSCRIBE_OPTIONS: list[tuple[dict[str, Any], type[errors.FluxError]]] = [
    ({"topic": None}, errors.InvalidTopic),
    ({"topic": 5}, errors.InvalidTopic),
    ({"topic": ""}, errors.InvalidTopic),
    ({"topic": "a..b"}, errors.InvalidTopic),
    ({"topic": "orders.*"}, errors.InvalidTopic),
    ({"topic": "orders.>"}, errors.InvalidTopic),
    ({"topic": "x" * 256}, errors.InvalidTopic),
    ({"mode": "poll"}, errors.InvalidRequest),
    ({"mode": None}, errors.InvalidRequest),
    ({"name": ""}, errors.InvalidRequest),
    ({"name": "~s"}, errors.InvalidRequest),
    ({"name": 7}, errors.InvalidRequest),
    ({"name": "n" * 256}, errors.InvalidRequest),
    ({"read_old": "yes"}, errors.InvalidRequest),
    ({"read_old": 1}, errors.InvalidRequest),
    ({"from_offset": "0"}, errors.InvalidRequest),
    ({"from_offset": 1.0}, errors.InvalidRequest),
    ({"from_offset": -1}, errors.InvalidRequest),
    ({"from_offset": 3}, errors.OffsetOutOfRange),
    ({"generation": "x"}, errors.InvalidRequest),
    ({"on_reset": "latest"}, errors.InvalidRequest),
    ({"max_in_flight": -1}, errors.InvalidRequest),
    ({"max_in_flight": 0}, errors.InvalidRequest),
    ({"max_in_flight": 2.5}, errors.InvalidRequest),
    ({"credit": "lots"}, errors.InvalidRequest),
    ({"credit": -5}, errors.InvalidRequest),
]


@pytest.mark.parametrize(("opts", "error"), BAD_SUBSCRIBE_OPTIONS,
                         ids=[f"{k}={v!r}"[:40] for (o, _) in BAD_SUBSCRIBE_OPTIONS
                              for k, v in o.items()])
def test_bad_subscribe_option_is_a_typed_error_and_changes_nothing(
        opts: dict[str, Any], error: type[errors.FluxError]) -> None:
    """G8: each bad SUBSCRIBE option gets its own typed error; no subscription is made."""
    shard, client = _prepared()
    before = _snapshot(shard)
    reply = client.subscribe_frame(9, **{"name": "new", **opts})
    assert reply[0] == P.ERROR, reply
    assert reply[2] == error.code, reply
    assert isinstance(reply[3], str) and reply[3]
    assert _snapshot(shard) == before


@pytest.mark.parametrize("opts", [{"topic": "fresh.topic", "from_offset": 4},
                                  {"topic": "fresh.topic", "max_in_flight": -1},
                                  {"topic": "fresh.topic", "mode": "pull", "name": None}])
def test_refused_subscribe_to_a_new_topic_creates_no_topic(opts: dict[str, Any]) -> None:
    """G8: a refused request changes nothing, not even the list of topics STATS reports."""
    shard, client = _prepared()
    before = _snapshot(shard)
    reply = client.subscribe_frame(9, **{"name": "new", **opts})
    assert reply[0] == P.ERROR
    assert _snapshot(shard) == before


def test_bad_sid_in_subscribe_is_invalid_request() -> None:
    shard, client = _prepared()
    before = _snapshot(shard)
    for sid in ("1", None, 1.0, [1]):
        reply = client.request([P.SUBSCRIBE, 50, sid, {"topic": TOPIC, "name": "x"}])
        assert reply[0] == P.ERROR and reply[2] == errors.InvalidRequest.code
    assert _snapshot(shard) == before


BAD_FRAMES: list[tuple[list[Any], type[errors.FluxError]]] = [
    ([999, 40], errors.InvalidRequest),                       # unknown kind
    ([P.PONG, 40], errors.InvalidRequest),                    # a server->client kind
    ([P.DELIVER, 40, GEN, 1, [], [], [], []], errors.InvalidRequest),
    ([P.HELLO_OK, 40, {}], errors.InvalidRequest),
    ([P.REGISTER, 40, {}], errors.NotAuthorized),             # router control, not for clients
    ([P.ADOPT, 41, {"control": "127.0.0.1:1"}], errors.NotAuthorized),
    ([P.PING], errors.InvalidRequest),
    ([P.PUBLISH, 40], errors.InvalidRequest),
    ([P.PUBLISH, 40, {"topic": TOPIC}], errors.InvalidRequest),
    ([P.PUBLISH, 40, None], errors.InvalidRequest),
    ([P.PUBLISH, 40, [[TOPIC, "c", b""]]], errors.InvalidRequest),         # a v1 item
    ([P.PUBLISH, 40, [[TOPIC, ["c"], [b""]], [TOPIC, ["d"], []]]], errors.InvalidRequest),
    ([P.PUBLISH, 40, [[TOPIC, ["c"], [b""]], [TOPIC, ["d"]]]], errors.InvalidRequest),
    ([P.SUBSCRIBE, 40, 3], errors.InvalidRequest),
    ([P.SUBSCRIBE, 40, 3, [TOPIC]], errors.InvalidRequest),
    ([P.UNSUBSCRIBE, 40], errors.InvalidRequest),
    ([P.ACK, 40, 1, GEN], errors.InvalidRequest),
    ([P.ACK, 40, 1, GEN, "0", -1], errors.InvalidRequest),
    ([P.ACK, 40, 1, GEN, [0], "x"], errors.InvalidRequest),
    ([P.ACK, 40, 1, None, [0], -1], errors.TopicReset),
    ([P.ACK, 40, "1", GEN, [0], -1], errors.UnknownSubscription),
    ([P.FETCH, 40], errors.InvalidRequest),
    ([P.FETCH, 40, {"topic": TOPIC, "offset": -1}], errors.InvalidRequest),
    ([P.FETCH, 40, {"topic": TOPIC, "offset": "0"}], errors.InvalidRequest),
    ([P.FETCH, 40, {"topic": TOPIC, "max_messages": -1}], errors.InvalidRequest),
    ([P.FETCH, 40, {"topic": TOPIC, "max_messages": "all"}], errors.InvalidRequest),
    ([P.FETCH, 40, {"topic": "bad topic"}], errors.InvalidTopic),
    ([P.FETCH, 40, {"topic": TOPIC, "generation": GEN + 1}], errors.TopicReset),
    ([P.COMMIT, 40, {"topic": TOPIC, "name": "p", "generation": GEN}], errors.OffsetOutOfRange),
    ([P.COMMIT, 40, {"topic": TOPIC, "name": "p", "generation": GEN, "offset": 99}],
     errors.OffsetOutOfRange),
    ([P.COMMIT, 40, {"topic": TOPIC, "name": None, "generation": GEN, "offset": 1}],
     errors.UnknownSubscription),
    ([P.COMMIT, 40, "p"], errors.InvalidRequest),
    ([P.STATS], errors.InvalidRequest),
    ([P.HELLO, 40, "v1"], errors.InvalidRequest),
]


@pytest.mark.parametrize(("frame", "error"), BAD_FRAMES,
                         ids=[f"{P.KIND_NAMES.get(f[0], f[0])}-{i}"
                              for i, (f, _) in enumerate(BAD_FRAMES)])
def test_malformed_frame_gets_a_typed_error_and_changes_nothing(
        frame: list[Any], error: type[errors.FluxError]) -> None:
    """G8: a malformed request gets one ERROR naming its rid (or 0) and a typed code."""
    shard, client = _prepared()
    before = _snapshot(shard)
    got = client.send(frame)
    assert len(got) == 1, got
    [reply] = got
    assert reply[0] == P.ERROR
    assert reply[1] == (frame[1] if len(frame) > 1 and type(frame[1]) is int else 0)
    assert reply[2] == error.code, reply
    assert isinstance(reply[3], str) and reply[3]
    assert isinstance(reply[4], dict)
    assert not client.closed
    assert _snapshot(shard) == before
    # the connection still works
    assert client.ping()[0] == P.PONG


def test_bad_credit_is_an_error_and_does_not_answer_to_a_request_rid() -> None:
    """G8: CREDIT has no rid, so its error must not be addressed to a pending request.

    Its second field is a sid; an ERROR carrying it as rid would fail whichever
    request happens to use that number.
    """
    shard, client = _prepared()
    before = _snapshot(shard)
    for n in (-1, "5", 2.0, None):
        [reply] = client.credit(1, n)
        assert reply[0] == P.ERROR and reply[2] == errors.InvalidRequest.code
        assert reply[1] == 0, reply
    assert _snapshot(shard) == before


def test_wrong_shard_for_every_request_naming_a_topic() -> None:
    """G8: a topic owned by another shard gets WrongShard (retryable) and nothing is stored."""
    shard = Shard(index=0, shard_count=2)
    mine, theirs = _topic_of_shard(0, 2), _topic_of_shard(1, 2)
    client = shard.connect()
    reply = client.publish_frame([[theirs, ["a", "b"], [b"", b""]], [mine, ["a"], [b""]]])
    [[offsets, duplicates, refused], ok] = reply[3]
    assert (offsets, duplicates) == ([P.REFUSED, P.REFUSED], [])
    assert [r[:2] for r in refused] == [[0, errors.WrongShard.code], [1, errors.WrongShard.code]]
    assert "belongs to shard 1" in refused[0][2]
    assert ok == [0, [], []]
    for frame in ([P.SUBSCRIBE, 7, 1, {"topic": theirs, "name": "s"}],
                  [P.FETCH, 7, {"topic": theirs}],
                  [P.COMMIT, 7, {"topic": theirs, "name": "s", "generation": GEN, "offset": 0}]):
        reply = client.request(frame)
        assert reply[0] == P.ERROR and reply[2] == errors.WrongShard.code, reply
        assert errors.from_code(reply[2], reply[3]).retryable
    assert set(shard.stats()["topics"]) == {mine}


def test_wrong_shard_check_can_be_disabled() -> None:
    shard = Shard(index=0, shard_count=2)
    shard.core.check_ownership = False
    client = shard.connect()
    assert client.publish("a", topic=_topic_of_shard(1, 2)) == [[OK, 0, False]]


# -- fuzz ----------------------------------------------------------------------------------

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=True), st.text(max_size=12), st.binary(max_size=12),
    st.sampled_from([TOPIC, "s", "p", "other.topic", GEN, 0, 1, -1, "push", "pull",
                     "earliest", "raise"]),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=10,
)
_option_keys = ["topic", "name", "mode", "read_old", "from_offset", "max_in_flight", "credit",
                "generation", "on_reset", "offset", "max_messages", "max_bytes", "version"]
_options = st.dictionaries(st.sampled_from(_option_keys), _values, max_size=8)
_kinds = st.one_of(st.sampled_from(sorted(P.KIND_NAMES)), st.integers(-5, 300))
_frames = st.one_of(
    st.builds(lambda k, rest: [k, *rest], _kinds, st.lists(_values, max_size=6)),
    st.builds(lambda k, rid, sid, o: [k, rid, sid, o], _kinds, st.integers(0, 5),
              st.integers(0, 3), _options),
    st.builds(lambda k, rid, o: [k, rid, o], _kinds, st.integers(0, 5), _options),
    st.builds(lambda rid, items: [P.PUBLISH, rid, items], st.integers(0, 5),
              st.lists(st.lists(_values, max_size=4), max_size=4)),
    st.builds(lambda rid, groups: [P.PUBLISH, rid, groups], st.integers(0, 5),
              st.lists(st.builds(lambda t, column: [t, [c[0] for c in column],
                                                    [c[1] for c in column]],
                                 st.sampled_from([TOPIC, "other.topic", "bad topic", None]),
                                 st.lists(st.tuples(_values, _values), max_size=4)),
                       max_size=3)),
    st.builds(lambda rid, sid, gen, offs, t: [P.ACK, rid, sid, gen, offs, t], st.integers(0, 5),
              st.integers(0, 3), st.sampled_from([GEN, GEN + 1, None]),
              st.lists(_values, max_size=4), _values),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames=st.lists(_frames, min_size=1, max_size=8))
def test_no_decodable_frame_raises_or_loses_stored_data(frames: list[list[Any]]) -> None:
    """G8: whatever arrives (after the decoder), receive() and tick() do not raise, every
    ERROR has a known code and a message, and stored messages are still there."""
    shard, client = _prepared()
    decoder = P.FrameDecoder()
    for frame in frames:
        [decoded] = decoder.feed(P.encode(frame))
        shard.core.receive(client.conn, decoded, shard.now)
        shard.collect()
        shard.after(1.0)
        for got in client.take():
            assert isinstance(got, list) and type(got[0]) is int
            if got[0] == P.PUBLISHED:
                item_rows(decoded[2], got)  # one well-formed result per group
            if got[0] == P.ERROR:
                assert got[2] in KNOWN_CODES, got
                assert isinstance(got[3], str) and got[3]
            P.encode(got)  # every frame the shard sends can be encoded
        if client.closed:
            client = shard.connect()
    fetched = client.fetch(offset=0)
    assert [m[1] for m in fetched_messages(fetched)][:2] == ["a", "b"]


@pytest.mark.parametrize("frame", [[], [None], ["1"], [True, 1], [1.0, 1], [[P.PING], 1]])
def test_frames_the_decoder_would_refuse_get_a_protocol_error_not_an_exception(
        frame: list[Any]) -> None:
    """G8: receive() never raises, even on frames only a buggy shell could pass it."""
    shard, client = _prepared()
    before = _snapshot(shard)
    [reply] = client.send(frame)
    assert reply[0] == P.ERROR and reply[1] == 0 and reply[2] == errors.ProtocolError.code
    assert _snapshot(shard) == before


def test_a_request_without_an_integer_rid_is_refused_with_rid_0_and_does_nothing() -> None:
    """Found by the wire fuzzer: a PUBLISH with rid NaN was stored and answered with
    rid NaN, which no client can match."""
    shard = Shard()
    client = shard.connect()
    for rid in ("x", float("nan"), None, True, [1]):
        [reply] = client.send([P.PUBLISH, rid, [["orders.eu", ["a"], [b"x"]]]])
        assert reply[:3] == [P.ERROR, 0, errors.InvalidRequest.code]
        assert "integer rid" in reply[3]
    assert "orders.eu" not in shard.core.topics
    assert client.send([P.CREDIT, 9, 5]) == []   # CREDIT has no rid, and still no reply
