"""A shard that recovers its disk topics registers first, as *recovering* (G9): the router
knows it is alive and does not replace it however long the recovery takes, its port
answers Busy, and once it has rebuilt every topic it says READY and serves them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from rich.console import Console

from flux import errors, protocol, stats_view
from flux.client.trio import connect
from flux.monitor.api import health
from flux.monitor.gather import ShardEntry
from flux.shard.disk import ShardStorage

from .test_inprocess import make_config, running
from .wire import RawConn, item_result, owned_topic, publish_frame

P = protocol


async def _router_shards(router: str) -> list[dict[str, Any]]:
    async with await RawConn.open(router) as conn:
        reply = await conn.request([P.STATS, conn.rid()])
    assert reply[0] == P.STATS_OK
    return list(reply[2]["shards"])


async def _shard_address(router: str, index: int) -> str:
    async with await RawConn.open(router) as conn:
        reply = await conn.hello()
    return str(next(s[1] for s in reply[2]["shards"] if s[0] == index))


async def test_a_recovering_shard_is_registered_answers_busy_then_says_ready_and_serves(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = make_config(**{"storage.dir": str(tmp_path), "storage.kind": "disk"})
    topic = owned_topic(0)
    async with running(config) as broker:
        conn = await RawConn.open(await _shard_address(broker.address, 0))
        async with conn:
            assert (await conn.hello())[0] == P.HELLO_OK
            reply = await conn.request(publish_frame(conn.rid(), topic, "m1", b"kept"))
            assert item_result(reply)[0] == 0

    gate, entered = trio.Event(), trio.Event()
    recover_topic = ShardStorage._recover_topic

    async def slow(self: ShardStorage, core: Any, name: str) -> None:
        entered.set()
        await gate.wait()   # a recovery that takes as long as the test likes
        await recover_topic(self, core, name)

    monkeypatch.setattr(ShardStorage, "_recover_topic", slow)
    async with running(config) as broker:   # started: every shard registered
        await entered.wait()
        shards = await _router_shards(broker.address)
        assert [(s["registered"], s["recovering"]) for s in shards] == [(True, True),
                                                                        (True, False)]
        address = await _shard_address(broker.address, 0)
        async with await RawConn.open(address) as conn:
            reply = await conn.hello()
            assert reply[:3] == [P.ERROR, reply[1], errors.Busy.code]
            assert "recovering" in reply[3]
            fetch = await conn.request([P.FETCH, conn.rid(), {"topic": topic, "offset": 0}])
            assert fetch[2] == errors.Busy.code   # nothing is served, nothing created
        # the router keeps it: three heartbeats (1.5 s) of recovery and it is still there
        await trio.sleep(4 * config.subscriber.heartbeat)
        assert (await _router_shards(broker.address))[0]["recovering"]
        assert broker.shard(0).status is None
        # `flux stats` shows the other shard, and this one as recovering, without waiting
        # out the retry deadline
        async with connect(f"flux://{broker.address}", retry_deadline=30) as client:
            with trio.fail_after(10):
                replies = await client.stats(wait=1.0, partial=True)
            assert "Busy" in replies[0]["unavailable"]
            assert "recovering" in replies[0]["unavailable"]
            assert "unavailable" not in replies[1] and "topics" in replies[1]
            console = Console(record=True, width=120)
            stats_view.show(stats_view.select(replies, "*"), console=console)
            assert "shard 0: no reply (Busy" in console.export_text()
            with trio.fail_after(10), pytest.raises(errors.RetryDeadlineExceeded):
                await client.stats(wait=1.0)
        gate.set()
        while (await _router_shards(broker.address))[0]["recovering"]:
            await trio.sleep(0.05)
        async with await RawConn.open(address) as conn:
            assert (await conn.hello())[0] == P.HELLO_OK
            fetched = await conn.request([P.FETCH, conn.rid(), {"topic": topic, "offset": 0}])
            assert fetched[0] == P.FETCHED and fetched[5] == [b"kept"]


class _Directory:
    shard_count = 2

    def __init__(self, entries: list[ShardEntry]) -> None:
        self._entries = entries

    def entries(self) -> list[ShardEntry]:
        return self._entries

    def stopping(self) -> bool:
        return False


def test_healthz_says_which_shards_are_recovering() -> None:
    status, body = health(_Directory([ShardEntry(0, True, 10, 1, "127.0.0.1:1", 0, True),
                                      ShardEntry(1, True, 11, 2, "127.0.0.1:2", 0, False)]))
    assert status == 503 and body["status"] == "recovering" and body["recovering"] == [0]
    status, body = health(_Directory([ShardEntry(0, True, 10, 1, "127.0.0.1:1", 0, False)]))
    assert status == 200
