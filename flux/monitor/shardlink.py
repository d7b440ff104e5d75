"""The monitor's own connection to one shard: HELLO once, then STATS and FETCH requests.

One request at a time per shard, each bounded by a timeout; a broken or timed-out
connection is dropped and dialled again on the next request. Lives here: framing
and typed errors for the monitor's reads. Not here: what is asked or cached
(:mod:`flux.monitor.gather`).
"""

from __future__ import annotations

import itertools
import ssl
from collections.abc import Callable
from typing import Any

import trio

from flux import errors, protocol
from flux.host import Host
from flux.shard.server import BROKEN, RECV_BYTES, move_on_at

MAX_REPLY_BYTES = 1 << 28  # a STATS reply of a shard holding very many topics may be large


class ShardLink:
    """A lazily dialled request/reply connection to the shard at ``address``."""

    def __init__(self, host: Host, address: str, timeout: float,
                 hello: Callable[[], dict[str, Any]] | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.host = host
        self.tls = tls      # the shards' client ports speak TLS (flux.tls.internal_context)
        self.address = address
        self.timeout = timeout
        self.hello = hello  # the HELLO's credential fields (the broker's own, with auth)
        self._stream: trio.abc.Stream | None = None
        self._decoder = protocol.FrameDecoder(MAX_REPLY_BYTES)
        self._lock = trio.Lock()
        self._rids = itertools.count(1)

    async def request(self, frame: list[Any]) -> list[Any]:
        """Send ``frame`` (its rid is filled in) and return the reply frame.

        Raises ConnectionLost when the shard cannot be reached or closes,
        RequestTimeout after ``timeout`` seconds, or the typed RemoteError an
        ERROR reply carries.
        """
        async with self._lock:
            reused = self._stream is not None
            reply, failure = await self._attempt(frame)
            if reply is None and failure is not None and reused:
                # the shard may have closed an idle connection (two silent heartbeat
                # periods): one more try on a fresh one
                reply, failure = await self._attempt(frame)
            if reply is None:
                if failure is not None:
                    raise errors.ConnectionLost(f"shard at {self.address}: {failure}")
                raise errors.RequestTimeout(
                    f"shard at {self.address} did not answer within {self.timeout:g}s")
        if reply[0] == protocol.ERROR:
            if reply[1] == 0:  # the HELLO was refused, or the shard closed on an error
                await self.aclose()
            raise protocol.error_from_frame(reply)
        return reply

    async def _attempt(self, frame: list[Any]) -> tuple[list[Any] | None, str | None]:
        """The reply, or None and why not (None: the timeout passed); closes on failure."""
        reply: list[Any] | None = None
        failure: str | None = None
        # nothing may be raised inside move_on_at (its nursery would wrap it in a group)
        async with move_on_at(self.host, self.host.now() + self.timeout):
            try:
                reply = await self._exchange(frame)
            except (*BROKEN, errors.ProtocolError) as exc:
                failure = str(exc) or type(exc).__name__
        if reply is None:
            await self.aclose()
        return reply, failure

    async def _exchange(self, frame: list[Any]) -> list[Any]:
        if self._stream is None:
            host, port = protocol.parse_address(self.address)
            stream: trio.abc.Stream = await self.host.connect(host, port)
            if self.tls is not None:
                stream = trio.SSLStream(stream, self.tls, server_hostname=host)
                await stream.do_handshake()
            self._stream = stream
            self._decoder = protocol.FrameDecoder(MAX_REPLY_BYTES)
            body = {"version": protocol.VERSION, "role": "monitor",
                    **(self.hello() if self.hello is not None else {})}
            hello = await self._roundtrip([protocol.HELLO, 0, body])
            if hello[0] == protocol.ERROR:
                hello[1] = 0
                return hello
        return await self._roundtrip(list(frame))

    async def _roundtrip(self, frame: list[Any]) -> list[Any]:
        assert self._stream is not None
        rid = next(self._rids)
        frame[1] = rid
        await self._stream.send_all(protocol.encode(frame))
        while True:
            data = await self._stream.receive_some(RECV_BYTES)
            if not data:
                raise trio.BrokenResourceError("the shard closed the connection")
            for reply in self._decoder.feed(data):
                if len(reply) > 1 and reply[1] == rid:
                    return reply
                # anything else (a stray reply of a timed-out request) is dropped

    async def aclose(self) -> None:
        """Close the connection (the next request dials again)."""
        stream, self._stream = self._stream, None
        if stream is not None:
            await trio.aclose_forcefully(stream)
