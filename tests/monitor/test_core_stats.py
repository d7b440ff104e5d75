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
