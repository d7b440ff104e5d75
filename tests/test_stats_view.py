"""``flux stats`` output from hand-made STATS replies: tables, filter, JSON."""

from __future__ import annotations

import io
import json
from typing import Any

from rich.console import Console

from flux import stats_view


def reply(index: int, topics: dict[str, Any]) -> dict[str, Any]:
    return {"index": index, "generation": 0xAB, "shard_count": 2, "uptime": 3725.0,
            "sessions": 2, "counters": {"published": 1234, "acked": 5}, "memory": 123456,
            "max_memory": 6 << 30, "retired_topics": index + 1, "topics": topics}


TOPIC = {"oldest": 10, "next_offset": 50, "held": 40, "held_bytes": 5000, "dedup_ids": 45,
         "subscriptions": {
             "billing": {"mode": "push", "cursor": 20, "active": True, "in_flight": 7,
                         "ephemeral": False},
             "~3.1": {"mode": "push", "cursor": 50, "active": True, "in_flight": 0,
                      "ephemeral": True}}}
GLOBAL_POLICY = {"match": None, "message.ttl": 60.0, "message.dedup_window": 120.0,
                 "topic.max_bytes": 268435456, "subscriber.retry_count": 5,
                 "subscriber.retry_interval": 1.0, "subscriber.timeout": 30.0,
                 "subscriber.inactive_time": 300.0}
ORDERS_POLICY = {**GLOBAL_POLICY, "match": "orders.>", "message.ttl": 3600.0,
                 "subscriber.retry_count": 10, "subscriber.timeout": 2.5}
STATS = {1: reply(1, {"orders.eu": {**TOPIC, "policy": ORDERS_POLICY}}),
         0: reply(0, {"logs": {**TOPIC, "subscriptions": {}, "policy": GLOBAL_POLICY}})}


def printed(stats: dict[int, dict[str, Any]], pattern: str = "*") -> str:
    out = io.StringIO()
    stats_view.show(stats, pattern, Console(file=out, width=100))
    return out.getvalue()


def test_tables_show_shards_topics_and_subscription_lag() -> None:
    text = printed(STATS)
    assert text.index("Shards") < text.index("Counters") < text.index("Topics") \
        < text.index("Subscriptions")
    assert "0x00000000000000ab" in text and "1h02m" in text and "1,234" in text
    assert "4.9 KiB" in text and "120.6 KiB / 6.0 GiB" in text
    assert "Topics (3 more retired" in text
    rows = [line for line in text.splitlines() if "orders.eu" in line and "push" in line]
    billing = next(r for r in rows if "billing" in r).split("│")
    assert [c.strip() for c in billing[5:9]] == ["20", "30", "0", "7"]  # cursor, lag, delayed, in flight
    assert any("(ephemeral)" in r for r in rows)


def test_pattern_keeps_matching_topics_only() -> None:
    kept = stats_view.select(STATS, "orders.*")
    assert [list(r["topics"]) for _, r in sorted(kept.items())] == [[], ["orders.eu"]]
    assert "no topics match 'none.*'" in printed(stats_view.select(STATS, "none.*"), "none.*")


def test_json_lists_every_reply_in_shard_order() -> None:
    shards = json.loads(stats_view.as_json(STATS))["shards"]
    assert [s["index"] for s in shards] == [0, 1]
    assert shards[1]["topics"]["orders.eu"]["subscriptions"]["billing"]["cursor"] == 20


def test_topic_policies_table_shows_each_topic_values_and_matched_pattern() -> None:
    text = printed(STATS)
    assert text.index("Topics") < text.index("Topic policies") < text.index("Subscriptions")
    policies = text[text.index("Topic policies"):text.index("Subscriptions")]
    orders = next(line for line in policies.splitlines() if "orders.eu" in line).split("│")
    assert [c.strip() for c in orders[1:8]] == [
        "orders.eu", "orders.>", "3600s", "120s", "256.0 MiB", "10x(2.5s+1s)", "300s"]
    logs = next(line for line in policies.splitlines() if "logs" in line).split("│")
    assert [c.strip() for c in logs[1:4]] == ["logs", "(global)", "60s"]


def test_a_reply_without_policies_shows_no_policy_table() -> None:
    old = {i: {**r, "topics": {n: {k: v for k, v in t.items() if k != "policy"}
                               for n, t in r["topics"].items()}} for i, r in STATS.items()}
    assert "Topic policies" not in printed(old)


def test_disk_topics_table_shows_the_log_and_what_recovery_found() -> None:
    storage = {"log_bytes": 3 << 20, "appended": 900, "durable": 880, "exposed": 40,
               "failed": None, "recovered_bytes": 1 << 20, "recovered_records": 12,
               "recovery_seconds": 0.25, "new_generation": "damage in its log lost records",
               "damage": {"kind": "corrupt", "path": "/d/x.log", "position": 77,
                          "reason": "checksum mismatch", "set_aside": []}}
    stats = {0: reply(0, {"orders.eu": {**TOPIC, "generation": 0xD15C, "storage": storage},
                          "logs": {**TOPIC, "subscriptions": {}, "storage": None}})}
    text = printed(stats)
    disk = text[text.index("Disk topics"):text.index("Subscriptions")]
    assert "logs" not in disk
    row = next(line for line in disk.splitlines() if "orders.eu" in line).split("│")
    assert [c.strip() for c in row[1:5]] == ["orders.eu", "0x000000000000d15c", "3.0 MiB",
                                             "880"]
    assert "corrupt at 77" in disk and "new generation" in disk
    assert "Disk topics" not in printed(STATS)  # memory topics only: no such table


def test_shared_subscriptions_show_their_members() -> None:
    pool = {"mode": "push", "cursor": 12, "active": True, "in_flight": 5, "ephemeral": False,
            "shared": True, "key_ordered": True,
            "members": [{"in_flight": 3, "credit": 97, "max_in_flight": 10, "keys": 2,
                         "since": 65.0},
                        {"in_flight": 2, "credit": 8, "max_in_flight": 4, "keys": 1,
                         "since": 5.0}]}
    text = printed({0: reply(0, {"jobs": {**TOPIC, "subscriptions": {"pool": pool}}})})
    row = next(line for line in text.splitlines() if "pool" in line and "key-ordered" in line)
    assert "2 members" in row
    assert "Shared subscriptions: members" in text
    members = [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines()
               if line.startswith("│ jobs") and "pool" in line and "key-ordered" not in line]
    assert [m[2:7] for m in members] == [["1", "3", "10", "97", "2"], ["2", "2", "4", "8", "1"]]


def test_disk_topics_table_shows_a_topic_recovering_or_refused_and_damage_read_back() -> None:
    storage = {"log_bytes": 100, "durable": 100, "recovered_bytes": 100,
               "recovery_seconds": 0.1, "new_generation": "damage in its log lost records",
               "damage_read_back": "reading position 9 back failed"}
    stats = {0: {**reply(0, {"orders.eu": {**TOPIC, "storage": storage}}),
                 "topics_recovering": {"orders.us": "damage read back"}}}
    disk = printed(stats)
    disk = disk[disk.index("Disk topics"):]
    row = next(line for line in disk.splitlines() if "orders.us" in line)
    assert "RECOVERING" in row  # (the note wraps onto the next lines)
    stats[0]["topics_refused"] = {"orders.uk": "/data/shard-0/orders.uk/x.log: bad magic"}
    disk = printed(stats)
    disk = disk[disk.index("Disk topics"):]
    assert "REFUSED" in next(line for line in disk.splitlines() if "orders.uk" in line)
    assert "recovered while" in next(line for line in disk.splitlines() if "orders.eu" in line)


def test_the_collector_table_shows_a_shards_full_collections_only_when_reported() -> None:
    assert "Garbage collector" not in printed(STATS)  # (a simulated shard reports none)
    collected = {"tracked": 31234, "frozen": 27314, "full_collections": 12,
                 "last_full_ms": 2.25, "longest_full_ms": 7.5}
    text = printed({0: {**STATS[0], "gc": collected}, 1: STATS[1]})
    row = next(line for line in text.splitlines() if "31,234" in line).split("│")
    assert [c.strip() for c in row[1:7]] == ["0", "31,234", "27,314", "12", "2.2", "7.5"]
