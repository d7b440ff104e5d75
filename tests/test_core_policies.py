"""ShardCore under topic policies: a topic a policy matches uses the policy's ttl, dedup
window, max_bytes, push schedule and inactive_time; any other topic the global ones.

Global values (test_core_support.BASE): ttl 20, dedup_window 50, retry_count 2,
retry_interval 3, timeout 7, inactive_time 40; message cleanup every 5 s,
subscriber cleanup every 10 s. The policy for ``slow.>`` differs in each.
"""

from __future__ import annotations

from typing import Any

from test_core_support import OK, TOPIC, Shard

from flux import errors
from flux import protocol as P

POLICY = {"match": "slow.>",
          "message": {"ttl": 100, "dedup_window": 5},
          "topic": {"max_bytes": 48},
          "subscriber": {"retry_count": 1, "retry_interval": 1, "timeout": 2,
                         "inactive_time": 15}}
SLOW = "slow.a"


def _shard(**overrides: Any) -> Shard:
    return Shard({"topics": [{"match": "other"}, POLICY], "subscriber.heartbeat": 1000.0,
                  **overrides})


def _held(shard: Shard, topic: str) -> int:
    entry = shard.stats()["topics"].get(topic)
    return 0 if entry is None else int(entry["held"])


def _subscriptions(shard: Shard, topic: str) -> list[str]:
    entry = shard.stats()["topics"].get(topic)
    return [] if entry is None else sorted(entry["subscriptions"])


def test_a_topic_under_a_policy_keeps_its_messages_for_the_policy_ttl() -> None:
    shard = _shard()
    client = shard.connect()
    client.publish("a", topic=SLOW)
    client.publish("a", topic=TOPIC)
    shard.advance(20.0)  # the global ttl: the pass at 20 trims the global topic only
    assert (_held(shard, TOPIC), _held(shard, SLOW)) == (0, 1)
    shard.advance(99.9)
    assert _held(shard, SLOW) == 1
    shard.advance(100.0)
    assert _held(shard, SLOW) == 0


def test_a_topic_under_a_policy_remembers_ids_for_the_policy_dedup_window() -> None:
    shard = _shard()
    client = shard.connect()
    client.publish("a", topic=SLOW)
    client.publish("a", topic=TOPIC)
    shard.advance(4.9)
    assert client.publish("a", topic=SLOW) == [[OK, 0, True]]
    shard.advance(10.0)  # past the policy's window, inside the global one
    assert client.publish("a", topic=SLOW) == [[OK, 1, False]]
    assert client.publish("a", topic=TOPIC) == [[OK, 0, True]]


def test_a_topic_under_a_policy_is_full_at_the_policy_max_bytes() -> None:
    shard = _shard()
    client = shard.connect()
    payload = b"x" * 20
    # 20 payload + 2 id + 2 remembered id bytes = 24 each: two fit in 48, a third does not
    rows = client.publish("m1", "m2", "m3", topic=SLOW, payload=payload)
    assert [row[0] for row in rows] == [OK, OK, errors.TopicFull.code]
    assert "topic.max_bytes=48" in rows[2][1]
    assert [row[0] for row in client.publish("m1", "m2", "m3", payload=payload)] == [OK] * 3


def test_a_subscription_on_a_policy_topic_follows_the_policy_push_schedule() -> None:
    """G4 per topic: timeout 2 + retry_interval 1 and retry_count 1 under the policy;
    timeout 7 + retry_interval 3 and retry_count 2 elsewhere."""
    shard = _shard(**{"message.cleanup_time": 1000.0, "subscriber.cleanup_time": 1000.0})
    client = shard.connect()
    client.subscribe(1, name="s", topic=SLOW)
    client.subscribe(2, name="s", topic=TOPIC)
    client.publish("a", topic=SLOW)
    client.publish("a", topic=TOPIC)
    shard.advance(4.9)
    assert client.timed_deliveries(1) == [(0.0, 0, 1), (3.0, 0, 2)]
    assert client.sub_ended() == []
    shard.advance(5.0)  # the second push's ack deadline: out of pushes
    assert client.sub_ended() == [(1, errors.SubscriptionInactive.code)]
    shard.advance(30.0)
    assert client.timed_deliveries(2) == [(0.0, 0, 1), (10.0, 0, 2), (20.0, 0, 3)]
    assert client.sub_ended() == [(2, errors.SubscriptionInactive.code)]
    assert client.timed_deliveries(1) == []


def test_the_exhaustion_notice_counts_the_policy_pushes() -> None:
    shard = _shard()
    client = shard.connect()
    client.subscribe(1, name="s", topic=SLOW)
    client.publish("a", topic=SLOW)
    shard.advance(5.0)
    [(_, sid, code, message)] = client.take(P.SUB_ENDED)
    assert (sid, code) == (1, errors.SubscriptionInactive.code)
    assert "pushed 2 times" in message


def test_an_inactive_subscription_on_a_policy_topic_is_deleted_after_the_policy_time() -> None:
    shard = _shard()
    client = shard.connect()
    client.subscribe(1, name="s", topic=SLOW)
    client.subscribe(2, name="s", topic=TOPIC)
    shard.advance(1.0)
    client.unsubscribe(1)
    client.unsubscribe(2)
    shard.advance(19.9)  # inactive since 1: 15 s later is 16, the next pass is at 20
    assert (_subscriptions(shard, SLOW), _subscriptions(shard, TOPIC)) == (["s"], ["s"])
    shard.advance(20.0)
    assert (_subscriptions(shard, SLOW), _subscriptions(shard, TOPIC)) == ([], ["s"])
    shard.advance(49.9)  # 40 s after 1 is 41: the pass at 50
    assert _subscriptions(shard, TOPIC) == ["s"]
    shard.advance(50.0)
    assert _subscriptions(shard, TOPIC) == []


def test_stats_show_each_topic_policy_and_the_pattern_that_matched() -> None:
    shard = _shard()
    client = shard.connect()
    client.publish("a", topic=SLOW)
    client.publish("a", topic=TOPIC)
    topics = shard.stats()["topics"]
    assert topics[SLOW]["policy"] == {
        "match": "slow.>", "message.ttl": 100.0, "message.dedup_window": 5.0, "message.max_delay": 2592000.0,
        "dead_letter.enabled": False, "dead_letter.ttl": 604800.0,
        "topic.max_bytes": 48, "subscriber.retry_count": 1, "subscriber.retry_interval": 1.0,
        "subscriber.timeout": 2.0, "subscriber.inactive_time": 15.0,
        "storage.kind": "memory", "storage.max_bytes": 0}
    assert topics[TOPIC]["policy"] == {
        "match": None, "message.ttl": 20.0, "message.dedup_window": 50.0, "message.max_delay": 2592000.0,
        "dead_letter.enabled": False, "dead_letter.ttl": 604800.0,
        "topic.max_bytes": 268435456, "subscriber.retry_count": 2,
        "subscriber.retry_interval": 3.0, "subscriber.timeout": 7.0,
        "subscriber.inactive_time": 40.0, "storage.kind": "memory", "storage.max_bytes": 0}


def test_a_topic_resolves_its_policy_once_when_it_is_made() -> None:
    shard = _shard()
    client = shard.connect()
    calls: list[str] = []
    original = shard.core.config

    class Counting:
        def __getattr__(self, name: str) -> Any:
            return getattr(original, name)

        def settings_for(self, topic: str) -> Any:
            calls.append(topic)
            return original.settings_for(topic)

    shard.core.config = Counting()  # type: ignore[assignment]
    for i in range(5):
        client.publish(f"a{i}", f"b{i}", topic=SLOW)
    client.subscribe(1, name="s", topic=SLOW)
    assert calls == [SLOW]


def test_a_retired_topic_used_again_resolves_its_policy_again() -> None:
    shard = _shard(**{"message.dedup_window": 1.0})
    client = shard.connect()
    client.publish("a", topic=SLOW)
    shard.advance(105.0)
    assert SLOW in shard.core.retired
    client.publish("b", topic=SLOW)
    assert shard.stats()["topics"][SLOW]["policy"]["match"] == "slow.>"
    assert shard.stats()["topics"][SLOW]["next_offset"] == 2
