"""Publishing through the trio client against ShardCore shards in memory."""

from __future__ import annotations

import pytest
import trio
from test_client_harness import cluster

from flux import errors
from flux import protocol as P


async def test_publish_returns_offsets_generation_and_dedup_flag() -> None:
    with trio.fail_after(10):
        async with cluster() as c, c.client() as client:
            first = await client.publish("orders.eu", b"a", id="order-1")
            second = await client.publish("orders.eu", b"b")
            again = await client.publish("orders.eu", b"a", id="order-1")
    assert (first.offset, first.duplicate, first.id, first.topic) == (0, False, "order-1", "orders.eu")
    assert (second.offset, second.duplicate) == (1, False)
    assert (again.offset, again.duplicate) == (0, True)
    assert first.generation == c.shard.core.generation


async def test_generated_ids_are_32_hex_digits_and_distinct() -> None:
    with trio.fail_after(10):
        async with cluster() as c, c.client() as client:
            acks = await client.publish_many("t", [b"x", b"y", b"z"])
    assert [a.offset for a in acks] == [0, 1, 2]
    assert len({a.id for a in acks}) == 3
    assert all(len(a.id) == 32 and int(a.id, 16) >= 0 for a in acks)


async def test_retry_after_lost_connection_reuses_the_id(autojump_clock: object) -> None:
    with trio.fail_after(60):
        async with cluster() as c, c.client() as client:
            await client.publish("t", b"before")
            c.shard.cut_before.add(P.PUBLISHED)  # store it, then drop the connection
            ack = await client.publish("t", b"x", id="once")
            publishes = [i for f in c.shard.received(P.PUBLISH) for g in f[2] for i in g[1]]
    assert publishes.count("once") == 2
    assert (ack.offset, ack.duplicate) == (1, True)
    assert c.shard.core.topics["t"].log.next_offset == 2


async def test_retry_of_a_generated_id_sends_the_same_id(autojump_clock: object) -> None:
    with trio.fail_after(60):
        async with cluster() as c, c.client() as client:
            c.shard.cut_before.add(P.PUBLISHED)
            ack = await client.publish("t", b"x")
            ids = [i for f in c.shard.received(P.PUBLISH) for g in f[2] for i in g[1]]
    assert ids == [ack.id, ack.id]
    assert ack.duplicate


async def test_concurrent_publishes_coalesce_into_few_frames() -> None:
    acks: list[int] = []

    async def one(i: int) -> None:
        ack = await client.publish("t", b"%d" % i, id=f"m{i}")
        acks.append(ack.offset)

    with trio.fail_after(10):
        async with cluster() as c, c.client() as client:
            await client.publish("t", b"warm-up")  # the shard connection is open
            async with trio.open_nursery() as nursery:
                for i in range(200):
                    nursery.start_soon(one, i)
    frames = c.shard.received(P.PUBLISH)
    assert sorted(acks) == list(range(1, 201))
    assert len(frames) <= 5, [sum(len(g[1]) for g in f[2]) for f in frames]


async def test_publish_many_sends_items_in_order_in_frames_of_at_most_256() -> None:
    with trio.fail_after(10):
        async with cluster() as c, c.client() as client:
            acks = await client.publish_many("t", [b"%d" % i for i in range(600)])
    assert [a.offset for a in acks] == list(range(600))
    sizes = [sum(len(g[1]) for g in f[2]) for f in c.shard.received(P.PUBLISH)]
    assert sum(sizes) == 600 and max(sizes) <= 256


async def test_bad_topic_raises_invalid_topic_without_sending() -> None:
    with trio.fail_after(10):
        async with cluster() as c, c.client() as client:
            for bad in ["", "a..b", "orders.*", "x" * 256]:
                with pytest.raises(errors.InvalidTopic):
                    await client.publish(bad, b"x")
            with pytest.raises(errors.InvalidMessageId):
                await client.publish("t", b"x", id="")
            with pytest.raises(errors.InvalidTopic):
                await client.publish_many("bad topic", [b"x"])
    assert c.shard.received(P.PUBLISH) == []


async def test_topic_full_is_raised_not_retried() -> None:
    with trio.fail_after(10):
        async with cluster(topic__max_bytes=200) as c, c.client() as client:
            await client.publish("t", b"x" * 50)
            with pytest.raises(errors.TopicFull):
                await client.publish("t", b"y" * 50)
    assert len(c.shard.received(P.PUBLISH)) == 2


async def test_unanswered_publish_times_out_and_is_retried(autojump_clock: object) -> None:
    with trio.fail_after(120):
        async with cluster() as c, c.client(request_timeout=5) as client:
            await client.publish("t", b"first")
            c.shard.mute = True
            async with trio.open_nursery() as nursery:
                result: list[object] = []

                async def publish() -> None:
                    result.append(await client.publish("t", b"x", id="slow"))

                nursery.start_soon(publish)
                await trio.sleep(7)  # past request_timeout: the connection is dropped
                c.shard.mute = False
    ack = result[0]
    assert ack.offset == 1 and ack.duplicate  # type: ignore[attr-defined]


async def test_unreachable_shard_raises_retry_deadline_exceeded(autojump_clock: object) -> None:
    with trio.fail_after(300):
        async with cluster() as c, c.client(retry_deadline=20) as client:
            del c.host.listeners[c.shard.address]
            start = trio.current_time()
            with pytest.raises(errors.RetryDeadlineExceeded) as info:
                await client.publish("t", b"x")
            assert 20 <= trio.current_time() - start <= 25
    assert isinstance(info.value.__cause__, errors.ConnectionLost)


async def test_wrong_shard_refreshes_the_map_and_retries(autojump_clock: object) -> None:
    with trio.fail_after(60):
        async with cluster(shards=2) as c:
            # the router first claims one shard; shard 0 refuses the topics it does not own
            c.router.map_override = {"version": P.VERSION, "shard_count": 1, "shards": [
                [0, "shard0:7100", c.shards[0].core.generation]]}
            async with c.client() as client:
                topic = next(t for t in (f"t{i}" for i in range(100)) if c.shard_for(t).index == 1)
                c.router.map_override = None
                ack = await client.publish(topic, b"x")
    assert ack.generation == c.shards[1].core.generation
    assert c.router.hellos >= 2


async def test_connect_raises_connection_lost_when_router_is_down() -> None:
    with trio.fail_after(10):
        async with cluster() as c:
            del c.host.listeners[("router", 7070)]
            with pytest.raises(errors.ConnectionLost):
                async with c.client():
                    pass


async def test_errors_inside_the_client_block_propagate_unwrapped() -> None:
    with trio.fail_after(10):
        async with cluster() as c:
            with pytest.raises(KeyError):
                async with c.client():
                    raise KeyError("mine")


async def test_stats_reports_every_shard() -> None:
    with trio.fail_after(10):
        async with cluster(shards=2) as c, c.client() as client:
            await client.publish("a", b"x")
            stats = await client.stats()
    assert sorted(stats) == [0, 1]
    assert sum(s["counters"]["published"] for s in stats.values()) == 1


async def test_publish_many_with_one_bad_id_sends_nothing() -> None:
    with trio.fail_after(10):
        async with cluster() as c, c.client() as client:
            with pytest.raises(errors.InvalidMessageId):
                await client.publish_many("t", [b"a", b"b", b"c"], ids=["a", "", "c"])
            await client.publish("t", b"after", id="after")
    assert [i for f in c.shard.received(P.PUBLISH) for g in f[2] for i in g[1]] == ["after"]


async def test_closing_the_client_fails_waiting_publishes_with_client_closed(
        autojump_clock: object) -> None:
    result: list[BaseException] = []

    async def publish(client: object) -> None:
        try:
            await client.publish("t", b"x")  # type: ignore[attr-defined]
        except errors.ClientClosed as exc:
            result.append(exc)

    with trio.fail_after(60):
        async with cluster() as c, trio.open_nursery() as nursery, c.client() as client:
            del c.host.listeners[c.shard.address]  # it can never be sent
            nursery.start_soon(publish, client)
            await trio.sleep(1)
    assert len(result) == 1


async def test_reconnect_follows_a_shard_that_moved_to_a_new_address(
        autojump_clock: object) -> None:
    with trio.fail_after(60):
        async with cluster() as c, c.client() as client:
            await client.publish("t", b"a")
            handler = c.host.listeners.pop(c.shard.address)
            c.shard.address = ("elsewhere", 9999)
            c.host.listeners[c.shard.address] = handler
            c.shard.cut_all()
            ack = await client.publish("t", b"b")
    assert ack.offset == 1
    assert c.host.connects[-1] == ("elsewhere", 9999)
    assert c.router.hellos >= 2
