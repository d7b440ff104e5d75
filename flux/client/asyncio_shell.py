"""The asyncio shell of the client: transports, one timer handle, wake-ups (I/O only).

:class:`AsyncioShell` runs a sans-IO :class:`~flux.client.core.ClientCore` on an
asyncio loop (the default loop or uvloop): it opens the connections the core
asks for as asyncio protocols, feeds them frames and ``loop.time()``, writes what
the core hands back and wakes the tasks parked on its waiters. No protocol
decision is made here; the user API is :mod:`flux.client.asyncio`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import ssl
from collections.abc import Callable
from typing import Any, cast

from flux import errors, protocol
from flux.client.core import ClientCore

MAX_INCOMING_FRAME = 1 << 30  # the shard enforces its own limit; this only catches garbage
CLOSE_WAIT = 5.0              # seconds to wait for transports to report their close


class _Connection(asyncio.Protocol):
    """One connection: the asyncio protocol that feeds the core and writes its output."""

    def __init__(self, shell: AsyncioShell, conn_id: int, address: tuple[str, int]) -> None:
        self.shell = shell
        self.id = conn_id
        self.address = address
        self.transport: asyncio.Transport | None = None
        self.opener: asyncio.Task[None] | None = None
        self.decoder = protocol.FrameDecoder(MAX_INCOMING_FRAME)
        self.paused = False          # the transport's buffer is over its high-water mark
        self.flush_soon = False
        self.reason: errors.FluxError | None = None
        self.done = shell.loop.create_future()

    def __repr__(self) -> str:
        host, port = self.address
        state = "open" if self.transport is not None else "connecting"
        return f"<asyncio connection #{self.id} {host}:{port} {state}>"

    # -- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError, AttributeError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        shell = self.shell
        try:
            shell.core.connected(self.id, shell.now())
        except Exception as exc:  # a bug: stop the client rather than hang its callers
            shell._crash(exc)
            return
        shell.pump()

    def data_received(self, data: bytes) -> None:
        shell = self.shell
        try:
            frames = self.decoder.feed(data)
        except errors.ProtocolError as exc:
            host, port = self.address
            self.reason = errors.ConnectionLost(f"corrupt frames from {host}:{port}: {exc}")
            self.abort()
            return
        now = shell.now()
        receive = shell.core.receive
        try:
            for frame in frames:
                receive(self.id, frame, now)
        except Exception as exc:
            shell._crash(exc)
            return
        shell.pump()

    def eof_received(self) -> bool:
        host, port = self.address
        self.reason = self.reason or errors.ConnectionLost(f"{host}:{port} closed the connection")
        return False  # let the transport close

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None and self.reason is None:
            host, port = self.address
            self.reason = errors.ConnectionLost(f"connection to {host}:{port} broke: {exc}")
        self.shell._finished(self, self.shell.core.connection_lost)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.schedule_flush()

    # -- driven by the shell ---------------------------------------------------------

    def schedule_flush(self) -> None:
        """Write the core's output at the end of this loop iteration, so that everything
        queued by the tasks running now shares one write (and one PUBLISH frame)."""
        if not self.flush_soon:
            self.flush_soon = True
            self.shell.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.flush_soon = False
        transport = self.transport
        if transport is None or self.paused or transport.is_closing():
            return
        shell = self.shell
        try:
            frames = shell.core.take_output(self.id, shell.now())
        except Exception as exc:
            shell._crash(exc)
            return
        if frames:
            transport.write(protocol.encode_many(frames))
            shell.pump()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
        elif self.opener is not None:
            self.opener.cancel()


class AsyncioShell:
    """Drives one ClientCore on the running asyncio loop; :meth:`aclose` stops it all."""

    def __init__(self, core: ClientCore, loop: asyncio.AbstractEventLoop,
                 tls: ssl.SSLContext | None = None) -> None:
        self.core = core
        self.loop = loop
        self.tls = tls  # every connection speaks TLS with it (None: plain TCP)
        self._conns: dict[int, _Connection] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self.crashed: BaseException | None = None   # a bug in a callback, raised at close

    def now(self) -> float:
        return self.loop.time()

    def start(self) -> None:
        self.pump()

    async def aclose(self) -> None:
        """Fail what is outstanding (ClientClosed), close every connection and wait for it."""
        self.core.close()
        self.pump()
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._timer_at = None, math.inf
        pending = [conn.done for conn in self._conns.values()]
        if pending:
            await asyncio.wait(pending, timeout=CLOSE_WAIT)

    async def wait_all(self, waiters: list[Any]) -> None:
        """Wait until every waiter is done; abandon the rest if cancelled."""
        waited = False
        try:
            for waiter in waiters:
                if not waiter.done:
                    event = asyncio.Event()
                    waiter.waker = event
                    waited = True
                    await event.wait()
        except BaseException:
            for waiter in waiters:
                if not waiter.done:
                    self.core.abandon(waiter)
            raise
        if not waited:
            await asyncio.sleep(0)

    def pump(self) -> None:
        """Carry out what the core asked for: open, close, write, wake, re-arm the timer."""
        try:
            self._pump()
        except Exception as exc:  # a bug: stop the client rather than hang its callers
            self._crash(exc)

    def _pump(self) -> None:
        core = self.core
        for conn in core.take_connects():
            new = _Connection(self, conn.id, conn.address)
            self._conns[conn.id] = new
            new.opener = self.loop.create_task(self._open(new))
        for conn_id in core.take_closes():
            closing = self._conns.get(conn_id)
            if closing is not None:
                closing.abort()
        for conn_id in core.take_writable():
            writable = self._conns.get(conn_id)
            if writable is not None:
                writable.schedule_flush()
        for obj in core.take_woken():
            waker, obj.waker = obj.waker, None
            if waker is not None:
                waker.set()
        at = core.next_deadline()
        if at < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = at
            self._timer = self.loop.call_at(at, self._on_timer) if at < math.inf else None

    def _on_timer(self) -> None:
        # the loop runs a timer once its time is within the clock's resolution: never
        # hand the core a ``now`` before the deadline it asked for
        now = max(self.now(), self._timer_at)
        self._timer, self._timer_at = None, math.inf
        try:
            self.core.tick(now)
        except Exception as exc:
            self._crash(exc)
            return
        self.pump()

    async def _open(self, conn: _Connection) -> None:
        host, port = conn.address
        try:
            if self.tls is None:
                await self.loop.create_connection(lambda: conn, host, port)
            else:
                await self.loop.create_connection(lambda: conn, host, port, ssl=self.tls,
                                                  server_hostname=host)
        except OSError as exc:
            conn.reason = errors.ConnectionLost(f"cannot connect to {host}:{port}: {exc}")
        except asyncio.CancelledError:
            pass  # the core gave up on it (connect timeout, or the client closed)
        finally:
            conn.opener = None
        if conn.transport is None:
            self._finished(conn, self.core.connect_failed)

    def _finished(self, conn: _Connection,
                  report: Callable[[int, float, errors.FluxError | None], None]) -> None:
        """The connection is over: tell the core (``connection_lost``/``connect_failed``)."""
        if self._conns.get(conn.id) is conn:
            del self._conns[conn.id]
        if not conn.done.done():
            conn.done.set_result(None)
        try:
            report(conn.id, self.now(), conn.reason)
        except Exception as exc:
            self._crash(exc)
            return
        self.pump()

    def _crash(self, exc: BaseException) -> None:
        if self.crashed is None:
            self.crashed = exc
        if not self.core.closed:
            self.core.close()
            with contextlib.suppress(Exception):
                self._pump()
