"""ShardCore generations (G7): what a SUBSCRIBE carrying another generation gets."""

from __future__ import annotations

from test_core_support import GEN, Shard

from flux import errors
from flux import protocol as P

OLD = GEN - 1


def test_subscribe_with_the_current_generation_is_not_a_reset() -> None:
    shard = Shard()
    client = shard.connect()
    client.publish("a", "b")
    reply = client.subscribe(1, name="s", generation=GEN)
    assert (reply["reset"], reply["start_offset"], reply["generation"]) == (False, 2, GEN)


def test_on_reset_earliest_starts_a_new_subscription_at_offset_zero() -> None:
    """G7: 'earliest' restarts at offset 0 of the new generation, so nothing is missed."""
    shard = Shard()
    client = shard.connect()
    client.publish("a", "b")
    reply = client.subscribe(1, name="s", generation=OLD, on_reset="earliest")
    assert (reply["reset"], reply["created"], reply["start_offset"]) == (True, True, 0)
    assert reply["generation"] == GEN
    assert client.deliveries(1) == [(0, 1), (1, 1)]


def test_on_reset_earliest_ignores_a_from_offset_of_the_old_generation() -> None:
    """G7: offsets of two generations are never mixed."""
    shard = Shard()
    client = shard.connect()
    client.publish("a", "b", "c")
    reply = client.subscribe(1, name="s", generation=OLD, from_offset=2)
    assert (reply["reset"], reply["start_offset"]) == (True, 0)


def test_on_reset_is_earliest_by_default() -> None:
    shard = Shard()
    client = shard.connect()
    client.publish("a")
    body = {"topic": "orders.eu", "name": "s", "generation": OLD}
    reply = client.request([P.SUBSCRIBE, 5, 1, body])
    assert reply[0] == P.SUBSCRIBED
    assert (reply[3]["reset"], reply[3]["start_offset"]) == (True, 0)


def test_on_reset_earliest_after_cleanup_starts_at_the_oldest_held() -> None:
    shard = Shard()
    client = shard.connect()
    client.publish("a", "b")
    shard.advance(25.0)
    client.publish("c")
    reply = client.subscribe(1, name="s", generation=OLD)
    assert (reply["reset"], reply["start_offset"], reply["clamped"]) == (True, 2, True)


def test_on_reset_raise_is_topic_reset_with_old_and_new_and_creates_nothing() -> None:
    """G7: 'raise' gets TopicReset(old, new)."""
    shard = Shard()
    client = shard.connect()
    client.publish("a")
    reply = client.subscribe_frame(1, name="s", generation=OLD, on_reset="raise")
    assert reply[0] == P.ERROR and reply[2] == errors.TopicReset.code
    assert reply[4] == {"old": OLD, "new": GEN}
    err = P.error_from_frame(reply)
    assert isinstance(err, errors.TopicReset) and (err.old, err.new) == (OLD, GEN)
    assert shard.topic_stats()["subscriptions"] == {}
    assert client.deliveries() == []


def test_reset_of_an_existing_subscription_keeps_its_cursor() -> None:
    """G6/G7: a subscription that already exists in this generation keeps its place."""
    shard = Shard()
    client = shard.connect()
    client.publish("a", "b", "c")
    client.subscribe(1, name="s", from_offset=1)
    client.ack(1, 1)
    client.unsubscribe(1)
    reply = client.subscribe(2, name="s", generation=OLD)
    assert (reply["reset"], reply["created"], reply["cursor"]) == (True, False, 2)
    assert client.deliveries(2) == [(2, 1)]


def test_every_reply_carries_the_generation() -> None:
    """G7: publish acks, deliveries, subscribe replies and FETCH carry the generation."""
    shard = Shard(generation=12345)
    client = shard.connect()
    client.subscribe(1, name="s")
    reply = client.publish_frame([["orders.eu", ["a"], [b""]]])
    assert reply[2] == 12345
    [deliver] = client.take(P.DELIVER)
    assert deliver[2] == 12345
    assert client.fetch()[2]["generation"] == 12345
    assert client.hello()[2]["generation"] == 12345
