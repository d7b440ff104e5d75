"""Message cleanup passes done in slices (G5): a pass longer than one slice goes on at
once where it stopped, and finishes every topic it visits, however many there are."""

from __future__ import annotations

from test_core_support import TOPIC, Shard

from flux.shard.cleanup import CLEANUP_SLICE


def tick_until(shard: Shard, to: float) -> None:
    """Tick at every deadline up to ``to``, again at once while one is still due, as the
    shell does (``Shard.advance`` wants each tick to finish its work)."""
    for _ in range(10_000):
        due = shard.core.next_deadline()
        if due > to:
            break
        shard.now = max(shard.now, due)
        shard.core.tick(shard.now)
    shard.now = to


def test_a_cleanup_pass_longer_than_one_slice_finishes_at_once() -> None:
    shard = Shard()
    client = shard.connect()
    client.hello()
    n = CLEANUP_SLICE + 100
    client.publish_frame([[TOPIC, [f"m{i}" for i in range(n)], [b"x"] * n]])
    tick_until(shard, 20.0)  # the pass at 20 s finds every message at its ttl
    assert shard.topic_stats()["held"] == 0


def test_a_cleanup_pass_over_more_topics_than_one_slice_visits_finishes_at_once() -> None:
    shard = Shard()
    client = shard.connect()
    client.hello()
    topics = [f"t.{i}" for i in range(300)]  # more visits than one slice's budget
    client.publish_frame([[t, [f"m{t}"], [b"x"]] for t in topics])
    tick_until(shard, 20.0)
    assert shard.stats()["counters"]["trimmed"] == len(topics)
