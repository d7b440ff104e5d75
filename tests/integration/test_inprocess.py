"""Router and shards in one trio run (TaskLauncher, loopback TCP): fast lifecycle tests.

These run the same run_router/run_shard code as ``flux serve``, with shards as
tasks in a nursery the test owns, so a "crashed" router leaves its shards running.
"""

from __future__ import annotations

import random
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio.testing

from flux import config as config_mod
from flux import protocol
from flux.host import RealHost, ShardSpec
from flux.router.launcher import TaskLauncher, TaskShard
from flux.router.router import RouterInfo, run_router
from flux.router.state import MemoryStateStore
from flux.shard.server import run_shard

from .wire import RawConn, owned_topic, shard_map

P = protocol
TIMEOUT = 20
SECRET = "ab" * 32
SETTINGS: dict[str, Any] = {
    "port": 0, "shards": 2, "subscriber.heartbeat": 0.5, "router.adopt_window": 3.0,
    "shard.orphan_timeout": 10.0,
}


def make_config(**overrides: Any) -> config_mod.Config:
    return config_mod.Config().replace(**{**SETTINGS, **overrides})


class Broker:
    """A router task plus its launcher; the router can be 'crashed' and started again."""

    def __init__(self, nursery: trio.Nursery, config: config_mod.Config,
                 launcher: TaskLauncher | None = None) -> None:
        self.nursery = nursery
        self.config = config
        self.launcher = launcher or TaskLauncher(nursery, lambda spec: RealHost(f"s{spec.index}"))
        self.store = MemoryStateStore()
        self.stop = trio.Event()
        self.scope = trio.CancelScope()
        self.done = trio.Event()
        self.info: RouterInfo | None = None

    async def start(self) -> RouterInfo:
        self.stop, self.scope, self.done = trio.Event(), trio.CancelScope(), trio.Event()

        async def router(task_status: Any) -> None:
            try:
                with self.scope:
                    await run_router(RealHost("router"), self.config, self.launcher,
                                     state=lambda port: self.store, stop=self.stop,
                                     task_status=task_status)
            finally:
                self.done.set()

        self.info = await self.nursery.start(router)
        return self.info

    @property
    def address(self) -> str:
        assert self.info is not None
        return self.info.address

    def shard(self, index: int) -> TaskShard:
        return next(s for s in self.launcher.shards.values() if s.index == index)


@asynccontextmanager
async def running(config: config_mod.Config | None = None) -> AsyncIterator[Broker]:
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            broker = Broker(nursery, config or make_config())
            await broker.start()
            yield broker
            broker.stop.set()
            while broker.launcher.shards:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert broker.launcher.errors == []


async def test_hello_returns_every_registered_shard() -> None:
    async with running() as broker:
        assert broker.info is not None
        shards = await shard_map(broker.address)
        assert [s[0] for s in shards] == [0, 1]
        assert [s[2] for s in shards] == [i.generation for i in broker.info.shards if i]
        assert all(s[2] != 0 for s in shards)


async def test_stop_drains_every_shard_and_clears_the_state() -> None:
    async with trio.open_nursery() as nursery:
        broker = Broker(nursery, make_config())
        with trio.fail_after(TIMEOUT):
            await broker.start()
            shards = list(broker.launcher.shards.values())
            assert broker.store.state is not None
            broker.stop.set()
            for shard in shards:
                assert await shard.wait() == 0  # drained, not killed
    assert broker.store.state is None  # the router returned after clearing it


async def test_killed_shard_is_restarted_and_hello_waits_for_it() -> None:
    async with running() as broker:
        old = broker.shard(1)
        old_generation = (await shard_map(broker.address))[1][2]
        old.kill()
        await old.wait()
        shards = await shard_map(broker.address)  # waits for the new registration
        assert shards[1][2] not in (old_generation, 0)
        assert broker.shard(1).pid != old.pid
        assert shards[1][1] == (broker.info.shards[1].advertise  # type: ignore[union-attr]
                                if broker.info else None)


async def test_restarted_router_adopts_shards_through_adopt_on_a_new_control_port() -> None:
    async with running() as broker:
        before = await shard_map(broker.address)
        old_info = broker.info
        assert old_info is not None
        pids = sorted(broker.launcher.shards)
        broker.scope.cancel()  # the router "crashes"; its shards keep running
        await broker.done.wait()
        # occupy the old control port, so the new router must announce a new one (ADOPT)
        blocker = socket.socket()
        blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        blocker.bind(protocol.parse_address(old_info.control))
        blocker.listen()
        try:
            info = await broker.start()
        finally:
            blocker.close()
        assert info.control != old_info.control
        assert sorted(broker.launcher.shards) == pids  # nothing launched, nothing killed
        assert [s.generation for s in info.shards if s] == [s[2] for s in before]
        topic = owned_topic(0)
        async with await RawConn.open(before[0][1]) as conn:
            await conn.hello()
            reply = await conn.request([P.PUBLISH, 1, [[topic, ["x"], [b"x"]]]])
            assert reply[3] == [[0, [], []]]


class CuttableHost(RealHost):
    """RealHost whose outgoing connections can be cut (the shard cannot reach any router)."""

    cut = False

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        if self.cut:
            raise OSError("network cut by the test")
        return await super().connect(host, port)


async def test_restarted_router_replaces_a_running_shard_that_does_not_register() -> None:
    hosts: dict[int, CuttableHost] = {}

    def host_for(spec: ShardSpec) -> CuttableHost:
        hosts[spec.index] = CuttableHost(f"s{spec.index}")
        return hosts[spec.index]

    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            config = make_config(**{"router.adopt_window": 1.0})
            broker = Broker(nursery, config, TaskLauncher(nursery, host_for))
            await broker.start()
            keep, silent = broker.shard(0), broker.shard(1)
            broker.scope.cancel()
            await broker.done.wait()
            hosts[1].cut = True  # shard 1 keeps running but can no longer register
            info = await broker.start()
            assert info.shards[0] is not None and info.shards[0].pid == keep.pid
            assert await silent.wait() < 0  # killed (and its exit seen) before replacing it
            assert info.shards[1] is not None and info.shards[1].pid != silent.pid
            broker.stop.set()


async def test_stale_state_without_running_shards_does_not_delay_the_start() -> None:
    async with trio.open_nursery() as nursery:
        broker = Broker(nursery, make_config(**{"router.adopt_window": 60.0}))
        broker.store.save({"version": 2, "port": 1, "control": "127.0.0.1:1", "shard_count": 2,
                           "secret": SECRET, "shards": [{"index": 0, "pid": 99,
                                                         "address": "127.0.0.1:1",
                                                         "control": "127.0.0.1:1"}]})
        with trio.fail_after(TIMEOUT):  # far less than adopt_window
            info = await broker.start()
            assert all(info.shards)
            broker.stop.set()


async def test_shard_without_a_router_exits_after_orphan_timeout() -> None:
    config = make_config(**{"shard.orphan_timeout": 0.5})
    spec = ShardSpec(index=0, shard_count=1, port=0, control="127.0.0.1:1", advertise=None,
                     config=config.to_dict(), secret=SECRET)
    with trio.fail_after(TIMEOUT):
        await run_shard(RealHost(), spec, pid=1)


class CountingStream(trio.abc.HalfCloseableStream):
    """A stream that counts ``send_all`` calls (to observe write coalescing)."""

    def __init__(self, inner: trio.StapledStream[Any, Any]) -> None:
        self.inner = inner
        self.sends = 0

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.sends += 1
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


class MemoryHost(RealHost):
    """RealHost's clock and randomness, with in-memory streams instead of TCP."""

    def __init__(self) -> None:
        super().__init__("memory", seed=1)
        self.random = random.Random(1)
        self.nursery: trio.Nursery | None = None
        self.handler: Any = None

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        raise OSError("no router in this test")

    async def serve(self, host: str, port: int, handler: Any, *,
                    task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            if self.handler is None:  # the client port (the control listener comes next)
                self.nursery, self.handler = nursery, handler
            task_status.started(1234)
            await trio.sleep_forever()

    def open(self) -> tuple[trio.abc.Stream, CountingStream]:
        client, server = trio.testing.memory_stream_pair()
        counted = CountingStream(server)
        assert self.nursery is not None
        self.nursery.start_soon(self.handler, counted)
        return client, counted


async def test_replies_to_one_batch_are_written_with_one_send() -> None:
    host = MemoryHost()
    spec = ShardSpec(index=0, shard_count=1, port=0, control="127.0.0.1:1", advertise=None,
                     config=make_config(shards=1).to_dict(), secret=SECRET)
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: run_shard(host, spec, pid=1,
                                                              task_status=task_status))
            client, server = host.open()
            await client.send_all(P.encode_many([[P.PING, i] for i in range(50)]))
            decoder, frames = P.FrameDecoder(), []
            while len(frames) < 50:
                frames += decoder.feed(await client.receive_some(1 << 20))
            assert frames == [[P.PONG, i] for i in range(50)]
            assert server.sends == 1
            nursery.cancel_scope.cancel()
