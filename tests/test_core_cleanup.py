"""ShardCore message cleanup (G2 hold for ttl, G5 delete only when expired and acked by all).

Message cleanup passes run every 5 s (t = 5, 10, ...), ttl is 20 s.
"""

from __future__ import annotations

from test_core_support import Shard

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
        core.tick(at)
        stats = core.stats(at)["topics"]["orders.eu"]
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
