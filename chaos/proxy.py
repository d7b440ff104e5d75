"""The fault-injecting TCP proxy that shards advertise: one listener per shard.

A :class:`ShardProxy` forwards every client connection to its shard's real port
and, when told, adds latency, stalls traffic (held, then delivered), blackholes
it (dropped; the connections are reset when the blackhole ends, since their
byte streams are broken) or resets every connection. Loopback only; no faults
are chosen here (that is :mod:`chaos.schedule`), only carried out.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from dataclasses import dataclass, field

import trio

CHUNK = 65536
QUEUE_CHUNKS = 256       # chunks held per direction before the reader stops (back-pressure)
CONNECT_TIMEOUT = 2.0
_EOF = b""


@dataclass
class ProxyStats:
    connections: int = 0
    refused: int = 0
    resets: int = 0
    bytes_up: int = 0       # client -> shard
    bytes_down: int = 0     # shard -> client
    dropped: int = 0


@dataclass(eq=False)
class _Link:
    """One proxied connection: both sockets and the scope of its pumps."""

    client: trio.SocketStream
    upstream: trio.SocketStream | None = None
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    tainted: bool = False    # lost bytes to a blackhole: unusable, reset when it ends

    def abort(self) -> None:
        """Close both sockets with an RST (SO_LINGER 0) and stop the pumps."""
        for stream in (self.client, self.upstream):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                             struct.pack("ii", 1, 0))
        self.scope.cancel()


class ShardProxy:
    """Listens on ``127.0.0.1:listen_port`` and forwards to ``127.0.0.1:target_port``."""

    def __init__(self, index: int, listen_port: int, target_port: int) -> None:
        self.index = index
        self.listen_port = listen_port
        self.target_port = target_port
        self.latency = 0.0
        self.blackholed = False
        self.stats = ProxyStats()
        self._links: dict[int, _Link] = {}
        self._ids = 0
        self._open_gate = trio.Event()
        self._open_gate.set()

    @property
    def stalled(self) -> bool:
        return not self._open_gate.is_set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Accept and forward until cancelled. Raises OSError if the port cannot be bound."""
        listeners = await trio.open_tcp_listeners(self.listen_port, host="127.0.0.1")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, self._handle, listeners)
            task_status.started()

    # -- faults (called by the runner) -------------------------------------------------

    def set_latency(self, seconds: float) -> None:
        """Delay every chunk sent from now on by ``seconds`` (0 removes the delay)."""
        self.latency = max(0.0, seconds)

    def stall(self) -> None:
        """Hold traffic both ways until :meth:`unstall` (nothing is lost)."""
        if not self.stalled:
            self._open_gate = trio.Event()

    def unstall(self) -> None:
        self._open_gate.set()

    def blackhole(self) -> None:
        """Drop traffic both ways until :meth:`unblackhole`."""
        self.blackholed = True

    def unblackhole(self) -> int:
        """Let traffic pass again and reset the connections that lost bytes; returns how many."""
        self.blackholed = False
        tainted = [link for link in self._links.values() if link.tainted]
        for link in tainted:
            link.abort()
        self.stats.resets += len(tainted)
        return len(tainted)

    def reset(self) -> int:
        """Reset every open connection (an RST each way); returns how many."""
        links = list(self._links.values())
        for link in links:
            link.abort()
        self.stats.resets += len(links)
        return len(links)

    def heal(self) -> None:
        """Remove every fault in force."""
        self.set_latency(0.0)
        self.unstall()
        if self.blackholed:
            self.unblackhole()

    # -- forwarding --------------------------------------------------------------------

    async def _handle(self, client: trio.SocketStream) -> None:
        self._ids += 1
        link_id = self._ids
        link = _Link(client)
        self._links[link_id] = link
        self.stats.connections += 1
        try:
            with link.scope:
                try:
                    with trio.fail_after(CONNECT_TIMEOUT):
                        link.upstream = await trio.open_tcp_stream("127.0.0.1", self.target_port)
                except (OSError, trio.TooSlowError):
                    # the shard is down: the client sees a reset, as from a closed port
                    self.stats.refused += 1
                    link.abort()
                    return
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._direction, link, client, link.upstream, True)
                    nursery.start_soon(self._direction, link, link.upstream, client, False)
        finally:
            del self._links[link_id]
            for stream in (client, link.upstream):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.socket.close()

    async def _direction(self, link: _Link, src: trio.SocketStream, dst: trio.SocketStream,
                         up: bool) -> None:
        send, receive = trio.open_memory_channel[tuple[float, bytes]](QUEUE_CHUNKS)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._reader, link, src, send, up)
            await self._writer(link, dst, receive)
            nursery.cancel_scope.cancel()
        # one direction ended: the connection ends both ways (Flux peers close fully)
        link.scope.cancel()

    async def _reader(self, link: _Link, src: trio.SocketStream,
                      send: trio.MemorySendChannel[tuple[float, bytes]], up: bool) -> None:
        async with send:
            while True:
                try:
                    data = await src.receive_some(CHUNK)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    data = _EOF
                if data and self.blackholed:
                    link.tainted = True
                    self.stats.dropped += len(data)
                    continue
                if up:
                    self.stats.bytes_up += len(data)
                else:
                    self.stats.bytes_down += len(data)
                try:
                    await send.send((trio.current_time() + self.latency, data))
                except trio.BrokenResourceError:
                    return  # the writer already ended (its peer is gone): so does this link
                if not data:
                    return

    async def _writer(self, link: _Link, dst: trio.SocketStream,
                      receive: trio.MemoryReceiveChannel[tuple[float, bytes]]) -> None:
        async with receive:
            async for at, data in receive:
                while self.stalled:
                    await self._open_gate.wait()
                await trio.sleep_until(at)
                if not data:
                    return
                if self.blackholed:
                    link.tainted = True
                    self.stats.dropped += len(data)
                    continue
                try:
                    await dst.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    return
