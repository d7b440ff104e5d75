"""The trio shell of the client: connection tasks, a timer task, wake-ups (I/O only).

:class:`TrioShell` runs a sans-IO :class:`~flux.client.core.ClientCore` on trio:
it opens the connections the core asks for through the :class:`~flux.host.Host`,
feeds it frames and ``now``, writes what it hands back, and wakes the tasks
parked on its waiters. The user API is :mod:`flux.client.trio`.
"""

from __future__ import annotations

import math
import ssl
from typing import Any

import trio

from flux import errors, protocol
from flux.client.core import ClientCore
from flux.host import Host

RECEIVE_BYTES = 1 << 18
MAX_INCOMING_FRAME = 1 << 30  # the shard enforces its own limit; this only catches garbage
_IO_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError)


class _ConnIO:
    """The shell's side of one connection: its task's cancel scope and writer wake-up."""

    __slots__ = ("address", "id", "reason", "scope", "wake")

    def __init__(self, conn_id: int, address: tuple[str, int]) -> None:
        self.id = conn_id
        self.address = address
        self.scope = trio.CancelScope()
        self.wake = trio.Event()
        self.reason: errors.FluxError | None = None


def _why(exc: BaseException) -> str:
    """What went wrong, for a person: trio's TLS errors keep the reason in their cause."""
    if str(exc) or exc.__cause__ is None:
        return str(exc) or type(exc).__name__
    return f"{type(exc.__cause__).__name__}: {exc.__cause__}"


class TrioShell:
    """Drives one ClientCore: every task it starts lives in ``nursery``."""

    def __init__(self, core: ClientCore, host: Host, nursery: trio.Nursery,
                 tls: ssl.SSLContext | None = None) -> None:
        self.core = core
        self.host = host
        self.tls = tls  # every connection speaks TLS with it (None: plain TCP)
        self._nursery = nursery
        self._io: dict[int, _ConnIO] = {}
        self._timer_scope: trio.CancelScope | None = None
        self._timer_at = math.inf

    def start(self) -> None:
        self._nursery.start_soon(self._run_timer)
        self.pump()

    def close(self) -> None:
        """Fail what is outstanding (ClientClosed) and stop every task."""
        self.core.close()
        self.pump()
        self._nursery.cancel_scope.cancel()

    async def wait_all(self, waiters: list[Any]) -> None:
        """Wait until every waiter is done; abandon the rest if cancelled."""
        waited = False
        try:
            for waiter in waiters:
                if not waiter.done:
                    event = trio.Event()
                    waiter.waker = event
                    waited = True
                    await event.wait()
        except BaseException:
            for waiter in waiters:
                if not waiter.done:
                    self.core.abandon(waiter)
            raise
        if not waited:
            await trio.lowlevel.checkpoint()

    def pump(self) -> None:
        """Carry out what the core asked for: open, close, write, wake, re-arm the timer."""
        core = self.core
        for conn in core.take_connects():
            io = _ConnIO(conn.id, conn.address)
            self._io[conn.id] = io
            self._nursery.start_soon(self._run_conn, io)
        for conn_id in core.take_closes():
            closing = self._io.get(conn_id)
            if closing is not None:
                closing.scope.cancel()
        for conn_id in core.take_writable():
            writable = self._io.get(conn_id)
            if writable is not None:
                writable.wake.set()
        for obj in core.take_woken():
            waker, obj.waker = obj.waker, None
            if waker is not None:
                waker.set()
        if self._timer_scope is not None and core.next_deadline() < self._timer_at:
            self._timer_scope.cancel()

    async def _run_timer(self) -> None:
        while True:
            at = self.core.next_deadline()
            with trio.CancelScope() as scope:
                self._timer_scope, self._timer_at = scope, at
                if at == math.inf:
                    await trio.sleep_forever()
                else:
                    await self.host.sleep_until(at)
            self._timer_scope, self._timer_at = None, math.inf
            self.core.tick(self.host.now())
            self.pump()

    async def _run_conn(self, io: _ConnIO) -> None:
        host, port = io.address
        stream: trio.abc.Stream | None = None
        try:
            with io.scope:
                try:
                    stream = await self.host.connect(host, port)
                    if self.tls is not None:
                        stream = trio.SSLStream(stream, self.tls, server_hostname=host)
                        await stream.do_handshake()
                except _IO_ERRORS as exc:
                    io.reason = errors.ConnectionLost(f"cannot connect to {host}:{port}:"
                                                      f" {_why(exc)}")
                    if stream is not None:  # the TLS handshake failed
                        await trio.aclose_forcefully(stream)
                        stream = None
                else:
                    self.core.connected(io.id, self.host.now())
                    self.pump()
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._write_loop, io, stream, nursery.cancel_scope)
                        await self._read_loop(io, stream)
                        nursery.cancel_scope.cancel()
        finally:  # also when the whole client is cancelled (close): never leak the socket
            if stream is not None:
                await trio.aclose_forcefully(stream)
        self._io.pop(io.id, None)
        if stream is not None:
            self.core.connection_lost(io.id, self.host.now(), io.reason)
        else:
            self.core.connect_failed(io.id, self.host.now(), io.reason)
        self.pump()

    async def _read_loop(self, io: _ConnIO, stream: trio.abc.Stream) -> None:
        host, port = io.address
        decoder = protocol.FrameDecoder(MAX_INCOMING_FRAME)
        core = self.core
        try:
            while True:
                data = await stream.receive_some(RECEIVE_BYTES)
                if not data:
                    io.reason = errors.ConnectionLost(f"{host}:{port} closed the connection")
                    return
                frames = decoder.feed(data)
                now = self.host.now()
                for frame in frames:
                    core.receive(io.id, frame, now)
                self.pump()
        except _IO_ERRORS as exc:
            io.reason = errors.ConnectionLost(f"connection to {host}:{port} broke: {exc}")
        except errors.ProtocolError as exc:
            io.reason = errors.ConnectionLost(f"corrupt frames from {host}:{port}: {exc}")

    async def _write_loop(self, io: _ConnIO, stream: trio.abc.Stream,
                          scope: trio.CancelScope) -> None:
        host, port = io.address
        core = self.core
        try:
            while True:
                frames = core.take_output(io.id, self.host.now())
                if frames is None:
                    return
                if frames:
                    self.pump()
                    await stream.send_all(protocol.encode_many(frames))
                    continue
                io.wake = trio.Event()
                await io.wake.wait()
        except _IO_ERRORS as exc:
            io.reason = errors.ConnectionLost(f"connection to {host}:{port} broke: {exc}")
            scope.cancel()
