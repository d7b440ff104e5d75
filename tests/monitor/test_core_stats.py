"""What the shard's STATS adds for monitoring: exact lag and the bytes-in counter."""

from __future__ import annotations

from tests.test_core_support import TOPIC, Shard


def test_lag_leaves_out_offsets_acked_above_the_cursor() -> None:
    shard = Shard()
    client = shard.connect()
    client.hello()
    client.subscribe(1, name="s", max_in_flight=10, credit=10)
    for i in range(5):
        client.publish_one(f"m{i}")
    shard.collect()
    cursor, refused = client.ack(1, 1, 3)  # offset 0 stays unacked: the cursor stays at 0
    assert (cursor, refused) == (0, [])
    sub = shard.topic_stats()["subscriptions"]["s"]
    assert (sub["cursor"], sub["lag"]) == (0, 3)  # offsets 0, 2 and 4
    client.ack(1, 0, 2, 4)
    assert shard.topic_stats()["subscriptions"]["s"]["lag"] == 0


def test_bytes_in_counts_stored_payload_bytes_on_both_publish_paths() -> None:
    shard = Shard()
    client = shard.connect()
    client.hello()
    client.publish("a", "b", payload=b"12345")   # one group stored whole: the fast path
    assert shard.stats()["counters"]["bytes_in"] == 10
    rows = client.publish_rows([[TOPIC, "a", b"dup"], [TOPIC, "c", b"xyz"]])  # a duplicate
    assert [row[2] for row in rows] == [True, False]
    assert shard.stats()["counters"]["bytes_in"] == 13


def test_each_subscription_counts_its_own_redeliveries() -> None:
    shard = Shard({"subscriber.timeout": 7.0, "subscriber.retry_interval": 3.0,
                   "subscriber.retry_count": 2, "message.cleanup_time": 1000.0,
                   "subscriber.cleanup_time": 1000.0, "subscriber.heartbeat": 1000.0})
    client = shard.connect()
    client.subscribe(1, name="slow")
    client.subscribe(2, name="quick")
    client.publish_one("a")
    client.ack(2, 0)
    shard.advance(10.0)   # the first re-push of offset 0 to "slow" only
    subs = shard.topic_stats()["subscriptions"]
    assert (subs["slow"]["redelivered"], subs["quick"]["redelivered"]) == (1, 0)
    shard.advance(20.0)
    assert shard.topic_stats()["subscriptions"]["slow"]["redelivered"] == 2
    assert shard.stats()["counters"]["redelivered"] == 2


def test_latency_histogram_counts_a_bound_in_its_own_bucket_and_clamps_negatives() -> None:
    from flux.histogram import BOUNDS, LatencyHistogram

    histogram = LatencyHistogram()
    for seconds in (0.0001, 0.00011, 7.0, -1.0):
        histogram.observe(seconds)
    data = histogram.as_dict()
    assert data["bounds"] == list(BOUNDS) and len(data["counts"]) == len(BOUNDS) + 1
    assert data["counts"][0] == 2          # 0.0001 (the bound itself) and the clamped -1
    assert data["counts"][1] == 1          # 0.00011 <= 0.00025
    assert data["counts"][-1] == 1         # 7 s: above every bound
    assert data["sum"] == 0.0001 + 0.00011 + 7.0


def test_stats_carry_the_publish_ack_histogram() -> None:
    assert Shard().stats()["publish_ack_seconds"]["counts"] == [0] * 16
