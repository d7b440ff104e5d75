"""The client flavours the shared suite runs against, behind one async face.

The trio and asyncio clients (asyncio also on uvloop, where it is installed) are
used exactly as users use them. The blocking client is wrapped in a thin async
facade that runs each blocking call in a worker thread, so the very same test
bodies exercise it too. Helpers reach a client's core on the client's own loop.
"""

from __future__ import annotations

import importlib.util
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread

from flux.client import sync
from flux.hashing import shard_for

_END = object()


async def in_thread(fn: Callable[[], Any]) -> Any:
    """Run a blocking call in a worker thread; a test timeout stops waiting for it."""
    return await anyio.to_thread.run_sync(fn, abandon_on_cancel=True)


class SyncMessage:
    """A blocking client's message with an awaitable ``ack``."""

    def __init__(self, msg: sync.Message) -> None:
        self.msg = msg

    def __getattr__(self, name: str) -> Any:
        return getattr(self.msg, name)

    async def ack(self) -> None:
        self.msg.ack()  # never blocks: it only queues the ack on the client's loop

    async def nak(self, delay: float = 0) -> None:
        self.msg.nak(delay)

    async def term(self, reason: str = "") -> None:
        self.msg.term(reason)

    async def in_progress(self) -> None:
        self.msg.in_progress()

    def __repr__(self) -> str:
        return repr(self.msg)


class SyncSubscription:
    """``async with`` / ``async for`` over a blocking :class:`flux.client.sync.Subscription`."""

    def __init__(self, sub: sync.Subscription) -> None:
        self.sub = sub

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sub, name)

    @property
    def _state(self) -> Any:
        return self.sub._sub._state

    async def __aenter__(self) -> SyncSubscription:
        await in_thread(self.sub.__enter__)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await in_thread(self.sub.unsubscribe)

    def __aiter__(self) -> SyncSubscription:
        return self

    async def __anext__(self) -> SyncMessage:
        def step() -> Any:
            try:
                return next(self.sub)
            except StopIteration:  # cannot cross into the event loop as it is
                return _END

        msg = await in_thread(step)
        if msg is _END:
            raise StopAsyncIteration
        return SyncMessage(msg)

    async def unsubscribe(self) -> None:
        await in_thread(self.sub.unsubscribe)

    async def next_within(self, timeout: float) -> SyncMessage | None:
        msg = await in_thread(lambda: self.sub.next(timeout=timeout))
        return SyncMessage(msg) if msg is not None else None

    def __repr__(self) -> str:
        return repr(self.sub)


class SyncClient:
    """The async face of a blocking :class:`flux.client.sync.Client`."""

    def __init__(self, client: sync.Client) -> None:
        self.client = client

    @property
    def _core(self) -> Any:
        return self.client._client._core

    def __repr__(self) -> str:
        return repr(self.client)

    async def publish(self, *args: Any, **kwargs: Any) -> Any:
        return await in_thread(lambda: self.client.publish(*args, **kwargs))

    async def publish_many(self, *args: Any, **kwargs: Any) -> Any:
        return await in_thread(lambda: self.client.publish_many(*args, **kwargs))

    async def subscribe_pull(self, *args: Any, **kwargs: Any) -> Any:
        return await in_thread(lambda: self.client.subscribe_pull(*args, **kwargs))

    async def fetch(self, *args: Any, **kwargs: Any) -> Any:
        return await in_thread(lambda: self.client.fetch(*args, **kwargs))

    async def commit(self, *args: Any, **kwargs: Any) -> Any:
        return await in_thread(lambda: self.client.commit(*args, **kwargs))

    async def stats(self) -> Any:
        return await in_thread(self.client.stats)

    def subscribe(self, *args: Any, **kwargs: Any) -> SyncSubscription:
        return SyncSubscription(self.client.subscribe(*args, **kwargs))


@asynccontextmanager
async def connect_sync(url: str, **options: Any) -> AsyncIterator[SyncClient]:
    client = await in_thread(lambda: sync.connect(url, **options))
    try:
        yield SyncClient(client)
    finally:
        await anyio.to_thread.run_sync(client.close)


def _connect_trio(url: str, **options: Any) -> Any:
    from flux.client.trio import connect

    return connect(url, **options)


def _connect_asyncio(url: str, **options: Any) -> Any:
    from flux.client.asyncio import connect

    return connect(url, **options)


@dataclass(frozen=True)
class Flavour:
    """One client flavour: how to connect, and which anyio backend runs its tests."""

    name: str
    backend: Any
    connect: Callable[..., Any]

    def __repr__(self) -> str:
        return self.name


HAVE_UVLOOP = importlib.util.find_spec("uvloop") is not None
FLAVOURS = {
    "trio": Flavour("trio", "trio", _connect_trio),
    "asyncio": Flavour("asyncio", "asyncio", _connect_asyncio),
    "uvloop": Flavour("uvloop", ("asyncio", {"use_uvloop": True}), _connect_asyncio),
    "sync": Flavour("sync", "asyncio", connect_sync),
}


async def next_within(sub: Any, timeout: float) -> Any:
    """The subscription's next message, or None if none comes within ``timeout``."""
    if isinstance(sub, SyncSubscription):
        return await sub.next_within(timeout)
    with anyio.move_on_after(timeout):
        return await sub.__anext__()
    return None


async def take(sub: Any, n: int, *, ack: bool = True) -> list[Any]:
    """The next ``n`` messages of ``sub`` (acked unless ``ack`` is False)."""
    out: list[Any] = []
    async for msg in sub:
        out.append(msg)
        if ack:
            await msg.ack()
        if len(out) == n:
            break
    return out


async def on_client_loop(client: Any, fn: Callable[[Any], Any]) -> Any:
    """Call ``fn(async_client)`` where the client's core lives (its own loop thread for
    the blocking client), so tests can reach into the core safely."""
    if isinstance(client, SyncClient):
        inner = client.client

        async def call() -> Any:
            return fn(inner._client)

        return await in_thread(lambda: inner._portal.run(call()))
    return fn(client)


def topic_on(shard: int, prefix: str, shards: int = 2) -> str:
    """A topic starting with ``prefix`` that lives on ``shard``."""
    return next(t for t in (f"{prefix}.t{i}" for i in range(1000)) if shard_for(t, shards) == shard)


def unused_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port
