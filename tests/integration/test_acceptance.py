"""Acceptance: a demanding user checks Flux black-box through the public trio client.

Each test runs against real ``flux serve --shards 2`` processes (see tests/conftest.py)
and is bounded with ``trio.fail_after``. What is already covered by
test_client_e2e.py and test_bad_input.py is not repeated here; these tests push
volume, timing and hostility.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import pytest
import trio

from flux import errors, protocol
from flux.client.trio import Subscription, connect
from flux.client.types import Message
from flux.hashing import shard_for
from flux.router.launcher import pid_alive

from .wire import RawConn, owned_topic, shard_map

if TYPE_CHECKING:
    from tests.conftest import Broker, BrokerFactory

pytestmark = pytest.mark.integration
P = protocol


async def first_deliveries(sub: Subscription, n: int, *, ack: bool = True) -> list[Message]:
    """Iterate ``sub`` until ``n`` distinct offsets came; returns every first delivery.

    A redelivery (an offset seen before) is acked again and not returned, so a slow
    test machine cannot turn G4 redeliveries into false order failures; but it must
    say so (``attempt`` > 1): a repeated first delivery is a duplicate.
    """
    seen: set[int] = set()
    out: list[Message] = []
    async for msg in sub:
        if ack:
            await msg.ack()
        if msg.offset in seen:
            assert msg.attempt > 1, f"duplicate first delivery {msg}"
            continue
        assert msg.attempt == 1, f"first delivery of {msg} is not attempt 1"
        seen.add(msg.offset)
        out.append(msg)
        if len(out) == n:
            break
    return out


# -- 1. ordering at volume -----------------------------------------------------------------


async def test_twenty_thousand_messages_on_forty_topics_arrive_in_order_exactly_once(
        broker: Broker) -> None:
    topics = [f"vol.topic{i}" for i in range(40)]
    assert {shard_for(t, 2) for t in topics} == {0, 1}
    per_topic = 500
    strict = topics[:2] + topics[20:22]  # two bulk-loaded and two concurrently published
    # offset -> payload per topic, from the publish acks
    published: dict[str, dict[int, bytes]] = defaultdict(dict)
    received: dict[tuple[str, str], list[Message]] = {}

    with trio.fail_after(60):
        async with connect(broker.url) as producer, connect(broker.url) as consumer:
            subs: dict[tuple[str, str], Subscription] = {}
            try:
                for topic in topics:
                    sub = consumer.subscribe(topic, name="all")
                    subs[(topic, "all")] = await sub.__aenter__()
                    assert sub.start_offset == 0
                for topic in strict:
                    sub = consumer.subscribe(topic, name="strict", max_in_flight=1)
                    subs[(topic, "strict")] = await sub.__aenter__()

                async def consume(key: tuple[str, str], sub: Subscription) -> None:
                    received[key] = await first_deliveries(sub, per_topic)

                async def bulk(topic: str) -> None:
                    for chunk in range(0, per_topic, 125):
                        payloads = [f"{topic}/{i}".encode() for i in range(chunk, chunk + 125)]
                        ids = [f"{topic}-{i}" for i in range(chunk, chunk + 125)]
                        acks = await producer.publish_many(topic, payloads, ids=ids)
                        # publish_many keeps order within the call
                        assert [a.offset for a in acks] == list(range(chunk, chunk + 125))
                        assert not any(a.duplicate for a in acks)
                        for ack, payload in zip(acks, payloads, strict=True):
                            published[topic][ack.offset] = payload

                async def scattered(topic: str, worker: int, workers: int) -> None:
                    for i in range(worker, per_topic, workers):
                        payload = f"{topic}/{i}".encode()
                        ack = await producer.publish(topic, payload, id=f"{topic}-{i}")
                        assert not ack.duplicate
                        assert ack.offset not in published[topic]
                        published[topic][ack.offset] = payload

                async with trio.open_nursery() as nursery:
                    for key, sub in subs.items():
                        nursery.start_soon(consume, key, sub)
                    for topic in topics[:20]:
                        nursery.start_soon(bulk, topic)
                    for topic in topics[20:]:
                        for worker in range(5):
                            nursery.start_soon(scattered, topic, worker, 5)
            finally:
                for sub in subs.values():
                    await sub.__aexit__(None, None, None)
            # leaving sent every ack: each cursor is past the last message (G6)
            cursors: dict[tuple[str, str], int] = {}
            for stats in (await consumer.stats()).values():
                for topic, info in stats["topics"].items():
                    for name, sub_info in info["subscriptions"].items():
                        cursors[(topic, name)] = sub_info["cursor"]
            assert cursors == {key: per_topic for key in subs}

    for topic in topics:
        assert sorted(published[topic]) == list(range(per_topic)), topic
        assert sorted(published[topic].values()) == sorted(
            f"{topic}/{i}".encode() for i in range(per_topic))
    for (topic, name), got in received.items():
        assert [m.offset for m in got] == list(range(per_topic)), (topic, name)
        assert [m.payload for m in got] == [published[topic][i] for i in range(per_topic)]
        assert len({m.generation for m in got}) == 1
    assert len(received) == len(topics) + len(strict)


# -- 2. dedup ------------------------------------------------------------------------------


async def test_retried_ids_are_deduplicated_after_trim_and_stored_anew_after_the_window(
        broker_factory: BrokerFactory) -> None:
    broker = broker_factory("message.ttl=0.3", "message.cleanup_time=0.1",
                            "message.dedup_window=2")
    topic = owned_topic(1, prefix="dedup")
    ids = [f"order-{i}" for i in range(10)]
    with trio.fail_after(20):
        async with connect(broker.url) as client, \
                client.subscribe(topic, name="acker") as sub:
            started = time.monotonic()
            originals = await client.publish_many(topic, [i.encode() for i in ids], ids=ids)
            assert [a.offset for a in originals] == list(range(10))
            await first_deliveries(sub, 10)
            # a retry right away, while the message is still held
            again = await client.publish(topic, b"order-3", id="order-3")
            assert (again.offset, again.generation, again.duplicate) == (
                3, originals[3].generation, True)

            async def topic_stats() -> dict[str, Any]:
                return dict((await client.stats())[1]["topics"][topic])

            while (await topic_stats())["held"]:  # acked and past ttl: trimmed
                await trio.sleep(0.05)
            assert time.monotonic() - started < 1.8, "trim took too long for this test"
            retries = await client.publish_many(topic, [i.encode() for i in ids], ids=ids)
            assert [(a.offset, a.duplicate) for a in retries] == [
                (a.offset, True) for a in originals]
            assert (await topic_stats())["next_offset"] == 10

            await trio.sleep(max(0.0, started + 2.5 - time.monotonic()))  # window passed
            fresh = await client.publish(topic, b"order-0 again", id="order-0")
            assert (fresh.duplicate, fresh.offset) == (False, 10)
            (msg,) = await first_deliveries(sub, 1)
            assert (msg.offset, msg.id, msg.payload) == (10, "order-0", b"order-0 again")
            # and the new copy has its own window
            dup = await client.publish(topic, b"x", id="order-0")
            assert (dup.duplicate, dup.offset) == (True, 10)


async def test_a_retry_into_a_full_topic_is_still_deduplicated(
        broker_factory: BrokerFactory) -> None:
    broker = broker_factory("topic.max_bytes=4096")
    topic = owned_topic(0, prefix="full")
    with trio.fail_after(20):
        async with connect(broker.url) as client:
            acks = []
            with pytest.raises(errors.TopicFull):
                for i in range(100):
                    acks.append(await client.publish(topic, b"x" * 200, id=f"big-{i}"))
            assert len(acks) >= 5
            # G3: the dedup check comes before the TopicFull check
            again = await client.publish(topic, b"x" * 200, id="big-2")
            assert (again.offset, again.duplicate) == (2, True)
            with pytest.raises(errors.TopicFull):
                await client.publish(topic, b"x" * 200, id="new")


# -- 3. cleanup timings --------------------------------------------------------------------


async def test_unsubscribed_subscription_is_deleted_after_inactive_time_plus_cleanup_time(
        broker_factory: BrokerFactory) -> None:
    inactive_time, cleanup_time = 1.0, 0.5
    broker = broker_factory(f"subscriber.inactive_time={inactive_time}",
                            f"subscriber.cleanup_time={cleanup_time}")
    topic = owned_topic(0, prefix="idle")
    with trio.fail_after(20):
        async with connect(broker.url) as client:

            async def subs() -> dict[str, Any]:
                return dict((await client.stats())[0]["topics"][topic]["subscriptions"])

            async with client.subscribe(topic, name="stays"), \
                    client.subscribe(topic, name="leaves") as leaving:
                assert leaving.created
                await leaving.unsubscribe()
                left = time.monotonic()
                await trio.sleep(0.1)
                assert (await subs())["leaves"]["active"] is False
                while time.monotonic() - left < inactive_time - 0.2:
                    assert "leaves" in await subs(), "deleted before inactive_time"
                    await trio.sleep(0.1)
                while "leaves" in await subs():
                    await trio.sleep(0.05)
                gone_after = time.monotonic() - left
                assert inactive_time - 0.2 <= gone_after <= inactive_time + cleanup_time + 0.5, \
                    gone_after
                # an attached subscription is never deleted
                await trio.sleep(inactive_time + cleanup_time)
                assert (await subs())["stays"]["active"] is True


async def test_acked_messages_are_trimmed_after_ttl_but_an_unacked_one_is_held(
        broker_factory: BrokerFactory) -> None:
    ttl = 0.5
    broker = broker_factory(f"message.ttl={ttl}", "message.cleanup_time=0.2",
                            "subscriber.timeout=10")
    topic = owned_topic(0, prefix="trim")
    with trio.fail_after(20):
        async with connect(broker.url) as client:

            async def held() -> int:
                return int((await client.stats())[0]["topics"][topic]["held"])

            async with client.subscribe(topic, name="a") as a, \
                    client.subscribe(topic, name="b") as b:
                await client.publish_many(topic, [b"m%d" % i for i in range(5)])
                published = time.monotonic()
                await first_deliveries(a, 5)
                b_msgs = await first_deliveries(b, 5, ack=False)
                for msg in b_msgs:
                    if msg.offset != 1:
                        await msg.ack()
                # held for at least ttl, whatever was acked (G2)
                while time.monotonic() - published < ttl - 0.15:
                    assert await held() == 5
                    await trio.sleep(0.05)
                # after ttl: offset 0 trimmed, 1 held for "b", so 1..4 stay (trim is a prefix)
                deadline = published + ttl + 0.2 + 1.0
                while await held() != 4:
                    assert time.monotonic() < deadline, await held()
                    await trio.sleep(0.05)
                await trio.sleep(0.6)  # several more passes
                assert await held() == 4
                await b_msgs[1].ack()
                while await held():
                    assert time.monotonic() < deadline + 2.0, await held()
                    await trio.sleep(0.05)


# -- 4. shard restart ----------------------------------------------------------------------


async def test_publishing_and_subscribing_continue_across_a_kill_9_of_a_shard(
        broker: Broker) -> None:
    victim = 1
    topic = owned_topic(victim, prefix="crash")
    bystander = owned_topic(0, prefix="calm")
    old_pid = broker.shards[victim].pid
    acks: list[tuple[int, int, bytes]] = []  # (generation, offset, payload)
    got: list[Message] = []
    with trio.fail_after(40):
        async with connect(broker.url, retry_deadline=15) as client:
            calm_before = await client.publish(bystander, b"calm")
            async with client.subscribe(topic, name="follower", on_reset="earliest") as sub:
                old_generation = sub.generation
                assert old_generation == broker.shards[victim].generation
                killed = trio.Event()

                async def publisher() -> None:
                    i = 0
                    while len([a for a in acks if a[0] != old_generation]) < 200:
                        payload = f"p{i}".encode()
                        ack = await client.publish(topic, payload, id=f"id-{i}")
                        acks.append((ack.generation, ack.offset, payload))
                        i += 1
                        if i == 100:
                            os.kill(old_pid, signal.SIGKILL)
                            killed.set()
                        if i % 10 == 0:
                            await trio.sleep(0.01)

                async def subscriber() -> None:
                    async for msg in sub:
                        await msg.ack()
                        got.append(msg)
                        new = [m for m in got if m.generation != old_generation]
                        if len({m.offset for m in new}) >= 200:
                            return

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(publisher)
                    nursery.start_soon(subscriber)

            calm_after = await client.publish(bystander, b"calm again")
            assert calm_after.generation == calm_before.generation
            assert calm_after.offset == calm_before.offset + 1

    assert killed.is_set()
    broker.note_pids()
    assert not pid_alive(old_pid)
    generations = [g for g, _, _ in acks]
    new_generation = generations[-1]
    assert new_generation != old_generation
    # generations are never interleaved, and the new one is what the router now reports
    assert generations == sorted(generations, key=lambda g: g == new_generation)
    assert set(generations) <= {old_generation, new_generation}
    new_acks = [(o, p) for g, o, p in acks if g == new_generation]
    assert [o for o, _ in new_acks] == list(range(len(new_acks)))  # G7: from 0, no gaps
    routed = {s["index"]: s for s in broker.stats()["shards"]}[victim]
    assert routed["generation"] == new_generation and routed["pid"] != old_pid
    # the subscriber never mixed generations and saw the new one from offset 0 in order
    sub_generations = [m.generation for m in got]
    assert sub_generations == sorted(sub_generations, key=lambda g: g == new_generation)
    first_new: dict[int, bytes] = {}
    for m in got:
        if m.generation == new_generation and m.offset not in first_new:
            first_new[m.offset] = m.payload
    assert list(first_new) == list(range(len(first_new)))
    assert list(first_new.items()) == new_acks[:len(first_new)]


# -- 5. hostile input ----------------------------------------------------------------------


def random_value(rng: random.Random, depth: int = 0) -> Any:
    choice = rng.randrange(10 if depth < 3 else 7)
    if choice == 0:
        return None
    if choice == 1:
        return rng.choice([0, -1, 1, 2**31, 2**63 - 1, -(2**63), rng.randrange(-1000, 1000)])
    if choice == 2:
        return rng.choice([0.0, -1.5, 1e300, float("inf"), float("nan")])
    if choice == 3:
        return rng.choice([True, False])
    if choice == 4:
        return rng.choice(["", "a", "t.n0", "..", "*", ">", "x" * 300, "\u00e9\u4e2d", "a.b.c"])
    if choice == 5:
        return rng.randbytes(rng.randrange(0, 64))
    if choice == 6:
        return rng.choice([-5, 0, 1, 10**6, 2**64 - 1])
    if choice in (7, 8):
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(0, 5))]
    keys = ["topic", "name", "generation", "offset", "max_messages", "max_bytes", "version",
            "role", "read_old", "from_offset", "max_in_flight", "on_reset", "mode", "index",
            "pid", "address", "control", "shard_count"]
    return {rng.choice(keys): random_value(rng, depth + 1) for _ in range(rng.randrange(0, 6))}


def shaped_frame(rng: random.Random) -> list[Any]:
    """A frame of a real kind and shape whose fields are wrong, on a hostile topic."""
    v = lambda: random_value(rng)  # noqa: E731
    topic = rng.choice(["hostile.a", "hostile.b", v()])
    options = {"topic": topic, "name": rng.choice([None, "h", v()]), "read_old": v(),
               "from_offset": v(), "max_in_flight": v(), "on_reset": v(), "mode": v(),
               "generation": v(), "offset": v(), "max_messages": v(), "max_bytes": v()}
    for key in rng.sample(sorted(options), rng.randrange(0, 4)):
        del options[key]
    return rng.choice([
        [P.PUBLISH, rng.randrange(1, 999), [[topic, v(), v()] for _ in range(rng.randrange(4))]],
        [P.PUBLISH, rng.randrange(1, 999), [[topic, [v() for _ in range(n)],
                                             [v() for _ in range(rng.choice([n, n + 1]))]]
                                            for n in range(rng.randrange(4))]],
        [P.PUBLISH, rng.randrange(1, 999), [[topic, [f"h{rng.random()}"], [b"x"]], v()]],
        [P.SUBSCRIBE, rng.randrange(1, 999), rng.choice([1, 2, v()]), options],
        [P.UNSUBSCRIBE, rng.randrange(1, 999), rng.choice([1, 2, v()])],
        [P.CREDIT, rng.choice([1, 2, v()]), rng.choice([-1, 0, 2**62, v()])],
        [P.ACK, rng.randrange(1, 999), rng.choice([1, 2, v()]), v(),
         [v() for _ in range(rng.randrange(3))], v()],
        [P.FETCH, rng.randrange(1, 999), options],
        [P.COMMIT, rng.randrange(1, 999), options],
    ])


def random_frame(rng: random.Random) -> list[Any]:
    if rng.random() < 0.5:
        return shaped_frame(rng)
    kinds = [P.HELLO, P.PING, P.PUBLISH, P.SUBSCRIBE, P.UNSUBSCRIBE, P.CREDIT, P.ACK, P.FETCH,
             P.COMMIT, P.STATS, P.REGISTER, P.DRAIN, P.ADOPT, P.DELIVER, P.ERROR, 99, -1]
    frame: list[Any] = [rng.choice(kinds)]
    frame += [random_value(rng) for _ in range(rng.randrange(0, 6))]
    if rng.random() < 0.5 and len(frame) > 1:
        frame[1] = rng.randrange(1, 1000)  # a plausible rid, to get past the first check
    return frame


async def hostile_connection(address: str, seed: int, done: trio.Event,
                             errors_seen: list[int]) -> None:
    """Until ``done``: open, say hello (sometimes), send well-framed junk and garbage, close."""
    rng = random.Random(seed)
    while not done.is_set():
        try:
            async with await RawConn.open(address) as conn:
                if rng.random() < 0.7:
                    await conn.send([P.HELLO, 1, {"version": P.VERSION, "role": "client"}])
                for _ in range(rng.randrange(1, 40)):
                    if rng.random() < 0.85:
                        await conn.send(random_frame(rng))
                    else:
                        await conn.send_bytes(rng.randbytes(rng.randrange(1, 200)))
                with trio.move_on_after(0.05):
                    while True:
                        frame = await conn.recv()
                        if frame[0] == P.ERROR:
                            errors_seen.append(frame[2])
        except (OSError, EOFError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the peer closed a corrupted connection: allowed (G8)


async def test_garbage_from_many_connections_leaves_good_clients_and_shards_intact(
        broker: Broker) -> None:
    pids = {i: s.pid for i, s in broker.shards.items()}
    router_pid = broker.router.proc.pid
    topics = [owned_topic(0, prefix="good"), owned_topic(1, prefix="good")]
    n = 300
    with trio.fail_after(60):
        addresses = [address for _, address, _ in await shard_map(broker.address)]
        async with connect(broker.url) as client:
            subs = [client.subscribe(t, name="good") for t in topics]
            for sub in subs:
                await sub.__aenter__()
            received: dict[str, list[Message]] = {}
            acks: dict[str, list[int]] = {}
            done = trio.Event()
            errors_seen: list[int] = []
            try:
                async def produce(topic: str) -> None:
                    offsets = []
                    for i in range(n):
                        ack = await client.publish(topic, f"good {i}".encode(), id=f"g{i}")
                        offsets.append(ack.offset)
                        if i % 5 == 0:
                            await trio.sleep(0.01)
                    acks[topic] = offsets

                async def consume(topic: str, sub: Subscription) -> None:
                    received[topic] = await first_deliveries(sub, n)

                async with trio.open_nursery() as hostile:
                    for seed in range(12):
                        target = [broker.address, *addresses][seed % 3]
                        hostile.start_soon(hostile_connection, target, seed, done, errors_seen)
                    async with trio.open_nursery() as nursery:
                        for topic, sub in zip(topics, subs, strict=True):
                            nursery.start_soon(produce, topic)
                            nursery.start_soon(consume, topic, sub)
                    done.set()
            finally:
                for sub in subs:
                    await sub.__aexit__(None, None, None)

            for topic in topics:
                assert acks[topic] == list(range(n))
                assert [m.offset for m in received[topic]] == list(range(n))
                assert [m.payload for m in received[topic]] == [
                    f"good {i}".encode() for i in range(n)]
                result = await client.fetch(topic, 0, n + 10)
                assert [m.payload for m in result.messages] == [
                    f"good {i}".encode() for i in range(n)]
            # the broker still serves new clients and the map did not change
            assert (await client.publish(topics[0], b"after", id="after")).offset == n

    assert len(errors_seen) > 100, "the garbage did not reach the broker"
    assert broker.router.proc.poll() is None and router_pid == broker.router.proc.pid
    routed = {s["index"]: s for s in broker.stats()["shards"]}
    for index, pid in pids.items():
        assert pid_alive(pid), f"shard {index} (pid {pid}) died"
        assert routed[index]["pid"] == pid
        assert routed[index]["generation"] == broker.shards[index].generation


async def test_wrongly_typed_fetch_generations_and_credit_sids_are_handled_as_typed_input(
        broker: Broker) -> None:
    # found by the fuzzing above: a non-integer FETCH/COMMIT generation used to be
    # answered with TopicReset ("was reset: generation [] -> ...") where SUBSCRIBE says
    # InvalidRequest, and a list sid in CREDIT with a Python TypeError (G8)
    topic = owned_topic(0, prefix="typed")
    with trio.fail_after(20):
        address = next(a for i, a, _ in await shard_map(broker.address) if i == 0)
        async with await RawConn.open(address) as conn:
            await conn.hello()
            reply = await conn.request([P.SUBSCRIBE, conn.rid(), 1, {
                "topic": topic, "name": "p", "mode": "pull", "read_old": True}])
            assert reply[0] == P.SUBSCRIBED, reply
            for bad in ([], "1", 1.5, True, {"g": 1}, b"\x01"):
                for kind in (P.FETCH, P.COMMIT):
                    reply = await conn.request([kind, conn.rid(), {
                        "topic": topic, "name": "p", "generation": bad, "offset": 0}])
                    assert reply[0] == P.ERROR and reply[2] == errors.InvalidRequest.code, reply
                    assert "generation must be an integer" in reply[3], reply
            reply = await conn.request([P.SUBSCRIBE, conn.rid(), 2, {"topic": topic, "name": "q"}])
            assert reply[0] == P.SUBSCRIBED, reply
            for bad in ([], None, "x", 1.0):  # PROTOCOL.md 6.7: not the shard's -> TopicReset
                reply = await conn.request([P.ACK, conn.rid(), 2, bad, [], -1])
                assert reply[0] == P.ERROR and reply[2] == errors.TopicReset.code, reply
            await conn.send([P.CREDIT, [1], 5], [P.CREDIT, {"a": 1}, 5])
            reply = await conn.request([P.PING, conn.rid()])
            assert reply[0] == P.PONG, (reply, conn.frames)  # unknown sids: ignored, no error
            generation = reply and (await conn.request([P.STATS, conn.rid()]))[2]["generation"]
            reply = await conn.request([P.ACK, conn.rid(), 2, generation, [], -1])
            assert reply[0] == P.ACKED, reply
