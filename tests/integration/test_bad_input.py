"""G8 against real processes: bad input gets a typed error; corruption closes one connection.

Every test here ends by showing that the shard kept serving the other
connections and lost nothing it had stored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import trio

from flux import errors, protocol

from .wire import RawConn, item_result, owned_topic, publish_frame, shard_map

if TYPE_CHECKING:
    from tests.conftest import Broker

pytestmark = pytest.mark.integration
P = protocol
TIMEOUT = 20


async def shard_address(broker: Broker, index: int) -> str:
    return next(address for i, address, _ in await shard_map(broker.address) if i == index)


async def publish(conn: RawConn, topic: str, message_id: str, payload: bytes) -> list[Any]:
    reply = await conn.request(publish_frame(conn.rid(), topic, message_id, payload))
    assert reply[0] == P.PUBLISHED, reply
    return item_result(reply)


async def held_ids(address: str, topic: str) -> list[str]:
    async with await RawConn.open(address) as conn:
        await conn.hello()
        reply = await conn.request([P.FETCH, conn.rid(), {
            "topic": topic, "name": None, "generation": None, "offset": 0,
            "max_messages": 100, "max_bytes": 1 << 20}])
    assert reply[0] == P.FETCHED, reply
    return list(reply[4])  # the ids column


async def assert_closed_after_error(conn: RawConn, code: int) -> None:
    frames = await conn.read_until_closed()
    assert frames, "expected an ERROR frame before the close"
    assert frames[-1][0] == P.ERROR and frames[-1][2] == code, frames


@pytest.mark.parametrize(("garbage", "code"), [
    (b"\x00\x00\x00\x05\xc1\xc1\xc1\xc1\xc1", errors.ProtocolError.code),  # undecodable body
    (P.HEADER.pack(3) + b"abc", errors.ProtocolError.code),  # not an array
    (P.HEADER.pack(0xFFFFFFF0), errors.FrameTooLarge.code),  # length over max_frame_bytes
    (P.HEADER.pack(2) + b"\x91\xa1", errors.ProtocolError.code),  # [kind] must be an integer
])
async def test_framing_corruption_closes_only_that_connection(
        broker: Broker, garbage: bytes, code: int) -> None:
    topic = owned_topic(0)
    with trio.fail_after(TIMEOUT):
        address = await shard_address(broker, 0)
        async with await RawConn.open(address) as good, await RawConn.open(address) as bad:
            await good.hello()
            assert (await publish(good, topic, "before", b"1"))[:2] == [0, 0]
            await bad.hello()
            await bad.send_bytes(garbage)
            await assert_closed_after_error(bad, code)
            assert (await publish(good, topic, "after", b"2"))[:2] == [0, 1]
        assert await held_ids(address, topic) == ["before", "after"]


async def test_truncated_frame_at_end_of_stream_gets_protocol_error(broker: Broker) -> None:
    with trio.fail_after(TIMEOUT):
        address = await shard_address(broker, 1)
        async with await RawConn.open(address) as conn:
            await conn.send_bytes(P.HEADER.pack(100) + b"\x93\x04")
            await conn.stream.send_eof()
            await assert_closed_after_error(conn, errors.ProtocolError.code)


async def test_unknown_frame_kind_gets_invalid_request_and_connection_stays(
        broker: Broker) -> None:
    with trio.fail_after(TIMEOUT):
        async with await RawConn.open(await shard_address(broker, 0)) as conn:
            await conn.hello()
            reply = await conn.request([99, 7, "what"])
            assert reply[:3] == [P.ERROR, 7, errors.InvalidRequest.code]
            assert await conn.request([P.PING, 8]) == [P.PONG, 8]


async def test_bad_topics_and_wrong_types_get_typed_errors_per_item(broker: Broker) -> None:
    topic = owned_topic(0)
    with trio.fail_after(TIMEOUT):
        address = await shard_address(broker, 0)
        async with await RawConn.open(address) as conn:
            await conn.hello()
            reply = await conn.request([P.PUBLISH, 5, [
                ["bad topic!", ["a", "b"], [b"x", b"y"]],   # not a valid topic name
                [topic, ["", "b", "ok"], [b"x", "not bytes", b"x"]],  # empty id, not binary
            ]])
            assert reply[0] == P.PUBLISHED, reply
            assert [item_result(reply, 0, i)[0] for i in range(2)] == [
                errors.InvalidTopic.code] * 2
            assert [item_result(reply, 1, i)[0] for i in range(3)] == [
                errors.InvalidMessageId.code, errors.InvalidRequest.code, 0]  # "ok" is stored
            assert reply[3][1][0] == [P.REFUSED, P.REFUSED, 0]
            assert (await conn.request([P.PUBLISH, 6, "not a list"]))[:3] == [
                P.ERROR, 6, errors.InvalidRequest.code]
            sub = await conn.request([P.SUBSCRIBE, 7, 1, {"topic": "*", "mode": "push"}])
            assert sub[:3] == [P.ERROR, 7, errors.InvalidTopic.code]
            sub = await conn.request([P.SUBSCRIBE, 8, "sid", {"topic": topic}])
            assert sub[:3] == [P.ERROR, 8, errors.InvalidRequest.code]
            sub = await conn.request([P.SUBSCRIBE, 9, 1, {"topic": topic, "read_old": "yes"}])
            assert sub[:3] == [P.ERROR, 9, errors.InvalidRequest.code]
        assert await held_ids(address, topic) == ["ok"]


@pytest.mark.parametrize("groups", [
    "not a list",
    [["T", "v1-shaped", b"x"]],                       # a v1 item: id and payload not arrays
    [["T", ["good"], [b"x"]], ["T", ["a", "b"], [b"x"]]],   # unequal lengths
    [["T", ["good"], [b"x"]], ["T", ["a"]]],           # a group of two fields
    [["T", ["good"], [b"x"]], ["T", ["a"], [b"x"], "extra"]],   # of four fields
    [["T", ["good"], [b"x"]], "not a group"],
])
async def test_a_malformed_publish_frame_is_refused_whole_and_stores_nothing(
        broker: Broker, groups: Any) -> None:
    topic = owned_topic(0)
    if isinstance(groups, list):
        groups = [[topic if part == "T" else part for part in g] if isinstance(g, list) else g
                  for g in groups]
    with trio.fail_after(TIMEOUT):
        address = await shard_address(broker, 0)
        async with await RawConn.open(address) as conn:
            await conn.hello()
            reply = await conn.request([P.PUBLISH, 5, groups])
            assert reply[:3] == [P.ERROR, 5, errors.InvalidRequest.code], reply
            assert (await publish(conn, topic, "after", b"x"))[0] == 0
        assert await held_ids(address, topic) == ["after"]  # nothing of the bad frame


async def test_acks_for_unknown_offsets_and_subscriptions_are_refused(broker: Broker) -> None:
    topic = owned_topic(1)
    with trio.fail_after(TIMEOUT):
        async with await RawConn.open(await shard_address(broker, 1)) as conn:
            hello = await conn.hello()
            generation = hello[2]["generation"]
            await publish(conn, topic, "m0", b"0")
            sub = await conn.request([P.SUBSCRIBE, 10, 1, {
                "topic": topic, "name": "acks", "read_old": True, "credit": 10}])
            assert sub[0] == P.SUBSCRIBED, sub
            deliver = await conn.recv_kind(P.DELIVER)
            assert deliver[3:5] == [1, 0]  # attempt 1, first offset
            acked = await conn.request([P.ACK, 11, 1, generation, [0, 999], -1])
            assert acked[0] == P.ACKED
            assert [(r[0], r[1]) for r in acked[4]] == [(999, errors.NotDelivered.code)]
            unknown = await conn.request([P.ACK, 12, 42, generation, [0], -1])
            assert unknown[:3] == [P.ERROR, 12, errors.UnknownSubscription.code]
            stale = await conn.request([P.ACK, 13, 1, generation + 1, [0], -1])
            assert stale[:3] == [P.ERROR, 13, errors.TopicReset.code]
            assert await conn.request([P.PING, 14]) == [P.PONG, 14]


async def test_publish_to_a_shard_that_does_not_own_the_topic_gets_wrong_shard(
        broker: Broker) -> None:
    with trio.fail_after(TIMEOUT):
        async with await RawConn.open(await shard_address(broker, 0)) as conn:
            await conn.hello()
            result = await publish(conn, owned_topic(1), "x", b"x")
            assert result[0] == errors.WrongShard.code
            assert "shard 1" in result[1]


async def test_router_refuses_bad_version_and_non_router_requests(broker: Broker) -> None:
    with trio.fail_after(TIMEOUT):
        async with await RawConn.open(broker.address) as conn:
            reply = await conn.request(publish_frame(3, "a", "b", b"c"))
            assert reply[:3] == [P.ERROR, 3, errors.InvalidRequest.code]
            reply = await conn.request([P.HELLO, 4, {"version": 1}])  # v1 was never released
            assert reply[:3] == [P.ERROR, 4, errors.UnsupportedVersion.code]
            assert await conn.read_until_closed() == []
        async with await RawConn.open(broker.address) as conn:
            await conn.send_bytes(P.HEADER.pack(0xFFFFFFF0))
            await assert_closed_after_error(conn, errors.FrameTooLarge.code)
        assert len(await shard_map(broker.address)) == 2  # the router still serves


async def test_shard_refuses_bad_version_hello(broker: Broker) -> None:
    with trio.fail_after(TIMEOUT):
        async with await RawConn.open(await shard_address(broker, 0)) as conn:
            reply = await conn.request([P.HELLO, 1, {"version": 99}])
            assert reply[:3] == [P.ERROR, 1, errors.UnsupportedVersion.code]
            await conn.read_until_closed()
