"""ShardCore message cleanup (G2 hold for ttl, G5 delete only when expired and acked by all).

Message cleanup passes run every 5 s (t = 5, 10, ...), ttl is 20 s.
"""

from __future__ import annotations

from test_core_support import OK, TOPIC, Shard

from flux import protocol as P

# keep subscriptions alive and their messages unexhausted for the whole test
PATIENT = {"subscriber.inactive_time": 10_000.0, "subscriber.retry_count": 1000}


def _held(shard: Shard) -> tuple[int, int]:
    """(oldest, held) of the test topic."""
    stats = shard.topic_stats()
    return int(stats["oldest"]), int(stats["held"])


def test_message_is_held_for_ttl_even_with_no_subscription() -> None:
    """G2: stored at t=1, ttl 20: still held at the pass at t=20, deleted at the pass at t=25."""
    shard = Shard()
    client = shard.connect()
    shard.advance(1.0)
    client.publish("a")
    shard.advance(24.9)
    assert _held(shard) == (0, 1)
    shard.advance(25.0)
    assert _held(shard) == (1, 0)


def test_message_is_deleted_at_the_first_pass_after_its_ttl() -> None:
    """G5: stored at t=0, expired at t=20, which is a pass time."""
    shard = Shard()
    client = shard.connect()
    client.publish("a")
    shard.advance(19.9)
    assert _held(shard) == (0, 1)
    shard.advance(20.0)
    assert _held(shard) == (1, 0)


def test_cleanup_deletes_only_expired_messages() -> None:
    shard = Shard()
    client = shard.connect()
    client.publish("a")           # t=0
    shard.advance(12.0)
    client.publish("b")           # t=12
    shard.advance(25.0)
    assert _held(shard) == (1, 1)
    shard.advance(35.0)
    assert _held(shard) == (2, 0)


def test_unacked_message_is_never_deleted_on_ttl_alone() -> None:
    """G5: a message a subscription has not acked stays, however old."""
    shard = Shard(PATIENT)
    client = shard.connect()
    client.subscribe(1, name="s")
    client.publish("a", "b")
    client.ack(1, 0)
    shard.advance(500.0)
    assert _held(shard) == (1, 1)
    client.ack(1, 1)
    shard.advance(505.0)
    assert _held(shard) == (2, 0)


def test_acked_message_is_still_held_until_its_ttl() -> None:
    """G2: acked by every subscription, but held for ttl anyway."""
    shard = Shard()
    client = shard.connect()
    client.subscribe(1, name="s")
    client.publish("a")
    client.ack(1, 0)
    shard.advance(15.0)
    assert _held(shard) == (0, 1)
    shard.advance(20.0)
    assert _held(shard) == (1, 0)


def test_message_is_held_until_every_subscription_has_acked_it() -> None:
    """G5: one subscription's ack is not enough."""
    shard = Shard(PATIENT)
    a, b = shard.connect(), shard.connect()
    a.subscribe(1, name="one")
    b.subscribe(1, name="two")
    a.publish("m")
    a.ack(1, 0)
    shard.advance(100.0)
    assert _held(shard) == (0, 1)
    b.ack(1, 0)
    shard.advance(105.0)
    assert _held(shard) == (1, 0)


def test_inactive_subscription_keeps_holding_its_unacked_messages() -> None:
    """G6: a disconnected named subscription still holds what it has not acked."""
    shard = Shard(PATIENT)
    client = shard.connect()
    client.subscribe(1, name="s")
    client.publish("a")
    shard.core.disconnect(client.conn, shard.now)
    shard.advance(1000.0)
    assert _held(shard) == (0, 1)


def test_exhausted_subscription_holds_until_it_is_deleted_then_releases() -> None:
    """G4/G5/G6: exhausted at t=27, deleted at the pass at t=70; the message goes at t=70."""
    shard = Shard()
    client = shard.connect()
    client.subscribe(1, name="s")
    client.publish("a")
    shard.advance(69.9)
    assert _held(shard) == (0, 1)
    assert "s" in shard.topic_stats()["subscriptions"]
    shard.advance(70.0)
    assert shard.topic_stats()["subscriptions"] == {}
    shard.advance(75.0)
    assert _held(shard) == (1, 0)


def test_ephemeral_subscription_releases_its_messages_when_its_session_ends() -> None:
    """G5: a deleted subscription no longer holds anything."""
    shard = Shard(PATIENT)
    client = shard.connect()
    client.subscribe(1)
    client.publish("a")
    shard.advance(50.0)
    assert _held(shard) == (0, 1)
    client.unsubscribe(1)
    shard.advance(55.0)
    assert _held(shard) == (1, 0)


def test_subscription_created_after_a_message_does_not_hold_it() -> None:
    """G2/G5: a subscription only holds offsets at or after its start."""
    shard = Shard(PATIENT)
    client = shard.connect()
    client.publish("a")
    client.subscribe(1, name="s")  # starts at 1
    client.publish("b")
    shard.advance(25.0)
    assert _held(shard) == (1, 1)


def test_cleanup_stops_at_the_lowest_cursor() -> None:
    """G5: acked offsets above an unacked one are kept (the pass never skips a gap)."""
    shard = Shard(PATIENT)
    client = shard.connect()
    client.subscribe(1, name="s")
    client.publish("a", "b", "c")
    client.ack(1, 0, 2)
    shard.advance(100.0)
    oldest, _ = _held(shard)
    assert oldest == 1
    assert shard.core.topics["orders.eu"].log.get(1) is not None


def test_held_bytes_and_dedup_ids_are_reported_and_released() -> None:
    """G5: ids count toward memory until the dedup window forgets them."""
    shard = Shard()
    client = shard.connect()
    client.publish("abc", payload=b"12345")
    stats = shard.topic_stats()
    assert (stats["held_bytes"], stats["dedup_ids"]) == (5 + 3 + 3, 1)
    shard.advance(25.0)
    stats = shard.topic_stats()
    assert (stats["held_bytes"], stats["dedup_ids"]) == (3, 1)
    shard.advance(50.0)
    stats = shard.topic_stats()
    assert (stats["held_bytes"], stats["dedup_ids"]) == (0, 0)


def test_cleanup_passes_run_on_their_fixed_period() -> None:
    """G5: a pass runs every message.cleanup_time, whatever else happens."""
    shard = Shard({"subscriber.cleanup_time": 1000.0, "subscriber.heartbeat": 1000.0})
    shard.advance(21.0)
    assert shard.ticks == [5.0, 10.0, 15.0, 20.0]


def test_a_late_tick_runs_one_pass_and_keeps_the_period() -> None:
    shard = Shard({"subscriber.cleanup_time": 1000.0, "subscriber.heartbeat": 1000.0})
    client = shard.connect()
    client.publish("a")
    shard.core.tick(23.0)  # the shell woke late: passes due at 5..20 collapse into one
    shard.now = 23.0
    assert _held(shard) == (1, 0)
    assert shard.core.next_deadline() == 25.0


def test_a_large_pass_runs_in_slices_that_stay_due_until_it_is_done() -> None:
    """G5 without stalls: a pass with more to free than one slice frees CLEANUP_SLICE
    messages and ids per tick and stays due (the shell ticks again after serving its
    sockets); the whole pass still completes at its own time."""
    from flux import protocol as P
    from flux.shard.cleanup import CLEANUP_SLICE

    shard = Shard({"topic.buffer": 4096})
    core = shard.core
    conn = core.connect(0.0)
    total = 3 * CLEANUP_SLICE
    batch = CLEANUP_SLICE // 2  # (at most topic.buffer a frame)
    for f in range(total // batch):
        ids = [f"m{f}.{i}" for i in range(batch)]
        core.receive(conn, [P.PUBLISH, f + 1, [["orders.eu", ids, [b"x"] * batch]]], 0.0)
    core.take_output()
    at = 50.0  # past ttl (20 s) and dedup_window (50 s): messages and ids are due
    freed: list[tuple[int, int]] = []
    while True:
        shard.now = at
        core.tick(at)
        stats = shard.topic_stats()
        freed.append((stats["held"], stats["dedup_ids"]))
        if core.next_deadline() > at:
            break
        assert len(freed) < 10, freed
    assert freed[-1] == (0, 0)
    steps = [(h0 + d0) - (h1 + d1) for (h0, d0), (h1, d1) in
             zip([(total, total), *freed], freed, strict=False)]
    assert all(step <= CLEANUP_SLICE for step in steps), steps
    assert 2 * total // CLEANUP_SLICE <= len(freed) <= 2 * total // CLEANUP_SLICE + 1
    assert core.next_deadline() == 55.0  # the next pass keeps the 5 s period


# -- retiring topics left with nothing ---------------------------------------------------


def test_topic_left_with_nothing_is_retired_and_used_again_from_its_next_offset() -> None:
    """A topic with no message, no remembered id and no subscription is forgotten at a
    pass (ttl 20 s, dedup window 50 s: at t=50); publishing again continues at its
    next offset, so no offset is reused (G1)."""
    shard = Shard()
    client = shard.connect()
    client.publish("a", "b")
    shard.advance(45.0)
    assert _held(shard) == (2, 0) and TOPIC in shard.core.topics  # ids still remembered
    shard.advance(50.0)
    assert TOPIC not in shard.core.topics and shard.core.retired == {TOPIC: 2}
    assert shard.stats()["retired_topics"] == 1
    reply = client.fetch(offset=0)
    # read like a held topic whose messages are all gone: from max(offset, oldest)
    assert (reply[2]["oldest"], reply[2]["next"], reply[3], reply[4]) == (2, 2, 2, [])
    assert client.publish_one("a") == 2  # the window has passed: a new message
    assert shard.core.retired == {}
    assert client.publish("a") == [[OK, 2, True]]  # G3 in the new topic object


def test_topic_that_remembers_ids_is_not_retired_and_still_deduplicates() -> None:
    """G3 across cleanup: messages gone at t=20, ids remembered until t=50."""
    shard = Shard()
    client = shard.connect()
    client.publish("a")
    shard.advance(25.0)
    assert _held(shard) == (1, 0) and TOPIC in shard.core.topics
    assert client.publish("a") == [[OK, 0, True]]


def test_topic_with_a_subscription_is_not_retired() -> None:
    shard = Shard(PATIENT)
    client = shard.connect()
    info = client.subscribe(1, name="s")
    assert info["start_offset"] == 0
    client.publish("a")
    client.ack(1, 0)
    client.unsubscribe(1)             # inactive, kept for inactive_time (10 000 s)
    shard.advance(100.0)
    assert _held(shard) == (1, 0) and TOPIC in shard.core.topics
    assert "s" in shard.topic_stats()["subscriptions"]


def test_subscribing_to_a_retired_topic_starts_at_its_next_offset() -> None:
    shard = Shard()
    client = shard.connect()
    client.publish("a", "b", "c")
    shard.advance(50.0)
    assert shard.core.retired == {TOPIC: 3}
    assert client.subscribe(1, name="s", read_old=True)["start_offset"] == 3
    assert TOPIC in shard.core.topics and shard.core.retired == {}
    client.publish("d")
    assert client.deliveries(1) == [(3, 1)]


def test_refused_subscribe_to_a_retired_topic_keeps_it_retired() -> None:
    shard = Shard()
    client = shard.connect()
    client.publish("a")
    shard.advance(50.0)
    reply = client.subscribe_frame(1, name="s", from_offset=5)  # past the next offset
    assert reply[0] == P.ERROR
    assert TOPIC not in shard.core.topics and shard.core.retired == {TOPIC: 1}


def test_topic_that_never_stored_a_message_leaves_nothing_behind() -> None:
    shard = Shard({"subscriber.inactive_time": 1.0})
    client = shard.connect()
    client.subscribe(1, name="s")
    client.unsubscribe(1)
    shard.advance(20.0)   # deleted by the subscriber pass at t=10, retired at t=10 or 15
    assert TOPIC not in shard.core.topics and shard.core.retired == {}


def test_a_pass_over_many_topics_is_sliced_and_goes_on_where_it_stopped() -> None:
    """Visiting a topic counts VISIT_COST: each tick of a pass visits at most
    CLEANUP_SLICE / VISIT_COST topics, the pass stays due until every topic that
    existed when it began was visited, and a topic made meanwhile waits for the next."""
    from flux.shard.cleanup import CLEANUP_SLICE, VISIT_COST

    shard = Shard()
    client = shard.connect()
    per_slice = CLEANUP_SLICE // VISIT_COST
    total = 3 * per_slice
    for i in range(0, total, 100):
        client.publish_rows([[f"t.{j}", "m", b"x"] for j in range(i, min(total, i + 100))])
    at = 50.0  # every topic is past ttl and dedup window: each is retired when visited
    left: list[int] = []
    while True:
        shard.now = at
        shard.core.tick(at)
        left.append(len(shard.core.topics))
        if len(left) == 1:
            client.publish_one("late", topic="t.late")  # made during the pass
        if shard.core.next_deadline() > at:
            break
        assert len(left) < 10, left
    # a visit here also forgets an id and trims a message: fewer than per_slice a tick
    steps = [a - b for a, b in zip([total, *left], left, strict=False)]
    assert all(0 < step <= per_slice for step in steps[:-1]), steps
    assert len(left) >= total // per_slice + 1
    assert list(shard.core.topics) == ["t.late"]
    assert len(shard.core.retired) == total
