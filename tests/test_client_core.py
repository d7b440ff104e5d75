"""The sans-IO client core, driven frame by frame: no sockets, no clock, no trio."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flux import errors
from flux import protocol as P
from flux.client.connection import Conn
from flux.client.core import ClientCore
from flux.client.subscription import SubState

GEN = 7
SHARD_HELLO = {"version": 1, "role": "shard", "index": 0, "shard_count": 1, "generation": GEN,
               "heartbeat": 5.0, "max_frame_bytes": P.DEFAULT_MAX_FRAME_BYTES}


def ready_core(**kwargs: Any) -> ClientCore:
    """A core that has the shard map of one shard at s:1."""
    core = ClientCore(("r", 1), rng=random.Random(1), now=0.0, **kwargs)
    [router] = core.take_connects()
    assert router.role == "router" and router.address == ("r", 1)
    core.connected(router.id, 0.0)
    [hello] = core.take_output(router.id, 0.0) or []
    assert hello[0] == P.HELLO and hello[2] == {"version": 1, "role": "client"}
    core.receive(router.id, [P.HELLO_OK, hello[1], {"version": 1, "shard_count": 1,
                                                     "shards": [[0, "s:1", GEN]]}], 0.0)
    assert core.ready.done and core.take_closes() == [router.id]
    return core


def open_shard(core: ClientCore, now: float = 0.0) -> Conn:
    [conn] = core.take_connects()
    assert conn.role == "shard" and conn.address == ("s", 1)
    core.connected(conn.id, now)
    [hello] = core.take_output(conn.id, now) or []
    assert hello[0] == P.HELLO
    core.receive(conn.id, [P.HELLO_OK, hello[1], SHARD_HELLO], now)
    return conn


def answer_router(core: ClientCore, router: Conn, now: float) -> None:
    core.connected(router.id, now)
    [hello] = core.take_output(router.id, now) or []
    core.receive(router.id, [P.HELLO_OK, hello[1], {"version": 1, "shard_count": 1,
                                                     "shards": [[0, "s:1", GEN]]}], now)


def reopen_shard(core: ClientCore, now: float) -> tuple[Conn, float]:
    """After a lost connection: answer the map refresh, wait out the backoff, reconnect."""
    for _ in range(10):
        conns = core.take_connects()
        for conn in conns:
            if conn.role == "router":
                answer_router(core, conn, now)
        shard = [c for c in conns if c.role == "shard"]
        if shard:
            core._new_conns[:0] = shard
            return open_shard(core, now), now
        now = max(now, core.next_deadline())
        core.tick(now)
    raise AssertionError("no shard connection was opened")


def out(core: ClientCore, conn: Conn, now: float = 0.0) -> list[list[Any]]:
    return core.take_output(conn.id, now) or []


def subscribed(core: ClientCore, conn: Conn, *, cursor: int = 0, generation: int = GEN,
               **kwargs: Any) -> tuple[SubState, int]:
    sub = core.subscribe("t", kwargs.pop("name", "s"), now=0.0, **kwargs)
    [frame] = out(core, conn)
    assert frame[0] == P.SUBSCRIBE
    core.receive(conn.id, [P.SUBSCRIBED, frame[1], frame[2], {
        "created": True, "start_offset": cursor, "cursor": cursor, "generation": generation,
        "clamped": False, "reset": False, "next_offset": cursor, "max_in_flight": 1000}], 0.0)
    assert sub.ready.done
    return sub, frame[2]


def deliver(core: ClientCore, conn: Conn, sid: int, *items: tuple[int, int],
            generation: int = GEN) -> None:
    core.receive(conn.id, [P.DELIVER, sid, generation,
                           [[o, f"id{o}", b"p%d" % o, 1.5, a] for o, a in items]], 0.0)


# -- publishing ----------------------------------------------------------------------------


def test_shard_connection_is_opened_lazily_and_directly() -> None:
    core = ready_core()
    assert core.take_connects() == []
    core.publish("t", b"x", None, 0.0)
    conn = open_shard(core)
    assert conn.index == 0


def test_publishes_queued_while_busy_go_out_in_one_frame() -> None:
    core = ready_core()
    items = [core.publish("t", b"%d" % i, f"id{i}", 0.0) for i in range(3)]
    conn = open_shard(core)
    [frame] = out(core, conn)
    assert frame[0] == P.PUBLISH and [i[1] for i in frame[2]] == ["id0", "id1", "id2"]
    core.receive(conn.id, [P.PUBLISHED, frame[1], GEN,
                           [[0, 10, False], [0, 11, False], [0, 3, True]]], 0.0)
    acks = [item.result() for item in items]
    assert [(a.offset, a.duplicate, a.generation) for a in acks] == [
        (10, False, GEN), (11, False, GEN), (3, True, GEN)]


def test_publish_frames_hold_at_most_256_items() -> None:
    core = ready_core()
    for _i in range(600):
        core.publish("t", b"x", None, 0.0)
    conn = open_shard(core)
    assert [len(f[2]) for f in out(core, conn)] == [256, 256, 88]


def test_generated_id_is_drawn_once_and_reused_on_retry() -> None:
    core = ready_core()
    item = core.publish("t", b"x", None, 0.0)
    conn = open_shard(core)
    [first] = out(core, conn)
    core.connection_lost(conn.id, 1.0)
    conn2, now = reopen_shard(core, 1.0)
    [second] = out(core, conn2, now)
    assert first[2][0][1] == second[2][0][1] == item.id and len(item.id) == 32


def test_lost_connection_resends_in_flight_items_first_in_order() -> None:
    core = ready_core()
    core.publish("t", b"a", "a", 0.0)
    core.publish("t", b"b", "b", 0.0)
    conn = open_shard(core)
    out(core, conn)
    core.connection_lost(conn.id, 1.0)
    core.publish("t", b"c", "c", 1.0)
    conn2, now = reopen_shard(core, 1.0)
    [frame] = out(core, conn2, now)
    assert [i[1] for i in frame[2]] == ["a", "b", "c"]


def test_request_timeout_closes_the_connection_and_retries_the_publish() -> None:
    core = ready_core(request_timeout=3.0)
    item = core.publish("t", b"a", "a", 0.0)
    conn = open_shard(core)
    out(core, conn)
    assert core.next_deadline() == 2.5  # heartbeat first
    core.tick(2.5)
    assert [f[0] for f in out(core, conn, 2.5)] == [P.PING]
    core.tick(3.0)
    assert core.take_closes() == [conn.id]
    assert not item.done
    conn2, now = reopen_shard(core, 3.0)
    [frame] = out(core, conn2, now)
    assert frame[2][0][1] == "a"


def test_busy_is_retried_after_a_backoff_with_the_same_id() -> None:
    core = ready_core()
    item = core.publish("t", b"a", "a", 0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    core.receive(conn.id, [P.PUBLISHED, frame[1], GEN, [[errors.Busy.code, "busy", None]]], 0.0)
    assert out(core, conn) == [] and not item.done
    due = core.next_deadline()
    assert 0 < due <= 0.1
    core.tick(due)
    [again] = out(core, conn, due)
    assert again[2][0][1] == "a"


def test_item_errors_fail_only_their_item_and_topic_full_is_not_retried() -> None:
    core = ready_core()
    ok = core.publish("t", b"a", None, 0.0)
    full = core.publish("t", b"b", None, 0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    core.receive(conn.id, [P.PUBLISHED, frame[1], GEN,
                           [[0, 0, False], [errors.TopicFull.code, "full", None]]], 0.0)
    assert ok.result().offset == 0
    with pytest.raises(errors.TopicFull):
        full.result()


def test_wrong_shard_asks_the_router_for_a_new_map() -> None:
    core = ready_core()
    core.publish("t", b"a", None, 0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    core.receive(conn.id, [P.PUBLISHED, frame[1], GEN,
                           [[errors.WrongShard.code, "not mine", None]]], 0.0)
    assert [c.role for c in core.take_connects()] == ["router"]


def test_invalid_topic_raises_before_anything_is_queued() -> None:
    core = ready_core()
    with pytest.raises(errors.InvalidTopic):
        core.publish("no spaces", b"x", None, 0.0)
    assert core.take_connects() == []


# -- subscriptions -------------------------------------------------------------------------


def test_subscribe_sends_prefetch_as_credit() -> None:
    core = ready_core()
    core.subscribe("t", "s", read_old=True, prefetch=8, now=0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    assert frame[3] == {"topic": "t", "name": "s", "mode": "push", "read_old": True,
                        "from_offset": None, "max_in_flight": None, "credit": 8,
                        "generation": None, "on_reset": "earliest"}


def test_credit_is_returned_as_messages_are_consumed() -> None:
    core = ready_core()
    core.subscribe("t", "warm", now=0.0)
    conn = open_shard(core)
    out(core, conn)
    sub, sid = subscribed(core, conn, prefetch=8)
    deliver(core, conn, sid, *[(o, 1) for o in range(8)])
    assert out(core, conn) == []
    core.next_message(sub)
    assert out(core, conn) == []  # one owed, buffer not empty: held back
    core.next_message(sub)
    assert out(core, conn) == [[P.CREDIT, sid, 2]]
    for _ in range(6):
        core.next_message(sub)
    assert out(core, conn) == [[P.CREDIT, sid, 6]]


def test_redelivery_of_an_unconsumed_offset_is_dropped() -> None:
    core = ready_core()
    core.subscribe("t", "warm", now=0.0)
    conn = open_shard(core)
    out(core, conn)
    sub, sid = subscribed(core, conn)
    deliver(core, conn, sid, (0, 1), (1, 1))
    deliver(core, conn, sid, (0, 2))
    got = [core.next_message(sub) for _ in range(3)]
    assert [(m.offset, m.attempt) for m in got if m] == [(0, 1), (1, 1)] and got[2] is None


def test_redelivery_of_a_consumed_unacked_offset_is_passed_on() -> None:
    core = ready_core()
    core.subscribe("t", "warm", now=0.0)
    conn = open_shard(core)
    out(core, conn)
    sub, sid = subscribed(core, conn)
    deliver(core, conn, sid, (0, 1))
    assert core.next_message(sub) is not None
    deliver(core, conn, sid, (0, 2))
    again = core.next_message(sub)
    assert again is not None and (again.offset, again.attempt) == (0, 2)


def test_refused_ack_surfaces_from_the_iterator() -> None:
    core = ready_core()
    core.subscribe("t", "warm", now=0.0)
    conn = open_shard(core)
    out(core, conn)
    sub, sid = subscribed(core, conn)
    deliver(core, conn, sid, (0, 1))
    msg = core.next_message(sub)
    assert msg is not None
    core.ack(sub, msg, 0.0)
    [ack] = [f for f in out(core, conn) if f[0] == P.ACK]
    assert ack[2:] == [sid, GEN, [0], -1]
    core.receive(conn.id, [P.ACKED, ack[1], sid, 0,
                           [[0, errors.NotDelivered.code, "not delivered"]]], 0.0)
    with pytest.raises(errors.NotDelivered):
        core.next_message(sub)
    assert core.next_message(sub) is None  # not sticky: the subscription goes on


def test_acks_wait_briefly_while_the_consumer_has_buffered_messages() -> None:
    core = ready_core()
    core.subscribe("t", "warm", now=0.0)
    conn = open_shard(core)
    out(core, conn)
    sub, sid = subscribed(core, conn)
    deliver(core, conn, sid, *[(o, 1) for o in range(10)])
    first = core.next_message(sub)
    assert first is not None
    core.ack(sub, first, 1.0)
    assert [f for f in out(core, conn, 1.0) if f[0] == P.ACK] == []
    assert core.next_deadline() == pytest.approx(1.005)
    core.tick(1.005)
    [ack] = [f for f in out(core, conn, 1.005) if f[0] == P.ACK]
    assert ack[4:] == [[0], -1]
    for _ in range(8):  # offsets 1-8, one by one, while more wait in the buffer
        msg = core.next_message(sub)
        assert msg is not None
        core.ack(sub, msg, 2.0)
        assert [f for f in out(core, conn, 2.0) if f[0] == P.ACK] == []
    last = core.next_message(sub)
    assert last is not None and not sub.buffer
    core.ack(sub, last, 2.0)  # the buffer is empty: the consumer is about to wait, flush now
    [ack] = [f for f in out(core, conn, 2.0) if f[0] == P.ACK]
    assert ack[4:] == [[], 9]


@pytest.mark.parametrize(("code", "exc"), [(61, errors.SubscriptionInactive),
                                           (62, errors.SubscriptionTakenOver)])
def test_sub_ended_raises_its_typed_error(code: int, exc: type[Exception]) -> None:
    core = ready_core()
    core.subscribe("t", "warm", now=0.0)
    conn = open_shard(core)
    out(core, conn)
    sub, sid = subscribed(core, conn)
    deliver(core, conn, sid, (0, 1))
    core.receive(conn.id, [P.SUB_ENDED, sid, code, "over"], 0.0)
    for _ in range(2):
        with pytest.raises(exc):
            core.next_message(sub)


def test_resubscribe_after_a_lost_connection_carries_generation_and_resume_point() -> None:
    core = ready_core()
    sub = core.subscribe("t", None, read_old=True, now=0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    core.receive(conn.id, [P.SUBSCRIBED, frame[1], frame[2], {
        "created": True, "start_offset": 0, "cursor": 0, "generation": GEN, "clamped": False,
        "reset": False, "next_offset": 5, "max_in_flight": 1000}], 0.0)
    deliver(core, conn, frame[2], *[(o, 1) for o in range(5)])
    msgs = [core.next_message(sub) for _ in range(5)]
    for m in (msgs[0], msgs[1], msgs[3]):
        assert m is not None
        core.ack(sub, m, 0.0)
    core.connection_lost(conn.id, 1.0)
    conn2, now = reopen_shard(core, 1.0)
    [again] = out(core, conn2, now)
    assert again[0] == P.SUBSCRIBE and again[2] != frame[2]
    assert again[3]["name"] is None and again[3]["generation"] == GEN
    assert again[3]["from_offset"] == 2 and again[3]["read_old"] is False
    core.receive(conn2.id, [P.SUBSCRIBED, again[1], again[2], {
        "created": True, "start_offset": 2, "cursor": 2, "generation": GEN, "clamped": False,
        "reset": False, "next_offset": 5, "max_in_flight": 1000}], now)
    assert sub.ack_on_arrival == {3}
    deliver(core, conn2, again[2], (2, 1), (3, 1), (4, 1))
    assert [m.offset for m in iter(lambda: core.next_message(sub), None)] == [2, 4]
    frames = out(core, conn2, now)
    assert [f[4:] for f in frames if f[0] == P.ACK] == [[[3], -1]]
    assert [f[2] for f in frames if f[0] == P.CREDIT] == [3]


def test_new_generation_forgets_acks_of_the_old_one() -> None:
    core = ready_core()
    core.subscribe("t", "warm", now=0.0)
    conn = open_shard(core)
    out(core, conn)
    sub, sid = subscribed(core, conn)
    deliver(core, conn, sid, (0, 1), (1, 1))
    _m0, m1 = core.next_message(sub), core.next_message(sub)
    assert m1 is not None
    core.connection_lost(conn.id, 1.0)
    core.ack(sub, m1, 0.0)
    assert sub.ack_on_arrival == {1}
    conn2, now = reopen_shard(core, 1.0)
    [frame] = [f for f in out(core, conn2, now) if f[3]["name"] == "s"]
    core.receive(conn2.id, [P.SUBSCRIBED, frame[1], frame[2], {
        "created": True, "start_offset": 0, "cursor": 0, "generation": 99, "clamped": False,
        "reset": True, "next_offset": 0, "max_in_flight": 1000}], 2.0)
    assert sub.generation == 99 and sub.ack_on_arrival == set()
    deliver(core, conn2, frame[2], (1, 1), generation=99)
    msg = core.next_message(sub)
    assert msg is not None and (msg.offset, msg.generation) == (1, 99)


# -- ack coalescing, as a property ------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(offsets=st.lists(st.integers(0, 60), min_size=1, max_size=40, unique=True),
       data=st.data())
def test_cumulative_ack_never_covers_an_offset_the_user_did_not_ack(
        offsets: list[int], data: st.DataObject) -> None:
    offsets.sort()  # first deliveries come in increasing order (G1)
    core = ready_core()
    core.subscribe("t", "warm", now=0.0)
    conn = open_shard(core)
    out(core, conn)
    sub, sid = subscribed(core, conn, cursor=offsets[0])
    deliver(core, conn, sid, *[(o, 1) for o in offsets])
    msgs = {}
    while (m := core.next_message(sub)) is not None:
        msgs[m.offset] = m
    order = data.draw(st.permutations(offsets))
    order = order[:data.draw(st.integers(0, len(order)), label="acks")]
    acked: set[int] = set()
    covered: set[int] = set()

    def flush() -> None:
        for frame in out(core, conn):
            if frame[0] == P.ACK:
                explicit, through = frame[4], frame[5]
                assert set(explicit) <= acked
                assert all(o in acked for o in offsets if o <= through), (through, acked)
                covered.update(explicit)
                covered.update(o for o in offsets if o <= through)

    for offset in order:
        core.ack(sub, msgs[offset], 0.0)
        acked.add(offset)
        if data.draw(st.booleans(), label="flush"):
            flush()
    flush()
    assert covered == acked
