"""Publishing, identical in every flavour: acks, dedup, batching, linger, typed errors."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from flux import errors
from flux import protocol as P
from flux.hashing import shard_for

from .flavours import Flavour, on_client_loop, unused_port

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
TIMEOUT = 30


async def spy_publish_frames(client: Any) -> list[list[Any]]:
    """Record every PUBLISH frame the client's core hands its shell from now on."""
    sent: list[list[Any]] = []

    def install(inner: Any) -> None:
        core = inner._core
        take_output = core.take_output

        def spying(conn_id: int, now: float) -> Any:
            frames = take_output(conn_id, now)
            sent.extend(f for f in frames or () if f[0] == P.PUBLISH)
            return frames

        core.take_output = spying

    await on_client_loop(client, install)
    return sent


async def test_publish_returns_offset_generation_and_duplicate_flag(
        flavour: Flavour, suite_broker: Any, topic: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(suite_broker.url) as client:
            first = await client.publish(topic, b"a", id="order-17")
            second = await client.publish(topic, b"b")
            again = await client.publish(topic, b"a", id="order-17")
    assert (first.offset, first.duplicate, second.offset, second.duplicate) == (0, False, 1, False)
    assert (again.offset, again.generation, again.duplicate) == (0, first.generation, True)
    assert second.generation == first.generation and second.topic == topic
    assert len(second.id) == 32 and int(second.id, 16) >= 0  # a generated 128-bit id


async def test_concurrent_publishes_coalesce_into_batched_frames(
        flavour: Flavour, suite_broker: Any, topic: str) -> None:
    count = 200
    offsets: list[int] = []
    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(suite_broker.url) as client:
            await client.publish(topic, b"warm-up")  # the shard connection is open and idle
            sent = await spy_publish_frames(client)

            async def publish_one(i: int) -> None:
                offsets.append((await client.publish(topic, b"%d" % i)).offset)

            async with anyio.create_task_group() as tasks:
                for i in range(count):
                    tasks.start_soon(publish_one, i)
    sizes = [sum(len(g[1]) for g in frame[2]) for frame in sent]
    assert sorted(offsets) == list(range(1, count + 1))
    assert sum(sizes) == count and max(sizes) <= 256
    # busy: publishes made while a frame is being written share the next ones. Tasks
    # publish all at once; the blocking client's threads (40 at a time here) each
    # wait for their ack and reach its loop spread out, so only some of theirs meet
    assert len(sizes) <= (5 if flavour.name != "sync" else count - 20), (len(sizes), sizes)


async def test_linger_gathers_spaced_publishes_into_one_frame(
        flavour: Flavour, suite_broker: Any, topic: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(suite_broker.url, linger=0.5) as client:
            await client.publish(topic, b"warm-up")
            sent = await spy_publish_frames(client)

            async def publish_one(i: int) -> None:
                await anyio.sleep(0.02 * i)
                await client.publish(topic, b"%d" % i)

            async with anyio.create_task_group() as tasks:
                for i in range(5):
                    tasks.start_soon(publish_one, i)
    assert [sum(len(g[1]) for g in frame[2]) for frame in sent] == [5]


async def test_publish_many_keeps_order_in_frames_of_at_most_256(
        flavour: Flavour, suite_broker: Any, topic: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(suite_broker.url) as client:
            sent = await spy_publish_frames(client)
            acks = await client.publish_many(topic, [b"%d" % i for i in range(600)],
                                             ids=[f"bulk-{i}" for i in range(600)])
            again = await client.publish_many(topic, [b"0", b"1"], ids=["bulk-0", "bulk-1"])
    assert [a.offset for a in acks] == list(range(600))
    assert [sum(len(g[1]) for g in frame[2]) for frame in sent] == [256, 256, 88, 2]
    assert [(a.offset, a.duplicate) for a in again] == [(0, True), (1, True)]


async def test_bad_input_raises_typed_errors_before_anything_is_sent(
        flavour: Flavour, suite_broker: Any, topic: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(suite_broker.url) as client:
            sent = await spy_publish_frames(client)
            for bad in ("bad topic", "a..b", "", "x" * 256):
                with pytest.raises(errors.InvalidTopic):
                    await client.publish(bad, b"x")
            for bad_id in ("", "i" * 129):
                with pytest.raises(errors.InvalidMessageId):
                    await client.publish(topic, b"x", id=bad_id)
            with pytest.raises(errors.InvalidRequest, match="bytes"):
                await client.publish(topic, "text")
            with pytest.raises(errors.InvalidRequest, match="2 ids for 1 payloads"):
                await client.publish_many(topic, [b"x"], ids=["a", "b"])
            with pytest.raises(errors.InvalidRequest, match="prefetch"):
                async with client.subscribe(topic, prefetch=0):
                    pass
            with pytest.raises(errors.InvalidRequest, match="on_reset"):
                async with client.subscribe(topic, on_reset="never"):
                    pass
    assert sent == []


async def test_topic_full_is_raised_not_retried_and_dedup_comes_first(
        flavour: Flavour, tight_broker: Any, topic: str) -> None:
    payload = b"x" * 600  # the topic holds 2000 bytes: a few of these fit
    stored = []
    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(tight_broker.url) as client:
            with pytest.raises(errors.TopicFull):
                for i in range(5):
                    stored.append(await client.publish(topic, payload, id=f"big-{i}"))
            again = await client.publish(topic, payload, id="big-0")
    assert 1 <= len(stored) < 5 and [a.offset for a in stored] == list(range(len(stored)))
    assert (again.offset, again.duplicate) == (0, True)  # G3: the dedup check comes first


async def test_stats_reports_every_shard(flavour: Flavour, suite_broker: Any, topic: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(suite_broker.url) as client:
            await client.publish(topic, b"x")
            stats = await client.stats()
    assert sorted(stats) == [0, 1] and [stats[i]["index"] for i in (0, 1)] == [0, 1]
    assert stats[shard_for(topic, 2)]["topics"][topic]["held"] == 1


async def test_calls_after_the_client_closed_raise_client_closed(
        flavour: Flavour, suite_broker: Any, topic: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(suite_broker.url) as client:
            pass
        with pytest.raises(errors.ClientClosed):
            await client.publish(topic, b"late")


async def test_unreachable_router_raises_connection_lost(flavour: Flavour) -> None:
    port = unused_port()
    with anyio.fail_after(TIMEOUT), pytest.raises(errors.ConnectionLost, match="router"):
        async with flavour.connect(f"flux://127.0.0.1:{port}", request_timeout=2):
            pass
