"""What one hostile client may cost a broker (DESIGN.md "Why a connection may close"):
``limits.*`` against a real ``flux serve`` and misbehaving loopback sockets.

Each test starts its own broker with small limits, misbehaves on raw sockets (no
client library in the way), and checks the typed ERROR (rid 0 where the connection
closes), that the limit holds, and that the broker goes on serving others.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from flux import errors, protocol

from .wire import owned_topic

if TYPE_CHECKING:
    from tests.conftest import Broker, BrokerFactory

pytestmark = pytest.mark.integration
P = protocol
TIMEOUT = 30.0


class Sock:
    """A blocking loopback socket speaking raw frames, every wait bounded."""

    def __init__(self, address: str, *, rcvbuf: int | None = None) -> None:
        host, port = P.parse_address(address)
        self.sock = socket.socket()
        if rcvbuf is not None:  # before connect, so the window stays small
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(TIMEOUT)
        self.sock.connect((host, port))
        self.decoder = P.FrameDecoder(1 << 30)
        self.frames: list[list[Any]] = []

    def send(self, *frames: list[Any]) -> None:
        self.sock.sendall(P.encode_many(list(frames)))

    def recv(self) -> list[Any]:
        while not self.frames:
            data = self.sock.recv(1 << 16)
            if not data:
                raise EOFError("closed")
            self.frames.extend(self.decoder.feed(data))
        return self.frames.pop(0)

    def request(self, frame: list[Any]) -> list[Any]:
        self.send(frame)
        while True:
            reply = self.recv()
            if reply[0] not in (P.DELIVER, P.SUB_ENDED) and reply[1] == frame[1]:
                return reply

    def hello(self) -> list[Any]:
        return self.request([P.HELLO, 1, {"version": P.VERSION, "role": "client"}])

    def until_closed(self) -> list[list[Any]]:
        """Every frame until the peer closes (a reset counts as closed)."""
        out, self.frames = self.frames, []
        try:
            while data := self.sock.recv(1 << 16):
                out.extend(self.decoder.feed(data))
        except ConnectionResetError:
            pass
        return out

    def close(self) -> None:
        self.sock.close()


def closed_with(frames: list[list[Any]], error: type[errors.RemoteError]) -> None:
    """The last frame before the close is ``error`` as an ERROR with rid 0."""
    assert frames, "closed without an ERROR"
    assert frames[-1][:3] == [P.ERROR, 0, error.code], frames[-1]


def eventually(check: Callable[[], bool], timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def shard_address(broker: Broker, index: int = 0) -> str:
    return broker.shards[index].address


def test_a_connection_without_hello_is_closed_after_hello_timeout(
        broker_factory: BrokerFactory) -> None:
    broker = broker_factory("limits.hello_timeout=0.5")
    for address in (broker.address, shard_address(broker)):
        silent, pinging, greeted = Sock(address), Sock(address), Sock(address)
        try:
            greeted.hello()
            started = time.monotonic()
            pinging.send([P.PING, 5])  # answered, but no HELLO: still closed
            closed_with(silent.until_closed(), errors.HelloTimeout)
            frames = pinging.until_closed()
            assert frames[0] == [P.PONG, 5]
            closed_with(frames, errors.HelloTimeout)
            assert 0.4 < time.monotonic() - started < 10
            time.sleep(0.3)
            assert greeted.request([P.PING, 6]) == [P.PONG, 6]  # HELLO done: kept
        finally:
            for s in (silent, pinging, greeted):
                s.close()


@pytest.mark.parametrize("where", ["router", "shard"])
def test_one_connection_over_max_connections_is_refused(broker_factory: BrokerFactory,
                                                       where: str) -> None:
    broker = broker_factory("limits.max_connections=3")
    address = broker.address if where == "router" else shard_address(broker)
    held = [Sock(address) for _ in range(3)]
    try:
        for s in held:
            assert s.hello()[0] == P.HELLO_OK
        extra = Sock(address)
        closed_with(extra.until_closed(), errors.TooManyConnections)
        extra.close()
        held.pop().close()  # a slot frees once the broker sees the close

        def admitted() -> bool:
            s = Sock(address)
            try:
                return s.hello()[0] == P.HELLO_OK
            except (EOFError, ConnectionResetError):
                return False
            finally:
                s.close()

        eventually(admitted)
    finally:
        for s in held:
            s.close()


def test_a_session_holds_at_most_max_subscriptions(broker_factory: BrokerFactory) -> None:
    broker = broker_factory("limits.max_subscriptions=3")
    topic = owned_topic(0)
    s = Sock(shard_address(broker))
    try:
        s.hello()
        for sid in (1, 2, 3):
            assert s.request([P.SUBSCRIBE, 10 + sid, sid, {"topic": topic}])[0] == P.SUBSCRIBED
        refused = s.request([P.SUBSCRIBE, 14, 4, {"topic": topic, "name": "fourth"}])
        assert refused[:3] == [P.ERROR, 14, errors.TooManySubscriptions.code]
        stats = s.request([P.STATS, 15])[2]
        assert "fourth" not in stats["topics"][topic]["subscriptions"]  # nothing made
        assert s.request([P.UNSUBSCRIBE, 16, 1]) == [P.UNSUBSCRIBED, 16, 1]
        assert s.request([P.SUBSCRIBE, 17, 4, {"topic": topic}])[0] == P.SUBSCRIBED
    finally:
        s.close()


def flood_frames(kind: str, topic: str, count: int) -> tuple[bytes, int, int]:
    """``count`` requests of one length as bytes, that length and the reply kind: one-
    message PUBLISHes (ids repeat per batch: duplicates), or STATS (a tiny request, a
    large reply)."""
    if kind == "publish":
        frames = [[P.PUBLISH, i + 1, [[topic, [f"m{i:09d}"], [b"x" * 100]]]]
                  for i in range(count)]
        reply = P.PUBLISHED
    else:
        frames = [[P.STATS, i + 1] for i in range(count)]
        reply = P.STATS_OK
    data = P.encode_many(frames)
    return data, len(data) // count, reply


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize("kind", ["publish", "stats"])
def test_a_client_that_never_reads_its_replies_is_not_read_either(
        broker_factory: BrokerFactory, kind: str) -> None:
    """Back-pressure: a client that sends requests and never reads a reply cannot make
    the shard take, or hold, without bound: its sends stall with what it sent bounded,
    the shard's memory stays small, and the shard serves others meanwhile, the
    flooder's connection kept open. (That nothing is dropped once it reads again is
    pinned without the kernel in the way: test_output_backpressure.)"""
    # http off: the monitoring endpoint's own connection would be one more session
    broker = broker_factory("max_frame_bytes=65536", "limits.max_output_bytes=131072",
                            "subscriber.heartbeat=30", "http.enabled=false")
    topic = owned_topic(0)
    s = Sock(shard_address(broker))
    s.hello()
    if kind == "stats":  # a topic with a subscription makes each STATS reply bigger
        assert s.request([P.SUBSCRIBE, 2, 1, {"topic": topic, "name": "n"}])[0] == P.SUBSCRIBED
    chunk, _, _ = flood_frames(kind, topic, 1000)
    # send until the client is stalled: under 64 KiB taken in the last two seconds
    budget, sent, taken = 512 << 20, 0, [(time.monotonic(), 0)]
    s.sock.setblocking(False)
    deadline = time.monotonic() + 20
    stalled = False
    while sent < budget and time.monotonic() < deadline and not stalled:
        try:
            sent += s.sock.send(memoryview(chunk)[sent % len(chunk):])
        except BlockingIOError:
            time.sleep(0.01)
        now = time.monotonic()
        if now - taken[-1][0] >= 0.5:
            taken.append((now, sent))
            old = [t for t in taken if now - t[0] >= 2.0]
            stalled = bool(old) and sent - old[-1][1] < 64 << 10
    assert stalled, f"the shard took {sent} bytes with no reply read and wanted more"
    assert sent < 128 << 20, sent
    assert rss_bytes(broker.shards[0].pid) < 256 << 20
    other = Sock(shard_address(broker))
    try:
        assert other.hello()[0] == P.HELLO_OK
        assert other.request([P.STATS, 2])[2]["sessions"] == 2  # the flooder's is kept
    finally:
        other.close()
        s.close()


def test_a_subscriber_that_never_reads_is_closed_past_max_output_bytes(
        broker_factory: BrokerFactory) -> None:
    broker = broker_factory("max_frame_bytes=65536", "limits.max_output_bytes=131072",
                            "subscriber.heartbeat=30", "subscriber.timeout=60")
    topic = owned_topic(0)
    sub = Sock(shard_address(broker), rcvbuf=4096)
    pub = Sock(shard_address(broker))
    try:
        sub.hello()
        pub.hello()
        reply = sub.request([P.SUBSCRIBE, 2, 1, {"topic": topic, "name": "slow",
                                                 "credit": 1000}])
        assert reply[0] == P.SUBSCRIBED
        payload = b"p" * 16_000
        stats: dict[str, Any] = {}
        for i in range(0, 1000, 3):  # 16 MB offered: far past the kernel's buffers
            ids = [f"m{j}" for j in range(i, min(i + 3, 1000))]
            reply = pub.request([P.PUBLISH, 100 + i, [[topic, ids, [payload] * len(ids)]]])
            assert reply[0] == P.PUBLISHED, reply
            stats = pub.request([P.STATS, 3])[2]
            if not stats["topics"][topic]["subscriptions"]["slow"]["active"]:
                break
        assert not stats["topics"][topic]["subscriptions"]["slow"]["active"], "never closed"
        sub.sock.settimeout(10)
        frames = sub.until_closed()
        assert all(f[0] == P.DELIVER for f in frames[:-1])
        closed_with(frames, errors.SlowConsumer)
        # the publisher was not touched, and its messages are kept for the subscription
        assert pub.request([P.PING, 4]) == [P.PONG, 4]
        assert stats["topics"][topic]["subscriptions"]["slow"]["cursor"] == 0
    finally:
        sub.close()
        pub.close()
