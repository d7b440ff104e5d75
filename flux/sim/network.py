"""The simulated network: in-memory streams between named hosts, with faults.

:class:`Network` owns listeners (one simulated address space: a port belongs to
one host), connections and link state: seeded latency per direction, one-way
blocks (partitions and stalls hold data until healed, like TCP retransmitting),
resets and slow links. :class:`SimStream` is one end of a connection, a real
``trio.abc.Stream``. Hosts and their pause gates live in ``flux.sim.simhost``.
"""

from __future__ import annotations

import errno
import itertools
import math
import random
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from flux.sim.simhost import SimHost

StreamHandler = Callable[[trio.abc.Stream], Awaitable[None]]

WINDOW_BYTES = 1 << 20      # bytes in flight per direction before send_all blocks
CONNECT_TIMEOUT = 20.0      # a SYN that never gets through fails like a kernel connect
FIRST_EPHEMERAL_PORT = 30000
TICK = 0.0005                # delivery times are multiples of this (fewer distinct wake-ups)


@dataclass
class LinkProfile:
    """Latency of one direction between two hosts: base + exponential jitter + rare spikes."""

    base: float
    jitter: float
    spike_p: float
    spike: float

    @classmethod
    def draw(cls, seed: int, src: str, dst: str) -> LinkProfile:
        # str seeds are hashed with sha512 by random.Random: stable across PYTHONHASHSEED
        rng = random.Random(f"{seed}:{src}>{dst}")
        base = rng.uniform(0.0002, 0.002)
        return cls(base=base, jitter=base * rng.uniform(0.1, 1.0),
                   spike_p=rng.choice((0.0, 0.001, 0.01)), spike=rng.uniform(0.005, 0.05))

    def sample(self, rng: random.Random) -> float:
        delay = self.base + rng.expovariate(1.0 / self.jitter)
        if self.spike_p and rng.random() < self.spike_p:
            delay += self.spike
        return delay


def _tick(at: float) -> float:
    """Round a delivery time up to the network's tick, so that deliveries bunch up."""
    return math.ceil(at / TICK) * TICK


class _Pipe:
    """One direction of a connection: chunks in flight with their delivery times."""

    __slots__ = ("buffered", "chunks", "dst", "eof", "eof_at", "last_at", "lot", "receiver_closed",
                 "reset", "src")

    def __init__(self, src: str, dst: str) -> None:
        self.src = src
        self.dst = dst
        self.chunks: deque[list[Any]] = deque()  # [deliver_at, bytes]
        self.buffered = 0
        self.last_at = 0.0
        self.eof = False          # the sender closed or sent EOF ...
        self.eof_at = math.inf    # ... which the receiver sees from this time on
        self.reset = False
        self.receiver_closed = False
        self.lot = trio.lowlevel.ParkingLot()

    def poke(self) -> None:
        self.lot.unpark_all()

    def close_send(self, network: Network) -> None:
        if not self.eof:
            self.eof = True
            self.eof_at = max(trio.current_time() + network.latency(self.src, self.dst),
                              self.last_at)
            network.wake_at(self.eof_at, self)

    def take(self, max_bytes: int | None) -> bytes:
        head = self.chunks[0]
        data: bytes = head[1]
        if max_bytes is not None and len(data) > max_bytes:
            head[1] = data[max_bytes:]
            data = data[:max_bytes]
        else:
            self.chunks.popleft()
        self.buffered -= len(data)
        self.poke()  # a sender may wait for window space
        return data

    def drop(self) -> None:
        self.chunks.clear()
        self.buffered = 0
        self.poke()


class SimStream(trio.abc.HalfCloseableStream):
    """One end of a simulated TCP connection, owned by one host (for its pause gate)."""

    def __init__(self, network: Network, host: SimHost, conn_id: int,
                 inbound: _Pipe, outbound: _Pipe) -> None:
        self._net = network
        self.host = host
        self.conn_id = conn_id
        self._in = inbound
        self._out = outbound
        self._closed = False
        self._eof_sent = False
        self._sending = False
        self._receiving = False

    def __repr__(self) -> str:
        return f"<SimStream #{self.conn_id} {self._out.src}->{self._out.dst}>"

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._sending:
            raise trio.BusyResourceError("another task is already sending on this stream")
        self._sending = True
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            pipe = self._out
            while True:
                if self._closed or self._eof_sent:
                    raise trio.ClosedResourceError("stream was closed for sending")
                if pipe.reset or pipe.receiver_closed:
                    raise trio.BrokenResourceError("connection reset by peer")
                if self.host.gate.closed:
                    await self.host.gate.passage()
                    continue
                if pipe.buffered < WINDOW_BYTES:
                    break
                await pipe.lot.park()
            self._put(data)
            await trio.lowlevel.cancel_shielded_checkpoint()
        finally:
            self._sending = False

    def try_send(self, data: bytes) -> int:
        """``send_all`` if it would not wait (all of ``data`` or nothing; 0 also when it
        would raise: ``send_all`` raises then). The host's ``try_send`` seam."""
        pipe = self._out
        if (self._sending or self._closed or self._eof_sent or pipe.reset or pipe.receiver_closed
                or self.host.gate.closed or pipe.buffered >= WINDOW_BYTES):
            return 0
        self._put(data)
        return len(data)

    def _put(self, data: bytes | bytearray | memoryview) -> None:
        if data:
            pipe = self._out
            chunk = bytes(data)
            at = max(_tick(trio.current_time() + self._net.latency(pipe.src, pipe.dst)),
                     pipe.last_at)
            pipe.last_at = at
            pipe.chunks.append([at, chunk])
            pipe.buffered += len(chunk)
            self._net.wake_at(at, pipe)

    async def send_eof(self) -> None:
        if self._sending:
            raise trio.BusyResourceError("another task is sending on this stream")
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._closed:
            raise trio.ClosedResourceError("stream was closed")
        if self._out.reset:
            raise trio.BrokenResourceError("connection reset by peer")
        self._eof_sent = True
        self._out.close_send(self._net)
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._receiving:
            raise trio.BusyResourceError("another task is already receiving on this stream")
        self._receiving = True
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            return await self._receive(max_bytes)
        finally:
            self._receiving = False

    async def _receive(self, max_bytes: int | None) -> bytes:
        pipe = self._in
        while True:
            if self._closed:
                raise trio.ClosedResourceError("stream was closed")
            if pipe.reset:
                raise trio.BrokenResourceError("connection reset by peer")
            deadline = math.inf
            if not self._net.blocked(pipe.src, pipe.dst):
                if pipe.chunks:
                    deadline = pipe.chunks[0][0]
                    if deadline <= trio.current_time():
                        if self.host.gate.closed:
                            await self.host.gate.passage()
                            continue
                        data = pipe.take(max_bytes)
                        await trio.lowlevel.cancel_shielded_checkpoint()
                        return data
                elif pipe.eof:
                    deadline = pipe.eof_at
                    if deadline <= trio.current_time():
                        if self.host.gate.closed:
                            await self.host.gate.passage()
                            continue
                        await trio.lowlevel.cancel_shielded_checkpoint()
                        return b""
            if self._net.timed_wakeups or deadline == math.inf:
                await pipe.lot.park()  # the network wakes us when the head is due
            else:
                with trio.move_on_at(deadline):
                    await pipe.lot.park()

    async def aclose(self) -> None:
        self.close_now()
        await trio.lowlevel.checkpoint()

    def close_now(self) -> None:
        """Close this end at once: the peer reads EOF after what was sent, then its sends fail."""
        if self._closed:
            return
        self._closed = True
        self._out.close_send(self._net)
        self._in.receiver_closed = True
        self._in.drop()
        self._net._forget(self)

    def reset(self) -> None:
        """Abort the connection both ways (an RST): pending data is lost."""
        for pipe in (self._in, self._out):
            pipe.reset = True
            pipe.drop()


@dataclass
class _Listener:
    host: SimHost
    port: int
    handler: StreamHandler
    nursery: trio.Nursery | None = None


class Network:
    """Every host, listener and connection of one simulated world."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(f"{seed}:network")
        self._listeners: dict[int, _Listener] = {}
        self._ports = itertools.count(FIRST_EPHEMERAL_PORT)
        self._conn_ids = itertools.count(1)
        self._streams: dict[int, dict[int, SimStream]] = {}  # host uid -> conn id -> end
        self._host_uids = itertools.count(1)
        self._profiles: dict[tuple[str, str], LinkProfile] = {}
        self._blocks: dict[tuple[str, str], int] = {}
        self._slow: dict[tuple[str, str], float] = {}
        self._healed = trio.lowlevel.ParkingLot()
        self._pipes: dict[tuple[str, str], dict[int, _Pipe]] = {}
        self.connections = 0
        self._clock: Any = None

    @property
    def timed_wakeups(self) -> bool:
        """Whether the clock delivers bytes (a SimClock) instead of receivers sleeping."""
        if self._clock is None:
            clock = trio.lowlevel.current_clock()
            self._clock = clock if hasattr(clock, "call_at") else False
        return self._clock is not False

    def wake_at(self, at: float, pipe: _Pipe) -> None:
        if self.timed_wakeups:
            self._clock.call_at(at, pipe.poke)
        else:
            pipe.poke()

    # -- hosts and latency -------------------------------------------------------------

    def register(self, host: SimHost) -> int:
        uid = next(self._host_uids)
        self._streams[uid] = {}
        return uid

    def latency(self, src: str, dst: str) -> float:
        key = (src, dst)
        profile = self._profiles.get(key)
        if profile is None:
            profile = self._profiles[key] = LinkProfile.draw(self.seed, src, dst)
        return profile.sample(self.rng) * self._slow.get(key, 1.0)

    # -- link faults -------------------------------------------------------------------

    def blocked(self, src: str, dst: str) -> bool:
        return bool(self._blocks) and self._blocks.get((src, dst), 0) > 0

    def block(self, src: str, dst: str) -> None:
        """Hold everything sent from ``src`` to ``dst`` (nested blocks count)."""
        key = (src, dst)
        self._blocks[key] = self._blocks.get(key, 0) + 1

    def unblock(self, src: str, dst: str) -> None:
        key = (src, dst)
        n = self._blocks.get(key, 0) - 1
        if n > 0:
            self._blocks[key] = n
            return
        self._blocks.pop(key, None)
        for pipe in self._pipes.get(key, {}).values():
            pipe.poke()
        self._healed.unpark_all()

    def heal_all(self) -> None:
        for src, dst in list(self._blocks):
            self._blocks[(src, dst)] = 1
            self.unblock(src, dst)
        self._slow.clear()

    def set_slow(self, src: str, dst: str, factor: float) -> None:
        if factor == 1.0:
            self._slow.pop((src, dst), None)
        else:
            self._slow[(src, dst)] = factor

    def reset_between(self, a: str, b: str) -> int:
        """Reset every connection between hosts named ``a`` and ``b``; returns how many."""
        count = 0
        for streams in self._streams.values():
            for stream in list(streams.values()):
                ends = {stream._out.src, stream._out.dst}
                if ends == {a, b} and not stream._out.reset:
                    stream.reset()
                    count += 1
        return count

    def crash(self, host: SimHost) -> None:
        """The process behind ``host`` died: its listeners vanish, its sockets close."""
        for port, listener in list(self._listeners.items()):
            if listener.host is host:
                del self._listeners[port]
        for stream in list(self._streams.get(host.uid, {}).values()):
            stream.close_now()

    # -- listening and connecting ------------------------------------------------------

    def listen(self, host: SimHost, port: int, handler: StreamHandler) -> _Listener:
        """Own ``port`` (0: a free one); raises OSError(EADDRINUSE) if it is taken."""
        if port == 0:
            port = next(self._ports)
            while port in self._listeners:
                port = next(self._ports)
        elif port in self._listeners:
            raise OSError(errno.EADDRINUSE, f"port {port} is already in use")
        listener = _Listener(host, port, handler)
        self._listeners[port] = listener
        return listener

    def unlisten(self, listener: _Listener) -> None:
        if self._listeners.get(listener.port) is listener:
            del self._listeners[listener.port]

    async def connect(self, host: SimHost, port: int) -> SimStream:
        """Open a connection from ``host`` to whoever listens on ``port``.

        Raises ConnectionRefusedError when nobody listens and TimeoutError when a
        block keeps the handshake from getting through for ``CONNECT_TIMEOUT``.
        """
        await host.gate.passage()
        listener = self._listeners.get(port)
        dst = listener.host.name if listener is not None else host.name
        await trio.sleep(self.latency(host.name, dst))
        with trio.move_on_after(CONNECT_TIMEOUT):
            while True:
                listener = self._listeners.get(port)
                if listener is None or listener.nursery is None:
                    await trio.sleep(self.latency(dst, host.name))
                    raise ConnectionRefusedError(errno.ECONNREFUSED, f"nothing listens on {port}")
                dst = listener.host.name
                if not self.blocked(host.name, dst) and not self.blocked(dst, host.name):
                    break
                await self._healed.park()
            client, server = self._pair(host, listener.host)
            assert listener.nursery is not None
            listener.nursery.start_soon(listener.handler, server,
                                        name=f"{dst}:conn#{server.conn_id}")
            await trio.sleep(self.latency(dst, host.name))
            await host.gate.passage()
            return client
        raise TimeoutError(errno.ETIMEDOUT, f"connect to port {port} timed out")

    def _pair(self, a: SimHost, b: SimHost) -> tuple[SimStream, SimStream]:
        conn_id = next(self._conn_ids)
        self.connections += 1
        ab, ba = _Pipe(a.name, b.name), _Pipe(b.name, a.name)
        self._pipes.setdefault((a.name, b.name), {})[conn_id] = ab
        self._pipes.setdefault((b.name, a.name), {})[conn_id] = ba
        end_a = SimStream(self, a, conn_id, inbound=ba, outbound=ab)
        end_b = SimStream(self, b, conn_id, inbound=ab, outbound=ba)
        self._streams[a.uid][conn_id] = end_a
        self._streams[b.uid][conn_id] = end_b
        return end_a, end_b

    def _forget(self, stream: SimStream) -> None:
        self._streams.get(stream.host.uid, {}).pop(stream.conn_id, None)
        out = stream._out
        pipes = self._pipes.get((out.src, out.dst))
        if pipes is not None and out.receiver_closed:
            pipes.pop(stream.conn_id, None)
        inbound = stream._in
        pipes = self._pipes.get((inbound.src, inbound.dst))
        if pipes is not None and inbound.eof:
            pipes.pop(stream.conn_id, None)
