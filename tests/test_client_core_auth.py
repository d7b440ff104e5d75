"""The client core's credentials (G13): what each HELLO carries, the router's session
token, and what a refusal does to the work waiting for a shard."""

from __future__ import annotations

import random
from typing import Any

import pytest

from flux import errors
from flux import protocol as P
from flux.client.connection import Conn
from flux.client.core import ClientCore
from flux.client.credentials import Credentials
from tests.test_client_core_support import GEN, SHARD_HELLO

MAP = {"version": P.VERSION, "shard_count": 1, "shards": [[0, "s:1", GEN]]}


def hello_of(core: ClientCore, conn: Conn, now: float = 0.0) -> list[Any]:
    core.connected(conn.id, now)
    [hello] = core.take_output(conn.id, now) or []
    assert hello[0] == P.HELLO
    return hello


def login(core: ClientCore, session: bytes | None, now: float = 0.0) -> dict[str, Any]:
    """Answer the router's HELLO (with ``session``); returns the HELLO's body."""
    [router] = [c for c in core.take_connects() if c.role == "router"]
    hello = hello_of(core, router, now)
    reply = dict(MAP, **({"user": "carol", "session": session, "session_ttl": 600.0}
                         if session is not None else {}))
    core.receive(router.id, [P.HELLO_OK, hello[1], reply], now)
    return dict(hello[2])


def test_a_token_goes_in_every_hello() -> None:
    core = ClientCore("flux://r:1?token=t0k", rng=random.Random(1), now=0.0)
    assert login(core, None)["token"] == "t0k"
    core.publish("a", b"x", "id", 0.0)
    [shard] = core.take_connects()
    assert hello_of(core, shard)[2]["token"] == "t0k"


def test_a_password_goes_to_the_router_only_and_its_session_token_to_the_shards() -> None:
    core = ClientCore(("r", 1), rng=random.Random(1), now=0.0,
                      credentials=Credentials(user="carol", password="pw"))
    body = login(core, b"session-1")
    assert (body["user"], body["password"]) == ("carol", "pw")
    core.publish("a", b"x", "id", 0.0)
    [shard] = core.take_connects()
    body = hello_of(core, shard)[2]
    assert body["session"] == b"session-1" and "password" not in body
    # the next login at the router uses the session token, not the password
    core._refresh_map(1.0)
    assert login(core, b"session-2", 1.0) == {"version": P.VERSION, "role": "client",
                                              "session": b"session-1"}


def test_an_expired_session_logs_in_again_with_the_password() -> None:
    core = ClientCore(("r", 1), rng=random.Random(1), now=0.0,
                      credentials=Credentials(user="carol", password="pw"))
    login(core, b"old")
    waiter = core.publish("a", b"x", "id", 0.0)
    [shard] = core.take_connects()
    hello = hello_of(core, shard)
    expired = errors.SessionExpired("expired")
    core.receive(shard.id, P.error_frame(hello[1], expired), 0.0)
    # the router refuses the old session too: the password is sent next
    [router] = [c for c in core.take_connects() if c.role == "router"]
    refused = hello_of(core, router)
    core.receive(router.id, P.error_frame(refused[1], expired), 0.0)
    now = 0.0
    for _ in range(20):
        now = max(now, core.next_deadline())
        core.tick(now)
        routers = [c for c in core.take_connects() if c.role == "router"]
        core._new_conns[:0] = routers
        if routers:
            body = login(core, b"new", now)
            assert body["password"] == "pw"
            break
    else:
        raise AssertionError("no new login")
    for _ in range(20):
        conns = core.take_connects()
        if conns:
            [shard] = conns
            hello = hello_of(core, shard, now)
            assert hello[2]["session"] == b"new"
            core.receive(shard.id, [P.HELLO_OK, hello[1], SHARD_HELLO], now)
            break
        now = max(now, core.next_deadline())
        core.tick(now)
    assert not waiter.done  # still queued, now on the new connection


def test_a_shard_that_refuses_the_credentials_fails_what_waited_for_it() -> None:
    core = ClientCore("flux://r:1?token=gone", rng=random.Random(1), now=0.0)
    login(core, None)
    waiter = core.publish("a", b"x", "id", 0.0)
    [shard] = core.take_connects()
    hello = hello_of(core, shard)
    core.receive(shard.id, P.error_frame(hello[1], errors.AuthenticationFailed("no")), 0.0)
    assert waiter.done
    with pytest.raises(errors.AuthenticationFailed):
        waiter.result()
