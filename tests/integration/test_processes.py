"""The router's process duties against real processes: restart, stop, adoption (G7, §3)."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio

from flux import protocol
from flux.router.launcher import pid_alive

from .wire import RawConn, item_result, owned_topic, publish_frame, shard_map

if TYPE_CHECKING:
    from tests.conftest import Broker

pytestmark = pytest.mark.integration
P = protocol
TIMEOUT = 40


async def wait_for_new_generation(broker: Broker, index: int, old: int) -> list[object]:
    """Poll the router until shard ``index`` is registered with a generation other than ``old``."""
    while True:
        for entry in await shard_map(broker.address):
            if entry[0] == index and entry[2] != old:
                return entry
        await trio.sleep(0.1)


async def publish_one(address: str, topic: str) -> list[object]:
    async with await RawConn.open(address) as conn:
        hello = await conn.hello()
        reply = await conn.request(publish_frame(conn.rid(), topic, "m", b"x"))
    assert reply[0] == P.PUBLISHED and reply[2] == hello[2]["generation"], reply
    return item_result(reply)


async def test_killed_shard_is_restarted_with_a_new_generation(broker: Broker) -> None:
    old = broker.shards[0]
    os.kill(old.pid, signal.SIGKILL)
    with trio.fail_after(TIMEOUT):
        _, address, generation = await wait_for_new_generation(broker, 0, old.generation)
        assert generation != old.generation
        stats = broker.stats()
        new_pid = stats["shards"][0]["pid"]
        broker.note_pids()
        assert new_pid != old.pid and not pid_alive(old.pid)
        assert stats["shards"][0]["restarts"] == 1
        assert stats["shards"][1]["pid"] == broker.shards[1].pid  # the other one untouched
        # the restart keeps the shard's address, and offsets start again at 0 (G7)
        assert address == old.address
        assert (await publish_one(str(address), owned_topic(0)))[:3] == [0, 0, False]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_drains_and_leaves_no_process_behind(broker: Broker, signum: int) -> None:
    proc = broker.router.proc
    proc.send_signal(signum)
    assert proc.wait(timeout=30) == 0
    deadline = time.monotonic() + 5
    while not any(line == "flux: stopped" for line in broker.router.stdout):
        broker.router.next_line(deadline)
    broker.assert_all_gone()
    assert not list((broker.tmp / "run").glob("router-*.json")), "state file left behind"


async def test_restarted_router_adopts_running_shards(broker: Broker) -> None:
    before = {i: (s.pid, s.generation, s.address) for i, s in broker.shards.items()}
    broker.kill_router()
    with trio.fail_after(TIMEOUT):
        # the router holds no data: shards keep serving clients that have the map
        for index, (_, _, address) in before.items():
            assert (await publish_one(address, owned_topic(index)))[0] == 0
        router = await trio.to_thread.run_sync(broker.restart_router)
        after = {i: (s.pid, s.generation, s.address) for i, s in router.shards.items()}
        assert after == before
        assert sorted(e[2] for e in await shard_map(broker.address)) == sorted(
            g for _, g, _ in before.values())


def state_of(broker: Broker) -> tuple[Path, dict[str, Any]]:
    """The router's adoption state file and what it holds."""
    path = broker.tmp / "run" / f"router-127.0.0.1-{broker.router.port}.json"
    return path, json.loads(path.read_text())


def test_the_broker_secret_is_private_and_on_no_command_line(broker: Broker) -> None:
    path, state = state_of(broker)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(state["secret"]) == 64
    for pid in [broker.router.proc.pid, *(s.pid for s in broker.shards.values())]:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert state["secret"].encode() not in cmdline, pid


async def test_restarted_router_adopts_through_shard_control_listeners(broker: Broker) -> None:
    before = {i: (s.pid, s.generation, s.address) for i, s in broker.shards.items()}
    _, state = state_of(broker)
    broker.kill_router()
    # take the old control port, so the shards cannot find the new router by themselves:
    # only an ADOPT proven with the secret (kept in the state) brings them over
    blocker = socket.socket()
    blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    blocker.bind(P.parse_address(state["control"]))
    blocker.listen()
    try:
        with trio.fail_after(TIMEOUT):
            router = await trio.to_thread.run_sync(broker.restart_router)
    finally:
        blocker.close()
    after = {i: (s.pid, s.generation, s.address) for i, s in router.shards.items()}
    assert after == before
    assert state_of(broker)[1]["control"] != state["control"]
    assert state_of(broker)[1]["secret"] == state["secret"]


async def test_restarted_router_replaces_a_shard_that_died_meanwhile(broker: Broker) -> None:
    survivor, victim = broker.shards[0], broker.shards[1]
    broker.kill_router()
    os.kill(victim.pid, signal.SIGKILL)
    with trio.fail_after(TIMEOUT):
        router = await trio.to_thread.run_sync(broker.restart_router)
        assert (router.shards[0].pid, router.shards[0].generation) == (
            survivor.pid, survivor.generation)
        assert router.shards[1].pid != victim.pid
        assert router.shards[1].generation != victim.generation


async def test_adopted_shard_that_dies_is_restarted(broker: Broker) -> None:
    broker.kill_router()
    with trio.fail_after(TIMEOUT):
        router = await trio.to_thread.run_sync(broker.restart_router)
        adopted = router.shards[1]
        os.kill(adopted.pid, signal.SIGKILL)
        entry = await wait_for_new_generation(broker, 1, adopted.generation)
        assert entry[1] == adopted.address
        broker.note_pids()


async def test_shard_that_stops_heartbeating_is_killed_and_replaced(broker: Broker) -> None:
    frozen = broker.shards[1]
    os.kill(frozen.pid, signal.SIGSTOP)  # alive, but silent (heartbeat=1: replaced after ~3s)
    try:
        with trio.fail_after(TIMEOUT):
            entry = await wait_for_new_generation(broker, 1, frozen.generation)
            assert entry[1] == frozen.address
            while pid_alive(frozen.pid):  # the frozen one was killed, not left beside it
                await trio.sleep(0.05)
    finally:
        if pid_alive(frozen.pid):
            os.kill(frozen.pid, signal.SIGCONT)
    broker.note_pids()


async def test_a_shard_process_reports_its_garbage_collector_in_stats(broker: Broker) -> None:
    """STATS ``gc``: what the shard's collector tracks, what it froze and its full
    collections (the simulator's shards have no such field). Once it serves and has
    imported what a large dedup window needs, an idle shard's collector tracks next to
    nothing: that import (numpy) is frozen out of its view like the start-up heap."""
    collected: dict[str, Any] = {}
    with trio.fail_after(TIMEOUT):
        async with await RawConn.open(broker.shards[0].address) as conn:
            await conn.hello()
            while not collected or collected["tracked"] >= 2000:  # (the import's thread)
                await trio.sleep(0.05)
                reply = await conn.request([P.STATS, conn.rid()])
                assert reply[0] == P.STATS_OK
                collected = reply[2]["gc"]
    assert set(collected) == {"tracked", "frozen", "full_collections", "last_full_ms",
                              "longest_full_ms"}
    assert collected["frozen"] > 20000
    assert 0 <= collected["last_full_ms"] <= collected["longest_full_ms"]
