"""The router's control listener: shards REGISTER here, heartbeat, and are told to DRAIN.

A registration is accepted from the process the router started for that index,
or adopted (by pid) when the index has no process; any other registrant is told
to drain, so two shards never serve one index. Supervision lives in
:mod:`flux.router.router`.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

import trio

from flux import errors, protocol
from flux.shard.server import BROKEN, RECV_BYTES, move_on_at

if TYPE_CHECKING:
    from flux.router.router import Router, Slot

log = logging.getLogger("flux.router")

SEND_TIMEOUT = 2.0


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """A registered shard, as the router reports it."""

    index: int
    pid: int
    generation: int
    address: str      # where it listens
    advertise: str    # what clients are told


class ControlLink:
    """The router's end of one shard's control connection."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self._lock = trio.Lock()

    async def send(self, frame: list[Any]) -> None:
        async with self._lock:
            await self.stream.send_all(protocol.encode(frame))


async def serve_control(router: Router, stream: trio.abc.Stream) -> None:
    """Handle one shard's control connection until it closes."""
    link = ControlLink(stream)
    decoder = protocol.FrameDecoder(router.config.max_frame_bytes)
    slot: Slot | None = None
    try:
        while True:
            data = await stream.receive_some(RECV_BYTES)
            if not data:
                break
            for frame in decoder.feed(data):
                rid = frame[1] if len(frame) > 1 and type(frame[1]) is int else 0
                if frame[0] == protocol.REGISTER:
                    slot = await register(router, link, rid, frame)
                    if slot is None:
                        return
                elif slot is not None and slot.link is link:
                    slot.last_seen = router.host.now()
                    if frame[0] == protocol.PING:
                        await link.send([protocol.PONG, rid])
                else:
                    await link.send(protocol.error_frame(rid, errors.InvalidRequest(
                        "the control port expects REGISTER first")))
    except errors.ProtocolError as exc:
        async with move_on_at(router.host, router.host.now() + SEND_TIMEOUT):
            await link.send(protocol.error_frame(0, exc))
    except BROKEN:
        pass
    finally:
        if slot is not None and slot.link is link:
            slot.link = None
        await trio.aclose_forcefully(stream)


def _valid_address(value: Any) -> bool:
    try:
        protocol.parse_address(value)
    except (ValueError, TypeError, AttributeError):
        return False
    return True


async def register(router: Router, link: ControlLink, rid: int,
                   frame: list[Any]) -> Slot | None:
    """Accept, adopt or refuse a REGISTER; returns the shard's slot if accepted."""
    body = frame[2] if len(frame) > 2 and isinstance(frame[2], dict) else {}
    index, pid, generation, shard_count = (
        body.get(k) for k in ("index", "pid", "generation", "shard_count"))
    address, advertise = body.get("address"), body.get("advertise")
    if (type(index) is not int or type(pid) is not int or type(generation) is not int
            or type(shard_count) is not int or not isinstance(address, str)
            or not isinstance(advertise, str) or not _valid_address(address)
            or not _valid_address(advertise)):
        await link.send(protocol.error_frame(rid, errors.InvalidRequest(
            "REGISTER needs {index, pid, generation, shard_count: int,"
            " address, advertise: 'host:port'}")))
        return None
    if shard_count != router.shard_count or not 0 <= index < shard_count:
        return await _refuse(link, rid, index, pid,
                             f"this router runs {router.shard_count} shards")
    if router.stopping:
        return await _refuse(link, rid, index, pid, "the router is stopping")
    slot = router.slots[index]
    now = router.host.now()
    if slot.proc is None and not slot.launching:
        try:
            slot.proc = router.launcher.adopt(index, pid)
        except (ProcessLookupError, OSError) as exc:
            return await _refuse(link, rid, index, pid, str(exc))
        slot.since, slot.killing = now, None
        log.info("adopted shard %d (pid %d, generation %#x)", index, pid, generation)
    elif slot.proc is None or slot.proc.pid != pid:
        owner = f"pid {slot.proc.pid}" if slot.proc is not None else "a shard being started"
        return await _refuse(link, rid, index, pid, f"shard {index} is served by {owner}")
    slot.info = ShardInfo(index, pid, generation, address, advertise)
    slot.link, slot.last_seen = link, now
    if isinstance(router.config.shard.ports, str):
        slot.port = protocol.parse_address(address)[1]  # a restart keeps the known address
    await link.send([protocol.REGISTERED, rid, {}])
    router.notify()
    return slot


async def _refuse(link: ControlLink, rid: int, index: int, pid: int,
                  reason: str) -> Slot | None:
    """Tell an unwanted shard to drain (so it exits); returns None, the refused slot."""
    log.warning("refusing shard %s (pid %s): %s; telling it to drain", index, pid, reason)
    await link.send([protocol.DRAIN, rid])
    return None
