"""ShardCore selective redelivery (G4): per-message timers, the exact push schedule, exhaustion.

Config in these tests: timeout 7, retry_interval 3, retry_count 2, so push k of a
message first pushed at t0 falls at t0 + 10k (k = 0, 1, 2) and the subscription
becomes inactive at t0 + 27 if the last push is not acked.
"""

from __future__ import annotations

from test_core_support import GEN, Shard

from flux import errors
from flux import protocol as P

# cleanup passes and heartbeat checks far away, so next_deadline() shows only G4 timers
QUIET = {"message.cleanup_time": 1000.0, "subscriber.cleanup_time": 1000.0,
         "subscriber.heartbeat": 1000.0}


def _step(shard: Shard) -> float:
    at = shard.core.next_deadline()
    shard.advance(at)
    return at


def test_unacked_message_is_pushed_exactly_at_t0_plus_k_timeout_plus_interval() -> None:
    """G4: push k at t0 + k*(timeout + retry_interval), k = 0..retry_count; then inactive."""
    shard = Shard(QUIET)
    client = shard.connect()
    client.subscribe(1, name="s")
    shard.advance(1.5)
    client.publish("a")
    # ack timeout, re-push, ack timeout, re-push, final ack timeout
    assert [_step(shard) for _ in range(5)] == [8.5, 11.5, 18.5, 21.5, 28.5]
    assert client.timed_deliveries(1) == [(1.5, 0, 1), (11.5, 0, 2), (21.5, 0, 3)]


def test_nothing_is_pushed_before_the_scheduled_moment() -> None:
    """G4: the re-push does not come early."""
    shard = Shard(QUIET)
    client = shard.connect()
    client.subscribe(1, name="s")
    client.publish("a")
    client.deliveries(1)
    shard.advance(9.999)
    assert client.deliveries(1) == []
    shard.advance(10.0)
    assert client.deliveries(1) == [(0, 2)]


def test_subscription_becomes_inactive_after_one_plus_retry_count_pushes() -> None:
    """G4/G6: the last push's ack timeout ends the attachment with SubscriptionInactive (61)."""
    shard = Shard(QUIET)
    client = shard.connect()
    client.subscribe(4, name="s")
    client.publish("a")
    shard.advance(26.9)
    assert client.sub_ended() == []
    assert shard.topic_stats()["subscriptions"]["s"]["active"] is True
    shard.advance(27.0)
    assert client.sub_ended() == [(4, errors.SubscriptionInactive.code)]
    sub = shard.topic_stats()["subscriptions"]["s"]
    assert (sub["active"], sub["cursor"], sub["in_flight"]) == (False, 0, 0)
    assert client.deliveries(4) == [(0, 1), (0, 2), (0, 3)]
    client.publish("b")
    shard.advance(39.0)  # inactive: no pushes at all (inactive_time 40 not reached)
    assert client.deliveries(4) == []
    assert client.sub_ended() == []


def test_acks_after_exhaustion_are_refused_as_inactive() -> None:
    """G6: an inactive subscription's old session cannot ack."""
    shard = Shard(QUIET)
    client = shard.connect()
    client.subscribe(1, name="s")
    client.publish("a")
    shard.advance(27.0)
    reply = client.ack_frame(1, [0])
    assert reply[0] == P.ERROR and reply[2] == errors.SubscriptionInactive.code
    assert shard.topic_stats()["subscriptions"]["s"]["cursor"] == 0


def test_retry_count_zero_means_one_push_then_inactive() -> None:
    shard = Shard({**QUIET, "subscriber.retry_count": 0})
    client = shard.connect()
    client.subscribe(1, name="s")
    client.publish("a")
    assert _step(shard) == 7.0
    assert client.sub_ended() == [(1, errors.SubscriptionInactive.code)]
    assert client.deliveries(1) == [(0, 1)]


def test_zero_retry_interval_pushes_again_at_the_ack_timeout() -> None:
    """G4 with retry_interval 0: push k at t0 + k*timeout."""
    shard = Shard({**QUIET, "subscriber.retry_interval": 0.0})
    client = shard.connect()
    client.subscribe(1, name="s")
    client.publish("a")
    shard.advance(20.0)
    assert client.timed_deliveries(1) == [(0.0, 0, 1), (7.0, 0, 2), (14.0, 0, 3)]
    assert client.sub_ended() == []
    shard.advance(21.0)
    assert client.sub_ended() == [(1, errors.SubscriptionInactive.code)]


def test_only_the_timed_out_message_is_pushed_again() -> None:
    """G4: selective redelivery; acked neighbours are never re-pushed."""
    shard = Shard(QUIET)
    client = shard.connect()
    client.subscribe(1, name="s")
    client.publish("a")       # offset 0 at t=0
    shard.advance(2.0)
    client.publish("b")       # offset 1 at t=2
    shard.advance(4.0)
    client.publish("c")       # offset 2 at t=4
    shard.advance(5.0)
    client.ack(1, 1)
    assert client.deliveries(1) == [(0, 1), (1, 1), (2, 1)]
    shard.advance(19.0)
    assert client.timed_deliveries(1) == [(10.0, 0, 2), (14.0, 2, 2)]


def test_an_ack_before_the_timeout_cancels_all_re_pushes() -> None:
    shard = Shard(QUIET)
    client = shard.connect()
    client.subscribe(1, name="s")
    client.publish("a")
    shard.advance(6.9)
    client.ack(1, 0)
    shard.advance(100.0)
    assert client.deliveries(1) == [(0, 1)]
    assert client.sub_ended() == []


def test_an_ack_between_timeout_and_re_push_cancels_the_re_push() -> None:
    """G4: 'unless the message was acked first' holds during retry_interval too."""
    shard = Shard(QUIET)
    client = shard.connect()
    client.subscribe(1, name="s")
    client.publish("a")
    shard.advance(8.0)  # past the ack timeout (7), before the re-push (10)
    assert client.ack(1, 0) == (1, [])
    shard.advance(100.0)
    assert client.deliveries(1) == [(0, 1)]
    assert client.sub_ended() == []


def test_an_ack_of_a_re_pushed_message_stops_further_pushes() -> None:
    shard = Shard(QUIET)
    client = shard.connect()
    client.subscribe(1, name="s")
    client.publish("a")
    shard.advance(12.0)
    client.ack(1, 0)
    shard.advance(100.0)
    assert client.deliveries(1) == [(0, 1), (0, 2)]
    assert client.sub_ended() == []


def test_re_pushes_due_together_go_in_one_frame_in_offset_order() -> None:
    """G1: redeliveries due at the same moment go in offset order."""
    shard = Shard(QUIET)
    client = shard.connect()
    client.subscribe(1, name="s", credit=100)
    client.publish("a", "b", "c")
    client.ack(1, 1)
    client.take()
    shard.advance(10.0)
    [frame] = client.take(P.DELIVER)
    assert frame == [P.DELIVER, 1, GEN, 2, [0, 2], ["a", "c"], [b"a", b"c"], [0.0, 2]]


def test_re_pushes_due_together_go_in_one_frame_per_attempt_in_offset_order() -> None:
    """G1: offset 0 (third push) and offset 1 (second push) fall due together at t=20.

    Offset 1 is published at t=10 *before* the shell runs the tick due at t=10, so
    its timer entry is queued ahead of offset 0's; a DELIVER has one attempt number,
    so they go in two frames, in offset order.
    """
    shard = Shard(QUIET)
    client = shard.connect()
    client.subscribe(1, name="s", credit=100)
    client.publish("a")                     # offset 0, t0 = 0
    shard.now = 10.0                        # a frame arrives before the overdue tick
    client.publish("b")                     # offset 1, t0 = 10
    shard.advance(10.0)                     # offset 0's second push
    client.take()
    shard.advance(20.0)
    frames = client.take(P.DELIVER)
    assert [f[3:5] for f in frames] == [[3, [0]], [2, [1]]]


def test_re_pushes_do_not_consume_credit() -> None:
    """Only attempt-1 pushes use credit: a re-push comes even with no credit left."""
    shard = Shard(QUIET)
    client = shard.connect()
    client.subscribe(1, name="s", credit=1)
    client.publish("a", "b")
    shard.advance(10.0)
    assert client.deliveries(1) == [(0, 1), (0, 2)]
    client.ack(1, 0)
    assert client.deliveries(1) == []  # still no credit for offset 1
    client.credit(1, 1)
    assert client.deliveries(1) == [(1, 1)]


def test_resubscribe_after_exhaustion_resumes_at_the_cursor_with_fresh_push_counts() -> None:
    """G4/G6: subscribing again reactivates; pushes resume from the cursor, attempt 1 again."""
    shard = Shard(QUIET)
    client = shard.connect()
    client.subscribe(1, name="s")
    client.publish("a", "b", "c")
    client.ack(1, 1)
    shard.advance(27.0)
    assert client.sub_ended() == [(1, errors.SubscriptionInactive.code)]
    client.take()
    shard.advance(30.0)
    reply = client.subscribe(1, name="s")
    assert (reply["created"], reply["cursor"]) == (False, 0)
    assert client.timed_deliveries(1) == [(30.0, 0, 1), (30.0, 2, 1)]
    assert [_step(shard) for _ in range(5)] == [37.0, 40.0, 47.0, 50.0, 57.0]
    assert client.timed_deliveries(1) == [(40.0, 0, 2), (40.0, 2, 2), (50.0, 0, 3), (50.0, 2, 3)]
    assert client.sub_ended() == [(1, errors.SubscriptionInactive.code)]


def test_resubscribe_before_exhaustion_restarts_push_counts() -> None:
    """G6: reattaching restarts push counts even if the message was already re-pushed."""
    shard = Shard(QUIET)
    client = shard.connect()
    client.subscribe(1, name="s")
    client.publish("a")
    shard.advance(12.0)
    assert client.deliveries(1) == [(0, 1), (0, 2)]
    client.unsubscribe(1)
    shard.advance(15.0)
    client.subscribe(2, name="s")
    shard.advance(45.0)
    assert client.timed_deliveries(2) == [(15.0, 0, 1), (25.0, 0, 2), (35.0, 0, 3)]
    assert client.sub_ended() == [(2, errors.SubscriptionInactive.code)]
    assert client.deliveries(1) == []


def test_no_redelivery_to_a_detached_session() -> None:
    """G6: an inactive subscription gets no pushes, and its old timers do nothing."""
    shard = Shard(QUIET)
    client = shard.connect()
    client.subscribe(1, name="s")
    client.publish("a")
    client.deliveries(1)
    client.unsubscribe(1)
    shard.advance(39.0)
    assert client.take() == []
    assert shard.topic_stats()["subscriptions"]["s"]["active"] is False


def test_exhaustion_keeps_the_cursor_and_acked_offsets() -> None:
    """G6: after inactivity, offsets acked above the cursor are not pushed again."""
    shard = Shard(QUIET)
    client = shard.connect()
    client.subscribe(1, name="s")
    client.publish("a", "b", "c", "d")
    client.ack(1, 1, 3)
    shard.advance(27.0)
    client.take()
    client.subscribe(1, name="s")
    assert client.deliveries(1) == [(0, 1), (2, 1)]
