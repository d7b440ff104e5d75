"""The monitor's cache and views without processes: health, rates across restarts, payloads,
and a gatherer whose shards answer, refuse or are missing."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from flux import protocol
from flux.host import RealHost
from flux.monitor import api
from flux.monitor.gather import RateHistory, ShardEntry, ShardView, Snapshot, StatsGatherer


class Directory:
    def __init__(self, entries: list[ShardEntry], stopping: bool = False) -> None:
        self._entries = entries
        self._stopping = stopping
        self.shard_count = len(entries)

    def entries(self) -> list[ShardEntry]:
        return list(self._entries)

    def stopping(self) -> bool:
        return self._stopping


def stats(generation: int, published: int, topics: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"generation": generation, "uptime": 1.0, "sessions": 0, "memory": 0,
            "max_memory": 1, "counters": {"published": published}, "topics": topics or {}}


def snapshot(at: float, *replies: dict[str, Any] | None) -> Snapshot:
    return Snapshot(at, 1000.0 + at, tuple(
        ShardView(ShardEntry(i, True, 10 + i, reply["generation"] if reply else None, "x:1"),
                  reply) for i, reply in enumerate(replies)))


def test_health_names_the_missing_shards_and_a_stopping_broker() -> None:
    up, down = ShardEntry(0, True, 5, 7, "127.0.0.1:1"), ShardEntry(1, False, 6)
    assert api.health(Directory([up]))[0] == 200
    status, body = api.health(Directory([up, down]))
    assert (status, body["status"], body["missing"]) == (503, "unavailable", [1])
    assert "shards [1] are not registered" in body["message"]
    status, body = api.health(Directory([up], stopping=True))
    assert (status, body["status"]) == (503, "stopping")


def test_rates_survive_a_shard_restart_as_a_counter_reset() -> None:
    history = RateHistory()
    history.add(snapshot(0.0, stats(1, 100)))
    history.add(snapshot(2.0, stats(1, 120)))        # +20 in 2 s
    history.add(snapshot(4.0, stats(2, 6)))          # new generation: counts from 0, +6
    assert history.samples[-1].totals["published"] == 126
    assert history.series("published") == [(1002.0, 10.0), (1004.0, 3.0)]
    assert history.rate("published") == pytest.approx(26 / 4)


def test_topic_and_cursor_rates_come_from_offsets_and_skip_resets() -> None:
    topic = {"next_offset": 10, "subscriptions": {"s": {"cursor": 4}}}
    later = {"next_offset": 30, "subscriptions": {"s": {"cursor": 14}}}
    history = RateHistory()
    history.add(snapshot(0.0, stats(1, 0, {"t": topic})))
    history.add(snapshot(5.0, stats(1, 0, {"t": later})))
    assert history.topic_rate("t") == 4.0
    assert history.ack_rate("t", "s") == 2.0
    history.add(snapshot(10.0, stats(2, 0, {"t": {"next_offset": 1, "subscriptions": {}}})))
    assert history.topic_rate("t") == 0.0  # went back: a new generation, not a negative rate
    assert history.topic_rate("unknown") == 0.0


def test_history_keeps_only_its_window() -> None:
    history = RateHistory(keep_seconds=10.0)
    for t in range(0, 30, 2):
        history.add(snapshot(float(t), stats(1, t)))
    assert [s.at for s in history.samples] == [18.0, 20.0, 22.0, 24.0, 26.0, 28.0]


@pytest.mark.parametrize(("payload", "expected"), [
    (b"plain", ("utf-8", "plain", False)),
    (b"\xff\x00", ("hex", "ff00", False)),
    (b"", ("utf-8", "", False)),
    ("\u00e9".encode() * 3, ("utf-8", "\u00e9\u00e9", True)),   # cut at 5 bytes, whole chars
    (b"\x80" * 8, ("hex", "80" * 5, True)),
])
def test_payloads_show_as_text_when_utf8_else_hex_and_are_cut(
        payload: bytes, expected: tuple[str, str, bool]) -> None:
    view = api.payload_view(payload, limit=5)
    assert (view["encoding"], view["payload"], view["truncated"]) == expected
    assert view["size"] == len(payload)


def test_lag_of_an_older_shard_without_the_field_is_next_minus_cursor() -> None:
    from flux.monitor.gather import lag

    assert lag({"next_offset": 9}, {"cursor": 4}) == 5
    assert lag({"next_offset": 9}, {"cursor": 4, "lag": 2}) == 2


def closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def fake_shard(stream: trio.abc.Stream, reply: Any) -> None:
    """Answer HELLO, then each STATS with ``reply`` (or an ERROR when it is an exception)."""
    decoder = protocol.FrameDecoder()
    async with stream:
        while data := await stream.receive_some(65536):
            for frame in decoder.feed(data):
                if frame[0] == protocol.HELLO:
                    out = [protocol.HELLO_OK, frame[1], {}]
                elif isinstance(reply, Exception):
                    out = protocol.error_frame(frame[1], reply)  # type: ignore[arg-type]
                else:
                    out = [protocol.STATS_OK, frame[1], reply]
                await stream.send_all(protocol.encode(out))


async def test_gatherer_caches_answers_and_says_why_a_shard_is_missing() -> None:
    from flux import errors

    host = RealHost("test")
    good = stats(7, 3, {"t": {"next_offset": 3, "subscriptions": {}}})
    async with trio.open_nursery() as nursery:
        port_ok = await nursery.start(host.serve, "127.0.0.1", 0,
                                      lambda s: fake_shard(s, good))
        port_err = await nursery.start(host.serve, "127.0.0.1", 0,
                                       lambda s: fake_shard(s, errors.Busy("recovering")))
        port_bad = await nursery.start(host.serve, "127.0.0.1", 0,
                                       lambda s: fake_shard(s, {"generation": "x"}))
        directory = Directory([
            ShardEntry(0, True, 1, 7, f"127.0.0.1:{port_ok}"),
            ShardEntry(1, True, 2, 8, f"127.0.0.1:{port_err}"),
            ShardEntry(2, False, None),
            ShardEntry(3, True, 4, 9, f"127.0.0.1:{closed_port()}"),
            ShardEntry(4, True, 5, 9, f"127.0.0.1:{port_bad}"),
        ])
        gatherer = StatsGatherer(host, directory, interval=0.05, timeout=2.0)
        with trio.fail_after(10):
            nursery.start_soon(gatherer.run)
            await gatherer.wait_gathered()
            await gatherer.wait_gathered()
        views = gatherer.snapshot.shards
        assert views[0].up and views[0].stats == good
        assert not views[1].up and views[1].error is not None and "Busy" in views[1].error
        assert (views[2].stats, views[2].error) == (None, "not registered")
        assert views[3].error is not None and views[3].error.startswith("ConnectionLost")
        assert (views[4].stats, views[4].error) == (None, "malformed STATS reply")
        assert [name for _, name, _ in gatherer.snapshot.topics()] == ["t"]
        nursery.cancel_scope.cancel()


async def test_a_connection_the_shard_closed_while_idle_is_dialled_again_at_once() -> None:
    host = RealHost("test")
    good = stats(7, 3)

    async def one_reply_per_connection(stream: trio.abc.Stream) -> None:
        decoder = protocol.FrameDecoder()
        async with stream:
            while data := await stream.receive_some(65536):
                for frame in decoder.feed(data):
                    if frame[0] == protocol.HELLO:
                        await stream.send_all(protocol.encode([protocol.HELLO_OK, frame[1], {}]))
                    else:  # as a shard closes a session silent for two heartbeats
                        await stream.send_all(protocol.encode([protocol.STATS_OK, frame[1], good]))
                        return

    async with trio.open_nursery() as nursery:
        port = await nursery.start(host.serve, "127.0.0.1", 0, one_reply_per_connection)
        gatherer = StatsGatherer(host, Directory([ShardEntry(0, True, 1, 7, f"127.0.0.1:{port}")]),
                                 interval=1.0, timeout=2.0)
        with trio.fail_after(10):
            for _ in range(3):
                snap = await gatherer.gather()
                assert snap.shards[0].up, snap.shards[0].error
        nursery.cancel_scope.cancel()
