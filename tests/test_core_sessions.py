"""ShardCore sessions and subscription lifetime (G6): takeover, ephemeral, heartbeat, cleanup.

Subscriber cleanup passes run every 10 s (t = 10, 20, ...) and delete what has
been inactive for 40 s; heartbeat is 5 s in the tests that need it (10 s of silence
closes a session).
"""

from __future__ import annotations

from test_core_support import GEN, TOPIC, Shard

from flux import errors
from flux import protocol as P

HEARTBEAT = {"subscriber.heartbeat": 5.0}


def _subs(shard: Shard) -> dict[str, dict[str, object]]:
    return dict(shard.topic_stats()["subscriptions"])


# -- takeover ------------------------------------------------------------------------------


def test_second_session_with_the_same_name_takes_over() -> None:
    """G6: the older session gets SUB_ENDED(SubscriptionTakenOver); the new one gets the pushes."""
    shard = Shard()
    old, new = shard.connect(), shard.connect()
    old.subscribe(3, name="s")
    old.publish("a", "b")
    old.ack(3, 0)
    reply = new.subscribe(8, name="s")
    assert (reply["created"], reply["cursor"]) == (False, 1)
    assert old.sub_ended() == [(3, errors.SubscriptionTakenOver.code)]
    assert new.sub_ended() == []
    assert new.deliveries(8) == [(1, 1)]
    old.deliveries()
    old.publish("c")
    assert old.deliveries() == []
    assert new.deliveries(8) == [(2, 1)]


def test_acks_of_a_taken_over_session_are_refused_and_change_nothing() -> None:
    """G6: after a takeover the older session's acks are refused with SubscriptionTakenOver."""
    shard = Shard()
    old, new = shard.connect(), shard.connect()
    old.subscribe(1, name="s")
    old.publish("a")
    new.subscribe(1, name="s")
    reply = old.ack_frame(1, [0])
    assert reply[0] == P.ERROR and reply[2] == errors.SubscriptionTakenOver.code
    assert _subs(shard)["s"]["cursor"] == 0
    assert new.ack(1, 0) == (1, [])


def test_acks_of_a_taken_over_session_stay_refused_after_the_new_session_leaves() -> None:
    """G6: 'refused from then on'; the old session never regains the subscription by acking."""
    shard = Shard()
    old, new = shard.connect(), shard.connect()
    old.subscribe(1, name="s")
    old.publish("a")
    new.subscribe(1, name="s")
    new.unsubscribe(1)
    reply = old.ack_frame(1, [0])
    assert reply[0] == P.ERROR
    assert reply[2] in (errors.SubscriptionTakenOver.code, errors.SubscriptionInactive.code)
    assert _subs(shard)["s"]["cursor"] == 0


def test_takeover_restarts_push_counts() -> None:
    """G6: the new session's first push of an unacked message is attempt 1."""
    shard = Shard()
    old, new = shard.connect(), shard.connect()
    old.subscribe(1, name="s")
    old.publish("a")
    shard.advance(12.0)
    assert old.deliveries(1) == [(0, 1), (0, 2)]
    new.subscribe(1, name="s")
    shard.advance(30.0)
    assert new.timed_deliveries(1) == [(12.0, 0, 1), (22.0, 0, 2)]
    assert old.deliveries() == []


def test_taken_over_session_leaving_does_not_detach_the_new_session() -> None:
    shard = Shard()
    old, new = shard.connect(), shard.connect()
    old.subscribe(1, name="s")
    new.subscribe(2, name="s")
    old.unsubscribe(1)
    shard.core.disconnect(old.conn, shard.now)
    assert _subs(shard)["s"]["active"] is True
    new.publish("a")
    assert new.deliveries(2) == [(0, 1)]


def test_takeover_within_one_connection_by_a_new_sid() -> None:
    shard = Shard()
    client = shard.connect()
    client.subscribe(1, name="s")
    client.subscribe(2, name="s")
    assert client.sub_ended() == [(1, errors.SubscriptionTakenOver.code)]
    client.publish("a")
    assert client.deliveries() == [(0, 1)]
    reply = client.ack_frame(1, [0])
    assert reply[2] == errors.SubscriptionTakenOver.code
    assert client.ack(2, 0) == (1, [])


def test_credit_from_a_taken_over_session_is_ignored() -> None:
    shard = Shard()
    old, new = shard.connect(), shard.connect()
    old.subscribe(1, name="s")
    new.subscribe(1, name="s", credit=1)
    old.credit(1, 100)
    new.publish("a", "b")
    assert new.deliveries(1) == [(0, 1)]


def test_old_session_may_take_the_subscription_back() -> None:
    shard = Shard()
    old, new = shard.connect(), shard.connect()
    old.subscribe(1, name="s")
    new.subscribe(1, name="s")
    old.subscribe(1, name="s")
    assert new.sub_ended() == [(1, errors.SubscriptionTakenOver.code)]
    old.publish("a")
    assert old.deliveries(1) == [(0, 1)]


# -- ephemeral -----------------------------------------------------------------------------


def test_ephemeral_subscription_is_deleted_on_unsubscribe() -> None:
    """G6: a subscribe without a name is deleted when its session ends."""
    shard = Shard()
    client = shard.connect()
    client.subscribe(1)
    assert len(_subs(shard)) == 1
    assert client.unsubscribe(1) == [P.UNSUBSCRIBED, 2, 1]
    assert _subs(shard) == {}
    reply = client.ack_frame(1, [0])
    assert reply[2] == errors.UnknownSubscription.code


def test_ephemeral_subscription_is_deleted_on_disconnect() -> None:
    shard = Shard()
    client = shard.connect()
    client.subscribe(1)
    shard.core.disconnect(client.conn, shard.now)
    assert _subs(shard) == {}


def test_ephemeral_subscriptions_of_two_connections_are_distinct() -> None:
    shard = Shard()
    a, b = shard.connect(), shard.connect()
    a.subscribe(1)
    b.subscribe(1)
    assert a.sub_ended() == [] and b.sub_ended() == []
    a.publish("x")
    assert a.deliveries(1) == [(0, 1)]
    assert b.deliveries(1) == [(0, 1)]
    a.unsubscribe(1)
    assert len(_subs(shard)) == 1


def test_ephemeral_subscription_is_deleted_when_exhausted() -> None:
    """G4/G6: an exhausted ephemeral subscription cannot be resumed by name, so it goes."""
    shard = Shard()
    client = shard.connect()
    client.subscribe(1)
    client.publish("a")
    shard.advance(27.0)
    assert client.sub_ended() == [(1, errors.SubscriptionInactive.code)]
    assert _subs(shard) == {}


def test_named_subscription_outlives_its_session() -> None:
    """G6: a disconnect makes a named subscription inactive, not deleted."""
    shard = Shard()
    client = shard.connect()
    client.subscribe(1, name="s")
    shard.core.disconnect(client.conn, shard.now)
    assert _subs(shard)["s"]["active"] is False


# -- heartbeat -----------------------------------------------------------------------------


def test_silent_session_is_closed_after_two_heartbeats() -> None:
    """G6: no frame for 2*heartbeat closes the session (after an ERROR) and detaches it."""
    shard = Shard(HEARTBEAT)
    client = shard.connect()
    client.subscribe(1, name="s")
    shard.advance(9.99)
    assert not client.closed and _subs(shard)["s"]["active"] is True
    shard.advance(10.0)
    assert client.closed
    [err] = client.errors()
    assert err[2] == errors.ProtocolError.code and "heartbeat" in err[3]
    assert client.conn not in shard.core.sessions
    assert _subs(shard)["s"]["active"] is False


def test_any_frame_keeps_a_session_alive() -> None:
    shard = Shard(HEARTBEAT)
    client = shard.connect()
    client.subscribe(1, name="s")
    for t in (6.0, 12.0, 18.0):
        shard.advance(t)
        client.ping()
    shard.advance(27.9)
    assert not client.closed
    shard.advance(28.0)
    assert client.closed


def test_heartbeat_close_is_due_exactly_two_heartbeats_after_the_last_frame() -> None:
    shard = Shard({**HEARTBEAT, "message.cleanup_time": 1000.0,
                   "subscriber.cleanup_time": 1000.0})
    client = shard.connect()
    shard.advance(3.0)
    client.ping()
    assert shard.core.next_deadline() == 10.0  # first check: nothing expired yet
    shard.advance(10.0)
    assert not client.closed
    assert shard.core.next_deadline() == 13.0
    shard.advance(13.0)
    assert client.closed


def test_a_closed_session_ignores_further_frames() -> None:
    shard = Shard(HEARTBEAT)
    client = shard.connect()
    client.subscribe(1, name="s")
    shard.advance(10.0)
    assert client.closed
    client.take()
    shard.core.receive(client.conn, [P.PUBLISH, 9, [[TOPIC, ["a"], [b""]]]], shard.now)
    shard.collect()
    assert client.take() == []
    assert shard.topic_stats()["next_offset"] == 0


def test_heartbeat_closure_makes_the_subscription_inactive_from_that_moment() -> None:
    """G6: inactive at t=10 (the close), so deleted at the pass at t=50, not t=40."""
    shard = Shard(HEARTBEAT)
    client = shard.connect()
    client.subscribe(1, name="s")
    shard.advance(49.9)
    assert "s" in _subs(shard)
    shard.advance(50.0)
    assert _subs(shard) == {}


# -- subscriber cleanup --------------------------------------------------------------------


def test_inactive_subscription_is_deleted_at_the_first_pass_after_inactive_time() -> None:
    """G6: inactive from t=3; 40 s later is t=43; the first pass after that is t=50."""
    shard = Shard()
    client = shard.connect()
    client.subscribe(1, name="s")
    shard.advance(3.0)
    client.unsubscribe(1)
    shard.advance(49.9)
    assert _subs(shard)["s"]["active"] is False
    shard.advance(50.0)
    assert _subs(shard) == {}


def test_subscription_inactive_exactly_inactive_time_before_a_pass_is_deleted_then() -> None:
    shard = Shard()
    client = shard.connect()
    client.subscribe(1, name="s")
    shard.advance(10.0)
    client.unsubscribe(1)
    shard.advance(49.9)
    assert "s" in _subs(shard)
    shard.advance(50.0)
    assert _subs(shard) == {}


def test_reactivated_subscription_is_not_deleted() -> None:
    shard = Shard()
    client = shard.connect()
    client.subscribe(1, name="s")
    shard.advance(3.0)
    client.unsubscribe(1)
    shard.advance(30.0)
    client.subscribe(1, name="s")
    shard.advance(200.0)
    assert _subs(shard)["s"]["active"] is True


def test_inactivity_time_restarts_when_a_subscription_is_reactivated_and_left_again() -> None:
    """G6: inactive 3..30, active 30..35, inactive from 35: deleted at the pass at t=80."""
    shard = Shard()
    client = shard.connect()
    client.subscribe(1, name="s")
    shard.advance(3.0)
    client.unsubscribe(1)
    shard.advance(30.0)
    client.subscribe(1, name="s")
    shard.advance(35.0)
    client.unsubscribe(1)
    shard.advance(79.9)
    assert "s" in _subs(shard)
    shard.advance(80.0)
    assert _subs(shard) == {}


def test_active_subscription_is_never_deleted() -> None:
    shard = Shard()
    client = shard.connect()
    client.subscribe(1, name="s")
    shard.advance(500.0)
    assert "s" in _subs(shard)


def test_deleted_subscription_name_creates_a_new_one_with_new_start_options() -> None:
    """G6: after deletion, the next subscribe with the name creates it again."""
    shard = Shard()
    client = shard.connect()
    client.subscribe(1, name="s")
    client.publish("a", "b")
    client.ack(1, 0, 1)
    client.unsubscribe(1)
    shard.advance(40.0)  # inactive since t=0: deleted at the pass at t=40
    assert _subs(shard) == {}
    client.publish("c", "d")
    reply = client.subscribe(1, name="s", from_offset=3)
    assert (reply["created"], reply["start_offset"], reply["cursor"]) == (True, 3, 3)


def test_acks_to_a_deleted_subscription_are_unknown_subscription() -> None:
    shard = Shard()
    client = shard.connect()
    client.subscribe(1, name="s")
    client.publish("a")
    shard.advance(27.0)  # exhausted: inactive from t=27
    client.take()
    shard.advance(70.0)
    assert _subs(shard) == {}
    reply = client.ack_frame(1, [0])
    assert reply[0] == P.ERROR and reply[2] == errors.UnknownSubscription.code


def test_framing_failure_closes_only_that_connection_after_an_error() -> None:
    """G8: framing corruption gets an ERROR and closes that one connection."""
    shard = Shard()
    bad, good = shard.connect(), shard.connect()
    good.subscribe(1, name="g")
    shard.core.fail(bad.conn, errors.FrameTooLarge("too big", size=1 << 30, limit=1024),
                    shard.now)
    shard.collect()
    assert bad.closed and not good.closed
    [err] = bad.errors()
    assert err[:3] == [P.ERROR, 0, errors.FrameTooLarge.code]
    good.publish("a")
    assert good.deliveries(1) == [(0, 1)]


def test_framing_failure_makes_subscriptions_inactive_from_the_failure_time() -> None:
    """G6: the session ends at the failure (t=9), not at its last good frame (t=0)."""
    shard = Shard()
    client = shard.connect()
    client.subscribe(1, name="s")
    shard.advance(9.0)
    shard.core.fail(client.conn, errors.ProtocolError("undecodable frame"), shard.now)
    shard.collect()
    assert client.closed
    shard.advance(45.0)  # a pass at t=40 must not delete it: inactive only 31 s by then
    assert "s" in _subs(shard)
    shard.advance(50.0)
    assert _subs(shard) == {}


def test_hello_with_an_unsupported_version_is_refused_and_closes() -> None:
    shard = Shard()
    client = shard.connect()
    reply = client.request([P.HELLO, 1, {"version": 99, "role": "client"}])
    assert reply[0] == P.ERROR and reply[2] == errors.UnsupportedVersion.code
    assert client.closed


def test_a_version_5_client_is_still_served_and_told_its_version() -> None:
    shard = Shard()
    client = shard.connect()
    reply = client.request([P.HELLO, 1, {"version": 5, "role": "client"}])
    assert reply[0] == P.HELLO_OK and reply[2]["version"] == 5
    assert client.publish("a") and not client.closed
    reply = shard.connect().request([P.HELLO, 1, {"version": 4, "role": "client"}])
    assert reply[0] == P.ERROR and reply[2] == errors.UnsupportedVersion.code


def test_hello_reply_describes_the_shard() -> None:
    shard = Shard(HEARTBEAT, index=1, shard_count=3)
    client = shard.connect()
    assert client.hello() == [P.HELLO_OK, 1, {
        "version": P.VERSION, "role": "shard", "index": 1, "shard_count": 3,
        "generation": GEN, "heartbeat": 5.0, "max_frame_bytes": shard.config.max_frame_bytes}]


def test_a_version_4_client_gets_unsupported_version() -> None:
    """Version 5 added keys, headers and delays (DELIVER out of offset order, a ninth
    field): a version-4 client is refused at HELLO rather than misreading them."""
    shard = Shard()
    client = shard.connect()
    reply = client.request([P.HELLO, 1, {"version": 4, "role": "client"}])
    assert reply[0] == P.ERROR and reply[2] == errors.UnsupportedVersion.code
    assert "speaks 5" in reply[3] and client.closed
