"""The router's control listener: shards REGISTER here, heartbeat, and are told to DRAIN.

Only a REGISTER that proves the broker's secret (:mod:`flux.control_proof`) is
heard, and our answer proves it back.

A registration is accepted from the process the router started for that index,
or adopted (by pid) when the index has no process; any other registrant is told
to drain, so two shards never serve one index. Supervision lives in
:mod:`flux.router.router`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import TYPE_CHECKING, Any

import trio

from flux import control_proof, errors, protocol
from flux.shard.server import BROKEN, CONTROL_MAX_FRAME, RECV_BYTES, move_on_at

if TYPE_CHECKING:
    from flux.router.router import Router, Slot

log = logging.getLogger("flux.router")

SEND_TIMEOUT = 2.0
HANDSHAKE_TIMEOUT = 10.0  # seconds a control connection has to REGISTER


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """A registered shard, as the router reports it."""

    index: int
    pid: int
    generation: int
    address: str      # where it listens
    advertise: str    # what clients are told
    control: str = ""  # its control listener (ADOPT), on loopback
    recovering: bool = False  # registered while recovering its disk topics (until READY)


class ControlLink:
    """The router's end of one shard's control connection."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self._lock = trio.Lock()

    async def send(self, frame: list[Any]) -> None:
        async with self._lock:
            await self.stream.send_all(protocol.encode(frame))


async def serve_control(router: Router, stream: trio.abc.Stream) -> None:
    """Handle one shard's control connection until it closes.

    The connection opens with our CHALLENGE; a REGISTER proving the broker secret
    (:mod:`flux.control_proof`) must follow within ``HANDSHAKE_TIMEOUT``.
    """
    link = ControlLink(stream)
    decoder = protocol.FrameDecoder(CONTROL_MAX_FRAME)  # whoever dialled, it buffers little
    nonce = control_proof.new_nonce(router.host)
    slot: Slot | None = None
    try:
        await link.send([protocol.CHALLENGE, 0, {"nonce": nonce}])
        frames: list[list[Any]] = []
        async with move_on_at(router.host, router.host.now() + HANDSHAKE_TIMEOUT):
            while slot is None:
                data = await stream.receive_some(RECV_BYTES)
                if not data:
                    return
                frames = decoder.feed(data)
                while frames and slot is None:
                    frame = frames.pop(0)
                    rid = _rid(frame)
                    if frame[0] != protocol.REGISTER:
                        await link.send(protocol.error_frame(rid, errors.InvalidRequest(
                            "the control port expects REGISTER first")))
                        continue
                    slot = await register(router, link, rid, frame, nonce)
                    if slot is None:
                        return
        if slot is None:
            log.warning("a control connection sent no REGISTER within %gs; closing it",
                        HANDSHAKE_TIMEOUT)
            return
        while True:
            for frame in frames:
                await _registered_frame(router, link, slot, frame)
            data = await stream.receive_some(RECV_BYTES)
            if not data:
                break
            frames = decoder.feed(data)
    except* errors.ProtocolError as group:  # grouped when raised inside move_on_at
        async with move_on_at(router.host, router.host.now() + SEND_TIMEOUT):
            with contextlib.suppress(*BROKEN):
                await link.send(protocol.error_frame(0, _first(group)))
    except* BROKEN:
        pass
    finally:
        if slot is not None and slot.link is link:
            slot.link = None
        await trio.aclose_forcefully(stream)


def _first(group: BaseExceptionGroup[errors.ProtocolError]) -> errors.ProtocolError:
    """The first ProtocolError of ``group`` (possibly nested)."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    assert isinstance(exc, errors.ProtocolError)
    return exc


def _rid(frame: list[Any]) -> int:
    return frame[1] if len(frame) > 1 and type(frame[1]) is int else 0


async def _registered_frame(router: Router, link: ControlLink, slot: Slot,
                            frame: list[Any]) -> None:
    """One frame from a registered shard: a heartbeat (PING), or an error."""
    if slot.link is not link:  # a newer connection registered this index
        await link.send(protocol.error_frame(_rid(frame), errors.InvalidRequest(
            "this connection no longer holds the shard's registration; register again")))
        return
    slot.last_seen = router.host.now()
    if frame[0] == protocol.PING:
        await link.send([protocol.PONG, _rid(frame)])
    elif frame[0] == protocol.READY:
        if slot.info is not None and slot.info.recovering:
            slot.info = dataclasses.replace(slot.info, recovering=False)
            log.info("shard %d recovered its disk topics", slot.index)
            router.notify()
    elif frame[0] == protocol.REGISTER:
        await link.send(protocol.error_frame(_rid(frame), errors.InvalidRequest(
            "this connection is registered already")))


def _valid_address(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        protocol.parse_address(value)
    except (ValueError, TypeError, AttributeError):
        return False
    return True


async def register(router: Router, link: ControlLink, rid: int, frame: list[Any],
                   nonce: bytes) -> Slot | None:
    """Accept, adopt or refuse a REGISTER answering our CHALLENGE ``nonce``; returns the
    shard's slot if accepted. A REGISTER that does not prove the broker secret is
    refused with NotAuthorized and changes nothing."""
    body = frame[2] if len(frame) > 2 and isinstance(frame[2], dict) else {}
    theirs = control_proof.nonce_of(body)
    if theirs is None or not control_proof.check(
            router.secret, body.get("proof"), control_proof.REGISTER, nonce, theirs,
            control_proof.register_fields(body)):
        log.warning("refusing a REGISTER (shard %r, pid %r) that did not prove the broker"
                    " secret", body.get("index"), body.get("pid"))
        await link.send(protocol.error_frame(rid, errors.NotAuthorized(
            "REGISTER must prove the broker's secret (only the broker's shards register)")))
        return None
    answer = control_proof.prove(router.secret, control_proof.REGISTERED, theirs, nonce)
    index, pid, generation, shard_count = (
        body.get(k) for k in ("index", "pid", "generation", "shard_count"))
    address, advertise, control = body.get("address"), body.get("advertise"), body.get("control")
    if (type(index) is not int or type(pid) is not int or type(generation) is not int
            or type(shard_count) is not int or not _valid_address(address)
            or not _valid_address(advertise) or not _valid_address(control)):
        await link.send(protocol.error_frame(rid, errors.InvalidRequest(
            "REGISTER needs {index, pid, generation, shard_count: int,"
            " address, advertise, control: 'host:port'}")))
        return None
    assert isinstance(address, str) and isinstance(advertise, str) and isinstance(control, str)
    if shard_count != router.shard_count or not 0 <= index < shard_count:
        return await _refuse(link, rid, index, pid, answer,
                             f"this router runs {router.shard_count} shards")
    if router.stopping:
        return await _refuse(link, rid, index, pid, answer, "the router is stopping")
    slot = router.slots[index]
    now = router.host.now()
    if slot.proc is None and not slot.launching:
        try:
            slot.proc = router.launcher.adopt(index, pid)
        except (ProcessLookupError, OSError) as exc:
            return await _refuse(link, rid, index, pid, answer, str(exc))
        slot.since, slot.killing = now, None
        log.info("adopted shard %d (pid %d, generation %#x)", index, pid, generation)
    elif slot.proc is None or slot.proc.pid != pid:
        owner = f"pid {slot.proc.pid}" if slot.proc is not None else "a shard being started"
        return await _refuse(link, rid, index, pid, answer,
                             f"shard {index} is served by {owner}")
    slot.info = ShardInfo(index, pid, generation, address, advertise, control,
                          recovering=body.get("recovering") is True)
    slot.link, slot.last_seen = link, now
    if isinstance(router.config.shard.ports, str):
        slot.port = protocol.parse_address(address)[1]  # a restart keeps the known address
    # the auth section and certificates in force: a shard adopted by a restarted router
    # takes this one's
    reply: dict[str, Any] = {"proof": answer, "auth": router.config.auth.to_dict()}
    if router.config.tls.enabled:
        reply["tls"] = router.config.tls.to_dict()
    await link.send([protocol.REGISTERED, rid, reply])
    router.notify()
    return slot


async def _refuse(link: ControlLink, rid: int, index: int, pid: int, answer: bytes,
                  reason: str) -> Slot | None:
    """Tell an unwanted (but proven) shard to drain, with our proof so that it believes
    us; returns None, the refused slot."""
    log.warning("refusing shard %s (pid %s): %s; telling it to drain", index, pid, reason)
    await link.send([protocol.DRAIN, rid, {"proof": answer}])
    return None
