"""ShardCore acks (§1 "Acks", G6 cursor): individual, idempotent, cumulative, refusals."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from test_core_support import GEN, TOPIC, Shard

from flux import errors
from flux import protocol as P
from flux.acks import Acks
from flux.shard.subscription import Subscription

QUIET = {"message.cleanup_time": 1000.0, "subscriber.cleanup_time": 1000.0}


def test_ack_reply_carries_rid_sid_cursor_and_no_refusals() -> None:
    shard = Shard(QUIET)
    client = shard.connect()
    client.subscribe(5, name="s")
    client.publish("a", "b")
    assert client.request([P.ACK, 31, 5, GEN, [0], -1]) == [P.ACKED, 31, 5, 1, []]


def test_cursor_is_the_lowest_unacked_offset() -> None:
    """G6: acks above the cursor are remembered; the cursor jumps when the gap closes."""
    shard = Shard(QUIET)
    client = shard.connect()
    client.subscribe(1, name="s")
    client.publish("a", "b", "c", "d")
    assert client.ack(1, 2) == (0, [])
    assert client.ack(1, 0) == (1, [])
    assert client.ack(1, 1) == (3, [])
    assert shard.topic_stats()["subscriptions"]["s"]["cursor"] == 3


def test_ack_is_idempotent() -> None:
    """Acks: acking the same delivered offset again changes nothing and is not refused."""
    shard = Shard(QUIET)
    client = shard.connect()
    client.subscribe(1, name="s")
    client.publish("a", "b", "c")
    assert client.ack(1, 1) == (0, [])
    assert client.ack(1, 1) == (0, [])
    assert client.ack(1, 0, 0) == (2, [])
    assert client.ack(1, 0) == (2, [])


def test_ack_through_acks_every_delivered_offset_up_to_n() -> None:
    """Acks: ack_through(n) acks each offset <= n delivered to this session."""
    shard = Shard(QUIET)
    client = shard.connect()
    client.subscribe(1, name="s")
    client.publish("a", "b", "c", "d")
    assert client.ack(1, through=2) == (3, [])
    shard.advance(100.0)
    assert [o for o, a in client.deliveries(1) if a > 1] == [3, 3]


def test_ack_through_never_acks_an_offset_not_yet_delivered() -> None:
    """Acks: a cumulative ack covers only what this session was sent."""
    shard = Shard(QUIET)
    client = shard.connect()
    client.subscribe(1, name="s", max_in_flight=2, credit=100)
    client.publish("a", "b", "c", "d")
    assert client.deliveries(1) == [(0, 1), (1, 1)]
    assert client.ack(1, through=100) == (2, [])
    # 2 and 3 were pushed only now; the earlier ack_through(100) did not cover them
    assert client.deliveries(1) == [(2, 1), (3, 1)]
    shard.advance(10.0)
    assert client.deliveries(1) == [(2, 2), (3, 2)]


def test_ack_through_and_individual_offsets_combine() -> None:
    shard = Shard(QUIET)
    client = shard.connect()
    client.subscribe(1, name="s")
    client.publish("a", "b", "c", "d", "e")
    assert client.ack(1, 3, through=1) == (2, [])
    assert client.ack(1, 2) == (4, [])  # 4 is still unacked


def test_ack_of_an_offset_not_yet_delivered_is_refused_and_changes_nothing() -> None:
    """Acks: NotDelivered for an offset this session was not sent; it is pushed later as usual."""
    shard = Shard(QUIET)
    client = shard.connect()
    client.subscribe(1, name="s", max_in_flight=1, credit=100)
    client.publish("a", "b")
    cursor, refused = client.ack(1, 1, 7)
    assert cursor == 0
    assert [(r[0], r[1]) for r in refused] == [(1, errors.NotDelivered.code),
                                               (7, errors.NotDelivered.code)]
    assert all(isinstance(r[2], str) and r[2] for r in refused)
    client.ack(1, 0)
    assert client.deliveries(1) == [(0, 1), (1, 1)]
    assert client.ack(1, 1) == (2, [])


def test_ack_of_an_offset_before_the_subscription_start_is_refused() -> None:
    """Acks: an offset below where this subscription started was never delivered to it."""
    shard = Shard(QUIET)
    client = shard.connect()
    client.publish("a", "b", "c")
    client.subscribe(1, name="s")  # starts at 3
    client.publish("d")
    cursor, refused = client.ack(1, 1)
    assert cursor == 3
    assert [(r[0], r[1]) for r in refused] == [(1, errors.NotDelivered.code)]


def test_ack_of_an_offset_acked_by_an_earlier_session_is_refused_to_a_new_one() -> None:
    """Acks: 'delivered to this session' — the new session was never sent offset 1."""
    shard = Shard(QUIET)
    first = shard.connect()
    first.subscribe(1, name="s")
    first.publish("a", "b", "c")
    first.ack(1, 1)
    second = shard.connect()
    second.subscribe(1, name="s")
    assert second.deliveries(1) == [(0, 1), (2, 1)]
    cursor, refused = second.ack(1, 1)
    assert cursor == 0
    assert [(r[0], r[1]) for r in refused] == [(1, errors.NotDelivered.code)]


def test_ack_of_an_offset_acked_and_passed_by_the_cursor_is_still_idempotent() -> None:
    shard = Shard(QUIET)
    client = shard.connect()
    client.subscribe(1, name="s")
    client.publish("a", "b")
    assert client.ack(1, 0, 1) == (2, [])
    assert client.ack(1, 0, 1) == (2, [])


def test_ack_with_another_generation_is_topic_reset_and_changes_nothing() -> None:
    """Acks/G7: an ack of another generation gets TopicReset; the message stays unacked."""
    shard = Shard(QUIET)
    client = shard.connect()
    client.subscribe(1, name="s")
    client.publish("a")
    reply = client.ack_frame(1, [0], generation=GEN + 1)
    assert reply[0] == P.ERROR and reply[2] == errors.TopicReset.code
    assert reply[4] == {"old": GEN + 1, "new": GEN}
    assert shard.topic_stats()["subscriptions"]["s"]["cursor"] == 0
    shard.advance(10.0)
    assert client.deliveries(1) == [(0, 1), (0, 2)]


def test_ack_of_an_unknown_sid_is_unknown_subscription() -> None:
    shard = Shard(QUIET)
    client = shard.connect()
    reply = client.ack_frame(99, [0])
    assert reply[0] == P.ERROR and reply[2] == errors.UnknownSubscription.code


def test_ack_after_unsubscribe_is_unknown_subscription() -> None:
    shard = Shard(QUIET)
    client = shard.connect()
    client.subscribe(1, name="s")
    client.publish("a")
    client.unsubscribe(1)
    reply = client.ack_frame(1, [0])
    assert reply[0] == P.ERROR and reply[2] == errors.UnknownSubscription.code
    assert shard.topic_stats()["subscriptions"]["s"]["cursor"] == 0


def test_ack_on_another_connection_is_unknown_subscription() -> None:
    """Acks: sids are per connection; another connection cannot ack this session's offsets."""
    shard = Shard(QUIET)
    owner, other = shard.connect(), shard.connect()
    owner.subscribe(1, name="s")
    owner.publish("a")
    reply = other.ack_frame(1, [0])
    assert reply[0] == P.ERROR and reply[2] == errors.UnknownSubscription.code
    assert shard.topic_stats()["subscriptions"]["s"]["cursor"] == 0


def test_bad_offsets_are_refused_one_by_one_and_good_ones_applied() -> None:
    """G8: inside an ack batch each bad offset gets its own refusal."""
    shard = Shard(QUIET)
    client = shard.connect()
    client.subscribe(1, name="s")
    client.publish("a", "b")
    reply = client.ack_frame(1, [0, "1", None, 1.0, True, -3, 1])
    assert reply[0] == P.ACKED and reply[3] == 2
    assert [(r[0], r[1]) for r in reply[4]] == [
        ("1", errors.InvalidRequest.code), (None, errors.InvalidRequest.code),
        (1.0, errors.InvalidRequest.code), (True, errors.InvalidRequest.code),
        (-3, errors.NotDelivered.code)]


def test_malformed_ack_frame_is_an_error_and_changes_nothing() -> None:
    """G8: wrong field types get InvalidRequest; nothing is acked."""
    shard = Shard(QUIET)
    client = shard.connect()
    client.subscribe(1, name="s")
    client.publish("a")
    for offsets, through in [(0, -1), ([0], "x"), ({"0": 1}, -1), ([0], None), ([0], 1.5)]:
        reply = client.ack_frame(1, offsets, through)
        assert reply[0] == P.ERROR and reply[2] == errors.InvalidRequest.code, reply
    short = client.request([P.ACK, 900, 1, GEN, [0]])
    assert short[0] == P.ERROR and short[2] == errors.InvalidRequest.code
    assert shard.topic_stats()["subscriptions"]["s"]["cursor"] == 0


def test_acked_offsets_above_the_cursor_are_never_redelivered_after_resubscribe() -> None:
    """G6: acked offsets above the cursor are remembered across sessions."""
    shard = Shard(QUIET)
    first = shard.connect()
    first.subscribe(1, name="s")
    first.publish("a", "b", "c", "d", "e")
    first.ack(1, 1, 3)
    shard.core.disconnect(first.conn, shard.now)
    second = shard.connect()
    reply = second.subscribe(7, name="s")
    assert reply["cursor"] == 0
    assert second.deliveries(7) == [(0, 1), (2, 1), (4, 1)]
    second.ack(7, 0)
    assert second.ack(7, 2) == (4, [])


def test_an_ack_opens_the_window_for_the_next_first_delivery() -> None:
    shard = Shard(QUIET)
    client = shard.connect()
    client.subscribe(1, name="s", max_in_flight=1, credit=10)
    client.publish("a", "b")
    client.take()
    reply = client.send([P.ACK, 500, 1, GEN, [0], -1])
    assert reply == [[P.ACKED, 500, 1, 1, []], [P.DELIVER, 1, GEN, 1, 1, ["b"], [b"b"], [0.0, 1]]]


def test_offset_acked_before_a_reattach_is_not_pushed_when_the_cursor_jumps_over_it() -> None:
    """G6: acked offsets above the cursor are never redelivered, even when the new session's
    window is too small to have passed them before the cursor moved."""
    shard = Shard(QUIET)
    client = shard.connect()
    client.subscribe(1, name="s", max_in_flight=3, credit=10)
    client.publish("a", "b", "c")
    client.ack(1, 1)
    client.unsubscribe(1)
    client.take()
    client.subscribe(2, name="s", max_in_flight=1, credit=10)
    assert client.deliveries(2) == [(0, 1)]
    assert client.ack(2, 0) == (2, [])
    assert client.deliveries(2) == [(2, 1)]
    assert client.ack(2, 2) == (3, [])
    assert client.deliveries(2) == []


@settings(max_examples=300)
@given(cursor=st.integers(0, 5), acked=st.sets(st.integers(0, 12), max_size=3),
       # mostly no gap: a run of offsets from the cursor, the case done in bulk
       pushed=st.lists(st.tuples(st.integers(0, 5).map(lambda g: max(0, g - 3)),
                                 st.integers(1, 3)), max_size=8),
       through=st.integers(-1, 16))
def test_ack_through_in_bulk_is_acking_each_offset_in_turn(
        cursor: int, acked: set[int], pushed: list[tuple[int, int]], through: int) -> None:
    """Acks: the bulk cases of ack_through (everything or a prefix from the cursor) end
    in the same cursor, acked set and in-flight pushes as acking offset by offset."""
    in_flight: dict[int, int] = {}
    offset = cursor
    for gap, pushes in pushed:  # increasing offsets above the cursor, not acked ones
        offset += gap
        while offset in acked:
            offset += 1
        in_flight[offset] = pushes
        offset += 1
    subs = [Subscription(topic="t", name="s", ephemeral=False, mode="push", cursor=cursor,
                         start_offset=0, created_at=0.0,
                         acked=Acks(o for o in acked if o > cursor))
            for _ in range(2)]
    for sub in subs:  # pushed one by one, as the shard does: a run while it can be one
        for o, p in in_flight.items():
            sub.in_flight[o] = p
    count = subs[0].ack_through(through)
    expected = sum(subs[1].ack(o) for o in list(in_flight) if o <= through)
    assert count == expected
    assert (subs[0].cursor, subs[0].acked, subs[0].in_flight) == \
        (subs[1].cursor, subs[1].acked, subs[1].in_flight)
    assert list(subs[0].in_flight) == sorted(subs[0].in_flight)


def test_fully_acked_batches_drop_their_ack_deadlines_at_once() -> None:
    """G4 bookkeeping: a DELIVER batch acked below the cursor leaves the deadline queue
    at the ack, not when its timeout comes; a partly acked batch keeps its deadline."""
    shard = Shard(QUIET)
    client = shard.connect()
    client.subscribe(1, name="s")
    client.publish("a", "b")
    client.publish("c", "d")
    sub = shard.core.topics["orders.eu"].subs["s"]
    assert len(sub.deadlines) == 2
    client.ack(1, through=1)      # the first batch: offsets 0 and 1
    assert [list(d[1]) for d in sub.deadlines] == [[2, 3]]
    client.ack(1, 2)              # half of the second: it stays due
    assert [list(d[1]) for d in sub.deadlines] == [[2, 3]]
    client.ack(1, 3)
    assert not sub.deadlines


def test_frames_received_together_make_one_push_pass() -> None:
    """A CREDIT and an ACK that frees the window, read in the same chunk, are answered
    with one DELIVER of everything they allow (frame by frame: two half-size ones)."""
    shard = Shard({**QUIET, "subscriber.max_in_flight": 4})
    client = shard.connect()
    client.subscribe(1, name="s", credit=2)
    client.publish("a", "b", "c", "d", "e", "f")
    [first] = client.take(P.DELIVER)
    assert first[4] == 0 and first[5] == ["a", "b"]
    shard.core.receive_many(client.conn, [[P.CREDIT, 1, 4], [P.ACK, 99, 1, GEN, [], 1]],
                            shard.now)
    shard.collect()
    [deliver] = client.take(P.DELIVER)
    assert deliver[4] == 2 and deliver[5] == ["c", "d", "e", "f"]


def test_acks_behind_a_message_held_at_the_cursor_cost_one_run() -> None:
    """A message held unacked at the cursor (a long job, a poison message) while every
    later one is acked: the acks above the cursor are one run, not one entry each, and
    the cursor passes them all when it is acked."""
    shard = Shard({"subscriber.max_in_flight": 5000})
    client = shard.connect()
    client.subscribe(1, name="s", credit=5000)
    for first in range(0, 3000, 1000):
        client.publish(*[f"m{i}" for i in range(first, first + 1000)])
    assert len(client.deliveries(1)) == 3000
    for first in range(1, 3000, 100):
        assert client.ack(1, *range(first, min(first + 100, 3000)))[1] == []
    [sub] = shard.core.topics[TOPIC].subs.values()
    assert (sub.cursor, len(sub.acked), sub.acked.runs) == (0, 2999, 1)
    assert client.ack(1, 0) == (3000, [])
    assert not sub.acked
