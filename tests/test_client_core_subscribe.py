"""The sans-IO client core, driven frame by frame: subscriptions, credit, acks, resume."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_client_core_support import (
    GEN,
    deliver,
    open_shard,
    out,
    ready_core,
    reopen_shard,
    subscribed,
    warm_subscription,
)

from flux import errors
from flux import protocol as P

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
    core, conn, sub, sid = warm_subscription(prefetch=8)
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
    core, conn, sub, sid = warm_subscription()
    deliver(core, conn, sid, (0, 1), (1, 1))
    deliver(core, conn, sid, (0, 2))
    got = [core.next_message(sub) for _ in range(3)]
    assert [(m.offset, m.attempt) for m in got if m] == [(0, 1), (1, 1)] and got[2] is None


def test_redelivery_of_a_consumed_unacked_offset_is_passed_on() -> None:
    core, conn, sub, sid = warm_subscription()
    deliver(core, conn, sid, (0, 1))
    assert core.next_message(sub) is not None
    deliver(core, conn, sid, (0, 2))
    again = core.next_message(sub)
    assert again is not None and (again.offset, again.attempt) == (0, 2)


def test_refused_ack_surfaces_from_the_iterator() -> None:
    core, conn, sub, sid = warm_subscription()
    deliver(core, conn, sid, (0, 1))
    msg = core.next_message(sub)
    assert msg is not None
    core.ack(sub, msg, 0.0)
    core.tick(0.005)  # held acks go out within ACK_DELAY
    [ack] = [f for f in out(core, conn, 0.005) if f[0] == P.ACK]
    assert ack[2:] == [sid, GEN, [0], -1]
    core.receive(conn.id, [P.ACKED, ack[1], sid, 0,
                           [[0, errors.NotDelivered.code, "not delivered"]]], 0.0)
    with pytest.raises(errors.NotDelivered):
        core.next_message(sub)
    assert core.next_message(sub) is None  # not sticky: the subscription goes on


def test_acks_wait_briefly_to_share_a_frame() -> None:
    core, conn, sub, sid = warm_subscription()
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
    core.ack(sub, last, 2.0)  # the buffer is empty: still held (more may come to share it)
    assert [f for f in out(core, conn, 2.0) if f[0] == P.ACK] == []
    assert core.next_deadline() == pytest.approx(2.005)
    core.tick(2.005)
    [ack] = [f for f in out(core, conn, 2.005) if f[0] == P.ACK]
    assert ack[4:] == [[], 9]


def test_a_full_batch_of_acks_goes_at_once() -> None:
    core = ready_core()
    core.subscribe("t", "warm", now=0.0)
    conn = open_shard(core)
    out(core, conn)
    sub, sid = subscribed(core, conn, prefetch=8)   # a batch is prefetch // 4 acks
    deliver(core, conn, sid, *[(o, 1) for o in range(3)])
    for _ in range(2):
        msg = core.next_message(sub)
        assert msg is not None
        assert core.ack(sub, msg, 1.0)
    assert [f[4:] for f in out(core, conn, 1.0) if f[0] == P.ACK] == [[[], 1]]


@pytest.mark.parametrize(("code", "exc"), [(61, errors.SubscriptionInactive),
                                           (62, errors.SubscriptionTakenOver),
                                           (80, errors.NotAuthorized)])
def test_sub_ended_raises_its_typed_error(code: int, exc: type[Exception]) -> None:
    core, conn, sub, sid = warm_subscription()
    deliver(core, conn, sid, (0, 1))
    core.receive(conn.id, [P.SUB_ENDED, sid, code, "over"], 0.0)
    for _ in range(2):
        with pytest.raises(exc):
            core.next_message(sub)


def test_sub_ended_storage_unavailable_resubscribes_by_itself_through_busy() -> None:
    """SUB_ENDED 42 (the topic's log is recovered after damage was read back, §6.8) is
    retryable: the iterator never raises it; the client subscribes again after a
    backoff with the generation it knows and its resume point, retries while the
    shard answers Busy, and the user's acks of an earlier session are kept (G4)."""
    core, conn, sub, sid = warm_subscription()
    deliver(core, conn, sid, (0, 1), (1, 1), (2, 1))
    m0, m1 = core.next_message(sub), core.next_message(sub)
    assert m0 is not None and m1 is not None
    core.ack(sub, m1, 1.0)  # 0 unacked, 1 acked (not yet sent), 2 unconsumed
    core.receive(conn.id, [P.SUB_ENDED, sid, errors.StorageUnavailable.code, "recovering"], 1.0)
    assert core.next_message(sub) is None and sub.status == "waiting"  # never raised
    assert out(core, conn, 1.0) == []  # not at once: after a backoff
    at = core.next_deadline()
    assert 1.0 < at <= 1.2
    core.tick(at)
    [again] = out(core, conn, at)
    assert again[0] == P.SUBSCRIBE and again[2] != sid
    assert (again[3]["name"], again[3]["generation"], again[3]["from_offset"]) == ("s", GEN, 0)
    core.receive(conn.id, [P.ERROR, again[1], errors.Busy.code, "recovering", {}], at)
    assert core.next_message(sub) is None and sub.status == "waiting"
    later = core.next_deadline()
    assert later > at
    core.tick(later)
    [third] = out(core, conn, later)
    assert third[0] == P.SUBSCRIBE and third[3]["generation"] == GEN
    core.receive(conn.id, [P.SUBSCRIBED, third[1], third[2], {
        "created": False, "start_offset": 0, "cursor": 0, "generation": GEN, "clamped": False,
        "reset": False, "next_offset": 3, "max_in_flight": 1000}], later)
    deliver(core, conn, third[2], (0, 1), (1, 1), (2, 1))
    assert [m.offset for m in iter(lambda: core.next_message(sub), None)] == [0, 2]
    core.tick(later + 0.005)
    assert [f[4:] for f in out(core, conn, later + 0.005) if f[0] == P.ACK] == [[[1], -1]]


def test_sub_ended_storage_unavailable_follows_on_reset_raise() -> None:
    """A resubscribe that finds a new generation (the recovery cut acked records) with
    ``on_reset="raise"`` ends the subscription with TopicReset (G7)."""
    core, conn, sub, sid = warm_subscription(on_reset="raise")
    core.receive(conn.id, [P.SUB_ENDED, sid, errors.StorageUnavailable.code, "recovering"], 1.0)
    core.tick(core.next_deadline())
    [again] = out(core, conn, 2.0)
    assert again[3]["on_reset"] == "raise" and again[3]["generation"] == GEN
    core.receive(conn.id, [P.ERROR, again[1], errors.TopicReset.code, "reset",
                           {"old": GEN, "new": 99}], 2.0)
    for _ in range(2):
        with pytest.raises(errors.TopicReset):
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
    core.tick(now + 0.005)
    frames = out(core, conn2, now + 0.005)
    assert [f[4:] for f in frames if f[0] == P.ACK] == [[[3], -1]]
    assert sub.credit_owed == 3  # credit goes back in quarters of prefetch


def test_new_generation_forgets_acks_of_the_old_one() -> None:
    core, conn, sub, sid = warm_subscription()
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
    core, conn, sub, sid = warm_subscription(cursor=offsets[0])
    deliver(core, conn, sid, *[(o, 1) for o in offsets])
    msgs = {}
    while (m := core.next_message(sub)) is not None:
        msgs[m.offset] = m
    order = data.draw(st.permutations(offsets))
    order = order[:data.draw(st.integers(0, len(order)), label="acks")]
    acked: set[int] = set()
    covered: set[int] = set()

    def flush() -> None:
        core.tick(1.0)  # held acks are due
        for frame in out(core, conn, 1.0):
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


@pytest.mark.parametrize("frame", [
    [P.DELIVER, 0, GEN, 1, [0, 1], ["a"], [b"a", b"b"], [1.0, 2]],     # unequal lengths
    [P.DELIVER, 0, GEN, 1, 0, ["a"], [b"a", b"b"], [1.0, 1]],          # a payload too many
    [P.DELIVER, 0, GEN, 1, [0], ["a"], [b"a"]],                        # an array missing
    [P.DELIVER, 0, GEN, "1", [0], ["a"], [b"a"], [1.0, 1]],            # attempt not an int
    [P.DELIVER, 0, GEN, 1, 0, "a", b"a", 1.0],                         # not arrays
    [P.DELIVER, 0, GEN, 1, -1, ["a"], [b"a"], [1.0, 1]],               # a negative first offset
    [P.DELIVER, 0, GEN, 1, 0.0, ["a"], [b"a"], [1.0, 1]],              # a float first offset
    [P.DELIVER, 0, GEN, 1, 0, ["a", "b"], [b"a", b"b"], [1.0, 1]],     # runs cover too few
    [P.DELIVER, 0, GEN, 1, 0, ["a"], [b"a"], [1.0, 1, 2.0]],           # half a run
    [P.DELIVER, 0, GEN, 1, 0, ["a"], [b"a"], [1.0, 2, 2.0, -1]],       # a negative count
    [P.DELIVER, 0, GEN, 1, 0, ["a"], [b"a"], [1.0, 1.0]],              # a float count
])
def test_a_malformed_deliver_closes_the_connection(frame: list[object]) -> None:
    core, conn, sub, sid = warm_subscription()
    frame[1] = sid
    core.receive(conn.id, frame, 0.0)
    assert core.take_closes() == [conn.id]
    assert sub.status == "waiting" and not sub.buffer
