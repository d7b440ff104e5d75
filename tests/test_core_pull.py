"""ShardCore pull path (§1 "Pull subscriptions"): SUBSCRIBE mode pull, FETCH, COMMIT.

heartbeat 5 s here, so a pull subscription with no FETCH or COMMIT for 10 s is
inactive; subscriber passes every 10 s delete it 40 s after that.
"""

from __future__ import annotations

import pytest
from test_core_support import GEN, TOPIC, Shard, fetched_messages

from flux import errors
from flux import protocol as P

PULL = {"subscriber.heartbeat": 5.0}


def _pull(shard: Shard, name: str = "p", **opts: object) -> dict[str, object]:
    client = shard.connect()
    return client.subscribe(0, name=name, mode="pull", **opts)


def _subs(shard: Shard) -> dict[str, dict[str, object]]:
    topic = shard.stats()["topics"].get(TOPIC)
    return {} if topic is None else dict(topic["subscriptions"])


def test_pull_subscribe_creates_a_cursor_and_never_pushes() -> None:
    shard = Shard(PULL)
    client = shard.connect()
    client.publish("a", "b")
    reply = client.subscribe(1, name="p", mode="pull", read_old=True)
    assert (reply["created"], reply["start_offset"], reply["cursor"]) == (True, 0, 0)
    client.publish("c")
    shard.advance(9.0)
    assert client.take(P.DELIVER) == []
    assert _subs(shard)["p"]["mode"] == "pull"


def test_pull_subscription_needs_a_name() -> None:
    shard = Shard(PULL)
    client = shard.connect()
    reply = client.subscribe_frame(1, name=None, mode="pull")
    assert reply[0] == P.ERROR and reply[2] == errors.InvalidRequest.code
    assert _subs(shard) == {}


def test_fetch_returns_a_range_of_held_messages() -> None:
    shard = Shard(PULL)
    client = shard.connect()
    client.publish("a", "b", "c", "d")
    shard.advance(2.0)
    client.publish("e")
    reply = client.fetch(offset=1, max_messages=2)
    assert reply[0] == P.FETCHED
    assert reply[2:] == [{"generation": GEN, "oldest": 0, "next": 5}, 1, ["b", "c"],
                         [b"b", b"c"], [0.0, 2]]
    reply = client.fetch(offset=3)
    assert fetched_messages(reply) == [[3, "d", b"d", 0.0], [4, "e", b"e", 2.0]]


def test_fetch_past_the_end_is_empty_and_below_the_oldest_starts_there() -> None:
    shard = Shard(PULL)
    client = shard.connect()
    client.publish("a", "b")
    shard.advance(25.0)
    client = shard.connect()  # the first one was closed for silence (heartbeat 5)
    client.publish("c")
    below = client.fetch(offset=0)
    assert (below[2]["oldest"], below[2]["next"]) == (2, 3)
    assert [m[0] for m in fetched_messages(below)] == [2]
    assert fetched_messages(client.fetch(offset=3)) == []
    assert fetched_messages(client.fetch(offset=50)) == []


def test_fetch_is_bounded_by_max_bytes_but_returns_at_least_one() -> None:
    shard = Shard(PULL)
    client = shard.connect()
    client.publish("a", "b", "c", payload=b"x" * 100)
    assert [m[0] for m in fetched_messages(client.fetch(offset=0, max_bytes=250))] == [0, 1]
    assert [m[0] for m in fetched_messages(client.fetch(offset=0, max_bytes=1))] == [0]


def test_fetch_of_an_unknown_topic_is_empty_and_creates_nothing() -> None:
    shard = Shard(PULL)
    client = shard.connect()
    reply = client.fetch(topic="no.such.topic")
    assert reply[2:] == [{"generation": GEN, "oldest": 0, "next": 0}, 0, [], [], []]
    assert "no.such.topic" not in shard.stats()["topics"]


def test_fetch_with_another_generation_is_topic_reset() -> None:
    """G7: FETCH carries the generation the client knows; a mismatch is TopicReset."""
    shard = Shard(PULL)
    client = shard.connect()
    client.publish("a")
    reply = client.fetch(generation=GEN - 1)
    assert reply[0] == P.ERROR and reply[2] == errors.TopicReset.code
    assert reply[4] == {"old": GEN - 1, "new": GEN}
    assert fetched_messages(client.fetch(generation=GEN)) != []


def test_fetch_with_an_unknown_subscription_name_is_unknown_subscription() -> None:
    shard = Shard(PULL)
    client = shard.connect()
    client.publish("a")
    reply = client.fetch(name="nobody")
    assert reply[0] == P.ERROR and reply[2] == errors.UnknownSubscription.code


def test_fetch_or_commit_naming_a_push_subscription_is_refused() -> None:
    shard = Shard(PULL)
    client = shard.connect()
    client.subscribe(1, name="pushed")
    client.publish("a")
    reply = client.fetch(name="pushed")
    assert reply[0] == P.ERROR and reply[2] == errors.InvalidRequest.code
    reply = client.commit("pushed", 1)
    assert reply[0] == P.ERROR and reply[2] == errors.InvalidRequest.code
    assert _subs(shard)["pushed"]["cursor"] == 0


def test_push_subscribe_to_a_pull_name_is_refused_and_vice_versa() -> None:
    shard = Shard(PULL)
    client = shard.connect()
    _pull(shard, "p")
    client.subscribe(1, name="s")
    reply = client.subscribe_frame(2, name="p", mode="push")
    assert reply[0] == P.ERROR and reply[2] == errors.InvalidRequest.code
    reply = client.subscribe_frame(3, name="s", mode="pull")
    assert reply[0] == P.ERROR and reply[2] == errors.InvalidRequest.code


def test_commit_moves_the_cursor_and_never_back() -> None:
    shard = Shard(PULL)
    _pull(shard)
    client = shard.connect()
    client.publish("a", "b", "c")
    assert client.commit("p", 2)[2] == {"cursor": 2}
    reply = client.request([P.COMMIT, 700, {"topic": TOPIC, "name": "p", "generation": GEN,
                                            "offset": 1}])
    assert reply == [P.COMMITTED, 700, {"cursor": 2}]
    assert client.commit("p", 3)[2] == {"cursor": 3}
    assert _subs(shard)["p"]["cursor"] == 3


def test_commit_out_of_range_is_refused_and_changes_nothing() -> None:
    """G8: COMMIT past the next offset, negative or not an integer gets a typed error."""
    shard = Shard(PULL)
    _pull(shard)
    client = shard.connect()
    client.publish("a", "b")
    for bad in (3, -1, None):
        reply = client.commit("p", bad)
        assert reply[0] == P.ERROR and reply[2] == errors.OffsetOutOfRange.code, (bad, reply)
    for bad in ("1", 1.5, True):
        reply = client.commit("p", bad)
        assert reply[0] == P.ERROR and reply[2] == errors.InvalidRequest.code, (bad, reply)
    assert _subs(shard)["p"]["cursor"] == 0
    assert client.commit("p", 2)[2] == {"cursor": 2}


def test_commit_with_another_generation_is_topic_reset() -> None:
    """G7: offsets of two generations are never mixed."""
    shard = Shard(PULL)
    _pull(shard)
    client = shard.connect()
    client.publish("a")
    reply = client.commit("p", 1, generation=GEN + 5)
    assert reply[0] == P.ERROR and reply[2] == errors.TopicReset.code
    assert _subs(shard)["p"]["cursor"] == 0


def test_commit_of_an_unknown_subscription_is_unknown_subscription() -> None:
    shard = Shard(PULL)
    client = shard.connect()
    client.publish("a")
    reply = client.commit("nobody", 1)
    assert reply[0] == P.ERROR and reply[2] == errors.UnknownSubscription.code
    reply = client.commit("nobody", 0, topic="never.published")
    assert reply[0] == P.ERROR and reply[2] == errors.UnknownSubscription.code


def test_commit_lets_cleanup_free_the_committed_messages() -> None:
    """G5 on the pull path: every offset below the committed cursor counts as acked."""
    shard = Shard({**PULL, "subscriber.inactive_time": 10_000.0})
    client = shard.connect()
    client.subscribe(0, name="p", mode="pull")
    client.publish("a", "b", "c")
    for t in (8.0, 16.0, 24.0):  # stay active
        shard.advance(t)
        client.fetch(name="p", offset=0)
    assert shard.topic_stats()["held"] == 3
    client.commit("p", 2)
    shard.advance(25.0)
    assert (shard.topic_stats()["oldest"], shard.topic_stats()["held"]) == (2, 1)


def test_pull_subscription_without_fetch_or_commit_becomes_inactive_and_is_deleted() -> None:
    """G6/pull: no FETCH or COMMIT since t=0: inactive from t=10, deleted at the pass at t=50."""
    shard = Shard(PULL)
    _pull(shard)
    shard.advance(9.9)
    assert _subs(shard)["p"]["active"] is True
    shard.advance(10.0)
    assert _subs(shard)["p"]["active"] is False
    shard.advance(49.9)
    assert "p" in _subs(shard)
    shard.advance(50.0)
    assert _subs(shard) == {}


def test_fetch_and_commit_keep_a_pull_subscription_active() -> None:
    """G6/pull: the last FETCH at t=8 makes it inactive from t=18: deleted at the pass at t=60."""
    shard = Shard(PULL)
    _pull(shard)
    client = shard.connect()
    client.publish("a")
    shard.advance(4.0)
    client.commit("p", 0)
    shard.advance(8.0)
    client.fetch(name="p")
    shard.advance(20.0)
    assert _subs(shard)["p"]["active"] is False
    shard.advance(59.9)
    assert "p" in _subs(shard)
    shard.advance(60.0)
    assert _subs(shard) == {}


def test_fetch_without_a_name_does_not_keep_a_subscription_active() -> None:
    shard = Shard(PULL)
    _pull(shard)
    client = shard.connect()
    shard.advance(8.0)
    client.fetch()
    shard.advance(10.0)
    assert _subs(shard)["p"]["active"] is False


def test_inactive_pull_subscription_is_reactivated_by_fetch_and_keeps_its_cursor() -> None:
    shard = Shard(PULL)
    _pull(shard)
    client = shard.connect()
    client.publish("a", "b")
    client.commit("p", 1)
    shard.advance(30.0)
    assert _subs(shard)["p"]["active"] is False
    client = shard.connect()
    client.fetch(name="p")
    assert _subs(shard)["p"] == {"mode": "pull", "cursor": 1, "active": True, "in_flight": 0,
                                 "ephemeral": False, "lag": 1, "delayed": 0, "redelivered": 0}
    shard.advance(70.0)  # would have been deleted at t=50 had it stayed inactive
    assert "p" in _subs(shard)


def test_pull_resubscribe_keeps_the_cursor_and_start() -> None:
    """G6: start options apply only when the subscription is created."""
    shard = Shard(PULL)
    client = shard.connect()
    client.publish("a", "b", "c")
    client.subscribe(0, name="p", mode="pull", from_offset=1)
    client.commit("p", 2)
    reply = client.subscribe(0, name="p", mode="pull", read_old=True)
    assert (reply["created"], reply["start_offset"], reply["cursor"]) == (False, 1, 2)


def test_pull_subscription_holds_uncommitted_messages() -> None:
    """G5: messages at or above a pull cursor are kept past ttl."""
    shard = Shard({**PULL, "subscriber.inactive_time": 10_000.0})
    client = shard.connect()
    client.subscribe(0, name="p", mode="pull", read_old=True)
    client.publish("a")
    shard.advance(500.0)
    assert shard.topic_stats()["held"] == 1


def test_fetch_of_zero_messages_reports_only_the_bounds() -> None:
    shard = Shard(PULL)
    client = shard.connect()
    client.publish("a", "b")
    assert client.fetch(max_messages=0)[2:] == [{"generation": GEN, "oldest": 0, "next": 2},
                                                0, [], [], []]


@pytest.mark.parametrize("opts", [{"offset": -1}, {"max_messages": -1}, {"max_bytes": -1}])
def test_negative_fetch_bounds_are_refused(opts: dict[str, int]) -> None:
    shard = Shard(PULL)
    client = shard.connect()
    client.publish("a")
    reply = client.fetch(**opts)
    assert reply[0] == P.ERROR and reply[2] == errors.InvalidRequest.code
