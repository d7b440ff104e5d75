"""Failures, identical in every flavour: a lost reply is retried under the same id, a
dropped connection is reopened and subscriptions resume, a killed shard is followed
to its new generation (or raises TopicReset when asked to), and a subscription the
shard ended while it recovers a damaged log resumes by itself."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest

from flux import errors
from flux import protocol as P

from .flavours import Flavour, on_client_loop, take, topic_on

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
TIMEOUT = 40


def kill_shard(broker: Any, index: int) -> int:
    """SIGKILL shard ``index`` as it runs now; returns its generation (the router restarts it)."""
    entry = broker.stats()["shards"][index]
    broker.pids.add(entry["pid"])
    os.kill(entry["pid"], signal.SIGKILL)
    return int(entry["generation"])


async def test_retry_after_a_lost_reply_reuses_the_id(
        flavour: Flavour, suite_broker: Any, topic: str) -> None:
    lost: list[list[Any]] = []

    def lose_first_published(inner: Any) -> None:
        core = inner._core
        receive = core.receive

        def lossy(conn_id: int, frame: list[Any], now: float) -> None:
            if frame[0] == P.PUBLISHED and not lost:
                lost.append(frame)  # stored by the shard, but the client never hears of it
                return
            receive(conn_id, frame, now)

        core.receive = lossy

    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(suite_broker.url, request_timeout=0.5) as client:
            await on_client_loop(client, lose_first_published)
            ack = await client.publish(topic, b"once")  # a generated id, drawn once
            page = await client.fetch(topic, 0)
    assert lost and lost[0][3] == [[0, [], []]]
    assert (ack.offset, ack.duplicate) == (0, True)  # the retry carried the same id (G3)
    assert [(m.offset, m.id) for m in page.messages] == [(0, ack.id)]


async def test_dropped_connection_is_reopened_and_a_named_subscription_resumes(
        flavour: Flavour, suite_broker: Any, topic: str) -> None:
    def drop_shard_connections(inner: Any) -> None:
        core = inner._core
        for conn in list(core.conns.values()):
            if conn.role == "shard":
                core._close(conn, errors.ConnectionLost("dropped by the test"),
                            anyio.current_time())
        inner._pump()

    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(suite_broker.url) as client:
            await client.publish_many(topic, [b"0", b"1", b"2"])
            async with client.subscribe(topic, name="resumer", read_old=True) as sub:
                [first] = await take(sub, 1)
                await on_client_loop(client, drop_shard_connections)
                await client.publish_many(topic, [b"3", b"4"])
                rest = await take(sub, 4)
    assert first.offset == 0
    assert [m.offset for m in rest] == [1, 2, 3, 4]


async def test_killed_shard_is_followed_to_its_new_generation(
        flavour: Flavour, crash_broker: Any, topic: str) -> None:
    topic = topic_on(1, topic)
    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(crash_broker.url, request_timeout=2) as client:
            before = await client.publish(topic, b"before")
            async with client.subscribe(topic, name="follower", read_old=True) as sub:
                assert [m.payload for m in await take(sub, 1)] == [b"before"]
                old = kill_shard(crash_broker, 1)
                after = await client.publish(topic, b"after")  # retried until the restart
                [msg] = await take(sub, 1)
                assert sub.generation == after.generation
    assert before.generation == old != after.generation
    assert after.offset == 0  # G7: a new generation starts again at offset 0
    assert (msg.payload, msg.generation, msg.offset) == (b"after", after.generation, 0)
    crash_broker.note_pids()


async def test_on_reset_raise_raises_topic_reset_after_a_shard_restart(
        flavour: Flavour, crash_broker: Any, topic: str) -> None:
    topic = topic_on(0, topic)
    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(crash_broker.url, request_timeout=2) as client:
            before = await client.publish(topic, b"before")
            async with client.subscribe(topic, name="strict", read_old=True,
                                        on_reset="raise") as sub:
                await take(sub, 1)
                kill_shard(crash_broker, 0)
                after = await client.publish(topic, b"after")
                with pytest.raises(errors.TopicReset):
                    await take(sub, 1)
    assert after.generation != before.generation
    crash_broker.note_pids()


async def test_a_subscription_ended_by_damage_read_back_resumes_by_itself(
        flavour: Flavour, disk_broker: tuple[Any, Path], topic: str) -> None:
    """G9 "Corruption" read back while the shard serves: the shard ends the topic's
    sessions with SUB_ENDED StorageUnavailable while it recovers that log alone; the
    client subscribes again by itself (Busy until the recovery is over) and follows
    the new generation (on_reset="earliest"). The iterator never raises, and nothing
    it yields differs from what was published."""
    broker, data = disk_broker
    sent: dict[str, bytes] = {}
    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(broker.url, retry_deadline=30) as client:
            for group in range(8):
                ids = [f"g{group}m{i}" for i in range(50)]
                payloads = [(b"%s|" % i.encode()) * 40 for i in ids]
                acks = await client.publish_many(topic, payloads, ids=ids)
                sent.update(zip(ids, payloads, strict=True))
            generation = acks[0].generation
            [segment] = sorted((data / "shard-0" / topic).glob("*.log"))
            middle = len(segment.read_bytes().rstrip(b"\0")) // 2   # (zeros written ahead follow)
            with open(segment, "r+b") as f:  # a payload byte of a group in the middle
                f.seek(middle)
                byte = f.read(1)
                f.seek(middle)
                f.write(bytes([byte[0] ^ 0x04]))
            seen: list[Any] = []
            async with client.subscribe(topic, name="survivor", read_old=True,
                                        prefetch=20) as sub:
                async for msg in sub:
                    seen.append(msg)
                    await msg.ack()
                    if msg.generation != generation:
                        break
                after = await client.publish(topic, b"after", id="after")
                async for msg in sub:
                    seen.append(msg)
                    await msg.ack()
                    if msg.id == "after":
                        break
    assert after.generation != generation  # the damage cut acked messages: new generation
    assert all(m.payload == sent[m.id] for m in seen if m.id != "after")
    assert (seen[-1].generation, seen[-1].offset) == (after.generation, after.offset)
