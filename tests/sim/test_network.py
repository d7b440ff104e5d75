"""The simulated network: latency, partitions, stalls, resets, pauses, crashes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from flux.sim.determinism import SimClock, seed_scheduler
from flux.sim.network import CONNECT_TIMEOUT, Network, SimStream
from flux.sim.simhost import EPOCH, SimHost


def simulate(fn: Callable[[Network, SimHost, SimHost], Awaitable[Any]]) -> Any:
    """Run ``fn(network, a, b)`` on the sim clock, with ``b`` echoing on port 9000."""

    async def main() -> Any:
        net = Network(seed=1)
        a, b = SimHost(net, "a", seed=1), SimHost(net, "b", seed=1)

        async def echo(stream: trio.abc.Stream) -> None:
            try:
                async with stream:
                    while data := await stream.receive_some():
                        await stream.send_all(data)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                pass  # the test crashed this host under the handler

        async with trio.open_nursery() as nursery:
            await nursery.start(b.serve, "127.0.0.1", 9000, echo)
            with trio.fail_after(3600):
                result = await fn(net, a, b)
            nursery.cancel_scope.cancel()
        return result

    seed_scheduler(1)
    return trio.run(main, clock=SimClock())


async def roundtrip(stream: trio.abc.Stream, data: bytes) -> bytes:
    await stream.send_all(data)
    got = b""
    while len(got) < len(data):
        chunk = await stream.receive_some()
        assert chunk, "EOF before the echo came back"
        got += chunk
    return got


def test_bytes_arrive_in_order_after_some_latency() -> None:
    async def body(net: Network, a: SimHost, b: SimHost) -> None:
        stream = await a.connect("127.0.0.1", 9000)
        t0 = trio.current_time()
        for i in range(50):
            assert await roundtrip(stream, b"msg%d" % i) == b"msg%d" % i
        elapsed = trio.current_time() - t0
        assert 50 * 2 * 0.0002 <= elapsed < 50 * 2 * 0.2

    simulate(body)


def test_one_way_block_holds_data_until_healed() -> None:
    async def body(net: Network, a: SimHost, b: SimHost) -> None:
        stream = await a.connect("127.0.0.1", 9000)
        net.block("a", "b")
        await stream.send_all(b"held")  # sending still works: the data waits in the network
        with trio.move_on_after(10) as waited:
            await stream.receive_some()
        assert waited.cancelled_caught
        net.unblock("a", "b")
        assert await stream.receive_some() == b"held"

    simulate(body)


def test_block_in_the_other_direction_lets_requests_through_but_holds_replies() -> None:
    async def body(net: Network, a: SimHost, b: SimHost) -> None:
        stream = await a.connect("127.0.0.1", 9000)
        net.block("b", "a")
        await stream.send_all(b"ping")
        with trio.move_on_after(5) as waited:
            await stream.receive_some()
        assert waited.cancelled_caught
        net.heal_all()
        assert await stream.receive_some() == b"ping"

    simulate(body)


def test_connect_across_a_partition_times_out_then_works_after_heal() -> None:
    async def body(net: Network, a: SimHost, b: SimHost) -> None:
        net.block("a", "b")
        net.block("b", "a")
        t0 = trio.current_time()
        with pytest.raises(TimeoutError):
            await a.connect("127.0.0.1", 9000)
        assert trio.current_time() - t0 >= CONNECT_TIMEOUT
        net.heal_all()
        stream = await a.connect("127.0.0.1", 9000)
        assert await roundtrip(stream, b"x") == b"x"

    simulate(body)


def test_connect_to_a_port_nobody_listens_on_is_refused() -> None:
    async def body(net: Network, a: SimHost, b: SimHost) -> None:
        with pytest.raises(ConnectionRefusedError):
            await a.connect("127.0.0.1", 9999)

    simulate(body)


def test_reset_breaks_both_ends() -> None:
    async def body(net: Network, a: SimHost, b: SimHost) -> None:
        stream = await a.connect("127.0.0.1", 9000)
        assert await roundtrip(stream, b"x") == b"x"
        assert net.reset_between("b", "a") == 1
        with pytest.raises(trio.BrokenResourceError):
            await stream.receive_some()
        with pytest.raises(trio.BrokenResourceError):
            await stream.send_all(b"y")

    simulate(body)


def test_close_gives_the_peer_eof_after_the_data_then_refuses_its_sends() -> None:
    async def body(net: Network, a: SimHost, b: SimHost) -> None:
        client, server = net._pair(a, b)
        await server.send_all(b"last words")
        await server.aclose()
        assert await client.receive_some() == b"last words"
        assert await client.receive_some() == b""
        with pytest.raises(trio.BrokenResourceError):
            await client.send_all(b"anyone?")
        with pytest.raises(trio.ClosedResourceError):
            await server.receive_some()

    simulate(body)


def test_paused_host_gets_nothing_and_its_timers_wait_until_resumed() -> None:
    async def body(net: Network, a: SimHost, b: SimHost) -> None:
        client, server = net._pair(a, b)
        b.gate.close()
        await client.send_all(b"hello")
        woke: list[float] = []

        async def sleeper() -> None:
            await b.sleep_until(trio.current_time() + 1)
            woke.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sleeper)
            with trio.move_on_after(5) as waited:
                await server.receive_some()
            assert waited.cancelled_caught and not woke
            b.gate.open()
        assert woke and woke[0] >= 5
        assert await server.receive_some() == b"hello"

    simulate(body)


def test_crashed_host_closes_its_connections_and_stops_listening() -> None:
    async def body(net: Network, a: SimHost, b: SimHost) -> None:
        stream = await a.connect("127.0.0.1", 9000)
        assert await roundtrip(stream, b"x") == b"x"
        net.crash(b)
        assert await stream.receive_some() == b""
        with pytest.raises(ConnectionRefusedError):
            await a.connect("127.0.0.1", 9000)

    simulate(body)


def test_slow_link_multiplies_latency() -> None:
    async def body(net: Network, a: SimHost, b: SimHost) -> float:
        stream = await a.connect("127.0.0.1", 9000)
        t0 = trio.current_time()
        for _ in range(20):
            await roundtrip(stream, b"x")
        fast = trio.current_time() - t0
        net.set_slow("a", "b", 50.0)
        t0 = trio.current_time()
        for _ in range(20):
            await roundtrip(stream, b"x")
        slow = trio.current_time() - t0
        return slow / fast

    assert simulate(body) > 5


def test_sim_host_clock_and_wall_time_follow_the_sim_clock() -> None:
    async def body(net: Network, a: SimHost, b: SimHost) -> None:
        await a.sleep_until(100.0)
        assert a.now() == 100.0
        assert a.wall_time() == EPOCH + 100.0

    simulate(body)


def test_ports_in_use_are_refused() -> None:
    async def body(net: Network, a: SimHost, b: SimHost) -> None:
        async with trio.open_nursery() as nursery:
            with pytest.raises(OSError):
                await nursery.start(a.serve, "127.0.0.1", 9000, _ignore)

    simulate(body)


async def _ignore(stream: trio.abc.Stream) -> None:
    await stream.aclose()


def test_host_randomness_depends_on_seed_name_and_incarnation() -> None:
    net = Network(seed=3)
    draws = {SimHost(net, name, seed=3, incarnation=i).random.random()
             for name in ("x", "y") for i in (0, 1)}
    assert len(draws) == 4
    assert SimHost(net, "x", seed=3).random.random() == SimHost(net, "x", seed=3).random.random()


def test_streams_are_trio_streams() -> None:
    async def body(net: Network, a: SimHost, b: SimHost) -> None:
        client, _server = net._pair(a, b)
        assert isinstance(client, SimStream)
        assert isinstance(client, trio.abc.HalfCloseableStream)

    simulate(body)


def test_try_send_queues_in_order_and_refuses_what_would_wait() -> None:
    async def body(net: Network, a: SimHost, b: SimHost) -> None:
        stream = await a.connect("127.0.0.1", 9000)
        assert a.try_send(stream, b"one,") == 4
        await stream.send_all(b"two,")
        assert a.try_send(stream, b"three") == 5
        got = b""
        while len(got) < 13:
            got += await stream.receive_some()
        assert got == b"one,two,three"
        net.block("a", "b")
        sent = 0
        while (n := a.try_send(stream, b"x" * 4096)) > 0:  # fills the window, then refuses
            sent += n
        assert 0 < sent < 10 << 20
        net.unblock("a", "b")
        a.gate.close()  # a paused host sends nothing, even where it would fit
        await trio.sleep(5)
        assert a.try_send(stream, b"y") == 0
        a.gate.open()

    simulate(body)
