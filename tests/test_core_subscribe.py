"""ShardCore push subscriptions: start options (G6), first-delivery order (G1), window and credit."""

from __future__ import annotations

from test_core_support import GEN, TOPIC, Shard, fetched_messages

from flux import errors
from flux import protocol as P


def _trimmed_topic(shard: Shard, published: int, kept: int) -> None:
    """Publish ``published`` messages and let cleanup free them, then publish ``kept`` more."""
    client = shard.connect()
    client.publish(*[f"old{i}" for i in range(published)])
    shard.after(30.0)  # ttl 20 plus a cleanup pass; no subscription holds them
    assert shard.topic_stats()["oldest"] == published
    client.publish(*[f"new{i}" for i in range(kept)])


def test_subscribe_defaults_to_the_next_offset() -> None:
    """G6: without read_old or from_offset a new subscription starts at the next offset."""
    shard = Shard()
    client = shard.connect()
    client.publish("a", "b")
    reply = client.subscribe(1, name="s")
    assert reply == {"created": True, "start_offset": 2, "cursor": 2, "generation": GEN,
                     "clamped": False, "reset": False, "next_offset": 2, "max_in_flight": 100}
    assert client.deliveries() == []
    client.publish("c")
    assert client.deliveries(1) == [(2, 1)]


def test_read_old_starts_at_the_oldest_held_message() -> None:
    """G6: read_old starts at the oldest message held, not at offset 0 once 0 is cleaned up."""
    shard = Shard()
    _trimmed_topic(shard, published=3, kept=2)
    client = shard.connect()
    reply = client.subscribe(1, name="s", read_old=True)
    assert (reply["start_offset"], reply["cursor"], reply["clamped"]) == (3, 3, False)
    assert client.deliveries(1) == [(3, 1), (4, 1)]


def test_from_offset_starts_at_that_offset() -> None:
    """G6: from_offset starts exactly there."""
    shard = Shard()
    client = shard.connect()
    client.publish("a", "b", "c", "d")
    reply = client.subscribe(1, name="s", from_offset=2)
    assert (reply["start_offset"], reply["clamped"]) == (2, False)
    assert client.deliveries(1) == [(2, 1), (3, 1)]


def test_from_offset_older_than_the_oldest_held_is_clamped_and_says_so() -> None:
    """G6: a from_offset below the oldest held message starts at the oldest, clamped=True."""
    shard = Shard()
    _trimmed_topic(shard, published=3, kept=2)
    client = shard.connect()
    reply = client.subscribe(1, name="s", from_offset=1)
    assert (reply["start_offset"], reply["cursor"], reply["clamped"]) == (3, 3, True)
    assert client.deliveries(1) == [(3, 1), (4, 1)]


def test_from_offset_equal_to_the_next_offset_is_accepted() -> None:
    shard = Shard()
    client = shard.connect()
    client.publish("a", "b")
    assert client.subscribe(1, name="s", from_offset=2)["start_offset"] == 2


def test_from_offset_past_the_next_offset_is_out_of_range() -> None:
    """G8: an offset the topic has not reached gets a typed error and creates nothing."""
    shard = Shard()
    client = shard.connect()
    client.publish("a", "b")
    reply = client.subscribe_frame(1, name="s", from_offset=3)
    assert reply[0] == P.ERROR and reply[2] == errors.OffsetOutOfRange.code
    assert shard.topic_stats()["subscriptions"] == {}


def test_start_options_apply_only_when_the_subscription_is_created() -> None:
    """G6: subscribing again with a name ignores read_old/from_offset; pushes resume at the cursor."""
    shard = Shard()
    client = shard.connect()
    client.publish("a", "b")
    client.subscribe(1, name="s")
    client.publish("c", "d")
    client.ack(1, 2)
    client.unsubscribe(1)
    reply = client.subscribe(2, name="s", read_old=True, from_offset=0)
    assert (reply["created"], reply["start_offset"], reply["cursor"]) == (False, 2, 3)
    assert client.deliveries(2) == [(3, 1)]


def test_deliver_items_carry_offset_id_payload_timestamp_and_attempt() -> None:
    """G2: a DELIVER names the subscription's sid and the generation."""
    shard = Shard()
    client = shard.connect()
    client.subscribe(9, name="s")
    shard.after(2.5)
    client.publish("m", payload=b"body")
    [frame] = client.take(P.DELIVER)
    assert frame == [P.DELIVER, 9, GEN, 1, 0, ["m"], [b"body"], [2.5, 1]]


def test_first_deliveries_are_strictly_increasing_across_publishes_and_acks() -> None:
    """G1: first deliveries of one subscription come in strictly increasing offset order."""
    shard = Shard()
    client = shard.connect()
    client.subscribe(1, name="s", max_in_flight=3, credit=1000)
    seen: list[int] = []
    for i in range(10):
        client.publish(f"m{i}")
        got = client.deliveries(1)
        seen += [o for o, a in got if a == 1]
        for o, _ in got:
            if o % 2 == 0:
                client.ack(1, o)
        seen += [o for o, a in client.deliveries(1) if a == 1]
    # odd offsets are never acked, so the window of 3 fills with them
    assert seen == sorted(set(seen))
    assert seen == [0, 1, 2, 3, 4, 5]


def test_every_subscription_on_the_topic_gets_every_message() -> None:
    """G2: a message is delivered to each subscription whose start is at or before it."""
    shard = Shard()
    a, b = shard.connect(), shard.connect()
    a.subscribe(1, name="one")
    b.subscribe(1, name="two")
    a.publish("x", "y")
    b.subscribe(2, name="late")
    a.publish("z")
    assert a.deliveries(1) == [(0, 1), (1, 1), (2, 1)]
    assert b.deliveries(1) == [(0, 1), (1, 1), (2, 1)]
    assert b.deliveries(2) == [(2, 1)]


def test_messages_of_other_topics_are_not_delivered() -> None:
    shard = Shard()
    client = shard.connect()
    client.subscribe(1, name="s")
    client.publish("a", topic="other.topic")
    client.publish("b")
    assert client.deliveries(1) == [(0, 1)]


def test_window_is_limited_by_max_in_flight() -> None:
    """At most max_in_flight pushed-and-unacked messages; an ack opens room for the next."""
    shard = Shard()
    client = shard.connect()
    client.subscribe(1, name="s", max_in_flight=3, credit=100)
    client.publish(*[f"m{i}" for i in range(6)])
    assert client.deliveries(1) == [(0, 1), (1, 1), (2, 1)]
    client.ack(1, 1)
    assert client.deliveries(1) == [(3, 1)]
    client.ack(1, 0, 2)
    assert client.deliveries(1) == [(4, 1), (5, 1)]


def test_max_in_flight_is_capped_by_the_shard_config() -> None:
    shard = Shard({"subscriber.max_in_flight": 2})
    client = shard.connect()
    reply = client.subscribe(1, name="s", max_in_flight=50)
    assert reply["max_in_flight"] == 2
    client.publish("a", "b", "c")
    assert client.deliveries(1) == [(0, 1), (1, 1)]


def test_window_is_limited_by_credit_and_credit_grants_more() -> None:
    """Only CREDIT (not acks) lets more first deliveries through once credit is used."""
    shard = Shard()
    client = shard.connect()
    client.subscribe(1, name="s", max_in_flight=10, credit=2)
    client.publish(*[f"m{i}" for i in range(6)])
    assert client.deliveries(1) == [(0, 1), (1, 1)]
    client.ack(1, 0, 1)
    assert client.deliveries(1) == []
    assert client.credit(1, 3) == [[P.DELIVER, 1, GEN, 1, 2, ["m2", "m3", "m4"],
                                    [b"m2", b"m3", b"m4"], [0.0, 3]]]
    assert client.deliveries(1) == [(2, 1), (3, 1), (4, 1)]
    client.credit(1, 10)
    assert client.deliveries(1) == [(5, 1)]


def test_credit_defaults_to_max_in_flight() -> None:
    """Without "credit" the shard grants max_in_flight first deliveries, then waits for CREDIT."""
    shard = Shard()
    client = shard.connect()
    client.subscribe(1, name="s", max_in_flight=2)
    client.publish("a", "b", "c")
    assert client.deliveries(1) == [(0, 1), (1, 1)]
    client.ack(1, 0, 1)
    assert client.deliveries(1) == []
    client.credit(1, 1)
    assert client.deliveries(1) == [(2, 1)]


def test_zero_credit_pushes_nothing_until_credit_is_granted() -> None:
    shard = Shard()
    client = shard.connect()
    client.subscribe(1, name="s", credit=0)
    client.publish("a")
    assert client.deliveries(1) == []
    client.credit(1, 1)
    assert client.deliveries(1) == [(0, 1)]


def test_credit_for_an_unknown_sid_is_ignored_without_reply() -> None:
    shard = Shard()
    client = shard.connect()
    assert client.credit(42, 5) == []


def test_strict_mode_pushes_the_next_message_only_after_the_ack() -> None:
    """G1 strict mode: with max_in_flight 1 a subscriber sees exactly the broker's order,
    each message repeated only until it is acked."""
    shard = Shard()
    client = shard.connect()
    client.subscribe(1, name="s", max_in_flight=1, credit=100)
    client.publish("a", "b", "c")
    assert client.deliveries(1) == [(0, 1)]
    shard.advance(10.0)  # timeout 7 + retry_interval 3: offset 0 again, not offset 1
    assert client.deliveries(1) == [(0, 2)]
    client.ack(1, 0)
    assert client.deliveries(1) == [(1, 1)]
    client.ack(1, 1)
    assert client.deliveries(1) == [(2, 1)]
    client.ack(1, 2)
    shard.advance(100.0)
    assert client.deliveries(1) == []


def test_reusing_an_attached_sid_on_the_same_connection_is_refused() -> None:
    """G8: sids are unique per connection while attached."""
    shard = Shard()
    client = shard.connect()
    client.subscribe(1, name="s")
    reply = client.subscribe_frame(1, name="other")
    assert reply[0] == P.ERROR and reply[2] == errors.InvalidRequest.code
    client.publish("a")
    assert client.deliveries(1) == [(0, 1)]
    assert set(shard.topic_stats()["subscriptions"]) == {"s"}


def test_subscribing_to_an_empty_topic_delivers_later_publishes() -> None:
    shard = Shard()
    client = shard.connect()
    reply = client.subscribe(1, name="s", read_old=True)
    assert (reply["start_offset"], reply["next_offset"]) == (0, 0)
    client.publish("a")
    assert client.deliveries(1) == [(0, 1)]


def test_a_publish_from_another_connection_is_pushed_to_the_subscriber() -> None:
    shard = Shard()
    sub, pub = shard.connect(), shard.connect()
    sub.subscribe(3, name="s")
    pub.publish("a")
    assert pub.take(P.DELIVER) == []
    assert sub.deliveries(3) == [(0, 1)]


def test_delivery_timestamp_is_wall_time_of_storage() -> None:
    """DELIVER timestamps are the shard's epoch plus the monotonic time the message was stored."""
    shard = Shard()
    shard.core.epoch = 1_700_000_000.0
    client = shard.connect()
    client.subscribe(1, name="s")
    shard.advance(3.5)
    client.publish("a")
    [frame] = client.take(P.DELIVER)
    assert frame[7] == [1_700_000_003.5, 1]
    assert fetched_messages(client.fetch())[0][3] == 1_700_000_003.5


def test_stats_report_what_the_shard_holds() -> None:
    shard = Shard()
    client = shard.connect()
    client.subscribe(1, name="s", read_old=True)
    client.publish("a", "b")
    client.ack(1, 0)
    reply = client.request([P.STATS, 88])
    assert reply[0] == P.STATS_OK and reply[1] == 88
    body = reply[2]
    assert (body["generation"], body["sessions"]) == (GEN, 1)
    assert body["topics"][TOPIC]["next_offset"] == 2
    assert body["topics"][TOPIC]["subscriptions"]["s"] == {
        "mode": "push", "cursor": 1, "active": True, "in_flight": 1, "ephemeral": False,
        "lag": 1, "delayed": 0, "redelivered": 0}
