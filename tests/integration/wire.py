"""A raw protocol connection for tests: send frames or arbitrary bytes, read frames back."""

from __future__ import annotations

from typing import Any

import trio

from flux import protocol
from flux.hashing import shard_for


class RawConn:
    """One TCP connection speaking raw frames (no client library in the way)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = protocol.FrameDecoder(1 << 30)
        self.frames: list[list[Any]] = []
        self._rid = 100

    @classmethod
    async def open(cls, address: str) -> RawConn:
        host, port = protocol.parse_address(address)
        return cls(await trio.open_tcp_stream(host, port))

    def rid(self) -> int:
        self._rid += 1
        return self._rid

    async def send(self, *frames: list[Any]) -> None:
        await self.stream.send_all(protocol.encode_many(list(frames)))

    async def send_bytes(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def recv(self) -> list[Any]:
        """The next frame; raises EOFError if the peer closed first."""
        while not self.frames:
            data = await self.stream.receive_some(65536)
            if not data:
                raise EOFError("connection closed")
            self.frames.extend(self.decoder.feed(data))
        return self.frames.pop(0)

    async def recv_kind(self, kind: int) -> list[Any]:
        """The next frame of ``kind``, skipping others (e.g. DELIVER between replies)."""
        while True:
            frame = await self.recv()
            if frame[0] == kind:
                return frame

    async def request(self, frame: list[Any]) -> list[Any]:
        """Send ``frame`` and return the reply whose rid matches ``frame[1]``."""
        await self.send(frame)
        while True:
            reply = await self.recv()
            if reply[0] not in (protocol.DELIVER, protocol.SUB_ENDED) and reply[1] == frame[1]:
                return reply

    async def hello(self) -> list[Any]:
        return await self.request([protocol.HELLO, self.rid(), {"version": protocol.VERSION,
                                                               "role": "client"}])

    async def read_until_closed(self) -> list[list[Any]]:
        """Every frame until the peer closes (a reset counts as closed)."""
        out = list(self.frames)
        self.frames.clear()
        try:
            while True:
                data = await self.stream.receive_some(65536)
                if not data:
                    return out
                out.extend(self.decoder.feed(data))
        except trio.BrokenResourceError:
            return out

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def __aenter__(self) -> RawConn:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await trio.aclose_forcefully(self.stream)


async def shard_map(router: str) -> list[list[Any]]:
    """The router's shard map ``[[index, address, generation], ...]``."""
    async with await RawConn.open(router) as conn:
        reply = await conn.hello()
    assert reply[0] == protocol.HELLO_OK, reply
    return list(reply[2]["shards"])


def publish_frame(rid: int, topic: str, message_id: str, payload: bytes) -> list[Any]:
    """A PUBLISH of one message (one group of one item)."""
    return [protocol.PUBLISH, rid, [[topic, [message_id], [payload]]]]


def item_result(reply: list[Any], group: int = 0, index: int = 0) -> list[Any]:
    """One item's result in a PUBLISHED: ``[0, offset, duplicate]`` if it was stored,
    ``[code, message, None]`` if it was refused."""
    offsets, duplicates, refused = reply[3][group][:3]  # (a disk topic adds its generation)
    for i, code, message in refused:
        if i == index:
            return [code, message, None]
    return [0, protocol.offsets_of(offsets, index + 1)[index], index in duplicates]


def owned_topic(shard: int, shard_count: int = 2, prefix: str = "t") -> str:
    """A topic name that shard ``shard`` of ``shard_count`` owns."""
    for i in range(10_000):
        name = f"{prefix}.n{i}"
        if shard_for(name, shard_count) == shard:
            return name
    raise AssertionError("no topic found")
