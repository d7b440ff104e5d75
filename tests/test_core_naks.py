"""ShardCore: nak, term and in_progress (G11), dead-letter topics, push counts that
survive re-attaching, and their bad input (typed refusals that change nothing)."""

from __future__ import annotations

from typing import Any

from test_core_support import TOPIC, Client, Shard

from flux import errors
from flux import protocol as P
from flux.hashing import dead_letter_topic, shard_for
from flux.message_meta import read_columns

DLQ = dead_letter_topic(TOPIC, "w")
POLICY = {"topics": ({"match": "orders.*", "dead_letter": True},)}


def _shard(dead_letter: bool = False, **overrides: Any) -> Shard:
    if dead_letter:
        overrides = {**overrides, "dead_letter.enabled": True}
    return Shard(overrides)


def _settle(client: Client, sid: int, **body: Any) -> tuple[int, list[list[Any]]]:
    """An ACK carrying only a settle map; returns (cursor, refused items)."""
    reply = client.request([P.ACK, client.rid(), sid, client.shard.generation, [], -1, body])
    assert reply[0] == P.ACKED, reply
    return int(reply[3]), list(reply[4])


def _letters(client: Client) -> list[tuple[int, str, dict[str, str]]]:
    """(offset, id, headers) of every message of the dead-letter topic ``DLQ``."""
    reply = client.fetch(topic=DLQ, offset=0)
    assert reply[0] == P.FETCHED, reply
    count = len(reply[4])
    first = reply[3]
    headers = read_columns(reply[7], count)[1] if len(reply) > 7 else [None] * count
    return [(first + i, reply[4][i], headers[i] or {}) for i in range(count)]


def test_nak_pushes_again_after_its_delay_and_counts_the_push() -> None:
    shard = _shard()
    c = shard.connect()
    c.subscribe(1, name="w")
    c.publish("a", "b")
    assert c.deliveries() == [(0, 1), (1, 1)]
    shard.advance(1.0)
    assert _settle(c, 1, nak=[[0, 2.5]]) == (0, [])
    shard.advance(3.4)
    assert c.deliveries() == []
    shard.advance(3.5)
    assert c.timed_deliveries() == [(3.5, 0, 2)]


def test_nak_frees_a_slot_of_the_window_at_once() -> None:
    shard = _shard()
    c = shard.connect()
    c.subscribe(1, name="w", max_in_flight=1)
    c.publish("a", "b")
    assert c.deliveries() == [(0, 1)]
    c.credit(1, 5)  # the window, not the credit, holds "b" back
    assert c.deliveries() == []
    _settle(c, 1, nak=[[0, 5.0]])
    assert c.deliveries() == [(1, 1)]


def test_an_ack_of_a_nakd_message_waiting_for_its_push_acks_it() -> None:
    shard = _shard()
    c = shard.connect()
    c.subscribe(1, name="w")
    c.publish("a")
    c.deliveries()
    _settle(c, 1, nak=[[0, 5.0]])
    assert c.ack(1, 0) == (1, [])
    shard.advance(20.0)
    assert c.deliveries() == []


def test_a_through_never_covers_a_nakd_offset() -> None:
    shard = _shard()
    c = shard.connect()
    c.subscribe(1, name="w")
    c.publish("a", "b", "c")
    c.deliveries()
    _settle(c, 1, nak=[[1, 0.5]])
    assert c.ack(1, through=2) == (1, [])
    shard.advance(0.5)
    assert c.deliveries() == [(1, 2)]


def test_nak_on_the_last_push_exhausts_at_once_without_a_dead_letter_policy() -> None:
    shard = _shard()  # retry_count 2: three pushes
    c = shard.connect()
    c.subscribe(1, name="w")
    c.publish("a")
    for attempt in (1, 2):
        assert c.deliveries() == [(0, attempt)]
        _settle(c, 1, nak=[[0, 0.0]])
        shard.after(0.0)
    assert c.deliveries() == [(0, 3)]
    _settle(c, 1, nak=[[0, 0.0]])
    assert c.sub_ended() == [(1, errors.SubscriptionInactive.code)]


def test_nak_on_the_last_push_dead_letters_with_the_policy() -> None:
    shard = _shard(True)
    c = shard.connect()
    c.subscribe(1, name="w")
    c.publish("a", "b")
    c.deliveries()
    for _ in range(2):
        _settle(c, 1, nak=[[0, 0.0]])
        shard.after(0.0)
        c.deliveries()
    assert _settle(c, 1, nak=[[0, 0.0]]) == (1, [])
    assert c.sub_ended() == []
    [(_, message_id, headers)] = _letters(c)
    assert message_id == "a" and headers["flux-pushes"] == "3"
    assert headers["flux-reason"] == "exhausted"


def test_term_without_a_dead_letter_policy_counts_as_an_ack() -> None:
    shard = _shard()
    c = shard.connect()
    c.subscribe(1, name="w")
    c.publish("a", "b")
    c.deliveries()
    assert _settle(c, 1, term=[[0, "bad"]]) == (1, [])
    shard.advance(100.0)
    assert all(o != 0 for o, _ in c.deliveries())  # never pushed again
    assert DLQ not in shard.stats()["topics"]


def test_term_with_the_policy_writes_the_dead_letter_and_acks_it() -> None:
    shard = _shard(True)
    c = shard.connect()
    c.subscribe(1, name="w")
    c.publish_frame([[TOPIC, ["a", "b"], [b"pa", b"pb"], {"keys": ["k", None],
                                                          "headers": [{"x": "1"}, None]}]])
    c.deliveries()
    shard.advance(2.0)
    c.ack(1, 1)
    assert _settle(c, 1, term=[[0, "no good"]]) == (2, [])
    [(offset, message_id, headers)] = _letters(c)
    assert (offset, message_id) == (0, "a")
    assert headers == {"x": "1", "flux-topic": TOPIC, "flux-offset": "0",
                       "flux-generation": str(shard.generation), "flux-subscription": "w",
                       "flux-pushes": "1", "flux-reason": "term: no good",
                       "flux-time": f"{2.0:.6f}"}
    fetched = c.fetch(topic=DLQ, offset=0)
    assert list(fetched[5]) == [b"pa"] and read_columns(fetched[7], 1)[0] == ["k"]
    shard.advance(100.0)  # never pushed again
    assert 0 not in [o for o, _ in c.deliveries()]
    stats = shard.topic_stats()
    assert stats["subscriptions"]["w"]["dead_lettered"] == 1
    assert stats["dead_letter_held"] == 1 and stats["dead_letter_topics"] == {"w": 1}
    assert shard.stats()["topics"][DLQ]["dead_letter_of"] == TOPIC


def test_an_exhausted_message_goes_to_the_dead_letter_topic_and_pushes_go_on() -> None:
    shard = _shard(True)
    c = shard.connect()
    c.subscribe(1, name="w")
    c.publish("a")
    shard.advance(100.0)  # three pushes, each timing out
    assert [a for _, a in c.deliveries()] == [1, 2, 3]
    assert c.sub_ended() == []
    [(_, _, headers)] = _letters(c)
    assert headers["flux-reason"] == "exhausted" and headers["flux-pushes"] == "3"
    assert shard.topic_stats()["subscriptions"]["w"]["cursor"] == 1
    c.publish("b")
    assert c.deliveries() == [(1, 1)]


def test_in_progress_puts_the_ack_deadline_off_without_using_a_push() -> None:
    shard = _shard()  # timeout 7, retry_interval 3
    c = shard.connect()
    c.subscribe(1, name="w")
    c.publish("a")
    c.deliveries()
    shard.advance(5.0)
    assert _settle(c, 1, progress=[0]) == (0, [])
    shard.advance(14.9)
    assert c.deliveries() == []
    shard.advance(15.0)
    assert c.timed_deliveries() == [(15.0, 0, 2)]


def test_push_counts_survive_reattaching_with_a_dead_letter_policy() -> None:
    shard = _shard(True)
    c = shard.connect()
    c.subscribe(1, name="w")
    c.publish("a", "b")
    assert c.deliveries() == [(0, 1), (1, 1)]
    c.ack(1, 1)
    c.unsubscribe(1)
    c.subscribe(2, name="w")
    assert c.deliveries() == [(0, 2)]
    c.unsubscribe(2)
    c.subscribe(3, name="w")
    assert c.deliveries() == [(0, 3)]
    c.unsubscribe(3)
    c.subscribe(4, name="w")  # out of pushes: a dead letter, not a fourth push
    assert c.deliveries() == []
    assert [m for _, m, _ in _letters(c)] == ["a"]


def test_push_counts_restart_without_a_dead_letter_policy() -> None:
    shard = _shard()
    c = shard.connect()
    c.subscribe(1, name="w")
    c.publish("a")
    c.deliveries()
    c.unsubscribe(1)
    c.subscribe(2, name="w")
    assert c.deliveries() == [(0, 1)]


def test_a_refused_dead_letter_is_parked_counted_and_retried_by_cleanup() -> None:
    shard = Shard({"topic.max_bytes": 60, "dead_letter.enabled": True})
    c = shard.connect()
    c.subscribe(1, name="w")
    c.publish("a")
    c.deliveries()
    _settle(c, 1, term=[[0, "x"]])  # its reserved headers do not fit in 60 bytes
    stats = shard.topic_stats()["subscriptions"]["w"]
    assert (stats["cursor"], stats["dead_letter_refused"], stats["dead_letter_pending"]) \
        == (0, 1, 1)
    c.unsubscribe(1)
    c.subscribe(2, name="w")
    shard.advance(30.0)
    assert c.deliveries() == []  # parked: never pushed
    # room in the dead-letter topic (made anew with the config's topic.max_bytes)
    shard.core.config = shard.core.config.replace(**{"topic.max_bytes": 10_000})
    shard.core.topics.pop(DLQ, None)
    shard.advance(40.0)  # a cleanup pass retries it
    stats = shard.topic_stats()["subscriptions"]["w"]
    assert (stats["cursor"], stats["dead_lettered"], stats["dead_letter_pending"]) == (1, 1, 0)


def test_bad_settle_items_are_refused_one_by_one_and_change_nothing() -> None:
    shard = _shard()
    c = shard.connect()
    c.subscribe(1, name="w")
    c.publish("a", "b")
    c.deliveries()
    before = shard.topic_stats()["subscriptions"]["w"]
    cursor, refused = _settle(c, 1, nak=[[5, 0.0], [0, -1.0], [1, "soon"]],
                              term=[[0, "r" * 1025], [7, "x"]], progress=[9, "x"])
    assert cursor == 0
    assert [(o, code) for o, code, _ in refused] == [
        (5, errors.NotDelivered.code), (0, errors.InvalidDelay.code),
        (1, errors.InvalidDelay.code), (0, errors.InvalidRequest.code),
        (7, errors.NotDelivered.code), (9, errors.NotDelivered.code),
        (-1, errors.InvalidRequest.code)]
    assert shard.topic_stats()["subscriptions"]["w"] == before
    shard.advance(7.0)
    assert c.deliveries() == []
    shard.advance(10.0)  # the ordinary schedule: nothing was nak'd
    assert c.deliveries() == [(0, 2), (1, 2)]


def test_a_settle_field_of_the_wrong_shape_is_invalid_request() -> None:
    shard = _shard()
    c = shard.connect()
    c.subscribe(1, name="w")
    reply = c.request([P.ACK, c.rid(), 1, shard.generation, [], -1, [1, 2]])
    assert reply[0] == P.ERROR and reply[2] == errors.InvalidRequest.code


def test_dead_letter_topics_take_no_publishes_but_subscribe_and_fetch() -> None:
    shard = _shard(True)
    c = shard.connect()
    reply = c.publish_frame([[DLQ, ["x"], [b"x"]]])
    assert reply[3][0][2][0][1] == errors.InvalidTopic.code
    assert c.fetch(topic=DLQ, offset=0)[0] == P.FETCHED
    assert c.subscribe(5, topic=DLQ, name="reader")["created"]


def test_a_dead_letter_topic_lives_on_its_source_topics_shard() -> None:
    for n in (1, 2, 3, 7, 64):
        assert shard_for(DLQ, n) == shard_for(TOPIC, n)
        assert shard_for(dead_letter_topic(TOPIC, "a~b.c"), n) == shard_for(TOPIC, n)


def test_a_dead_letter_topic_never_dead_letters_itself() -> None:
    shard = _shard(True)
    c = shard.connect()
    c.subscribe(1, name="w")
    c.publish("a")
    c.deliveries()
    _settle(c, 1, term=[[0, ""]])
    c.subscribe(2, topic=DLQ, name="r", read_old=True)
    assert c.deliveries(2) == [(0, 1)]
    _settle(c, 2, term=[[0, ""]])  # counts as an ack: no dead letter of a dead letter
    assert dead_letter_topic(DLQ, "r") not in shard.stats()["topics"]


def test_on_disk_a_term_is_confirmed_once_its_dead_letter_is_durable_and_replay_keeps_all(
) -> None:
    from test_core_disk import Disk

    from flux.shard import journal as J
    from flux.shard.core import ShardCore
    from flux.shard.replay import TopicReplay

    shard = Shard({"storage.dir": "/data", "storage.kind": "disk", "dead_letter.enabled": True})
    disk = Disk(shard)
    c = shard.connect()
    c.send([P.PUBLISH, c.rid(), [[TOPIC, ["a", "b"], [b"a", b"b"]]]])
    c.send([P.SUBSCRIBE, c.rid(), 1, {"topic": TOPIC, "name": "w", "read_old": True}])
    disk.sync()
    c.take()
    shard.advance(7.0 + 3.0)  # both time out: each pushed twice
    c.take()
    c.send([P.ACK, c.rid(), 1, shard.generation, [], -1, {"term": [[0, "bad"]]}])
    disk.sync()
    assert c.take(P.ACKED) == []  # its dead letter is not durable yet
    disk.sync(DLQ)
    [acked] = c.take(P.ACKED)
    assert acked[3] == 1 and acked[4] == []
    assert J.PUSHES in disk.writer().kinds()

    def rebuilt(name: str, records: list[Any]) -> Any:
        held = shard.core.topics[name]
        replay = TopicReplay(name, held.settings, epoch=0.0)
        for rec in records:
            replay.feed(rec)
        return replay.build(held.generation, now=shard.now)

    # without the source's cursor records, the dead letter's record acks offset 0
    source = rebuilt(TOPIC, [r for r in disk.writer().records if r.type != J.CURSOR])
    assert source.subs["w"].push_counts == {0: 2, 1: 2}
    dlq = rebuilt(DLQ, disk.writer(DLQ).records)
    core = ShardCore(shard.config, generation=shard.generation, now=shard.now)
    core.adopt_recovered(dlq, shard.now)
    core.adopt_recovered(source, shard.now)
    w = core.topics[TOPIC].subs["w"]
    assert (w.cursor, w.acked) == (1, set())
    assert dlq.log.meta_of(0)[1]["flux-offset"] == "0"  # (its payload stays in the log)


def test_in_progress_at_the_instant_of_the_push_or_twice_at_once_re_pushes_once() -> None:
    """Found by the stateful model: in_progress whose deadline equals one in force (made
    at the push's own instant, or twice at one instant) left two timer entries for one
    push, and the message was re-pushed twice in one DELIVER."""
    for items in ([0], [1, 1]):
        shard = _shard()  # timeout 7, retry_interval 3
        c = shard.connect()
        c.subscribe(1, name="w")
        c.publish("a", "b")
        c.deliveries()
        _settle(c, 1, progress=items)
        shard.advance(10.0)
        assert c.timed_deliveries() == [(10.0, 0, 2), (10.0, 1, 2)], items


def test_a_message_dead_lettered_on_reattaching_leaves_its_room_to_the_next() -> None:
    """Found by the stateful model: a message out of pushes from an earlier attachment
    is dead-lettered when its turn comes, and the room it took in that push went unused:
    the next message waited for an unrelated frame or timer."""
    for delays in ([None, None], [1.0, None]):  # offset order, and due order (G12)
        shard = _shard(True, **{"subscriber.retry_count": 1})
        c = shard.connect()
        c.subscribe(1, name="w", max_in_flight=1)
        c.publish_frame([[TOPIC, ["a", "b"], [b"a", b"b"], {"delay": delays}]])
        shard.advance(1.0)
        [(first, _)] = c.deliveries()
        _settle(c, 1, nak=[[first, 0.0]])
        shard.after(0.0)
        assert c.deliveries() == [(first, 2)]
        c.unsubscribe(1)
        c.subscribe(2, name="w", max_in_flight=1)  # first is out of pushes: a dead letter
        assert c.deliveries() == [(1 - first, 1)], delays
        assert [o for o, _, _ in _letters(c)] == [0]


def test_a_carried_re_push_uses_no_credit_so_the_next_message_follows() -> None:
    """Found by the stateful model: a first push of an attachment that carries a count
    (a re-push: no credit used) took the whole room the credit allowed, and the next
    message waited though credit and window had room for it."""
    shard = _shard(True)
    c = shard.connect()
    c.subscribe(1, name="w")
    c.publish("a", "b")
    assert c.deliveries() == [(0, 1), (1, 1)]
    c.unsubscribe(1)
    c.subscribe(2, name="w", credit=1)
    assert c.deliveries() == [(0, 2), (1, 2)]


def test_in_progress_in_the_retry_interval_puts_the_re_push_off() -> None:
    """Found by the stateful model: an in_progress after the ack timeout, while the
    re-push waited for retry_interval, was confirmed but the re-push came anyway."""
    shard = _shard()  # timeout 7, retry_interval 3
    c = shard.connect()
    c.subscribe(1, name="w")
    c.publish("a")
    c.deliveries()
    shard.advance(8.0)  # timed out at 7; re-push due at 10
    assert _settle(c, 1, progress=[0]) == (0, [])
    shard.advance(17.9)
    assert c.deliveries() == []
    shard.advance(18.0)  # 8 + 7 + 3
    assert c.timed_deliveries() == [(18.0, 0, 2)]


def test_an_acked_messages_in_progress_deadline_is_forgotten() -> None:
    shard = _shard()
    c = shard.connect()
    c.subscribe(1, name="w")
    c.publish("a", "b")
    c.deliveries()
    _settle(c, 1, progress=[0, 1])
    c.ack(1, 0, 1)
    shard.advance(20.0)
    assert shard.core.topics[TOPIC].subs["w"].extended == {}
