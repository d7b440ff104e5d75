"""A client that sends shards bad input on purpose (G8), over the wire, by hand.

The client library refuses bad input before it leaves, so the vandal speaks the
protocol itself: it asks the router for the shard map, connects to a shard,
says HELLO, and sends one wrong request at a time (a PUBLISH whose items are
partly invalid, an unknown frame kind, bad options, an ACK for a subscription
it never made, a FETCH of a bad offset, a COMMIT of an unknown subscription, an
ADOPT that would send the shard to another router),
recording each request and its answer for the checker's G8 rules. Its valid
PUBLISH items are real messages (ids of its own), so the other rules judge them
too.
"""

from __future__ import annotations

import random
from typing import Any

import trio

from flux import errors, protocol
from flux.hashing import shard_for
from flux.sim import history as h
from flux.sim.tap import TappedHost

P = protocol
ANSWER_WAIT = 2.0   # seconds the vandal waits for an answer before it gives up
WHAT = ("publish-mixed", "publish-bad-topic", "unknown-kind", "bad-subscribe", "ack-unknown-sid",
        "fetch-bad-offset", "commit-unknown")


def bad_request(what: str, rid: int, topic: str, tag: str) -> tuple[list[Any], tuple[int, ...]]:
    """The frame for one kind of bad request (``tag`` makes its ids unique), and the
    PUBLISH items that are valid."""
    serial = rid
    if what == "publish-mixed":
        ids = [f"{tag}-a", "", f"{tag}-b", "x" * (P.MAX_ID_BYTES + 1), 7]
        payloads = [f"{tag}-a".encode(), b"no id", f"{tag}-b".encode(), b"id too long",
                    b"id not text"]
        return [P.PUBLISH, rid, [[topic, ids, payloads]]], (0, 2)
    if what == "publish-bad-topic":
        return [P.PUBLISH, rid, [["no spaces allowed", [f"{tag}-t"], [b"x"]]]], ()
    if what == "unknown-kind":
        return [99, rid, {"what": "nothing"}], ()
    if what == "bad-subscribe":
        return [P.SUBSCRIBE, rid, 900 + serial, {"topic": topic, "name": "v",
                                                 "max_in_flight": -5}], ()
    if what == "ack-unknown-sid":
        return [P.ACK, rid, 100000 + serial, 1, [0, 1], -1], ()
    if what == "control-frame":  # a hijack: send the shard to a "router" of ours (G13)
        return [P.ADOPT, rid, {"control": "127.0.0.1:1"}], ()
    if what == "fetch-bad-offset":
        return [P.FETCH, rid, {"topic": topic, "offset": "soon", "max_messages": 3}], ()
    return [P.COMMIT, rid, {"topic": topic, "name": f"never-made-{serial}", "offset": 1}], ()


class Vandal:
    """One vandal client on its tapped ``host``; ``record`` adds history events."""

    def __init__(self, host: TappedHost, topics: tuple[str, ...], rng: random.Random,
                 router_port: int, record: Any, hello: dict[str, Any] | None = None) -> None:
        self.host = host
        self.hello = {"version": P.VERSION, "role": "client", **(hello or {})}  # its credential
        self.topics = topics
        self.rng = rng
        self.router_port = router_port
        self.record = record
        self.serial = 0

    async def run(self, until: trio.Event) -> None:
        """Send bad requests now and then until ``until`` is set."""
        while not until.is_set():
            await trio.sleep(self.rng.uniform(0.2, 1.5))
            try:
                await self._visit()
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError,
                    errors.FluxError):
                continue  # a fault cut the connection: try again later

    async def _visit(self) -> None:
        shards = await self._shard_map()
        if not shards:
            return
        topic = self.rng.choice(self.topics)
        index = shard_for(topic, len(shards))
        address = shards.get(index)
        if address is None:
            return
        stream = await self.host.connect("127.0.0.1", int(address.rsplit(":", 1)[1]))
        link = _Link(stream)
        try:
            reply = await link.request([P.HELLO, 1, self.hello])
            if reply is None or reply[0] != P.HELLO_OK:
                return
            for _ in range(self.rng.randint(1, 4)):
                await self._one(link, index, topic)
            if self.serial % 8 == 0:  # now and then a hijack too (no draw: seeds keep their runs)
                await self._one(link, index, topic, "control-frame")
        finally:
            await trio.aclose_forcefully(stream)

    async def _one(self, link: _Link, shard: int, topic: str, what: str | None = None) -> None:
        self.serial += 1
        what = what or self.rng.choice(WHAT)
        rid = 10 + self.serial
        frame, valid = bad_request(what, rid, topic, f"{self.host.name}.{self.serial}")
        sent = trio.current_time()
        self.record(h.BadRequestSent(sent, self.host.name, shard, rid, what, valid))
        try:
            reply = await link.request(frame)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            reply = "closed"
        now = trio.current_time()
        if not isinstance(reply, list):
            self.record(h.BadRequestUnanswered(now, self.host.name, shard, rid, what,
                                               reply or "timeout", sent))
            if reply == "closed":
                raise trio.ClosedResourceError("the shard closed the connection")
            # no answer in time (a fault held it): this client sends no heartbeats, so
            # it does not linger on a connection whose shard may find it silent
            raise trio.ClosedResourceError("no answer; starting over on a new connection")
        elif reply[0] == P.ERROR:
            name = type(errors.from_code(int(reply[2]), str(reply[3]))).__name__
            self.record(h.BadRequestAnswered(now, self.host.name, shard, rid, what, name))
        elif reply[0] == P.PUBLISHED:
            stored, refused = _items(reply, len(frame[2][0][1]))
            self.record(h.BadRequestAnswered(now, self.host.name, shard, rid, what, "",
                                             stored, refused))
        else:
            self.record(h.BadRequestAnswered(now, self.host.name, shard, rid, what,
                                             f"frame {P.KIND_NAMES.get(reply[0], reply[0])}"))

    async def _shard_map(self) -> dict[int, str]:
        stream = await self.host.connect("127.0.0.1", self.router_port)
        try:
            reply = await _Link(stream).request(
                [P.HELLO, 1, self.hello])
        finally:
            await trio.aclose_forcefully(stream)
        if not isinstance(reply, list) or reply[0] != P.HELLO_OK:
            return {}
        return {int(entry[0]): str(entry[1]) for entry in reply[2].get("shards", [])}


def _items(reply: list[Any], count: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Stored item indexes and ``"index:ErrorName"`` refusals of a one-group PUBLISHED."""
    offsets, _duplicates, refused = reply[3][0][:3]
    names = {int(i): type(errors.from_code(int(code), str(message))).__name__
             for i, code, message in refused}
    if isinstance(offsets, int):   # every item stored: the first offset stands for all
        return tuple(range(count)), ()
    stored = tuple(i for i, offset in enumerate(offsets) if offset != P.REFUSED)
    return stored, tuple(f"{i}:{name}" for i, name in sorted(names.items()))


class _Link:
    """One raw connection: send a frame, wait for the frame answering its rid."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.decoder = P.FrameDecoder(P.DEFAULT_MAX_FRAME_BYTES)
        self.frames: list[list[Any]] = []

    async def request(self, frame: list[Any]) -> list[Any] | str | None:
        """The reply to ``frame`` (matched by rid; rid 0 errors too), "closed" if the
        connection ended first, None after ``ANSWER_WAIT`` without one."""
        rid = frame[1]
        await self.stream.send_all(P.encode(frame))
        with trio.move_on_after(ANSWER_WAIT):
            while True:
                while self.frames:
                    reply = self.frames.pop(0)
                    if len(reply) > 1 and reply[0] != P.DELIVER and reply[1] in (rid, 0):
                        return reply
                data = await self.stream.receive_some(65536)
                if not data:
                    return "closed"
                self.frames.extend(self.decoder.feed(data))
        return None
