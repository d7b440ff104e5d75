"""The seams between broker code and the world: clock, network, randomness.

Router, shard and client code reach the outside only through a :class:`Host`.
:class:`RealHost` uses trio's clock and TCP and seeds its randomness from
``os.urandom``; the simulator (``flux.sim``) provides a host with a fake network,
a seeded ``random.Random`` and a pause gate. No broker module calls
``time.time()``, ``time.monotonic()`` or the global ``random`` directly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio

StreamHandler = Callable[[trio.abc.Stream], Awaitable[None]]


class Host(Protocol):
    """What a router, shard or client may use of the outside world."""

    name: str
    random: random.Random

    def now(self) -> float:
        """Seconds on the monotonic clock (trio's clock; fake in the simulator)."""
        ...

    def wall_time(self) -> float:
        """Seconds since the Unix epoch, for message timestamps only."""
        ...

    async def sleep_until(self, deadline: float) -> None:
        """Sleep until ``now() >= deadline``."""
        ...

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        """Open a stream to ``host:port``; raises OSError when refused or unreachable."""
        ...

    def try_send(self, stream: trio.abc.Stream, data: bytes) -> int:
        """Send what of ``data`` can go at once on ``stream`` without waiting; returns
        the count (0 when it would wait, or on any error: the next ``send_all`` on the
        stream reports it). Only while no ``send_all`` on the stream is in progress."""
        ...

    async def serve(self, host: str, port: int, handler: StreamHandler, *,
                    task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Accept connections on ``host:port`` forever, running ``handler`` per stream.

        Reports the bound port through ``task_status.started(port)``.
        """
        ...


def wall_clock() -> float:
    """The one place Flux reads the wall clock."""
    return time.time()  # seam-ok: the host's wall-time seam itself


class RealHost:
    """The production host: trio's clock and TCP, randomness from ``os.urandom``."""

    def __init__(self, name: str = "flux", seed: int | None = None) -> None:
        self.name = name
        self.random = random.Random(seed if seed is not None else os.urandom(16))

    def now(self) -> float:
        return trio.current_time()

    def wall_time(self) -> float:
        return wall_clock()

    async def sleep_until(self, deadline: float) -> None:
        await trio.sleep_until(deadline)

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        stream = await trio.open_tcp_stream(host, port)
        _nodelay(stream)
        return stream

    def try_send(self, stream: trio.abc.Stream, data: bytes) -> int:
        sock = getattr(stream, "socket", None)  # a trio.SocketStream (non-blocking socket)
        if sock is None:
            return 0
        try:
            return os.write(sock.fileno(), data)
        except OSError:  # full (BlockingIOError), or broken: send_all will say how
            return 0

    async def serve(self, host: str, port: int, handler: StreamHandler, *,
                    task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound = listeners[0].socket.getsockname()[1]

        async def wrapped(stream: trio.SocketStream) -> None:
            _nodelay(stream)
            await handler(stream)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, wrapped, listeners)
            task_status.started(bound)


def _nodelay(stream: Any) -> None:
    sock = getattr(stream, "socket", None)
    if sock is not None:
        import socket

        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class ShardProcess(Protocol):
    """A running shard as its launcher sees it (an OS process, or a task in the simulator)."""

    index: int
    pid: int

    async def wait(self) -> int:
        """Return the exit status once the shard has exited."""
        ...

    def kill(self) -> None:
        """Stop it at once (SIGKILL, or a simulated crash)."""
        ...

    def terminate(self) -> None:
        """Ask it to drain and exit (SIGTERM)."""
        ...


class Launcher(Protocol):
    """How the router starts and watches shards (DESIGN.md §3, seam 4)."""

    async def launch(self, spec: ShardSpec) -> ShardProcess:
        """Start shard ``spec.index``; returns once it is started (not yet registered)."""
        ...

    def adopt(self, index: int, pid: int) -> ShardProcess:
        """Watch a shard that a previous router started (it registered with ``pid``)."""
        ...


@dataclasses.dataclass(frozen=True)
class ShardSpec:
    """Everything a shard needs to start: the config and its place in the shard map."""

    index: int
    shard_count: int
    port: int                 # where the shard listens (0: any free port)
    control: str              # host:port of the router's control listener
    advertise: str | None     # the address clients should use, if not host:port
    config: dict[str, Any]    # Config.to_dict() of the broker
    cpu: int | None = None    # CPU to pin the shard to, if the OS allows
