"""The simulated world around the real router and shards: crashes, pauses, router restarts."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

from flux import config as config_mod
from flux.client.trio import connect
from flux.hashing import shard_for
from flux.sim import history as h
from flux.sim.determinism import SimClock, seed_scheduler
from flux.sim.faults import Fault
from flux.sim.world import World

URL = "flux://127.0.0.1:7070"
CONFIG = config_mod.from_dict({
    "port": 7070, "shards": 2,
    "subscriber": {"heartbeat": 1.0, "timeout": 1.0, "retry_interval": 0.5},
    "router": {"adopt_window": 1.0},
})


def in_world(fn: Callable[[World], Awaitable[Any]], seed: int = 1) -> tuple[Any, h.History]:
    history = h.History()

    async def main() -> Any:
        async with trio.open_nursery() as nursery:
            world = World(seed, CONFIG, history, nursery)
            await world.router.start()
            with trio.fail_after(600):
                result = await fn(world)
            nursery.cancel_scope.cancel()
        return result

    seed_scheduler(seed)
    return trio.run(main, clock=SimClock()), history


def generations(history: h.History, shard: int) -> list[int]:
    seen: list[int] = []
    for e in history.of(h.ShardHello):
        if e.shard == shard and e.generation not in seen:
            seen.append(e.generation)
    return seen


async def publish_to_each_shard(world: World, name: str) -> dict[int, int]:
    """Publish to topics on both shards; returns shard index -> generation of the ack."""
    host = world.client_host(name)
    gens: dict[int, int] = {}
    async with connect(URL, host=host, request_timeout=1.0, retry_deadline=20.0) as client:
        for topic in ("a", "b", "c", "d", "e", "f"):
            ack = await client.publish(topic, b"x", id=f"{name}-{topic}")
            gens[shard_for(topic, 2)] = ack.generation
    host.drop_connections()
    return gens


def test_a_crashed_shard_is_restarted_with_a_new_generation() -> None:
    async def body(world: World) -> tuple[dict[int, int], dict[int, int]]:
        before = await publish_to_each_shard(world, "c1")
        await world._apply(Fault(trio.current_time(), "crash", "shard-0"))
        await trio.sleep(5)
        after = await publish_to_each_shard(world, "c2")
        return before, after

    (before, after), history = in_world(body)
    assert before[0] != after[0]        # shard 0: new generation (G7)
    assert before[1] == after[1]        # shard 1 untouched
    assert any(isinstance(e, h.ShardStopped) and e.shard == 0 for e in history)


def test_shards_outlive_a_router_crash_and_keep_their_generation() -> None:
    async def body(world: World) -> tuple[dict[int, int], dict[int, int]]:
        before = await publish_to_each_shard(world, "c1")
        world.router.crash()
        assert not world.router.running
        await trio.sleep(2)
        world.router.restart()
        await trio.sleep(5)
        after = await publish_to_each_shard(world, "c2")
        return before, after

    (before, after), _ = in_world(body)
    assert before == after


def test_a_paused_shard_freezes_while_the_world_goes_on() -> None:
    async def body(world: World) -> float:
        await publish_to_each_shard(world, "c1")
        host, _shard = world.shards[shard_for("a", 2)]
        host.gate.close()
        await trio.sleep(0.5)
        t0 = trio.current_time()
        client_host = world.client_host("c2")
        async with connect(URL, host=client_host, request_timeout=0.5,
                           retry_deadline=30.0) as client:
            with trio.move_on_after(1.0) as waited:
                await client.publish("a", b"y", id="during-pause")
            assert waited.cancelled_caught
            host.gate.open()
            await client.publish("a", b"y", id="after-pause")
        client_host.drop_connections()
        return trio.current_time() - t0

    elapsed, _ = in_world(body)
    assert elapsed >= 1.0


def test_a_closed_client_closes_its_connections() -> None:
    async def body(world: World) -> int:
        host = world.client_host("c1")
        async with connect(URL, host=host) as client:
            await client.publish("a", b"x", id="one")
        await trio.sleep(0.1)
        return len(world.network._streams[host.uid])

    still_open, _ = in_world(body)
    assert still_open == 0


def test_a_reset_of_the_router_link_does_not_crash_the_shard() -> None:
    # found by `flux sim --seed 3` (reset:router<->shard-1): the reset escaped the
    # shard's control session as an ExceptionGroup and took the whole shard down
    async def body(world: World) -> tuple[dict[int, int], dict[int, int], list[str]]:
        before = await publish_to_each_shard(world, "c1")
        await world._apply(Fault(trio.current_time(), "reset", "router<->shard-0"))
        await trio.sleep(5)
        after = await publish_to_each_shard(world, "c2")
        return before, after, world.failures

    (before, after, failures), _ = in_world(body)
    assert failures == []
    assert before == after


def test_the_oracle_names_the_session_of_each_ephemeral_subscription_a_shard_deletes() -> None:
    """Two clients' ephemeral subscriptions on one topic and shard, both made with sid 1:
    the shard's deletion of each (c1's connection closing under it, c2's UNSUBSCRIBE)
    names that client's own session."""
    async def body(world: World) -> None:
        c1, c2 = world.client_host("c1"), world.client_host("c2")
        async with connect(URL, host=c1) as one, connect(URL, host=c2) as two:
            async with one.subscribe("a"), two.subscribe("a"):
                await trio.sleep(0.5)
                c1.drop_connections()  # as if c1's process died: no UNSUBSCRIBE
                await trio.sleep(0.5)
            await trio.sleep(0.5)
        c2.drop_connections()

    _, history = in_world(body)
    sessions = {e.session: e.subscriber for e in history.of(h.Subscribed)}
    gone = [(e.t, sessions[e.session]) for e in history.of(h.EphemeralGone)]
    ended = {sessions[e.session]: e for e in history.of(h.SessionEnded)}
    assert [who for _, who in gone][:2] == ["c1/~1", "c2/~1"], gone
    assert (ended["c1/~1"].reason, ended["c2/~1"].reason) == ("closed", "unsubscribed")
    for t, who in gone:
        assert abs(ended[who].t - t) < 0.1, (who, t, ended[who])  # the client heard then
    assert all(e.shard == shard_for("a", 2) and e.topic == "a"
               for e in history.of(h.EphemeralGone))
