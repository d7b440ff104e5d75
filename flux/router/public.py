"""The router's public listener: HELLO -> shard map, PING -> PONG, STATS.

A HELLO waits (bounded) until every shard is registered, so a client never gets
a partial map. Everything else a client sends goes to the shard owning the
topic; the router refuses it with a typed error. With ``auth`` on, HELLO proves an
identity first (a password login gets a session token for the shards, G13), and
STATS needs admin over every topic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from flux import errors, protocol
from flux.auth import identity as identities
from flux.auth.identity import Identity
from flux.shard.server import (
    BROKEN,
    RECV_BYTES,
    close_with_error,
    format_address,
    linger,
    move_on_at,
    secure,
)

if TYPE_CHECKING:
    from flux.router.router import Router

HELLO_WAIT = 5.0              # seconds a HELLO waits for every shard to be registered
WILDCARD_HOSTS = ("", "0.0.0.0", "::")


async def serve_client(router: Router, stream: trio.abc.Stream) -> None:
    """Answer one client connection until it closes (or sends framing garbage, sends
    no HELLO within ``limits.hello_timeout``, or is one over ``limits.max_connections``)."""
    limits = router.config.limits
    if router.clients >= limits.max_connections:
        await close_with_error(router.host, stream, errors.TooManyConnections(
            f"the router holds {limits.max_connections} connections (limits.max_connections);"
            " retry later"))
        return
    router.clients += 1
    peer = _Peer(_peer_host(stream), _local_host(stream))  # TLS hides the socket
    if router.tls is not None:
        secured = await secure(router.host, stream, router.tls, limits.hello_timeout)
        if secured is None:
            router.clients -= 1
            return
        stream, peer.certificate = secured
    decoder = protocol.FrameDecoder(router.config.max_frame_bytes)
    hello_by: float | None = router.host.now() + limits.hello_timeout  # None: HELLO came
    try:
        while True:
            data: bytes | bytearray | None = None
            if hello_by is None:
                data = await stream.receive_some(RECV_BYTES)
            else:
                async with move_on_at(router.host, hello_by):
                    data = await stream.receive_some(RECV_BYTES)
            if data is None:  # the HELLO deadline passed
                await stream.send_all(protocol.encode(protocol.error_frame(0, errors.HelloTimeout(
                    f"no HELLO within {limits.hello_timeout:g}s (limits.hello_timeout);"
                    " closing"))))
                await linger(router.host, stream)
                break
            if not data:
                break
            close = False
            try:
                frames = decoder.feed(data)
            except errors.ProtocolError as exc:
                frames, close = [], True
                await stream.send_all(protocol.encode(protocol.error_frame(0, exc)))
            for frame in frames:
                if frame[0] == protocol.HELLO:
                    hello_by = None
                reply, close = await answer(router, frame, stream, peer)
                await stream.send_all(protocol.encode(reply))
                if close:
                    break
            if close:
                await linger(router.host, stream)
                break
    except* BROKEN:  # grouped when raised inside move_on_at
        pass
    finally:
        router.clients -= 1
        await trio.aclose_forcefully(stream)


class _Peer:
    """One client connection of the router: its address and who it proved to be."""

    __slots__ = ("address", "certificate", "identity", "local")

    def __init__(self, address: str, local: str | None) -> None:
        self.address = address
        self.local = local  # the address it reached the router on
        self.identity: Identity | None = None
        self.certificate: str | None = None  # its TLS client certificate's common name


async def answer(router: Router, frame: list[Any], stream: trio.abc.Stream,
                 peer: _Peer | None = None) -> tuple[list[Any], bool]:
    """The reply to one frame, and whether to close the connection after it."""
    kind = frame[0]
    rid = frame[1] if len(frame) > 1 and type(frame[1]) is int and kind != protocol.CREDIT \
        else 0
    if kind != protocol.CREDIT and not (len(frame) > 1 and type(frame[1]) is int):
        return protocol.error_frame(0, errors.InvalidRequest(
            f"a {protocol.KIND_NAMES.get(kind, kind)} request needs an integer rid in"
            " position 1; nothing was done")), False
    if kind == protocol.PING:
        return [protocol.PONG, rid], False
    auth = router.config.auth
    if kind == protocol.STATS:
        if auth.enabled:
            refusal = _admin_refusal(peer.identity if peer is not None else None)
            if refusal is not None:
                return protocol.error_frame(rid, refusal), False
        return [protocol.STATS_OK, rid, stats(router)], False
    if kind in protocol.CONTROL_KINDS:
        return protocol.error_frame(rid, protocol.control_refused(kind)), False
    if kind != protocol.HELLO:
        return protocol.error_frame(rid, errors.InvalidRequest(
            f"the router answers HELLO, PING and STATS, not frame kind {kind}; send other"
            " requests to the shard that owns the topic")), False
    body = frame[2] if len(frame) > 2 and isinstance(frame[2], dict) else {}
    if body.get("version") not in protocol.SUPPORTED_VERSIONS:
        return protocol.error_frame(rid, errors.UnsupportedVersion(
            f"protocol version {body.get('version')!r} is not supported; this router"
            f" speaks {', '.join(map(str, protocol.SUPPORTED_VERSIONS))}")), True
    extra: dict[str, Any] = {}
    if auth.enabled:
        try:
            identity, session = await _authenticate(router, body, peer)
        except (errors.AuthenticationFailed, errors.SessionExpired,
                errors.TooManyLogins) as exc:
            return protocol.error_frame(rid, exc), True  # failed authentication closes
        if peer is not None:
            peer.identity = identity
        extra["user"] = identity.user
        if session is not None:
            extra.update(session=session, session_ttl=auth.session_ttl)
    ready = await router.wait_registered(router.host.now() + HELLO_WAIT)
    if router.stop_requested:
        return protocol.error_frame(rid, errors.ShuttingDown("the broker is stopping")), True
    if not ready:
        missing = [s.index for s in router.slots if s.info is None]
        return protocol.error_frame(rid, errors.Busy(
            f"shards {missing} have not registered (restarting?); retry shortly")), False
    return [protocol.HELLO_OK, rid, {
        "version": body["version"], "role": "router", "shard_count": router.shard_count,
        "shards": shard_map(router, peer.local if peer is not None else _local_host(stream)),
        **extra}], False


async def _authenticate(router: Router, body: dict[str, Any],
                        peer: _Peer | None) -> tuple[Identity, bytes | None]:
    """The identity a HELLO proves, and a session token when it was a password login."""
    auth = router.config.auth
    if identities.credential_kind(body) == "password":
        return await router.logins.login(auth, router.secret, body,
                                         peer.address if peer is not None else "?")
    return identities.fast(auth, router.secret, body, router.host.wall_time(),
                           peer.certificate if peer is not None else None), None


def _admin_refusal(identity: Identity | None) -> errors.FluxError | None:
    """Why the router's STATS is refused to ``identity``, if it is (admin over ``>``)."""
    if identity is None:
        return errors.NotAuthorized("STATS before HELLO: this broker requires a HELLO with"
                                    " credentials first")
    if not identity.permissions.broker_admin:
        return errors.NotAuthorized(f"user {identity.user!r} is no admin of every topic"
                                    " (admin: allow ['>']); the router's STATS needs that")
    return None


def shard_map(router: Router, local_host: str | None = None) -> list[list[Any]]:
    """``[[index, "host:port", generation], ...]`` of the registered shards.

    A shard advertising a wildcard host (``0.0.0.0``) is reported at the address
    the client reached the router on.
    """
    out: list[list[Any]] = []
    for slot in router.slots:
        if slot.info is None:
            continue
        advertise = slot.info.advertise
        host, port = protocol.parse_address(advertise)
        if host in WILDCARD_HOSTS and local_host:
            advertise = format_address(local_host, port)
        out.append([slot.index, advertise, slot.info.generation])
    return out


def stats(router: Router) -> dict[str, Any]:
    """The router's view: each shard's pid, registration and restarts (no message data)."""
    return {"role": "router", "shard_count": router.shard_count, "control": router.control,
            "shards": [{"index": s.index, "pid": s.proc.pid if s.proc else None,
                        "registered": s.info is not None, "connected": s.link is not None,
                        "recovering": s.info is not None and s.info.recovering,
                        "generation": s.info.generation if s.info else None,
                        "advertise": s.info.advertise if s.info else None,
                        "restarts": s.restarts} for s in router.slots]}


def _peer_host(stream: trio.abc.Stream) -> str:
    """The client's address (password logins are rate-limited per address)."""
    sock = getattr(stream, "socket", None)
    try:
        return str(sock.getpeername()[0]) if sock is not None else str(
            getattr(stream, "peer_name", "?"))
    except OSError:
        return "?"


def _local_host(stream: trio.abc.Stream) -> str | None:
    sock = getattr(stream, "socket", None)
    try:
        return str(sock.getsockname()[0]) if sock is not None else None
    except OSError:
        return None
