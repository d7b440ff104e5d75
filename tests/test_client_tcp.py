"""The trio client over loopback TCP against the real router and shards, run in-process
(``run_router`` with a TaskLauncher, RealHost everywhere, free ports)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from flux.client.trio import connect
from flux.client.types import Message
from flux.config import Config
from flux.hashing import shard_for
from flux.host import RealHost
from flux.router.launcher import TaskLauncher
from flux.router.router import RouterInfo, run_router
from flux.router.state import MemoryStateStore

TIMEOUT = 30
SETTINGS = {"port": 0, "shards": 2, "subscriber.heartbeat": 0.5, "subscriber.timeout": 2.0,
            "router.adopt_window": 1.0, "shard.orphan_timeout": 10.0}


class Running:
    def __init__(self, info: RouterInfo, launcher: TaskLauncher, scope: trio.CancelScope) -> None:
        self.info = info
        self.launcher = launcher
        self.router_scope = scope

    @property
    def url(self) -> str:
        return f"flux://{self.info.address}"

    def kill_shard(self, index: int) -> None:
        next(s for s in self.launcher.shards.values() if s.index == index).kill()


@asynccontextmanager
async def broker() -> AsyncIterator[Running]:
    config = Config().replace(**SETTINGS)
    store = MemoryStateStore()
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        launcher = TaskLauncher(nursery, lambda spec: RealHost(f"s{spec.index}"))
        scope = trio.CancelScope()

        async def router(task_status: Any) -> None:
            with scope:
                await run_router(RealHost("router"), config, launcher, state=lambda port: store,
                                 stop=stop, task_status=task_status)

        info = await nursery.start(router)
        yield Running(info, launcher, scope)
        stop.set()
        scope.cancel()
        for shard in list(launcher.shards.values()):
            shard.kill()
        nursery.cancel_scope.cancel()
    assert launcher.errors == []


def topic_on(shard: int, prefix: str = "t") -> str:
    return next(t for t in (f"{prefix}{i}" for i in range(1000)) if shard_for(t, 2) == shard)


async def take(sub: Any, n: int) -> list[Message]:
    out: list[Message] = []
    async for msg in sub:
        await msg.ack()
        out.append(msg)
        if len(out) == n:
            break
    return out


async def test_publish_and_subscribe_over_tcp_on_both_shards() -> None:
    with trio.fail_after(TIMEOUT):
        async with broker() as b, connect(b.url, request_timeout=5) as client:
            topics = [topic_on(0), topic_on(1)]
            acks = {t: await client.publish_many(t, [b"%d" % i for i in range(300)])
                    for t in topics}
            assert acks[topics[0]][0].generation != acks[topics[1]][0].generation
            for topic in topics:
                assert [a.offset for a in acks[topic]] == list(range(300))
                async with client.subscribe(topic, name="r", read_old=True, prefetch=50) as sub:
                    got = await take(sub, 300)
                assert [m.payload for m in got] == [b"%d" % i for i in range(300)]
            stats = await client.stats()
            assert stats[0]["topics"][topics[0]]["subscriptions"]["r"]["cursor"] == 300


async def test_killed_shard_is_followed_to_its_new_generation() -> None:
    topic = topic_on(1, "crash")
    with trio.fail_after(TIMEOUT):
        async with broker() as b, connect(b.url, request_timeout=2) as client:
            before = await client.publish(topic, b"before")
            async with client.subscribe(topic, name="f", read_old=True) as sub:
                assert [m.payload for m in await take(sub, 1)] == [b"before"]
                b.kill_shard(1)
                after = await client.publish(topic, b"after")
                [msg] = await take(sub, 1)
    assert after.generation != before.generation and after.offset == 0
    assert (msg.payload, msg.generation, msg.offset) == (b"after", after.generation, 0)


async def test_clients_keep_publishing_while_the_router_is_down() -> None:
    with trio.fail_after(TIMEOUT):
        async with broker() as b, connect(b.url) as client:
            topic = topic_on(0)
            await client.publish(topic, b"a")
            b.router_scope.cancel()
            await trio.sleep(0.2)
            ack = await client.publish(topic, b"b")
            assert ack.offset == 1
