"""Push subscriptions through the trio client against ShardCore shards in memory."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from test_client_harness import cluster, wait_for

from flux import errors
from flux import protocol as P
from flux.client.types import Message


async def take(sub: Any, n: int, ack: bool = True) -> list[Message]:
    out: list[Message] = []
    async for msg in sub:
        out.append(msg)
        if ack:
            await msg.ack()
        if len(out) == n:
            break
    return out


def sub_stats(shard: Any, topic: str, name: str) -> dict[str, Any]:
    return shard.core.stats(trio.current_time())["topics"][topic]["subscriptions"][name]


async def test_subscribe_iterates_in_order_and_acks() -> None:
    with trio.fail_after(10):
        async with cluster() as c, c.client() as client:
            await client.publish_many("t", [b"%d" % i for i in range(10)])
            async with client.subscribe("t", name="billing", read_old=True) as sub:
                assert (sub.created, sub.start_offset) == (True, 0)
                assert sub.generation == c.shard.core.generation
                msgs = await take(sub, 10)
            assert [m.offset for m in msgs] == list(range(10))
            assert [m.payload for m in msgs] == [b"%d" % i for i in range(10)]
            assert all(m.attempt == 1 and m.topic == "t" for m in msgs)
            assert sub_stats(c.shard, "t", "billing")["cursor"] == 10


async def test_subscribe_without_read_old_starts_at_the_next_offset() -> None:
    with trio.fail_after(10):
        async with cluster() as c, c.client() as client:
            await client.publish("t", b"old")
            async with client.subscribe("t") as sub:
                assert sub.start_offset == 1
                await client.publish("t", b"new")
                [msg] = await take(sub, 1)
    assert (msg.offset, msg.payload) == (1, b"new")


async def test_ack_coalescing_never_cumulatively_acks_an_unacked_offset() -> None:
    with trio.fail_after(10):
        async with cluster() as c, c.client() as client:
            await client.publish_many("t", [b"x"] * 10)
            async with client.subscribe("t", name="s", read_old=True) as sub:
                msgs = await take(sub, 10, ack=False)
                for msg in msgs:
                    if msg.offset != 3:
                        await msg.ack()
                await wait_for(lambda: sub_stats(c.shard, "t", "s")["in_flight"] == 1)
                for frame in c.shard.received(P.ACK):
                    assert frame[5] < 3, frame
                assert sub_stats(c.shard, "t", "s")["cursor"] == 3
                await msgs[3].ack()
                await wait_for(lambda: sub_stats(c.shard, "t", "s")["cursor"] == 10)


async def test_credit_is_granted_only_as_the_user_consumes(autojump_clock: object) -> None:
    with trio.fail_after(60):
        async with cluster() as c, c.client() as client:
            await client.publish_many("t", [b"x"] * 50)
            async with client.subscribe("t", name="s", read_old=True, prefetch=5) as sub:
                await trio.sleep(5)
                assert c.shard.core.counters["delivered"] == 5
                assert c.shard.received(P.CREDIT) == []
                await take(sub, 3)
                await trio.sleep(1)
                granted = sum(f[2] for f in c.shard.received(P.CREDIT))
                assert 2 <= granted <= 3
                assert c.shard.core.counters["delivered"] == 5 + granted
                rest = await take(sub, 47)
    assert [m.offset for m in rest] == list(range(3, 50))


async def test_unacked_message_is_redelivered_to_the_consumer(autojump_clock: object) -> None:
    with trio.fail_after(60):
        async with cluster(subscriber__timeout=2, subscriber__retry_interval=1) as c, \
                c.client() as client:
            await client.publish("t", b"x")
            async with client.subscribe("t", name="s", read_old=True) as sub:
                [first] = await take(sub, 1, ack=False)
                [again] = await take(sub, 1)
    assert (first.offset, first.attempt) == (0, 1)
    assert (again.offset, again.attempt) == (0, 2)


async def test_exhausted_pushes_raise_subscription_inactive(autojump_clock: object) -> None:
    with trio.fail_after(60):
        async with cluster(subscriber__timeout=1, subscriber__retry_count=0) as c, \
                c.client() as client:
            await client.publish("t", b"x")
            async with client.subscribe("t", name="s", read_old=True) as sub:
                await take(sub, 1, ack=False)
                with pytest.raises(errors.SubscriptionInactive):
                    await take(sub, 1)
                with pytest.raises(errors.SubscriptionInactive):  # sticky
                    await take(sub, 1)


async def test_second_session_takes_over_and_the_first_raises() -> None:
    with trio.fail_after(10):
        async with cluster() as c, c.client() as first, c.client() as second, \
                first.subscribe("t", name="s") as old, second.subscribe("t", name="s") as new:
            assert not new.created
            with pytest.raises(errors.SubscriptionTakenOver):
                await take(old, 1)
            await first.publish("t", b"x")
            [msg] = await take(new, 1)
    assert msg.payload == b"x"


async def test_reconnect_resumes_a_named_subscription_from_its_cursor(
        autojump_clock: object) -> None:
    with trio.fail_after(60):
        async with cluster() as c, c.client() as client:
            await client.publish_many("t", [b"%d" % i for i in range(5)])
            async with client.subscribe("t", name="s", read_old=True) as sub:
                msgs = await take(sub, 5, ack=False)
                for msg in msgs[:3]:
                    await msg.ack()
                await wait_for(lambda: sub_stats(c.shard, "t", "s")["cursor"] == 3)
                c.shard.cut_all()
                await client.publish_many("t", [b"5", b"6"])
                resumed = await take(sub, 4)
                assert sub.generation == c.shard.core.generation
    assert [(m.offset, m.attempt) for m in resumed] == [(3, 1), (4, 1), (5, 1), (6, 1)]
    assert sub_stats(c.shard, "t", "s")["cursor"] == 7


async def test_acks_queued_before_a_reconnect_are_applied_on_redelivery(
        autojump_clock: object) -> None:
    with trio.fail_after(60):
        async with cluster() as c, c.client() as client:
            await client.publish_many("t", [b"0", b"1", b"2"])
            async with client.subscribe("t", name="s", read_old=True) as sub:
                msgs = await take(sub, 3, ack=False)
                listener = c.host.listeners.pop(c.shard.address)
                c.shard.cut_all()
                await wait_for(lambda: sub._state.status == "waiting")
                await msgs[1].ack()  # its session is gone: acked when delivered again
                c.host.listeners[c.shard.address] = listener
                resumed = await take(sub, 2)
                await wait_for(lambda: sub_stats(c.shard, "t", "s")["cursor"] == 3)
    assert [m.offset for m in resumed] == [0, 2]


async def test_ephemeral_subscription_resumes_from_the_next_offset(autojump_clock: object) -> None:
    with trio.fail_after(60):
        async with cluster() as c, c.client() as client, client.subscribe("t") as sub:
            await client.publish_many("t", [b"0", b"1"])
            await take(sub, 2)
            await trio.sleep(1)
            c.shard.cut_all()
            await client.publish("t", b"2")
            [msg] = await take(sub, 1)
    assert msg.offset == 2


async def test_generation_change_with_on_reset_earliest_restarts_at_zero(
        autojump_clock: object) -> None:
    with trio.fail_after(60):
        async with cluster() as c, c.client() as client:
            await client.publish_many("t", [b"a", b"b"])
            async with client.subscribe("t", name="s", read_old=True) as sub:
                old = await take(sub, 2)
                c.shard.restart(generation=0x2222)
                await client.publish("t", b"after")
                [msg] = await take(sub, 1)
                assert sub.generation == 0x2222
    assert {m.generation for m in old} == {0x1000}
    assert (msg.offset, msg.generation, msg.payload) == (0, 0x2222, b"after")


async def test_generation_change_with_on_reset_raise_raises_topic_reset(
        autojump_clock: object) -> None:
    with trio.fail_after(60):
        async with cluster() as c, c.client() as client:
            await client.publish("t", b"a")
            async with client.subscribe("t", name="s", read_old=True, on_reset="raise") as sub:
                await take(sub, 1)
                c.shard.restart(generation=0x3333)
                with pytest.raises(errors.TopicReset) as info:
                    await take(sub, 1)
    assert (info.value.old, info.value.new) == (0x1000, 0x3333)


async def test_idle_subscription_stays_attached_thanks_to_heartbeats(
        autojump_clock: object) -> None:
    with trio.fail_after(600):
        async with cluster() as c, c.client() as client, client.subscribe("t", name="s") as sub:
            await trio.sleep(120)  # 24 heartbeat periods with nothing to say
            assert sub_stats(c.shard, "t", "s")["active"]
            await client.publish("t", b"x")
            [msg] = await take(sub, 1)
    assert msg.attempt == 1
    assert len(c.shard.received(P.PING)) >= 120 / 5
    assert len(c.host.connects) == 2  # router + shard: never reconnected


async def test_unsubscribe_ends_iteration() -> None:
    with trio.fail_after(10):
        async with cluster() as c, c.client() as client:
            async with client.subscribe("t", name="s") as sub:
                await sub.unsubscribe()
                assert [m async for m in sub] == []
            assert not sub_stats(c.shard, "t", "s")["active"]


async def test_subscribe_rejects_bad_options_without_sending() -> None:
    with trio.fail_after(10):
        async with cluster() as c, c.client() as client:
            with pytest.raises(errors.InvalidTopic):
                async with client.subscribe("a b"):
                    pass
            with pytest.raises(errors.InvalidRequest):
                async with client.subscribe("t", on_reset="never"):
                    pass
            with pytest.raises(errors.InvalidRequest):
                async with client.subscribe("t", prefetch=0):
                    pass
    assert c.shard.received(P.SUBSCRIBE) == []


async def test_pull_path_fetches_and_commits() -> None:
    with trio.fail_after(10):
        async with cluster() as c, c.client() as client:
            await client.publish_many("t", [b"%d" % i for i in range(5)])
            info = await client.subscribe_pull("t", "spark", read_old=True)
            assert (info.created, info.start_offset) == (True, 0)
            got = await client.fetch("t", 1, max_messages=3, name="spark",
                                     generation=info.generation)
            assert (got.oldest, got.next, got.generation) == (0, 5, info.generation)
            assert [(m.offset, m.payload) for m in got.messages] == [(1, b"1"), (2, b"2"),
                                                                     (3, b"3")]
            assert await client.commit("t", "spark", 4, info.generation) == 4
            with pytest.raises(errors.TopicReset):
                await client.fetch("t", 0, generation=info.generation + 1)
            with pytest.raises(errors.UnknownSubscription):
                await client.commit("t", "nobody", 1, info.generation)
