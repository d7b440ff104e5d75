"""The shard's trio shell around ShardCore: sockets, timers and the link to the router.

Lives here: per-connection reader and writer tasks (writes coalesced into one
``send_all``), the tick loop, the control link (REGISTER, heartbeats, DRAIN), the
control listener (ADOPT; both proven with the broker secret, flux.control_proof)
and the drain on stop. Broker rules live in :mod:`flux.shard.core`; process
concerns (signals, CPU pinning) in :mod:`flux.shard.__main__`. Only the host seams
are used here, so the simulator runs this exact code.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any

import trio

from flux import config as config_mod
from flux import control_proof, errors, protocol
from flux.auth.users import parse_auth
from flux.host import Host, ShardSpec
from flux.shard.core import ShardCore
from flux.shard.disk import ShardStorage
from flux.storage import LogFailed
from flux.tls import accept as tls_accept
from flux.tls import server_context

log = logging.getLogger("flux.shard")

RECV_BYTES = 65536
# frames of one read handled before the output is looked at again (a read is up to
# RECV_BYTES; a burst of small requests must not make unbounded output at once)
RUN_FRAMES = 256
# requests whose replies may be large: each ends a run
HEAVY_KINDS = frozenset({protocol.STATS, protocol.FETCH})
CLOSE_GRACE = 2.0         # seconds to flush and linger when closing one connection
DRAIN_GRACE = 5.0         # seconds a draining shard waits for its connections to close
CONNECT_TIMEOUT = 5.0
BACKOFF_MIN, BACKOFF_MAX = 0.05, 1.0
BROKEN = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)
CONTROL_HOST = "127.0.0.1"  # control listeners stay private to this machine
CONTROL_TIMEOUT = 5.0       # seconds one ADOPT exchange may take
CONTROL_MAX_FRAME = 65536   # control frames are small: a larger one is corruption


class StorageFailed(Exception):
    """A disk topic's log failed: the shard stops, and recovery runs when it restarts."""


def draw_generation(host: Host) -> int:
    """A new incarnation's generation: 64 random bits from the host's randomness, never 0
    (0 means "no generation known" on the wire)."""
    generation = 0
    while not generation:
        generation = host.random.getrandbits(64)
    return generation


async def run_shard(host: Host, spec: ShardSpec, *, pid: int, generation: int | None = None,
                    stop: trio.Event | None = None,
                    on_start: Callable[[ShardServer], None] | None = None,
                    on_serving: Callable[[], None] | None = None,
                    task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Serve shard ``spec.index`` until drained (DRAIN, ``stop`` set, or orphaned).

    This is the one start path of a shard incarnation, in production and in the
    simulator. ``on_start`` sees the server once it is built, before it serves (the
    simulator attaches its observer there). Reports the bound port through
    ``task_status.started(port)``; ``on_serving`` is called once the shard serves
    (after recovering its disk topics, if it has any). Raises OSError if the port cannot be bound and
    ConfigError if ``spec.config`` is invalid or ``spec.secret`` missing.
    """
    config = config_mod.from_dict(spec.config)
    if not control_proof.valid_secret(spec.secret):
        raise errors.ConfigError("secret", "a shard needs its broker's secret from the launcher")
    shard = ShardServer(host, spec, config, pid=pid,
                        generation=generation or draw_generation(host))
    if on_start is not None:
        on_start(shard)
    if on_serving is not None:
        shard.on_serving = on_serving
    await shard.run(stop, task_status)


@asynccontextmanager
async def move_on_at(host: Host, deadline: float) -> AsyncIterator[trio.CancelScope]:
    """Like ``trio.move_on_at``, but on the host's clock (so simulated pauses apply)."""
    async def fire() -> None:
        await host.sleep_until(deadline)
        body.cancel()

    async with trio.open_nursery() as nursery:
        with trio.CancelScope() as body:
            nursery.start_soon(fire)
            yield body
        nursery.cancel_scope.cancel()


async def linger(host: Host, stream: trio.abc.Stream) -> None:
    """Half-close, then read until the peer closes (bounded), so our last frame arrives."""
    if not isinstance(stream, trio.abc.HalfCloseableStream):
        return
    async with move_on_at(host, host.now() + CLOSE_GRACE):
        try:
            await stream.send_eof()
            while await stream.receive_some(RECV_BYTES):
                pass
        except BROKEN:
            pass


async def close_with_error(host: Host, stream: trio.abc.Stream, exc: errors.FluxError) -> None:
    """Refuse a connection before serving it: ``exc`` as an ERROR with rid 0, a bounded
    linger so that it arrives, then close."""
    async with move_on_at(host, host.now() + CLOSE_GRACE):
        with suppress(*BROKEN):
            await stream.send_all(protocol.encode(protocol.error_frame(0, exc)))
    await linger(host, stream)
    await trio.aclose_forcefully(stream)


async def secure(host: Host, stream: trio.abc.Stream, context: ssl.SSLContext, timeout: float
                 ) -> tuple[trio.abc.Stream, str | None] | None:
    """TLS over an accepted client ``stream`` (flux.tls.accept), bounded by ``timeout``
    (the HELLO deadline); None, the stream closed, when it fails (a plain client got a
    plain ERROR first)."""
    secured: tuple[trio.abc.Stream, str | None] | None = None
    async with move_on_at(host, host.now() + timeout):
        try:
            secured = await tls_accept(stream, context)
        except (*BROKEN, errors.ProtocolError) as exc:
            log.info("a TLS handshake failed: %s", exc if str(exc) else repr(exc.__cause__))
    if secured is None:
        await trio.aclose_forcefully(stream)
    return secured


def format_address(host: str, port: int) -> str:
    """``host:port``, with brackets around an IPv6 host."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Connection:
    """One client stream: output waiting for the writer, and its closing state.

    Output goes straight to the socket when the writer is idle and the socket takes
    it without waiting (the host's ``try_send``): a reply or DELIVER then leaves
    in the task that made it, without a wake-up of the writer task. What does not
    fit waits in ``pending`` for the writer, behind which nothing overtakes it.
    """

    __slots__ = ("_sent", "_try_send", "_wake", "backlog", "closing", "conn", "done", "nursery",
                 "partial_head", "paused", "pending", "pending_bytes", "publishes", "sending",
                 "stream", "writing_bytes")

    def __init__(self, conn: int, stream: trio.abc.Stream, nursery: trio.Nursery,
                 try_send: Callable[[trio.abc.Stream, bytes], int]) -> None:
        self.conn = conn
        self.stream = stream
        self.nursery = nursery    # the reader, writer and close guard of this connection
        self.pending: list[bytes] = []
        self.pending_bytes = 0
        self.partial_head = False  # pending[0] is the rest of a frame begun on the socket
        self.writing_bytes = 0    # what the writer's send_all holds now
        self.backlog: list[list[Any]] = []  # frames read but not handled (output was full)
        self.paused = False       # not read: its unsent output is over the pause mark
        self.sending = False      # the writer is inside send_all (or send_eof)
        self.closing = False      # no more input is handled; flush, then close
        self.done = trio.Event()  # everything was sent (and EOF, where supported)
        self._wake = trio.Event()
        self._sent = trio.Event()
        self._try_send = try_send
        self.publishes: dict[int, float] = {}  # rid of a PUBLISH not answered yet -> arrival

    def send(self, data: bytes) -> None:
        if data and not self.done.is_set():
            if not self.pending and not self.sending:
                sent = self._try_send(self.stream, data)
                if sent == len(data):
                    return
                data = data[sent:]
                self.partial_head = sent > 0
            self.pending.append(data)
            self.pending_bytes += len(data)
            self._wake.set()

    def drop_unsent(self) -> None:
        """Forget the waiting output no byte of which has left (whole frames only): the
        connection is closing because its peer does not read it."""
        self.pending = self.pending[:1] if self.partial_head else []
        self.pending_bytes = sum(map(len, self.pending))

    @property
    def unsent(self) -> int:
        """Output bytes made for this connection and not yet taken by the socket."""
        return self.pending_bytes + self.writing_bytes

    def wake(self) -> None:
        self._wake.set()

    async def wait_wake(self) -> None:
        await self._wake.wait()
        self._wake = trio.Event()

    async def wait_sent(self) -> None:
        await self._sent.wait()

    def mark_sent(self) -> None:
        self._sent.set()
        self._sent = trio.Event()


class ShardServer:
    """One shard incarnation: a ShardCore plus its connections, ticker and router link."""

    def __init__(self, host: Host, spec: ShardSpec, config: config_mod.Config, *, pid: int,
                 generation: int) -> None:
        self.host = host
        self.spec = spec
        self.config = config
        self.pid = pid
        now = host.now()
        self.core = ShardCore(config, index=spec.index, shard_count=spec.shard_count,
                              generation=generation, now=now, epoch=host.wall_time() - now)
        self.core.secret = spec.secret  # session tokens are signed with it (flux.auth)
        self._auth = config.auth        # the auth section in force (a reload replaces it)
        self.tls = server_context(config.tls)  # None: the client port speaks plain TCP
        self._handshakes = 0  # TLS handshakes under way (they count as connections)
        self.storage: ShardStorage | None = None
        if config.storage.dir is not None:
            self.storage = ShardStorage(host, config, spec.index, spec.shard_count,
                                        lambda: draw_generation(host))
        self.conns: dict[int, Connection] = {}
        # unsent output past which a connection's requests are not read (back-pressure)
        self._pause_bytes = config.limits.max_output_bytes // 4
        self.address = ""
        self.control = spec.control   # the router's control listener
        self.control_address = ""     # ours (ADOPT)
        self.registered = False
        self.draining = False
        self._stop = trio.Event()
        self._idle = trio.Event()
        self._tick_at = math.inf
        self._tick_scope: trio.CancelScope | None = None
        self._control_wake = trio.Event()
        self._control_switch = trio.Event()
        self._recovered = trio.Event()
        self.on_serving: Callable[[], None] = lambda: None

    async def run(self, stop: trio.Event | None, task_status: Any) -> None:
        storage = self.storage
        async with trio.open_nursery() as nursery:
            if storage is not None:
                await storage.check()
                # registered and heartbeating, but answering Busy, until every disk topic
                # is rebuilt (G9): a long recovery is not taken for a shard that hangs
                self.core.recovering = "starting"
            port = await nursery.start(self.host.serve, self.config.host, self.spec.port,
                                       self._serve_connection)
            self.address = format_address(self.config.host, port)
            control_port = await nursery.start(self.host.serve, CONTROL_HOST, 0,
                                               self._serve_control)
            self.control_address = format_address(CONTROL_HOST, control_port)
            if stop is not None:
                nursery.start_soon(self._stop_on, stop)
            nursery.start_soon(self._ticker)
            nursery.start_soon(self._control_loop)
            log.info("shard %d listening on %s (generation %#x)%s", self.spec.index,
                     self.address, self.core.generation,
                     "; recovering its disk topics" if storage is not None else "")
            task_status.started(port)
            if storage is None:
                self.on_serving()
            else:
                try:
                    await storage.recover(self.core)
                    await nursery.start(storage.run, self._dispatch)
                except* (OSError, LogFailed) as group:
                    # the disk failed while recovering (a read, a cut, an fsync): exit
                    # without serving, and the restart recovers again (G9)
                    storage.recovery_failed(group.exceptions[0])
                    self.stop()
                else:
                    nursery.start_soon(self._stop_on_storage_failure, storage)
                    self.core.recovering = None
                    self._rearm()   # the cleanup passes it held back may be due now
                    self._recovered.set()   # the control link tells the router (READY)
                    log.info("shard %d recovered its disk topics; serving", self.spec.index)
                    self.on_serving()
            await self._stop.wait()
            await self._drain()
            if storage is not None:
                await storage.close()
            nursery.cancel_scope.cancel()
        if storage is not None and storage.failure is not None:
            raise StorageFailed(f"shard {self.spec.index}: {storage.failure_line()}")

    async def _stop_on_storage_failure(self, storage: ShardStorage) -> None:
        await storage.failed.wait()
        self.stop()

    def stop(self) -> None:
        """Begin the drain: refuse publishes, flush and close every connection, return."""
        self._stop.set()

    async def _stop_on(self, event: trio.Event) -> None:
        await event.wait()
        self.stop()

    async def _drain(self) -> None:
        self.draining = True
        self.core.drain()
        self._dispatch()
        bye = protocol.encode(protocol.error_frame(0, errors.ShuttingDown(
            "shard is draining; ask the router for the shard map and reconnect")))
        for c in list(self.conns.values()):
            c.send(bye)
            self._begin_close(c)
        if self.conns:
            async with move_on_at(self.host, self.host.now() + DRAIN_GRACE):
                await self._idle.wait()
        log.info("shard %d drained", self.spec.index)

    # -- client connections --------------------------------------------------------------

    async def _serve_connection(self, stream: trio.abc.Stream) -> None:
        if self.draining:
            await trio.aclose_forcefully(stream)
            return
        limit = self.config.limits.max_connections
        if len(self.conns) + self._handshakes >= limit:
            await close_with_error(self.host, stream, errors.TooManyConnections(
                f"shard {self.spec.index} holds {limit} connections (limits.max_connections);"
                " retry later"))
            return
        certificate = None
        if self.tls is not None:  # within the HELLO deadline, and counted as a connection
            self._handshakes += 1
            try:
                secured = await secure(self.host, stream, self.tls,
                                       self.config.limits.hello_timeout)
            finally:
                self._handshakes -= 1
            if secured is None:
                return
            stream, certificate = secured
        conn = self.core.connect(self.host.now(), certificate)
        self._rearm()  # its HELLO deadline may come before the ticker's next wake-up
        try:
            async with trio.open_nursery() as nursery:
                c = Connection(conn, stream, nursery, self.host.try_send)
                self.conns[conn] = c
                nursery.start_soon(self._writer, c)
                await self._reader(c)
                await c.done.wait()
                nursery.cancel_scope.cancel()
        finally:
            self.conns.pop(conn, None)
            self.core.disconnect(conn, self.host.now())
            self._dispatch()
            if self.draining and not self.conns:
                self._idle.set()
            await trio.aclose_forcefully(stream)

    async def _reader(self, c: Connection) -> None:
        decoder = protocol.FrameDecoder(self.config.max_frame_bytes)
        try:
            while True:
                if c.unsent > self._pause_bytes and not c.closing:
                    if not c.paused:
                        c.paused = True
                        self.core.pause(c.conn, True, self.host.now())
                    await c.wait_sent()  # back-pressure: the peer is not reading its replies
                    continue
                if c.paused:
                    c.paused = False
                    self.core.pause(c.conn, False, self.host.now())
                if c.backlog and not c.closing:
                    frames, c.backlog = c.backlog, []
                    self._receive(c, frames)
                    continue
                data = await c.stream.receive_some(RECV_BYTES)
                if not data:
                    break
                if c.closing:
                    continue  # linger, so that our last bytes are not lost to a reset
                try:
                    frames = decoder.feed(data)
                except errors.ProtocolError as exc:  # framing corruption (FrameTooLarge too)
                    if exc.complete_frames:
                        self._receive(c, exc.complete_frames)
                    self.core.fail(c.conn, exc, self.host.now())
                    self._dispatch()
                    continue
                if frames:
                    self._receive(c, frames)
        except BROKEN:
            c.nursery.cancel_scope.cancel()
            return
        if decoder.pending and not c.closing:
            self.core.fail(c.conn, errors.ProtocolError(
                f"the stream ended inside a frame ({decoder.pending} bytes of it arrived)"),
                self.host.now())
            self._dispatch()
        self._begin_close(c)  # the peer half-closed: answer what it sent, then close

    def _receive(self, c: Connection, frames: list[list[Any]]) -> None:
        """Handle ``frames`` in runs (RUN_FRAMES, or up to a HEAVY_KINDS request); once
        the connection's output passes the pause mark, the rest waits in its backlog."""
        core, pause, count = self.core, self._pause_bytes, len(frames)
        now = self.host.now()
        for frame in frames:  # arrivals, for publish_ack_seconds (a backlog keeps its first)
            if frame[0] == protocol.PUBLISH and len(frame) > 1 and type(frame[1]) is int:
                c.publishes.setdefault(frame[1], now)
        start = 0
        while start < count:
            end = min(count, start + RUN_FRAMES)
            for i in range(start, end):
                if frames[i][0] in HEAVY_KINDS:
                    end = i + 1
                    break
            core.receive_many(c.conn, frames[start:end] if start or end < count else frames,
                              self.host.now())
            self._dispatch()
            start = end
            if start < count and c.unsent > pause:
                c.backlog = frames[start:]
                break
        self._rearm()

    def _rearm(self) -> None:
        """Wake the ticker early when the core's next deadline moved before its wake-up."""
        if self._tick_scope is not None and self.core.next_deadline() < self._tick_at:
            self._tick_scope.cancel()

    async def _writer(self, c: Connection) -> None:
        try:
            while True:
                if c.pending:
                    data = c.pending[0] if len(c.pending) == 1 else b"".join(c.pending)
                    c.pending = []
                    c.pending_bytes = 0
                    c.partial_head = False
                    c.sending = True
                    c.writing_bytes = len(data)
                    await c.stream.send_all(data)
                    c.writing_bytes = 0
                    c.sending = False
                    c.mark_sent()
                elif c.closing:
                    break
                else:
                    await c.wait_wake()
            c.done.set()
            if isinstance(c.stream, trio.abc.HalfCloseableStream):
                c.sending = True
                await c.stream.send_eof()  # the reader lingers until the peer closes
            else:
                c.nursery.cancel_scope.cancel()
        except BROKEN:
            c.nursery.cancel_scope.cancel()

    def _begin_close(self, c: Connection) -> None:
        """Handle no more input on ``c``; flush its output, then close it (bounded)."""
        if not c.closing:
            c.closing = True
            c.mark_sent()  # release a reader waiting on back-pressure
            c.wake()
            if not c.nursery.cancel_scope.cancel_called:  # else it is ending already (a
                # drain may come while its serving nursery closes: no new task fits there)
                c.nursery.start_soon(self._close_guard, c)

    async def _close_guard(self, c: Connection) -> None:
        await self.host.sleep_until(self.host.now() + CLOSE_GRACE)
        c.nursery.cancel_scope.cancel()

    def _dispatch(self) -> None:
        """Hand the core's output to each connection's writer; close a connection whose
        unsent output passes ``limits.max_output_bytes`` (SlowConsumer)."""
        limit = self.config.limits.max_output_bytes
        overflowing: list[Connection] = []
        for conn, frames, close in self.core.take_output():
            c = self.conns.get(conn)
            if c is None:
                continue
            if frames:
                if c.publishes:
                    self._time_publish_acks(c, frames)
                c.send(protocol.encode_many(frames))
                if c.unsent > limit and not close and not c.closing:
                    overflowing.append(c)
            if close:
                self._begin_close(c)
        for c in overflowing:
            log.warning("shard %d: connection %d does not read its output (%d bytes waiting);"
                        " closing it", self.spec.index, c.conn, c.unsent)
            c.drop_unsent()  # lost with the connection anyway; the ERROR goes next
            self.core.fail(c.conn, errors.SlowConsumer(
                f"more than {limit} bytes of replies and deliveries waited unread"
                " (limits.max_output_bytes); closing"), self.host.now())
        if overflowing:
            self._dispatch()

    def _time_publish_acks(self, c: Connection, frames: list[list[Any]]) -> None:
        """Observe each answered PUBLISH's time from arrival to its reply (an ERROR
        reply is no ack: it is only forgotten)."""
        now = self.host.now()
        for frame in frames:
            if frame[0] == protocol.PUBLISHED or frame[0] == protocol.ERROR:
                started = c.publishes.pop(frame[1], None)
                if started is not None and frame[0] == protocol.PUBLISHED:
                    self.core.publish_acks.observe(now - started)

    async def _serve_control(self, stream: trio.abc.Stream) -> None:
        """One connection to this shard's control listener: a router's ADOPT.

        We CHALLENGE first; an ADOPT counts only with the router's proof of the broker
        secret (flux.control_proof), and ADOPTED proves ours back. One exchange per
        connection, bounded by ``CONTROL_TIMEOUT``.
        """
        secret = self.spec.secret
        ours = control_proof.new_nonce(self.host)
        decoder = protocol.FrameDecoder(CONTROL_MAX_FRAME)
        try:
            async with move_on_at(self.host, self.host.now() + CONTROL_TIMEOUT):
                await stream.send_all(protocol.encode([protocol.CHALLENGE, 0, {"nonce": ours}]))
                frames: list[list[Any]] = []
                while not frames:
                    data = await stream.receive_some(RECV_BYTES)
                    if not data:
                        return
                    frames = decoder.feed(data)
                frame = frames[0]
                rid = frame[1] if len(frame) > 1 and type(frame[1]) is int else 0
                body = frame[2] if len(frame) > 2 and isinstance(frame[2], dict) else {}
                control, theirs = body.get("control"), control_proof.nonce_of(body)
                if frame[0] != protocol.ADOPT:
                    error: errors.FluxError = errors.InvalidRequest(
                        "a shard's control listener takes only ADOPT")
                elif (not isinstance(control, str) or theirs is None
                      or not control_proof.check(secret, body.get("proof"), control_proof.ADOPT,
                                                 ours, theirs, control.encode())):
                    log.warning("shard %d: refused an ADOPT that did not prove the broker"
                                " secret", self.spec.index)
                    error = errors.NotAuthorized(
                        "ADOPT must prove the broker's secret (only the broker's router adopts)")
                else:
                    try:
                        protocol.parse_address(control)
                    except ValueError as exc:
                        error = errors.InvalidRequest(f"ADOPT needs a control 'host:port': {exc}")
                    else:
                        self._adopt(control)
                        proof = control_proof.prove(secret, control_proof.ADOPTED, theirs, ours)
                        await stream.send_all(protocol.encode(
                            [protocol.ADOPTED, rid, {"proof": proof}]))
                        return
                await stream.send_all(protocol.encode(protocol.error_frame(rid, error)))
        except* (*BROKEN, errors.ProtocolError):  # move_on_at's nursery groups them
            pass
        finally:
            await trio.aclose_forcefully(stream)

    def _adopt(self, control: str) -> None:
        """A restarted router (proven) asks this shard to register at ``control``."""
        if control != self.control:
            log.info("shard %d: adopted; control address %s -> %s", self.spec.index,
                     self.control, control)
            self.control = control
            self._control_switch.set()
        self._control_wake.set()

    # -- time --------------------------------------------------------------------------

    async def _ticker(self) -> None:
        core = self.core
        while True:
            self._tick_at = core.next_deadline()
            with trio.CancelScope() as scope:
                self._tick_scope = scope
                await self.host.sleep_until(self._tick_at)
            self._tick_scope = None
            now = self.host.now()
            if now >= core.next_deadline():
                core.tick(now)
                self._dispatch()

    # -- the router link ---------------------------------------------------------------

    async def _control_loop(self) -> None:
        """Stay registered with a router; exit the shard after ``orphan_timeout`` without one."""
        orphan_since = self.host.now()
        backoff = BACKOFF_MIN
        while True:
            self._control_wake = trio.Event()
            self._control_switch = trio.Event()
            address = self.control
            stream = await self._dial(address)
            if stream is not None:
                try:
                    await self._control_session(stream)
                finally:
                    await trio.aclose_forcefully(stream)
                if self.registered:
                    self.registered = False
                    orphan_since = self.host.now()
                    backoff = BACKOFF_MIN
                    log.warning("shard %d: lost the router at %s; redialling", self.spec.index,
                                address)
            now = self.host.now()
            give_up = orphan_since + self.config.shard.orphan_timeout
            if now >= give_up:
                log.warning("shard %d: no router for %gs (shard.orphan_timeout); exiting",
                            self.spec.index, self.config.shard.orphan_timeout)
                self.stop()
                return
            if self.control == address:
                async with move_on_at(self.host, min(now + backoff, give_up)):
                    await self._control_wake.wait()
                backoff = min(backoff * 2, BACKOFF_MAX)

    async def _dial(self, address: str) -> trio.abc.Stream | None:
        try:
            host, port = protocol.parse_address(address)
        except ValueError:
            log.error("shard %d: bad control address %r", self.spec.index, address)
            return None
        async with move_on_at(self.host, self.host.now() + CONNECT_TIMEOUT):
            try:
                return await self.host.connect(host, port)
            except OSError:
                return None
        return None

    async def _control_session(self, stream: trio.abc.Stream) -> None:
        """One connection to the router's control listener: answer its CHALLENGE with a
        REGISTER that proves the broker secret, believe it only once its answer proves
        the secret back, then heartbeat until it ends."""
        heartbeat = self.config.subscriber.heartbeat
        decoder = protocol.FrameDecoder(self.config.max_frame_bytes)
        last_heard = [self.host.now()]
        link = _RouterLink(control_proof.new_nonce(self.host))
        sending = trio.Lock()  # the pinger, READY and REGISTER share the stream

        async def send(frame: list[Any]) -> None:
            async with sending:
                await stream.send_all(protocol.encode(frame))

        async def pinger(scope: trio.CancelScope) -> None:
            rid = 1
            while True:
                await self.host.sleep_until(self.host.now() + heartbeat)
                if self.host.now() - last_heard[0] > 3 * heartbeat:
                    log.warning("shard %d: the router is silent; reconnecting", self.spec.index)
                    scope.cancel()
                    return
                if link.proven:
                    rid += 1
                    await send([protocol.PING, rid])

        async def switch(scope: trio.CancelScope) -> None:
            await self._control_switch.wait()
            scope.cancel()

        async def ready() -> None:
            """Registered while recovering: say READY once the recovery is over."""
            await self._recovered.wait()
            await link.registered.wait()
            if link.recovering:
                await send([protocol.READY, 0])

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pinger, nursery.cancel_scope)
                nursery.start_soon(switch, nursery.cancel_scope)
                nursery.start_soon(ready)
                while True:
                    data = await stream.receive_some(RECV_BYTES)
                    if not data:
                        break
                    last_heard[0] = self.host.now()
                    for frame in decoder.feed(data):
                        if frame[0] == protocol.CHALLENGE and link.challenge is None:
                            await send(self._register(link, frame))
                        elif not self._control_frame(frame, link):
                            nursery.cancel_scope.cancel()
                            return
                nursery.cancel_scope.cancel()
        except* (*BROKEN, errors.ProtocolError):  # also when raised by the pinger or reader
            pass

    def _register(self, link: _RouterLink, challenge: list[Any]) -> list[Any]:
        """The REGISTER answering the router's CHALLENGE, with our proof."""
        body = challenge[2] if len(challenge) > 2 and isinstance(challenge[2], dict) else {}
        link.challenge = control_proof.nonce_of(body) or b""
        fields: dict[str, Any] = {
            "index": self.spec.index, "pid": self.pid, "generation": self.core.generation,
            "address": self.address, "advertise": self.spec.advertise or self.address,
            "shard_count": self.spec.shard_count, "control": self.control_address}
        proof = control_proof.prove(self.spec.secret, control_proof.REGISTER, link.challenge,
                                    link.nonce, control_proof.register_fields(fields))
        link.recovering = self.core.recovering is not None
        return [protocol.REGISTER, 1, {**fields, "recovering": link.recovering,
                                       "nonce": link.nonce, "proof": proof}]

    def _control_frame(self, frame: list[Any], link: _RouterLink) -> bool:
        """Handle one frame from the router; False ends the control session."""
        kind = frame[0]
        if kind == protocol.ERROR:
            exc = protocol.error_from_frame(frame)
            log.error("shard %d: the router refused it: %s", self.spec.index, exc)
            return False
        if not link.proven:
            body = frame[2] if len(frame) > 2 and isinstance(frame[2], dict) else {}
            if (kind not in (protocol.REGISTERED, protocol.DRAIN) or link.challenge is None
                    or not control_proof.check(self.spec.secret, body.get("proof"),
                                               control_proof.REGISTERED, link.nonce,
                                               link.challenge)):
                log.error("shard %d: the router at %s did not prove the broker secret;"
                          " dropping it", self.spec.index, self.control)
                return False
            link.proven = True
        if kind == protocol.REGISTERED:
            if not self.registered:
                log.info("shard %d: registered with the router at %s", self.spec.index,
                         self.control)
            self.registered = True
            link.registered.set()
            self._reload_auth(frame)  # a restarted router may hold a newer auth section
        elif kind == protocol.AUTH:
            self._reload_auth(frame)
        elif kind == protocol.DRAIN:
            log.info("shard %d: the router asked it to drain", self.spec.index)
            self.stop()
        return True


    def _reload_auth(self, frame: list[Any]) -> None:
        """Apply the router's ``auth`` section and TLS certificates (REGISTERED, or AUTH
        after a SIGHUP)."""
        body = frame[2] if len(frame) > 2 and isinstance(frame[2], dict) else {}
        if "tls" in body:  # AUTH: the files may have changed at the same paths
            self._reload_tls(body["tls"], again=frame[0] == protocol.AUTH)
        if "auth" not in body:
            return
        try:
            auth = parse_auth(body["auth"])
        except errors.ConfigError as exc:
            log.error("shard %d: the router sent an invalid auth section: %s", self.spec.index,
                      exc)
            return
        if auth != self._auth:
            log.info("shard %d: auth reloaded (%d users)", self.spec.index, len(auth.users))
            self._auth = auth
            self.core.reload_auth(auth, self.host.now())
            self._dispatch()


    def _reload_tls(self, raw: Any, again: bool) -> None:
        """Load the certificates the router's ``tls`` section names (``again``: even at
        the paths in force), for the connections accepted from now on (open ones keep
        theirs). One that cannot be loaded here is logged and the running one kept; TLS
        is never turned on or off."""
        try:
            tls = config_mod.parse_tls(raw)
            if tls.enabled != self.config.tls.enabled or (tls == self.config.tls
                                                          and not again):
                return
            context = server_context(tls)
        except errors.ConfigError as exc:
            log.error("shard %d: cannot load the reloaded TLS certificates, keeping the"
                      " running ones: %s", self.spec.index, exc)
            return
        self.tls = context
        self.config = dataclasses.replace(self.config, tls=tls)
        log.info("shard %d: TLS reloaded (%s)", self.spec.index, tls.cert)


class _RouterLink:
    """The shard's side of one control connection's handshake."""

    __slots__ = ("challenge", "nonce", "proven", "recovering", "registered")

    def __init__(self, nonce: bytes) -> None:
        self.nonce = nonce                    # ours, sent in REGISTER
        self.challenge: bytes | None = None   # the router's, from CHALLENGE
        self.proven = False                   # the router proved the secret
        self.recovering = False               # REGISTER said the shard was recovering
        self.registered = trio.Event()        # REGISTERED came
