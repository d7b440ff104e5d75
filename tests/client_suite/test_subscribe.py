"""Subscribing, identical in every flavour: order, acks, start options, strict mode,
redelivery, unsubscribe and resume, take-over, flow control, the pull path."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from flux import errors
from flux import protocol as P
from flux.hashing import shard_for

from .flavours import Flavour, next_within, on_client_loop, take

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
TIMEOUT = 30


async def subscription_stats(client: Any, topic: str, name: str) -> dict[str, Any]:
    stats = await client.stats()
    found: dict[str, Any] = stats[shard_for(topic, 2)]["topics"][topic]["subscriptions"][name]
    return found


async def test_messages_come_in_order_and_acks_are_coalesced(
        flavour: Flavour, suite_broker: Any, topic: str) -> None:
    count = 300
    acks: list[list[Any]] = []

    def spy(inner: Any) -> None:
        core = inner._core
        take_output = core.take_output

        def spying(conn_id: int, now: float) -> Any:
            frames = take_output(conn_id, now)
            acks.extend(f for f in frames or () if f[0] == P.ACK)
            return frames

        core.take_output = spying

    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(suite_broker.url) as client:
            await client.publish_many(topic, [b"%d" % i for i in range(count)])
            await on_client_loop(client, spy)
            async with client.subscribe(topic, name="reader", read_old=True, prefetch=100) as sub:
                got = await take(sub, count)
            cursor = (await subscription_stats(client, topic, "reader"))["cursor"]
    assert [m.offset for m in got] == list(range(count))
    assert [m.payload for m in got] == [b"%d" % i for i in range(count)]
    assert {(m.topic, m.generation, m.attempt) for m in got} == {(topic, got[0].generation, 1)}
    assert cursor == count
    acked: set[int] = set()
    for frame in acks:  # [ACK, rid, sid, generation, offsets, through]
        acked.update(frame[4])
        acked.update(range(frame[5] + 1))
    assert acked == set(range(count))
    assert len(acks) < count // 2, f"{len(acks)} ACK frames for {count} acks"


async def test_read_old_starts_at_the_oldest_and_the_default_at_the_next(
        flavour: Flavour, suite_broker: Any, topic: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(suite_broker.url) as client:
            await client.publish_many(topic, [b"old0", b"old1", b"old2"])
            async with client.subscribe(topic, name="fresh") as fresh, \
                    client.subscribe(topic, name="history", read_old=True) as history:
                assert (fresh.created, fresh.start_offset) == (True, 3)
                assert (history.created, history.start_offset) == (True, 0)
                await client.publish(topic, b"new")
                assert [m.payload for m in await take(history, 4)] == [
                    b"old0", b"old1", b"old2", b"new"]
                assert [m.payload for m in await take(fresh, 1)] == [b"new"]


async def test_from_offset_starts_at_that_offset(
        flavour: Flavour, suite_broker: Any, topic: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(suite_broker.url) as client:
            await client.publish_many(topic, [b"%d" % i for i in range(10)])
            async with client.subscribe(topic, from_offset=7) as sub:
                assert sub.start_offset == 7
                assert [m.offset for m in await take(sub, 3)] == [7, 8, 9]


async def test_strict_mode_pushes_the_next_message_only_after_the_ack(
        flavour: Flavour, suite_broker: Any, topic: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(suite_broker.url) as client:
            await client.publish_many(topic, [b"a", b"b", b"c"])
            async with client.subscribe(topic, read_old=True, max_in_flight=1) as sub:
                seen = []
                for _ in range(3):
                    [msg] = await take(sub, 1, ack=False)
                    seen.append(msg.offset)
                    assert await next_within(sub, 0.5) is None  # nothing else while unacked
                    await msg.ack()
    assert seen == [0, 1, 2]


async def test_unacked_message_is_redelivered_and_an_acked_one_is_not(
        flavour: Flavour, suite_broker: Any, topic: str) -> None:
    # the broker runs with subscriber.timeout=2 and retry_interval=0.2
    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(suite_broker.url) as client, \
                client.subscribe(topic, name="slow") as sub:
            await client.publish(topic, b"x", id="only")
            first, second = await take(sub, 2, ack=False)
            await second.ack()
            extra = await next_within(sub, 2.6)  # past another ack timeout
    assert (first.offset, first.attempt, second.offset, second.attempt) == (0, 1, 0, 2)
    assert second.id == "only" and extra is None


async def test_timed_out_waits_lose_no_message(
        flavour: Flavour, suite_broker: Any, topic: str) -> None:
    got: list[int] = []
    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(suite_broker.url) as client, \
                client.subscribe(topic) as sub:

            async def produce() -> None:
                for i in range(20):
                    await client.publish(topic, b"%d" % i)
                    await anyio.sleep(0.01)

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(produce)
                while len(got) < 20:
                    msg = await next_within(sub, 0.003)
                    if msg is not None:
                        await msg.ack()
                        got.append(msg.offset)
            assert await next_within(sub, 0.3) is None
    assert got == list(range(20))


async def test_unsubscribe_ends_iteration_and_the_name_resumes_from_its_cursor(
        flavour: Flavour, suite_broker: Any, topic: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(suite_broker.url) as client:
            await client.publish_many(topic, [b"%d" % i for i in range(4)])
            async with client.subscribe(topic, name="resume", read_old=True) as sub:
                assert [m.offset for m in await take(sub, 2)] == [0, 1]
                await sub.unsubscribe()
                assert [m async for m in sub] == []
                await sub.unsubscribe()  # idempotent
            async with client.subscribe(topic, name="resume", read_old=True) as again:
                assert (again.created, again.start_offset) == (False, 0)
                assert [m.offset for m in await take(again, 2)] == [2, 3]


async def test_a_second_session_with_the_name_takes_over(
        flavour: Flavour, suite_broker: Any, topic: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(suite_broker.url) as one, \
                flavour.connect(suite_broker.url) as two, \
                one.subscribe(topic, name="owner") as first, \
                two.subscribe(topic, name="owner") as second:  # entered in order: second is later
            with pytest.raises(errors.SubscriptionTakenOver):
                await next_within(first, 10)
            await one.publish(topic, b"to the new owner")
            [msg] = await take(second, 1)
    assert msg.payload == b"to the new owner"


async def test_slow_consumer_makes_nobody_buffer_without_bound(
        flavour: Flavour, suite_broker: Any, topic: str) -> None:
    # the client holds at most ``prefetch`` undelivered messages (it grants credit only
    # as the user consumes); the shard pushes at most ``max_in_flight`` unacked ones
    prefetch, max_in_flight, count = 100, 150, 10_000
    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(suite_broker.url) as client, \
                client.subscribe(topic, name="slow", prefetch=prefetch,
                                 max_in_flight=max_in_flight) as sub:
            acks = await client.publish_many(topic, [b"%d" % i for i in range(count)])
            assert acks[-1].offset == count - 1  # the producer is never held up
            while len(sub._state.buffer) < prefetch:
                await anyio.sleep(0.05)
            await anyio.sleep(0.3)  # time for more to come, if the credit let them
            assert len(sub._state.buffer) == prefetch
            assert (await subscription_stats(client, topic, "slow"))["in_flight"] == prefetch
            got = await take(sub, 120, ack=False)  # consumed, not acked: the shard holds on
            await anyio.sleep(0.3)
            assert len(sub._state.buffer) == max_in_flight - 120
            assert (await subscription_stats(client, topic, "slow"))["in_flight"] == max_in_flight
            for msg in got:
                await msg.ack()
            got += await take(sub, 130)
            assert len(sub._state.buffer) <= prefetch
    assert [m.offset for m in got] == list(range(250))


async def test_pull_path_fetches_and_commits(
        flavour: Flavour, suite_broker: Any, topic: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(suite_broker.url) as client:
            acks = await client.publish_many(topic, [b"%d" % i for i in range(5)])
            generation = acks[0].generation
            info = await client.subscribe_pull(topic, "puller", read_old=True)
            assert (info.created, info.start_offset, info.generation) == (True, 0, generation)
            page = await client.fetch(topic, 0, 3, name="puller", generation=generation)
            assert [m.offset for m in page.messages] == [0, 1, 2]
            assert (page.oldest, page.next, page.generation) == (0, 5, generation)
            assert await client.commit(topic, "puller", 3, generation) == 3
            again = await client.subscribe_pull(topic, "puller")
            assert (again.created, again.cursor) == (False, 3)
            with pytest.raises(errors.TopicReset):
                await client.fetch(topic, 0, name="puller", generation=generation + 1)
            with pytest.raises(errors.OffsetOutOfRange):
                await client.commit(topic, "puller", 99, generation)


async def test_reprs_say_what_they_are(flavour: Flavour, suite_broker: Any, topic: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(suite_broker.url) as client:
            await client.publish(topic, b"payload", id="r-1")
            async with client.subscribe(topic, name="looker", read_old=True) as sub:
                [msg] = await take(sub, 1)
                texts = repr(client), repr(sub), repr(msg)
    assert suite_broker.address in texts[0] and "shards=2" in texts[0]
    assert topic in texts[1] and "'looker'" in texts[1] and "active" in texts[1]
    assert f"{topic}@0" in texts[2] and "'r-1'" in texts[2] and "7B" in texts[2]
