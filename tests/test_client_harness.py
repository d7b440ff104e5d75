"""An in-memory Flux cluster for client tests: ShardCore shards and a HELLO-only router
behind trio memory streams, reached through a fake Host.

Nothing touches a socket or the real clock, so tests can run under pytest-trio's
``autojump_clock``. Shards record every frame they receive and can cut
connections, swallow a reply, or restart with a new generation.
"""

from __future__ import annotations

import errno
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio.testing

from flux import protocol as P
from flux.client.trio import Client, connect
from flux.config import Config
from flux.shard.core import ShardCore

ROUTER = ("router", 7070)
EPOCH = 1_700_000_000.0
Handler = Callable[[trio.abc.Stream], Awaitable[None]]


class MemoryHost:
    """A Host whose connect() reaches in-test servers over memory streams."""

    name = "test-client"

    def __init__(self, seed: int = 1) -> None:
        self.random = random.Random(seed)
        self.listeners: dict[tuple[str, int], Handler] = {}
        self.nursery: trio.Nursery | None = None
        self.connects: list[tuple[str, int]] = []

    def now(self) -> float:
        return trio.current_time()

    def wall_time(self) -> float:
        return EPOCH + trio.current_time()

    async def sleep_until(self, deadline: float) -> None:
        await trio.sleep_until(deadline)

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        self.connects.append((host, port))
        handler = self.listeners.get((host, port))
        if handler is None or self.nursery is None:
            raise OSError(errno.ECONNREFUSED, f"connection refused: {host}:{port}")
        client_end, server_end = trio.testing.memory_stream_pair()
        self.nursery.start_soon(handler, server_end)
        return client_end

    async def serve(self, host: str, port: int, handler: Handler, *,
                    task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        raise NotImplementedError


class _Peer:
    """One server-side connection: a writer task fed through a channel."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.send, self.recv = trio.open_memory_channel[bytes | None](1000)

    async def write_loop(self) -> None:
        async for data in self.recv:
            if data is None:
                break
            try:
                await self.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                break
        await trio.aclose_forcefully(self.stream)

    def close(self) -> None:
        self.send.send_nowait(None)


class FakeShard:
    """A shard: the real ShardCore behind memory streams."""

    def __init__(self, host: MemoryHost, index: int, count: int, config: Config,
                 generation: int) -> None:
        self.host = host
        self.index = index
        self.count = count
        self.config = config
        self.address = (f"shard{index}", 7100 + index)
        self.core = ShardCore(config, index=index, shard_count=count, generation=generation,
                              now=trio.current_time(), epoch=EPOCH)
        self.frames: list[list[Any]] = []       # every frame received, in order
        self.peers: dict[int, _Peer] = {}
        self.cut_before: set[int] = set()        # frame kinds: cut instead of sending (once)
        self.mute = False                        # receive but never answer
        self._kick = trio.Event()

    def received(self, kind: int) -> list[list[Any]]:
        return [f for f in self.frames if f[0] == kind]

    async def handle(self, stream: trio.abc.Stream) -> None:
        core = self.core
        conn = core.connect(trio.current_time())
        peer = _Peer(stream)
        self.peers[conn] = peer
        decoder = P.FrameDecoder()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(peer.write_loop)
            try:
                while True:
                    data = await stream.receive_some(65536)
                    if not data or core is not self.core:
                        break
                    for frame in decoder.feed(data):
                        self.frames.append(frame)
                        core.receive(conn, frame, trio.current_time())
                    self.flush()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            finally:
                if core is self.core:
                    core.disconnect(conn, trio.current_time())
                self.peers.pop(conn, None)
                peer.close()

    def flush(self) -> None:
        for conn, frames, close in self.core.take_output():
            peer = self.peers.get(conn)
            if peer is None or self.mute:
                continue
            cut = [f[0] for f in frames if f[0] in self.cut_before]
            if cut:
                self.cut_before.difference_update(cut)
                peer.close()
                continue
            peer.send.send_nowait(P.encode_many(frames))
            if close:
                peer.close()
        self._kick.set()

    async def run_ticker(self) -> None:
        while True:
            self._kick = trio.Event()
            with trio.move_on_at(self.core.next_deadline()):
                await self._kick.wait()
            self.core.tick(trio.current_time())
            self.flush()

    def cut_all(self) -> None:
        """Drop every client connection (the shard keeps its state)."""
        for peer in list(self.peers.values()):
            peer.close()

    def restart(self, generation: int) -> None:
        """Crash and restart: a new incarnation with empty state (G7)."""
        self.cut_all()
        self.peers.clear()
        self.core = ShardCore(self.config, index=self.index, shard_count=self.count,
                              generation=generation, now=trio.current_time(), epoch=EPOCH)
        self._kick.set()


class FakeRouter:
    """Answers HELLO with the shard map of ``shards`` (or of ``map_override``)."""

    def __init__(self, shards: list[FakeShard]) -> None:
        self.shards = shards
        self.hellos = 0
        self.map_override: dict[str, Any] | None = None

    def shard_map(self) -> dict[str, Any]:
        if self.map_override is not None:
            return self.map_override
        return {"version": P.VERSION, "shard_count": len(self.shards),
                "shards": [[s.index, f"{s.address[0]}:{s.address[1]}", s.core.generation]
                           for s in self.shards]}

    async def handle(self, stream: trio.abc.Stream) -> None:
        decoder = P.FrameDecoder()
        try:
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    break
                for frame in decoder.feed(data):
                    if frame[0] == P.HELLO:
                        self.hellos += 1
                        await stream.send_all(P.encode([P.HELLO_OK, frame[1], self.shard_map()]))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await trio.aclose_forcefully(stream)


class Cluster:
    def __init__(self, host: MemoryHost, router: FakeRouter, shards: list[FakeShard]) -> None:
        self.host = host
        self.router = router
        self.shards = shards

    @property
    def shard(self) -> FakeShard:
        return self.shards[0]

    def client(self, **kwargs: Any) -> Any:
        return connect(f"flux://{ROUTER[0]}:{ROUTER[1]}", host=self.host, **kwargs)

    def shard_for(self, topic: str) -> FakeShard:
        from flux.hashing import shard_for
        return self.shards[shard_for(topic, len(self.shards))]


@asynccontextmanager
async def cluster(shards: int = 1, seed: int = 1, **config: Any) -> AsyncIterator[Cluster]:
    """Run an in-memory cluster; ``config`` takes dotted keys with '__' for '.'."""
    cfg = Config().replace(**{k.replace("__", "."): v for k, v in config.items()})
    host = MemoryHost(seed)
    async with trio.open_nursery() as nursery:
        host.nursery = nursery
        members = [FakeShard(host, i, shards, cfg, generation=0x1000 + i) for i in range(shards)]
        router = FakeRouter(members)
        host.listeners[ROUTER] = router.handle
        for shard in members:
            host.listeners[shard.address] = shard.handle
            nursery.start_soon(shard.run_ticker)
        yield Cluster(host, router, members)
        nursery.cancel_scope.cancel()


async def wait_for(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll ``predicate`` (for state owned by another task) until true."""
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)


# -- the harness's own checks -----------------------------------------------------------


async def test_memory_host_refuses_unknown_addresses() -> None:
    host = MemoryHost()
    with trio.fail_after(5):
        try:
            await host.connect("nowhere", 1)
        except OSError as exc:
            assert exc.errno == errno.ECONNREFUSED
        else:
            raise AssertionError("connect to an unknown address succeeded")


async def test_cluster_answers_router_hello_with_its_shard_map() -> None:
    with trio.fail_after(10):
        async with cluster(shards=2) as c, c.client() as client:
            assert isinstance(client, Client)
            assert c.router.hellos == 1
            assert sorted(client._core.map.addresses) == [0, 1]  # type: ignore[union-attr]
