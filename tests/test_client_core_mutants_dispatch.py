"""The client core's connections and routing: shard maps that change, refused HELLOs,
malformed frames, frame limits and reconnect backoff.

Each test pins a behaviour that a surviving mutant of the client core showed no
test checked (``make mutate``). Sans-IO: frames in, frames and errors out.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from test_client_core_support import GEN, SHARD_HELLO, ids_of, open_shard, out, published, ready_core

from flux import errors
from flux import protocol as P
from flux.client.connection import Conn
from flux.client.core import ClientCore
from flux.client.requests import GROUP_OVERHEAD, ITEM_OVERHEAD
from flux.hashing import shard_for


def map_body(shards: int) -> dict[str, Any]:
    return {"version": P.VERSION, "shard_count": shards,
            "shards": [[i, f"s:{i + 1}", GEN] for i in range(shards)]}


def answer_router_with(core: ClientCore, shards: int, now: float) -> None:
    """Answer the router connection the core opened with a map of ``shards`` shards."""
    [router] = [c for c in core.take_connects() if c.role == "router"]
    core.connected(router.id, now)
    [hello] = core.take_output(router.id, now) or []
    core.receive(router.id, [P.HELLO_OK, hello[1], map_body(shards)], now)


def open_conn(core: ClientCore, conn: Conn, index: int, now: float = 0.0) -> None:
    core.connected(conn.id, now)
    [hello] = core.take_output(conn.id, now) or []
    core.receive(conn.id, [P.HELLO_OK, hello[1], {**SHARD_HELLO, "index": index,
                                                   "shard_count": 2}], now)


def refresh_map(core: ClientCore) -> Conn:
    """Open the shard and make the core ask the router for a new map: a publish refused
    with WrongShard. Returns the shard's connection."""
    core.publish("t", b"x", "w", 0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    published(core, conn, frame, [P.REFUSED], refused=[[0, errors.WrongShard.code, "not mine"]])
    return conn


def topic_on(shard: int, shards: int) -> str:
    return next(t for t in (f"t{i}" for i in range(100)) if shard_for(t, shards) == shard)


def test_a_call_queued_before_the_map_grows_is_routed_by_the_new_map() -> None:
    core = ready_core()
    conn = refresh_map(core)
    core.connection_lost(conn.id, 0.0)
    topic = topic_on(1, 2)
    call = core.fetch(topic, 0, now=0.0)  # queued for shard 0 while it reconnects
    answer_router_with(core, 2, 0.0)
    [new] = [c for c in core.take_connects() if c.address == ("s", 2)]
    open_conn(core, new, 1)
    sent = [f for f in out(core, new) if f[0] == P.FETCH]
    assert [f[2]["topic"] for f in sent] == [topic] and not call.done


def test_a_shard_that_left_the_map_has_its_connection_closed() -> None:
    core = ClientCore(("r", 1), rng=random.Random(1), now=0.0)
    answer_router_with(core, 2, 0.0)
    assert core.take_closes() and core.ready.done
    topic = topic_on(1, 2)
    core.fetch(topic, 0, now=0.0)
    [second] = [c for c in core.take_connects() if c.address == ("s", 2)]
    open_conn(core, second, 1)
    [fetch] = out(core, second)
    first = core.fetch(topic_on(0, 2), 0, now=0.0)
    [zero] = [c for c in core.take_connects() if c.address == ("s", 1)]
    open_conn(core, zero, 0)
    out(core, zero)
    core.receive(zero.id, [P.ERROR, 0, errors.ShuttingDown.code, "leaving"], 0.0)
    core.connection_lost(zero.id, 0.0)
    answer_router_with(core, 1, 0.0)
    assert second.id in core.take_closes() and core.take_output(second.id, 0.0) is None
    assert fetch[0] == P.FETCH and not first.done


def test_a_hello_the_router_refuses_fails_ready_with_its_error() -> None:
    core = ClientCore(("r", 1), rng=random.Random(1), now=0.0)
    [router] = core.take_connects()
    core.connected(router.id, 0.0)
    [hello] = core.take_output(router.id, 0.0) or []
    core.receive(router.id, [P.ERROR, hello[1], errors.InvalidRequest.code, "who are you"], 0.0)
    assert core.take_closes() == [router.id]
    with pytest.raises(errors.InvalidRequest, match="who are you"):
        core.ready.result()


def test_a_router_failure_after_a_good_map_is_retried_later() -> None:
    core = ready_core()
    refresh_map(core)
    [router] = [c for c in core.take_connects() if c.role == "router"]
    core.connect_failed(router.id, 0.0)  # counts one failure after the clean close
    now = 0.0
    for _ in range(20):
        now = max(now, core.next_deadline())
        core.tick(now)
        if any(c.role == "router" for c in core.take_connects()):
            break
    else:
        raise AssertionError("the router was never asked again")


def test_a_malformed_frame_closes_the_connection_and_names_itself_in_the_error() -> None:
    core = ready_core(retry_deadline=2.0)
    call = core.fetch("t", 0, now=0.0)
    conn = open_shard(core)
    out(core, conn)
    core.receive(conn.id, [P.DELIVER, "not a sid"], 0.0)
    assert core.take_closes() == [conn.id]
    with pytest.raises(errors.ProtocolError, match=r"^malformed DELIVER frame from s:1: ValueError"):
        call.result()


def test_a_malformed_frame_of_an_unknown_kind_is_named_with_a_question_mark() -> None:
    core = ready_core(retry_deadline=2.0)
    call = core.fetch("t", 0, now=0.0)
    conn = open_shard(core)
    out(core, conn)
    core.receive(conn.id, [250], 0.0)  # an unknown kind, too short to read
    with pytest.raises(errors.ProtocolError, match=r"^malformed \? frame from s:1"):
        call.result()


def test_a_payload_that_exactly_fills_a_frame_is_accepted_and_one_byte_more_is_not() -> None:
    core = ready_core()
    limit = P.DEFAULT_MAX_FRAME_BYTES - 1024 - len("t") - GROUP_OVERHEAD
    size = limit - len("a") - ITEM_OVERHEAD
    core.publish_many("t", [b"x" * size, b""], ["a", "b"], 0.0)
    with pytest.raises(errors.MessageTooLarge, match=f"a {size + 1}-byte payload"):
        core.publish_many("t", [b"x" * (size + 1)], ["a"], 0.0)


def test_a_publish_past_its_deadline_when_its_frame_is_built_fails_with_retry_deadline() -> None:
    core = ready_core(retry_deadline=1.0)
    item = core.publish("t", b"a", "a", 0.0)
    conn = open_shard(core, now=2.0)
    assert [f for f in out(core, conn, 2.0) if f[0] == P.PUBLISH] == []
    with pytest.raises(errors.RetryDeadlineExceeded, match="publish of id 'a' to 't'"):
        item.result()


def test_an_expired_publish_does_not_hold_back_the_ones_queued_after_it() -> None:
    core = ready_core(retry_deadline=1.0)
    core.publish("t", b"a", "a", 0.0)
    core.publish("t", b"b", "b", 1.5)
    conn = open_shard(core, now=2.0)
    [frame] = out(core, conn, 2.0)
    assert ids_of(frame) == ["b"]
