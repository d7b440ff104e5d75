"""The client core's publish path and reconnects, in the cases mutants showed unchecked:
malformed PUBLISHED replies, an abandoned batch inside a group, the in-flight window,
reconnect backoff, and a map refresh asked for while one is under way.

Each test pins a behaviour that a surviving mutant of the client core showed no
test checked (``make mutate``). Sans-IO: frames in, frames and errors out.
"""

from __future__ import annotations

import itertools

import pytest
from test_client_core_support import GEN, full_publish_window, ids_of, open_shard, out, published, ready_core

from flux import errors
from flux import protocol as P


def test_a_published_reply_without_arrays_fails_the_publish_saying_so() -> None:
    core = ready_core()
    item = core.publish("t", b"a", "a", 0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    core.receive(conn.id, [P.PUBLISHED, frame[1], GEN, [[[0], "none", []]]], 0.0)
    with pytest.raises(errors.ProtocolError,
                       match="malformed PUBLISHED: duplicates and refused must be arrays"):
        item.result()


def test_an_abandoned_publish_inside_a_group_keeps_the_offsets_of_those_after_it() -> None:
    core = ready_core()
    a = core.publish("t", b"a", "a", 0.0)
    b = core.publish("t", b"b", "b", 0.0)
    c = core.publish("t", b"c", "c", 0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    assert ids_of(frame) == ["a", "b", "c"]
    core.abandon(b)
    published(core, conn, frame, 10)
    assert a.result()[0].offset == 10 and c.result()[0].offset == 12


def test_a_reply_that_frees_the_publish_window_makes_the_connection_writable() -> None:
    core, conn, frames = full_publish_window()
    published(core, conn, frames[0], 0)
    assert conn.id in core.take_writable()
    [last] = out(core, conn)
    assert len(ids_of(last)) == 1


def test_reconnect_backoff_grows_while_a_shard_stays_unreachable() -> None:
    core = ready_core()
    core.publish("t", b"a", "a", 0.0)
    now, tried = 0.0, []
    while len(tried) < 6:
        for conn in core.take_connects():
            if conn.role == "shard":
                tried.append(now)
            core.connect_failed(conn.id, now)
        now = core.next_deadline()
        core.tick(now)
    gaps = [b - a for a, b in itertools.pairwise(tried)]
    assert gaps[-1] > 2 * gaps[0]


def test_a_refresh_asked_for_during_a_map_request_asks_again_after_it() -> None:
    core = ready_core()
    core.publish("t", b"a", "a", 0.0)
    core.publish("u", b"b", "b", 0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    refused = [[0, errors.WrongShard.code, "not mine"], [1, errors.WrongShard.code, "not mine"]]
    core.receive(conn.id, [P.PUBLISHED, frame[1], GEN, [[[P.REFUSED], [], refused[:1]],
                                                         [[P.REFUSED], [], [[0, *refused[1][1:]]]]]],
                 0.0)
    [router] = [c for c in core.take_connects() if c.role == "router"]
    core.publish("v", b"c", "c", 0.0)
    [frame2] = out(core, conn)
    published(core, conn, frame2, [P.REFUSED], refused=[[0, errors.WrongShard.code, "not mine"]])
    core.connected(router.id, 0.0)
    [hello] = core.take_output(router.id, 0.0) or []
    core.receive(router.id, [P.HELLO_OK, hello[1], {"version": P.VERSION, "shard_count": 1,
                                                     "shards": [[0, "s:1", GEN]]}], 0.0)
    assert router.id in core.take_closes()
    assert [c.role for c in core.take_connects()] == ["router"]


def test_a_publish_for_a_ready_connection_makes_it_writable_and_not_before() -> None:
    core = ready_core()
    core.publish("t", b"a", "a", 0.0)
    [conn] = core.take_connects()
    core.take_writable()
    core.publish("t", b"b", "b", 0.0)
    assert conn.id not in core.take_writable()  # still connecting: HELLO_OK flushes it
    core._new_conns[:0] = [conn]
    conn = open_shard(core)
    out(core, conn)
    core.take_writable()
    core.publish("t", b"c", "c", 0.0)
    assert core.take_writable() == [conn.id]


def test_a_connection_that_does_not_open_within_request_timeout_is_given_up() -> None:
    core = ready_core(request_timeout=3.0, retry_deadline=5.0)
    item = core.publish("t", b"a", "a", 0.0)
    [conn] = core.take_connects()
    assert core.next_deadline() == 3.0
    core.tick(3.0)
    assert core.take_closes() == [conn.id]
    now = 3.0
    while not item.done and now < 60.0:
        core.take_connects()  # every attempt hangs until its timeout
        now = max(now, core.next_deadline())
        core.tick(now)
    with pytest.raises(errors.RetryDeadlineExceeded,
                       match=r"last error RequestTimeout: connecting to s:1 took over 3s"):
        item.result()


def test_a_subscribe_refused_busy_is_sent_again_on_the_same_connection_after_a_backoff() -> None:
    core = ready_core()
    core.subscribe("t", "s", now=0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    core.receive(conn.id, [P.ERROR, frame[1], errors.Busy.code, "busy"], 0.0)
    assert out(core, conn) == []
    due = core.next_deadline()
    assert 0 < due < 1.0
    core.tick(due)
    [again] = out(core, conn, due)
    assert again[0] == P.SUBSCRIBE and again[3]["name"] == "s"
