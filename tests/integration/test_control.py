"""Control frames come only from the broker (DESIGN.md G13): refused on client ports,
and on the control listeners heard only with a proof of the broker's secret.

Router and shards run in one trio run on loopback (TaskLauncher), as in
``test_inprocess``; each test asserts what a client or an impostor sees and that
nothing about the broker changed.
"""

from __future__ import annotations

import functools
import socket
import struct
from typing import Any

import pytest
import trio

from flux import control_proof, errors, protocol

from .test_inprocess import Broker, make_config, running
from .wire import RawConn, item_result, owned_topic, publish_frame, shard_map

P = protocol
NOT_AUTHORIZED = errors.NotAuthorized.code
WRONG_SECRET = "cd" * 32
QUIET = 1.0  # seconds a redirected shard would need to dial its new "router"


def control_frames(control: str) -> list[list[Any]]:
    """One of each control kind, as a hijacker would send them (rid 7)."""
    return [[P.REGISTER, 7, {"index": 0, "pid": 1, "generation": 1, "shard_count": 2,
                             "address": control, "advertise": control, "control": control}],
            [P.REGISTERED, 7, {}], [P.DRAIN, 7], [P.ADOPT, 7, {"control": control}],
            [P.CHALLENGE, 7, {"nonce": b"n" * 16}], [P.ADOPTED, 7, {}], [P.READY, 7]]


class Trap:
    """A listener standing in for a hijacker's router: it counts who dials it."""

    def __init__(self) -> None:
        self.dialled = 0
        self.address = ""

    async def serve(self, nursery: trio.Nursery) -> None:
        async def handler(stream: trio.SocketStream) -> None:
            self.dialled += 1
            await stream.aclose()

        listeners = await nursery.start(functools.partial(trio.serve_tcp, handler, 0,
                                                          host="127.0.0.1"))
        self.address = f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"


def secret_of(broker: Broker) -> str:
    assert broker.store.state is not None
    secret: str = broker.store.state["secret"]
    return secret


def shard_control(broker: Broker, index: int) -> str:
    """Shard ``index``'s control listener, as the router recorded it."""
    assert broker.store.state is not None
    entry = next(e for e in broker.store.state["shards"] if e["index"] == index)
    control: str = entry["control"]
    return control


async def adopt(address: str, secret: str, control: str) -> list[Any]:
    """Send a shard's control listener an ADOPT proven with ``secret``; its answer."""
    async with await RawConn.open(address) as conn:
        challenge = await conn.recv()
        assert challenge[0] == P.CHALLENGE
        theirs, ours = challenge[2]["nonce"], b"o" * control_proof.NONCE_BYTES
        proof = control_proof.prove(secret, control_proof.ADOPT, theirs, ours, control.encode())
        await conn.send([P.ADOPT, 3, {"control": control, "nonce": ours, "proof": proof}])
        reply = await conn.recv()
        if reply[0] == P.ADOPTED:  # the shard proves the secret back
            assert control_proof.check(secret, reply[2]["proof"], control_proof.ADOPTED, ours,
                                       theirs)
        return reply


async def test_control_frames_on_a_shard_client_port_are_refused_and_change_nothing() -> None:
    async with running() as broker, trio.open_nursery() as nursery:
        trap = Trap()
        await trap.serve(nursery)
        before = await shard_map(broker.address)
        topic = owned_topic(0)
        async with await RawConn.open(before[0][1]) as conn:
            await conn.hello()
            for frame in control_frames(trap.address):
                reply = await conn.request(frame)
                assert reply[:3] == [P.ERROR, 7, NOT_AUTHORIZED], (frame, reply)
                assert "control frame" in reply[3]
            # the connection stays open and the shard keeps serving (DRAIN did nothing)
            published = await conn.request(publish_frame(conn.rid(), topic, "after", b"x"))
            assert item_result(published) == [0, 0, False]
        await trio.sleep(QUIET)
        assert trap.dialled == 0  # ADOPT did not send the shard to the hijacker
        assert await shard_map(broker.address) == before
        stats = await RawConn.open(broker.address)
        async with stats:
            reply = await stats.request([P.STATS, 1])
        assert all(s["connected"] for s in reply[2]["shards"])
        nursery.cancel_scope.cancel()


async def test_control_frames_on_the_router_public_port_are_refused() -> None:
    async with running() as broker:
        before = await shard_map(broker.address)
        async with await RawConn.open(broker.address) as conn:
            for frame in control_frames(broker.info.control if broker.info else ""):
                reply = await conn.request(frame)
                assert reply[:3] == [P.ERROR, 7, NOT_AUTHORIZED], (frame, reply)
            assert (await conn.request([P.PING, 9])) == [P.PONG, 9]
        assert await shard_map(broker.address) == before


@pytest.mark.parametrize("proof", ["none", "wrong-secret", "replayed"])
async def test_shard_control_listener_refuses_an_adopt_without_the_secret(proof: str) -> None:
    async with running() as broker, trio.open_nursery() as nursery:
        trap = Trap()
        await trap.serve(nursery)
        address = shard_control(broker, 1)
        if proof == "wrong-secret":
            reply = await adopt(address, WRONG_SECRET, trap.address)
        else:
            async with await RawConn.open(address) as conn:
                challenge = await conn.recv()
                assert challenge[0] == P.CHALLENGE
                body: dict[str, Any] = {"control": trap.address}
                if proof == "replayed":  # a proof made for another connection's nonce
                    old = b"x" * control_proof.NONCE_BYTES
                    body["nonce"] = ours = b"o" * control_proof.NONCE_BYTES
                    body["proof"] = control_proof.prove(secret_of(broker), control_proof.ADOPT,
                                                        old, ours, trap.address.encode())
                reply = await conn.request([P.ADOPT, 3, body])
        assert reply[:3] == [P.ERROR, 3, NOT_AUTHORIZED], reply
        await trio.sleep(QUIET)
        assert trap.dialled == 0
        nursery.cancel_scope.cancel()


async def test_shard_control_listener_takes_only_adopt() -> None:
    async with running() as broker, await RawConn.open(shard_control(broker, 0)) as conn:
        await conn.recv()  # CHALLENGE
        reply = await conn.request([P.PUBLISH, 4, [["t", ["a"], [b"x"]]]])
        assert reply[:3] == [P.ERROR, 4, errors.InvalidRequest.code]


async def test_an_adopt_proven_with_the_secret_moves_the_shard_to_the_new_router() -> None:
    async with running() as broker, trio.open_nursery() as nursery:
        trap = Trap()
        await trap.serve(nursery)
        reply = await adopt(shard_control(broker, 1), secret_of(broker), trap.address)
        assert reply[:2] == [P.ADOPTED, 3]
        with trio.fail_after(5):
            while not trap.dialled:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()


async def register(control: str, secret: str, fields: dict[str, Any]) -> list[Any]:
    """REGISTER at the router's control port as a shard knowing ``secret``; the answer."""
    async with await RawConn.open(control) as conn:
        challenge = await conn.recv()
        assert challenge[0] == P.CHALLENGE
        theirs, ours = challenge[2]["nonce"], b"s" * control_proof.NONCE_BYTES
        proof = control_proof.prove(secret, control_proof.REGISTER, theirs, ours,
                                    control_proof.register_fields(fields))
        reply = await conn.request([P.REGISTER, 1, {**fields, "nonce": ours, "proof": proof}])
        if reply[0] != P.ERROR:  # the router proves the secret back
            assert control_proof.check(secret, reply[2]["proof"], control_proof.REGISTERED, ours,
                                       theirs)
        return reply


async def test_router_control_port_hears_only_shards_that_prove_the_secret() -> None:
    async with running() as broker:
        assert broker.info is not None
        live = broker.info.shards[0]
        assert live is not None
        fields = {"index": 0, "pid": live.pid + 1, "generation": 7, "shard_count": 2,
                  "address": "127.0.0.1:9", "advertise": "127.0.0.1:9", "control": "127.0.0.1:9"}
        reply = await register(broker.info.control, WRONG_SECRET, fields)
        assert reply[:3] == [P.ERROR, 1, NOT_AUTHORIZED]
        # with the secret: a second process for a served index is told to drain
        assert (await register(broker.info.control, secret_of(broker), fields))[:2] == [P.DRAIN, 1]
        bad = await register(broker.info.control, secret_of(broker), {"index": "zero"})
        assert bad[:3] == [P.ERROR, 1, errors.InvalidRequest.code]
        assert (await shard_map(broker.address))[0][2] == live.generation


async def test_a_restarted_router_keeps_the_secret_and_a_fresh_start_draws_a_new_one() -> None:
    async with trio.open_nursery() as nursery:
        broker = Broker(nursery, make_config())
        with trio.fail_after(20):
            await broker.start()
            first = secret_of(broker)
            assert control_proof.valid_secret(first)
            broker.scope.cancel()  # crash: the state outlives it
            await broker.done.wait()
            await broker.start()
            assert secret_of(broker) == first
            broker.stop.set()
            await broker.done.wait()
            assert broker.store.state is None  # a clean stop forgets it
            broker.stop = trio.Event()
            await broker.start()
            assert secret_of(broker) != first
            broker.stop.set()
            while broker.launcher.shards:
                await trio.sleep(0.01)


async def test_a_client_reset_before_hello_does_not_take_the_router_down() -> None:
    async with running() as broker:
        host, port = P.parse_address(broker.address)
        for _ in range(3):
            sock = socket.socket()
            sock.connect((host, port))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()  # a reset while the router waits for HELLO
        await trio.sleep(0.2)
        assert [s[0] for s in await shard_map(broker.address)] == [0, 1]
