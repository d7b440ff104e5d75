"""G1-G7 end to end: the trio client against real ``flux serve`` processes on loopback."""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING

import pytest
import trio

from flux.client.trio import Subscription, connect
from flux.client.types import Message

from .wire import owned_topic

if TYPE_CHECKING:
    from tests.conftest import Broker, BrokerFactory

pytestmark = pytest.mark.integration
TIMEOUT = 40


async def take(sub: Subscription, n: int, *, ack: bool = True) -> list[Message]:
    """The next ``n`` messages of ``sub`` (acked unless ``ack`` is False)."""
    out: list[Message] = []
    async for msg in sub:
        out.append(msg)
        if ack:
            await msg.ack()
        if len(out) == n:
            break
    return out


async def test_each_topic_is_delivered_in_publish_order(broker: Broker) -> None:
    topics = [f"order.t{i}" for i in range(6)]  # spread over both shards
    per_topic = 40
    with trio.fail_after(TIMEOUT):
        async with connect(broker.url) as client:
            async with trio.open_nursery() as nursery:
                for topic in topics:
                    async def producer(topic: str = topic) -> None:
                        for i in range(per_topic):
                            ack = await client.publish(topic, f"{i}".encode(), id=f"{topic}-{i}")
                            assert (ack.offset, ack.duplicate) == (i, False)
                    nursery.start_soon(producer)
            for topic in topics:
                async with client.subscribe(topic, name="reader", read_old=True) as sub:
                    got = await take(sub, per_topic)
                assert [m.offset for m in got] == list(range(per_topic))
                assert [m.payload for m in got] == [f"{i}".encode() for i in range(per_topic)]
                assert len({m.generation for m in got}) == 1


async def test_duplicate_publish_returns_the_original_offset_and_is_stored_once(
        broker: Broker) -> None:
    with trio.fail_after(TIMEOUT):
        async with connect(broker.url) as client:
            first = await client.publish("dedup.orders", b"a", id="order-17")
            await client.publish("dedup.orders", b"b", id="order-18")
            again = await client.publish("dedup.orders", b"a", id="order-17")
            assert (again.offset, again.generation, again.duplicate) == (
                first.offset, first.generation, True)
            async with client.subscribe("dedup.orders", read_old=True) as sub:
                got = await take(sub, 2)
            assert [m.id for m in got] == ["order-17", "order-18"]


async def test_read_old_starts_at_the_oldest_message_and_default_at_the_next(
        broker: Broker) -> None:
    with trio.fail_after(TIMEOUT):
        async with connect(broker.url) as client:
            for i in range(3):
                await client.publish("old.news", f"old{i}".encode())
            async with client.subscribe("old.news", name="fresh") as fresh, \
                    client.subscribe("old.news", name="history", read_old=True) as history:
                assert (fresh.start_offset, history.start_offset) == (3, 0)
                await client.publish("old.news", b"new")
                assert [m.payload for m in await take(history, 4)] == [
                    b"old0", b"old1", b"old2", b"new"]
                assert [m.payload for m in await take(fresh, 1)] == [b"new"]


async def test_unacked_message_is_redelivered_until_acked(broker: Broker) -> None:
    # the broker runs with subscriber.timeout=2 and retry_interval=0.2
    with trio.fail_after(TIMEOUT):
        async with connect(broker.url) as client, \
                client.subscribe("redeliver.me", name="slow", read_old=True) as sub:
            await client.publish("redeliver.me", b"x", id="only")
            first, second = await take(sub, 2, ack=False)
            assert (first.offset, first.attempt) == (0, 1)
            assert (second.offset, second.attempt) == (0, 2)
            await second.ack()
            with trio.move_on_after(3.5):  # past another timeout: nothing more comes
                extra = await take(sub, 1, ack=False)
                pytest.fail(f"acked message came again: {extra}")


async def test_acked_messages_are_cleaned_up_once_every_subscription_is_done(
        broker_factory: BrokerFactory) -> None:
    broker = broker_factory("message.ttl=0.5", "message.cleanup_time=0.2",
                            "subscriber.cleanup_time=0.2", "subscriber.inactive_time=5")
    topic = owned_topic(0, prefix="clean")
    with trio.fail_after(TIMEOUT):
        async with connect(broker.url) as client:
            async with client.subscribe(topic, name="lazy"):
                pass  # created, then inactive: it holds every message it has not acked
            async with client.subscribe(topic, name="eager") as eager:
                for i in range(3):
                    await client.publish(topic, f"{i}".encode())
                await take(eager, 3)

                async def held() -> int:
                    stats = await client.stats()
                    return int(stats[0]["topics"][topic]["held"])

                await trio.sleep(1.0)  # ttl and several cleanup passes
                assert await held() == 3  # "lazy" has not acked them (G5)
                while await held():  # "lazy" is deleted after inactive_time, then trimmed
                    await trio.sleep(0.2)
                await client.publish(topic, b"3")
                assert [m.offset for m in await take(eager, 1)] == [3]  # offsets never reused


async def test_subscriber_follows_a_shard_restart_to_the_new_generation(broker: Broker) -> None:
    topic = owned_topic(1, prefix="restart")
    with trio.fail_after(TIMEOUT):
        async with connect(broker.url) as client:
            before = await client.publish(topic, b"before")
            async with client.subscribe(topic, name="follower", read_old=True) as sub:
                assert [m.payload for m in await take(sub, 1)] == [b"before"]
                os.kill(broker.shards[1].pid, signal.SIGKILL)
                after = await client.publish(topic, b"after")
                assert after.generation != before.generation
                assert after.offset == 0  # G7: a new generation starts at offset 0
                (msg,) = await take(sub, 1)
                assert (msg.payload, msg.generation, msg.offset) == (b"after", after.generation, 0)
        broker.note_pids()


async def test_read_old_made_after_a_trim_gets_the_kept_delayed_message_when_due(
        broker_factory: BrokerFactory) -> None:
    """G6 with G12: messages published around a pending delayed message are acked and
    cleaned up while it waits, kept out of line below the oldest in line; a read_old
    subscription made then starts at it (the oldest message held) and gets it when it
    is due, and nothing of what was cleaned up."""
    broker = broker_factory("message.ttl=0.5", "message.cleanup_time=0.2")
    topic = owned_topic(0, prefix="kept")
    with trio.fail_after(TIMEOUT):
        async with connect(broker.url) as client, \
                client.subscribe(topic, name="billing") as billing:
            await client.publish(topic, b"before", id="before")
            pending = await client.publish(topic, b"later", id="pending", delay=6)
            for i in range(5):
                await client.publish(topic, f"m{i}".encode(), id=f"m{i}")
            await take(billing, 6)  # all but the pending one

            async def held() -> tuple[int, int]:
                stats = (await client.stats())[0]["topics"][topic]
                return int(stats["held"]), int(stats["oldest"])

            while await held() != (1, 7):  # only the pending one, below the rest
                await trio.sleep(0.1)
            assert pending.due is not None and time.time() < pending.due  # still pending
            async with client.subscribe(topic, name="audit", read_old=True) as audit:
                assert audit.start_offset == pending.offset == 1
                [msg] = await take(audit, 1)
                assert (msg.offset, msg.id, msg.payload) == (1, "pending", b"later")
            [late] = await take(billing, 1)
            assert late.offset == 1
