"""The router: supervises the shards and keeps the shard map clients ask for.

Lives here: launching, restarting, watching and adopting shards, and the drain on
stop. The listeners are :mod:`flux.router.public` (clients) and
:mod:`flux.router.control` (shards); how a shard starts is
:mod:`flux.router.launcher`; where adoption state is kept, :mod:`flux.router.state`.
The router holds no messages: clients talk to shards directly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from collections.abc import Callable
from typing import Any

import trio

from flux import control_proof, errors, protocol
from flux.auth import sessions
from flux.auth.login import Logins
from flux.auth.users import AuthConfig
from flux.config import Config, TlsConfig
from flux.host import Host, Launcher, ShardProcess, ShardSpec
from flux.router.control import ControlLink, ShardInfo, serve_control
from flux.router.public import serve_client
from flux.router.state import STATE_VERSION, StateStore
from flux.shard.server import (
    BROKEN,
    CONTROL_HOST,
    CONTROL_MAX_FRAME,
    RECV_BYTES,
    format_address,
    move_on_at,
)
from flux.tls import internal_context, server_context

log = logging.getLogger("flux.router")

STARTUP_WAIT = 30.0         # seconds run_router waits for first registrations before started()
REGISTER_TIMEOUT = 30.0     # seconds a started shard may take to register before it is killed
SILENT_HEARTBEATS = 3       # heartbeats without a frame before a registered shard is replaced
DRAIN_TIMEOUT = 10.0        # seconds drained shards get to exit before SIGKILL
KILL_TIMEOUT = 5.0
SEND_TIMEOUT = 2.0
RESTART_BACKOFF_MAX = 5.0


@dataclasses.dataclass(frozen=True)
class RouterInfo:
    """What ``run_router`` reports through ``task_status.started``."""

    address: str
    port: int
    control: str
    shards: tuple[ShardInfo | None, ...]  # None: not registered (yet)


@dataclasses.dataclass(eq=False)
class Slot:
    """One shard index: the process serving it and its registration."""

    index: int
    port: int                                  # where the next incarnation listens
    proc: ShardProcess | None = None
    since: float = 0.0                         # when proc was launched or adopted
    launching: bool = False
    killing: int | None = None                 # pid already sent SIGKILL
    info: ShardInfo | None = None
    link: ControlLink | None = None
    last_seen: float = 0.0
    restarts: int = 0


async def run_router(host: Host, config: Config, launcher: Launcher, *,
                     state: Callable[[int], StateStore] | None = None,
                     stop: trio.Event | None = None,
                     task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Run the router until ``stop`` is set, then drain every shard and return.

    ``state(public_port)`` gives the store used to adopt the shards of a previous
    router on the same port. Reports a :class:`RouterInfo` through ``task_status``
    once the shards registered (or ``STARTUP_WAIT`` passed). Raises OSError if a
    listener cannot be bound.
    """
    await Router(host, config, launcher, state).run(stop, task_status)


class Router:
    """The router's state: one :class:`Slot` per shard index, and its listeners' ports."""

    def __init__(self, host: Host, config: Config, launcher: Launcher,
                 state: Callable[[int], StateStore] | None) -> None:
        self.host = host
        self.config = config
        self.launcher = launcher
        self.state_factory = state
        self.store: StateStore | None = None
        self.shard_count = config.shard_count
        ports = config.shard.ports
        self.slots = [Slot(i, 0 if isinstance(ports, str) else ports[i])
                      for i in range(self.shard_count)]
        self.port = 0
        self.clients = 0  # open client connections on the public port
        self.control = ""
        self.secret = ""  # the broker's (flux.control_proof); set before any shard starts
        self.logins = Logins(host)  # password logins (G13), rate-limited per address
        self.tls = server_context(config.tls)  # None: the public port speaks plain TCP
        # the broker's own client connections to its shards (the monitor's)
        self.internal_tls = internal_context(config.tls)
        self.stopping = False
        self.may_launch = False
        self.saving = False
        self._stop = trio.Event()
        self._changed = trio.Event()

    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set() or self.stopping

    def notify(self) -> None:
        """Wake everything waiting on a change of the shards (and save the state)."""
        self._changed.set()
        self._changed = trio.Event()
        self._save()

    async def run(self, stop: trio.Event | None, task_status: Any) -> None:
        cfg = self.config
        async with trio.open_nursery() as nursery:
            self.port = await nursery.start(self.host.serve, cfg.host, cfg.port,
                                            functools.partial(serve_client, self))
            self.store = self.state_factory(self.port) if self.state_factory else None
            previous = self.store.load() if self.store else None
            if previous is not None and previous.get("shard_count") != self.shard_count:
                log.warning("previous router ran %s shards, not %d: not adopting",
                            previous.get("shard_count"), self.shard_count)
                previous = None
            if previous is not None and not control_proof.valid_secret(previous.get("secret")):
                log.warning("previous router state holds no broker secret: not adopting")
                previous = None
            # the previous router's shards know its secret; a fresh start draws a new one
            self.secret = (previous["secret"] if previous is not None
                           else control_proof.new_secret(self.host))
            self.control = await self._listen_control(nursery, previous)
            if previous is None:
                self.saving = True
                self._save()
            if stop is not None:
                nursery.start_soon(self._stop_on, stop)
            for slot in self.slots:
                nursery.start_soon(self._supervise, slot)
            if previous is not None:
                await self._adopt(previous)
            # the previous state is kept until adoption is over, for a router that dies meanwhile
            self.saving = True
            self.may_launch = True
            self.notify()
            nursery.start_soon(self._watchdog)
            await self.wait_registered(self.host.now() + STARTUP_WAIT)
            task_status.started(self.info())
            await self._stop.wait()
            await self._drain()
            nursery.cancel_scope.cancel()

    async def _stop_on(self, event: trio.Event) -> None:
        await event.wait()
        self._stop.set()
        self.notify()

    def info(self) -> RouterInfo:
        return RouterInfo(format_address(self.config.host, self.port), self.port, self.control,
                          tuple(slot.info for slot in self.slots))

    async def _listen_control(self, nursery: trio.Nursery, previous: dict[str, Any] | None) -> str:
        handler = functools.partial(serve_control, self)
        port = self.config.router.control_port
        if not port and previous is not None:
            try:  # the previous router's shards keep redialling its control port
                old = protocol.parse_address(str(previous.get("control")))[1]
                port = await nursery.start(self.host.serve, CONTROL_HOST, old, handler)
                return format_address(CONTROL_HOST, port)
            except (OSError, ValueError) as exc:
                log.warning("cannot reuse the previous control port: %s", exc)
        port = await nursery.start(self.host.serve, CONTROL_HOST, port, handler)
        return format_address(CONTROL_HOST, port)

    def _save(self) -> None:
        if self.store is None or not self.saving:
            return
        shards = []
        for slot in self.slots:
            if slot.info is not None:
                shards.append(dataclasses.asdict(slot.info))
            elif slot.proc is not None:
                shards.append({"index": slot.index, "pid": slot.proc.pid})
        self.store.save({"version": STATE_VERSION, "port": self.port, "control": self.control,
                         "shard_count": self.shard_count, "secret": self.secret,
                         "shards": shards})

    # -- adoption ----------------------------------------------------------------------

    async def _adopt(self, previous: dict[str, Any]) -> None:
        """Wait ``adopt_window`` for the previous router's shards to register with us."""
        window = self.config.router.adopt_window
        recorded = [e for e in previous.get("shards", []) if isinstance(e, dict)
                    and isinstance(e.get("index"), int) and 0 <= e["index"] < self.shard_count]
        running = sorted({e["index"] for e in recorded if self._running(e)})
        if not running:
            log.info("no shard of the previous router is running; starting afresh")
            return
        log.info("adopting shards %s of a previous router (waiting up to %gs)", running, window)
        deadline = self.host.now() + window
        async with trio.open_nursery() as nursery:
            for entry in recorded:
                if isinstance(entry.get("control"), str):
                    nursery.start_soon(self._send_adopt, entry["index"], entry["control"])
            await self.wait_registered(deadline, running)
            nursery.cancel_scope.cancel()
        for entry in recorded:
            slot = self.slots[entry["index"]]
            address = entry.get("address")
            if (isinstance(address, str) and isinstance(self.config.shard.ports, str)
                    and slot.info is None):
                with contextlib.suppress(ValueError):  # clients know this address: keep it
                    slot.port = protocol.parse_address(address)[1]
            pid = entry.get("pid")
            if slot.proc is None and isinstance(pid, int):
                try:  # alive but silent: kill it and confirm before replacing it
                    proc = self.launcher.adopt(slot.index, pid)
                except (ProcessLookupError, OSError):
                    continue
                log.warning("shard %d (pid %d) did not register; replacing it", slot.index, pid)
                slot.proc, slot.since, slot.killing = proc, self.host.now(), pid
                proc.kill()
        self.notify()

    def _running(self, entry: dict[str, Any]) -> bool:
        pid = entry.get("pid")
        try:
            return isinstance(pid, int) and self.launcher.adopt(entry["index"], pid) is not None
        except (ProcessLookupError, OSError):
            return False

    async def _send_adopt(self, index: int, address: str) -> None:
        """Tell the shard whose control listener is at ``address`` to register with us.

        The shard challenges us first and believes ADOPT only with our proof of the
        broker secret; its ADOPTED proves it back. Failures are logged: a shard that
        does not register in ``adopt_window`` is replaced anyway.
        """
        try:
            host, port = protocol.parse_address(address)
        except ValueError:
            return
        async with move_on_at(self.host, self.host.now() + SEND_TIMEOUT):
            try:
                stream = await self.host.connect(host, port)
                try:
                    decoder = protocol.FrameDecoder(CONTROL_MAX_FRAME)
                    challenge = await _next_frame(stream, decoder)
                    theirs = control_proof.nonce_of(_body(challenge))
                    if challenge[0] != protocol.CHALLENGE or theirs is None:
                        log.warning("shard %d's control listener at %s sent no CHALLENGE",
                                    index, address)
                        return
                    ours = control_proof.new_nonce(self.host)
                    proof = control_proof.prove(self.secret, control_proof.ADOPT, theirs, ours,
                                                self.control.encode())
                    await stream.send_all(protocol.encode(
                        [protocol.ADOPT, 1, {"control": self.control, "nonce": ours,
                                             "proof": proof}]))
                    reply = await _next_frame(stream, decoder)
                    if reply[0] == protocol.ADOPTED and control_proof.check(
                            self.secret, _body(reply).get("proof"), control_proof.ADOPTED,
                            ours, theirs):
                        log.info("shard %d at %s took the adoption", index, address)
                    else:
                        log.warning("shard %d at %s refused the adoption: %r", index, address,
                                    reply)
                finally:
                    await trio.aclose_forcefully(stream)
            except (*BROKEN, errors.ProtocolError, EOFError):
                pass

    # -- supervision -------------------------------------------------------------------

    def _spec(self, slot: Slot) -> ShardSpec:
        advertise = self.config.shard.advertise
        return ShardSpec(index=slot.index, shard_count=self.shard_count, port=slot.port,
                         control=self.control,
                         advertise=advertise[slot.index] if advertise else None,
                         config=self.config.to_dict(), cpu=slot.index, secret=self.secret)

    async def _supervise(self, slot: Slot) -> None:
        """Keep one process serving ``slot``: launch it, wait for its exit, restart it."""
        delay = 0.0
        while not self.stopping:
            until = self.host.now() + delay
            while slot.proc is None and not self.stopping and (
                    not self.may_launch or self.host.now() < until):
                changed = self._changed  # an adoption, the end of the adopt phase, or stop
                async with move_on_at(self.host, until if self.may_launch else until + 3600):
                    await changed.wait()
            if self.stopping:
                return
            if slot.proc is None:
                slot.launching = True
                try:
                    proc = await self.launcher.launch(self._spec(slot))
                except OSError as exc:
                    log.error("cannot start shard %d: %s", slot.index, exc)
                    delay = RESTART_BACKOFF_MAX
                    continue
                finally:
                    slot.launching = False
                slot.proc, slot.since, slot.killing = proc, self.host.now(), None
                self.notify()
                if self.stopping:
                    proc.terminate()
            proc = slot.proc
            assert proc is not None
            status = await proc.wait()
            registered = slot.info is not None and slot.info.pid == proc.pid
            ran = self.host.now() - slot.since
            if slot.proc is proc:
                slot.proc, slot.killing = None, None
            if registered:
                slot.info, slot.link = None, None
            self.notify()
            if self.stopping:
                return
            slot.restarts += 1
            log.warning("shard %d (pid %d) exited with status %s; restarting", slot.index,
                        proc.pid, status)
            if not registered and isinstance(self.config.shard.ports, str):
                slot.port = 0  # maybe its old port is taken: let the next one pick a free one
            delay = 0.0 if registered and ran >= 1.0 else min(max(0.2, 2 * delay),
                                                              RESTART_BACKOFF_MAX)

    async def _watchdog(self) -> None:
        """Kill a shard that stopped heart-beating (or never registered); its exit restarts it."""
        heartbeat = self.config.subscriber.heartbeat
        while not self.stopping:
            await self.host.sleep_until(self.host.now() + heartbeat / 2)
            now = self.host.now()
            for slot in self.slots:
                proc = slot.proc
                if proc is None or slot.killing == proc.pid or self.stopping:
                    continue
                if slot.info is not None and slot.info.pid == proc.pid:
                    silent = now - slot.last_seen
                    if silent <= SILENT_HEARTBEATS * heartbeat:
                        continue
                    log.warning("shard %d (pid %d) silent for %.1fs; killing it", slot.index,
                                proc.pid, silent)
                elif now - slot.since > REGISTER_TIMEOUT:
                    log.warning("shard %d (pid %d) did not register within %gs; killing it",
                                slot.index, proc.pid, REGISTER_TIMEOUT)
                else:
                    continue
                slot.killing = proc.pid
                proc.kill()

    def broker_hello(self) -> dict[str, Any]:
        """HELLO fields of the broker's own connections to its shards (the monitor): with
        auth on, a session token of the broker itself (flux.auth.sessions)."""
        auth = self.config.auth
        if not auth.enabled:
            return {}
        expires = self.host.wall_time() + auth.session_ttl
        return {"session": sessions.issue(self.secret, sessions.BROKER, b"", expires)}

    async def reload_auth(self, auth: AuthConfig, tls: TlsConfig | None = None) -> None:
        """Put a reloaded ``auth`` section, and the certificates ``tls`` names, in force
        (SIGHUP): here, in every registered shard (AUTH on its control link) and in the
        shards started from now on. Connections open keep the certificate they shook
        hands with. A ``tls`` that turns TLS on or off, or whose files do not load, is
        logged and the running certificates are kept."""
        body: dict[str, Any] = {"auth": auth.to_dict()}
        if tls is not None and self._reload_tls(tls):
            body["tls"] = tls.to_dict()
        self.config = dataclasses.replace(self.config, auth=auth)
        frame = [protocol.AUTH, 0, body]
        for slot in self.slots:
            if slot.link is not None:  # a shard that misses it gets it when it registers
                async with move_on_at(self.host, self.host.now() + SEND_TIMEOUT):
                    with contextlib.suppress(*BROKEN):
                        await slot.link.send(frame)
        log.info("auth reloaded: %d users", len(auth.users))

    def _reload_tls(self, tls: TlsConfig) -> bool:
        """Load the certificates of a reloaded ``tls`` section for new connections;
        False (logged, the running ones kept) when they cannot be put in force."""
        if tls.enabled != self.config.tls.enabled:
            log.error("SIGHUP: turning TLS %s needs a restart (clients change their URLs);"
                      " keeping the running TLS settings", "on" if tls.enabled else "off")
            return False
        if not tls.enabled:
            return False
        try:
            context = server_context(tls)
        except errors.ConfigError as exc:
            log.error("SIGHUP: %s; keeping the running certificate", exc)
            return False
        self.tls = context
        self.internal_tls = internal_context(tls)
        self.config = dataclasses.replace(self.config, tls=tls)
        log.info("TLS reloaded: %s", tls.cert)
        return True

    async def wait_registered(self, deadline: float, indices: list[int] | None = None) -> bool:
        """Wait until every shard (or those of ``indices``) is registered.

        Returns False at ``deadline`` or when a stop is requested.
        """
        slots = self.slots if indices is None else [self.slots[i] for i in indices]
        while any(slot.info is None for slot in slots):
            if self._stop.is_set() or self.host.now() >= deadline:
                return False
            changed = self._changed
            async with move_on_at(self.host, deadline):
                await changed.wait()
        return True

    # -- stopping ----------------------------------------------------------------------

    async def _drain(self) -> None:
        """DRAIN every shard, wait for their exits (bounded), SIGKILL stragglers."""
        self.stopping = True
        self.notify()
        log.info("draining %d shards", sum(s.proc is not None for s in self.slots))
        async with trio.open_nursery() as nursery:
            for slot in self.slots:
                nursery.start_soon(self._drain_one, slot)
        if not await self._wait_exited(self.host.now() + DRAIN_TIMEOUT):
            for slot in self.slots:
                if slot.proc is not None:
                    log.warning("shard %d (pid %d) did not exit; killing it", slot.index,
                                slot.proc.pid)
                    slot.proc.kill()
            await self._wait_exited(self.host.now() + KILL_TIMEOUT)
        if self.store is not None:
            self.store.clear()

    async def _drain_one(self, slot: Slot) -> None:
        proc, link = slot.proc, slot.link
        if proc is None:
            return
        if link is not None and slot.info is not None and slot.info.pid == proc.pid:
            async with move_on_at(self.host, self.host.now() + SEND_TIMEOUT):
                try:
                    await link.send([protocol.DRAIN, 0])
                    return
                except BROKEN:
                    pass
        proc.terminate()

    async def _wait_exited(self, deadline: float) -> bool:
        while any(slot.proc is not None for slot in self.slots):
            if self.host.now() >= deadline:
                return False
            changed = self._changed
            async with move_on_at(self.host, deadline):
                await changed.wait()
        return True




async def _next_frame(stream: trio.abc.Stream, decoder: protocol.FrameDecoder) -> list[Any]:
    """The next frame on ``stream``; EOFError if it closes first (one frame at a time:
    control exchanges are strictly request and answer)."""
    while True:
        data = await stream.receive_some(RECV_BYTES)
        if not data:
            raise EOFError("the peer closed the control connection")
        frames = decoder.feed(data)
        if frames:
            return frames[0]


def _body(frame: list[Any]) -> dict[str, Any]:
    return frame[2] if len(frame) > 2 and isinstance(frame[2], dict) else {}
