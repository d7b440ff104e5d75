"""ShardCore: shared subscriptions (G10): members, who may ack, hand-offs, push counts
across members, key order, late pushes and cumulative acks, kinds refused."""

from __future__ import annotations

from typing import Any

import pytest
from test_core_support import TOPIC, Client, Shard

from flux import errors
from flux import protocol as P
from flux.hashing import dead_letter_topic
from flux.shard import held_keys

NAME = "workers"
_BUILT = held_keys.fast


@pytest.fixture(autouse=True, scope="module", params=["c", "python"])
def _bookkeeping(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """Every test here twice: members' held keys kept by the C functions, and by the
    Python ones (Flux built without a C compiler)."""
    held_keys.fast = _BUILT if request.param == "c" else None
    yield request.param
    held_keys.fast = _BUILT


def _join(client: Client, sid: int, **opts: Any) -> dict[str, Any]:
    """Join as a member with plenty of credit (the window is what limits it)."""
    return client.subscribe(sid, name=NAME, shared=True, **{"credit": 1000, **opts})


def _publish_keyed(client: Client, keys: list[str | None]) -> None:
    ids = [f"m{client.shard.core.topics[TOPIC].log.next_offset + i}"
           if TOPIC in client.shard.core.topics else f"m{i}" for i in range(len(keys))]
    reply = client.publish_frame([[TOPIC, ids, [i.encode() for i in ids], {"keys": keys}]])
    assert reply[0] == P.PUBLISHED, reply


def _two_members_with_one_each() -> tuple[Shard, Client, Client]:
    """Two members with windows of one, and two messages: one each."""
    shard = Shard()
    a, b = shard.connect(), shard.connect()
    _join(a, 1, max_in_flight=1)
    _join(b, 1, max_in_flight=1)
    a.publish("x", "y")
    return shard, a, b


def _held(shard: Shard) -> dict[int, int]:
    """offset -> the conn of the member holding it."""
    group = shard.core.topics[TOPIC].subs[NAME].group
    assert group is not None
    return {o: m.conn for o, m in group.holder.items()}


def test_each_message_goes_to_one_member_within_its_window() -> None:
    shard = Shard()
    a, b = shard.connect(), shard.connect()
    info = _join(a, 1, max_in_flight=3)
    assert info["created"] and info["shared"] and info["members"] == 1
    assert _join(b, 1, max_in_flight=3)["members"] == 2
    a.publish(*[f"m{i}" for i in range(8)])
    got_a, got_b = a.deliveries(1), b.deliveries(1)
    assert len(got_a) == 3 and len(got_b) == 3
    assert {o for o, _ in got_a}.isdisjoint({o for o, _ in got_b})
    assert all(attempt == 1 for _, attempt in got_a + got_b)
    # an ack frees a slot: the next message goes out, to that member
    a.ack(1, got_a[0][0])
    assert len(a.deliveries(1)) == 1 and b.deliveries(1) == []


def test_only_the_holder_may_ack() -> None:
    shard, a, b = _two_members_with_one_each()
    [(oa, _)] = a.deliveries(1)
    [(ob, _)] = b.deliveries(1)
    cursor, refused = b.ack(1, oa)
    assert [r[0] for r in refused] == [oa] and refused[0][1] == errors.NotDelivered.code
    assert _held(shard)[oa] == a.conn
    # a cumulative ack never covers another member's message
    cursor, refused = b.ack(1, through=10)
    assert refused == [] and oa in _held(shard) and ob not in _held(shard)
    assert cursor == (oa if oa < ob else ob + 1)
    cursor, refused = a.ack(1, oa)
    assert refused == []
    # acking again what the group has acked changes nothing and is not refused
    assert a.ack(1, oa)[1] == []


def test_a_leaving_member_hands_its_messages_on_at_once_counting_a_push() -> None:
    shard = Shard()
    a, b = shard.connect(), shard.connect()
    _join(a, 1, max_in_flight=2)
    _join(b, 1, max_in_flight=4)
    a.publish("p", "q", "r", "s")
    got_a = [o for o, _ in a.deliveries(1)]
    got_b = [o for o, _ in b.deliveries(1)]
    assert len(got_a) + len(got_b) == 4
    a.unsubscribe(1)
    assert shard.now == 0.0
    handed = b.deliveries(1)
    # b had room for two more: a's two come to it now, each on its second push
    assert sorted(o for o, _ in handed) == sorted(got_a)
    assert all(attempt == 2 for _, attempt in handed)
    assert set(_held(shard).values()) == {b.conn}


def test_hand_offs_wait_for_room_and_go_in_offset_order() -> None:
    shard = Shard()
    a, b = shard.connect(), shard.connect()
    _join(a, 1, max_in_flight=3)
    a.publish("p", "q", "r")
    assert [o for o, _ in a.deliveries(1)] == [0, 1, 2]
    _join(b, 1, max_in_flight=1)
    shard.core.disconnect(a.conn, shard.now)
    shard.collect()
    assert b.deliveries(1) == [(0, 2)]
    b.ack(1, 0)
    assert b.deliveries(1) == [(1, 2)]
    b.ack(1, 1)
    assert b.deliveries(1) == [(2, 2)]


def test_ack_timeouts_re_push_to_the_holder_on_g4s_schedule() -> None:
    shard = Shard()  # timeout 7, retry_interval 3, retry_count 2
    a, b = shard.connect(), shard.connect()
    _join(a, 1, max_in_flight=1)
    _join(b, 1, max_in_flight=1)
    a.publish("x")
    [(o, attempt)] = a.deliveries(1)
    assert attempt == 1
    shard.advance(9.9)
    assert a.deliveries(1) == [] and b.deliveries(1) == []
    shard.advance(10.0)
    assert a.deliveries(1) == [(o, 2)]
    shard.advance(20.0)
    assert a.deliveries(1) == [(o, 3)]
    # the third push times out: the message is exhausted and the group inactive (G4)
    shard.advance(27.0)
    ended = a.take(P.SUB_ENDED) + b.take(P.SUB_ENDED)
    assert len(ended) == 2 and all(f[2] == errors.SubscriptionInactive.code for f in ended)
    stats = shard.topic_stats()["subscriptions"][NAME]
    assert stats["active"] is False and stats["members"] == []
    # a member attaching again: pushes resume from the cursor, the exhausted message's
    # count afresh
    _join(a, 2)
    assert a.deliveries(2) == [(o, 1)]


def test_push_counts_survive_hand_offs_and_run_out() -> None:
    shard = Shard()  # 3 pushes allowed
    a, b, c = shard.connect(), shard.connect(), shard.connect()
    _join(a, 1, max_in_flight=1)
    a.publish("poison")
    assert a.deliveries(1) == [(0, 1)]
    _join(b, 1, max_in_flight=1)
    a.unsubscribe(1)
    assert b.deliveries(1) == [(0, 2)]
    _join(c, 1, max_in_flight=1)
    b.unsubscribe(1)
    assert c.deliveries(1) == [(0, 3)]
    _join(a, 3, max_in_flight=1)
    c.unsubscribe(1)
    # a fourth push is one too many: exhausted at the hand-off
    assert a.deliveries(3) == []
    [ended] = a.take(P.SUB_ENDED)
    assert ended[1] == 3 and ended[2] == errors.SubscriptionInactive.code


def test_counts_survive_the_group_going_inactive_and_back() -> None:
    shard = Shard()
    a = shard.connect()
    _join(a, 1)
    a.publish("x", "y")
    assert a.deliveries(1) == [(0, 1), (1, 1)]
    a.ack(1, 1)
    a.unsubscribe(1)
    assert shard.topic_stats()["subscriptions"][NAME]["active"] is False
    b = shard.connect()
    _join(b, 1)
    assert b.deliveries(1) == [(0, 2)]
    b.publish("z")
    assert b.deliveries(1) == [(2, 1)]


def test_late_pushes_are_not_covered_by_a_cumulative_ack() -> None:
    shard = Shard()
    a, b = shard.connect(), shard.connect()
    _join(a, 1, max_in_flight=1)
    _join(b, 1, max_in_flight=5)
    a.publish("p")
    assert a.deliveries(1) == [(0, 1)]
    a.publish("q", "r")
    assert b.deliveries(1) == [(1, 1), (2, 1)]
    a.unsubscribe(1)
    assert b.deliveries(1) == [(0, 2)]
    # b's client may have sent this before it saw offset 0: it must not ack 0
    cursor, refused = b.ack(1, through=2)
    assert refused == [] and cursor == 0
    assert _held(shard) == {0: b.conn}
    cursor, _ = b.ack(1, 0)
    assert cursor == 3


def test_key_order_pins_a_key_to_one_member_until_its_messages_are_acked() -> None:
    shard = Shard()
    a, b = shard.connect(), shard.connect()
    _join(a, 1, max_in_flight=2, key_ordered=True)
    _join(b, 1, max_in_flight=2, key_ordered=True)
    _publish_keyed(a, ["k1", "k1", "k1", "k2"])
    got_a, got_b = a.deliveries(1), b.deliveries(1)
    by_member = {a.conn: [o for o, _ in got_a], b.conn: [o for o, _ in got_b]}
    k1 = a.conn if 0 in by_member[a.conn] else b.conn
    other = b.conn if k1 == a.conn else a.conn
    # k1's first two on one member; its third waits for that member, never the other
    assert by_member[k1][:2] == [0, 1]
    assert 2 not in by_member[other] and 3 in by_member[other]
    holder = a if k1 == a.conn else b
    holder.ack(1, 0)
    assert [o for o, _ in holder.deliveries(1)] == [2]
    holder.ack(1, 1, 2)
    group = shard.core.topics[TOPIC].subs[NAME].group
    assert group is not None and "k1" not in group.pins


def test_pinned_keys_go_to_their_members_at_once_and_wait_when_one_is_full() -> None:
    """A round whose keys are all pinned already, each once (the bulk path): each goes to
    its own member while that one has room; the rest wait in their keys' queues, in
    order, and follow as their members ack; no key is ever on two members."""
    shard = Shard()
    a, b = shard.connect(), shard.connect()
    _join(a, 1, max_in_flight=3, key_ordered=True)
    _join(b, 1, max_in_flight=6, key_ordered=True)
    _publish_keyed(a, ["k1", "k2", "k3", "k4"])
    first = {a.conn: [o for o, _ in a.deliveries(1)], b.conn: [o for o, _ in b.deliveries(1)]}
    owner = {key: (a if o in first[a.conn] else b)
             for o, key in enumerate(["k1", "k2", "k3", "k4"])}
    group = shard.core.topics[TOPIC].subs[NAME].group
    assert group is not None and {k: group.pins[k] for k in owner} \
        == {k: group.members[(c.conn, 1)] for k, c in owner.items()}
    # every key pinned, each once in the round: offsets 4..7 follow their keys
    _publish_keyed(a, ["k1", "k2", "k3", "k4"])
    got = {c.conn: [o for o, _ in c.deliveries(1)] for c in (a, b)}
    waited = []
    for o, key in zip(range(4, 8), ["k1", "k2", "k3", "k4"], strict=True):
        member = owner[key]
        other = b if member is a else a
        assert o not in got[other.conn]
        if o not in got[member.conn]:  # its member was full: it waits for that member
            assert key in group.queued and list(group.queued[key]) == [o]
            waited.append(o)
    assert waited  # (a's window of 3 took one of its two keys' second messages)
    # once their keys' messages are all acked, the waiting ones go out, once each
    later: list[int] = []
    for c in (a, b):
        c.ack(1, *sorted(first[c.conn] + got[c.conn]))
        later += [o for o, _ in c.deliveries(1)]
    later += [o for c in (a, b) for o, _ in c.deliveries(1)]
    assert sorted(later) == waited and not group.queued


def test_a_keys_messages_follow_it_when_its_member_leaves() -> None:
    shard = Shard()
    a, b = shard.connect(), shard.connect()
    _join(a, 1, max_in_flight=1, key_ordered=True)
    _publish_keyed(a, ["k", "k", "k"])
    assert a.deliveries(1) == [(0, 1)]
    _join(b, 1, max_in_flight=3, key_ordered=True)
    assert b.deliveries(1) == []  # k is a's
    a.unsubscribe(1)
    assert b.deliveries(1) == [(0, 2), (1, 1), (2, 1)]


def test_unkeyed_messages_of_a_key_ordered_group_go_anywhere() -> None:
    shard = Shard()
    a, b = shard.connect(), shard.connect()
    _join(a, 1, max_in_flight=1, key_ordered=True)
    _join(b, 1, max_in_flight=1, key_ordered=True)
    _publish_keyed(a, [None, None])
    assert len(a.deliveries(1)) == 1 and len(b.deliveries(1)) == 1


@pytest.mark.parametrize(("first", "then", "error"), [
    ({}, {"shared": True}, errors.SubscriptionKindMismatch),
    ({"shared": True}, {}, errors.SubscriptionKindMismatch),
    ({"shared": True}, {"shared": True, "key_ordered": True}, errors.SubscriptionKindMismatch),
])
def test_kinds_never_mix(first: dict[str, Any], then: dict[str, Any],
                         error: type[errors.RemoteError]) -> None:
    shard = Shard()
    a, b = shard.connect(), shard.connect()
    a.subscribe(1, name=NAME, **first)
    reply = b.subscribe_frame(1, name=NAME, **then)
    assert reply[0] == P.ERROR and reply[2] == error.code


@pytest.mark.parametrize(("opts", "error"), [
    ({"shared": True, "name": None}, errors.InvalidRequest),
    ({"shared": True, "name": NAME, "mode": "pull"}, errors.SubscriptionKindMismatch),
    ({"key_ordered": True, "name": NAME}, errors.InvalidRequest),
    ({"shared": "yes", "name": NAME}, errors.InvalidRequest),
])
def test_bad_shared_subscribes_are_refused(opts: dict[str, Any],
                                           error: type[errors.RemoteError]) -> None:
    shard = Shard()
    a = shard.connect()
    reply = a.subscribe_frame(1, **opts)
    assert reply[0] == P.ERROR and reply[2] == error.code, reply
    topic = shard.core.topics.get(TOPIC)
    assert topic is None or NAME not in topic.subs


def test_no_takeover_members_join() -> None:
    shard = Shard()
    a, b = shard.connect(), shard.connect()
    _join(a, 1)
    _join(b, 1)
    assert a.take(P.SUB_ENDED) == [] and b.take(P.SUB_ENDED) == []


def test_stats_show_members_and_their_in_flight() -> None:
    shard = Shard()
    a, b = shard.connect(), shard.connect()
    _join(a, 1, max_in_flight=2)
    _join(b, 1, max_in_flight=5)
    a.publish("p", "q", "r")
    stats = shard.topic_stats()["subscriptions"][NAME]
    assert stats["shared"] is True and stats["in_flight"] == 3
    assert sum(m["in_flight"] for m in stats["members"]) == 3
    assert sorted(m["max_in_flight"] for m in stats["members"]) == [2, 5]


def test_a_member_that_left_cannot_ack() -> None:
    shard = Shard()
    a, b = shard.connect(), shard.connect()
    _join(a, 1)
    _join(b, 1)
    a.unsubscribe(1)
    reply = a.ack_frame(1, [0])
    assert reply[0] == P.ERROR and reply[2] == errors.UnknownSubscription.code


def test_hand_offs_use_no_credit_only_window_room() -> None:
    shard = Shard()
    a, b = shard.connect(), shard.connect()
    _join(a, 1, max_in_flight=2)
    a.publish("p", "q")
    assert [o for o, _ in a.deliveries(1)] == [0, 1]
    _join(b, 1, max_in_flight=4, credit=1)
    a.unsubscribe(1)
    # b's one credit is for a first push; the two hand-offs need only window room
    assert b.deliveries(1) == [(0, 2), (1, 2)]
    b.publish("r", "s")
    assert b.deliveries(1) == [(2, 1)]
    stats = shard.topic_stats()["subscriptions"][NAME]
    assert stats["members"][0]["credit"] == 0


def test_a_surviving_count_at_its_limit_ends_the_next_round() -> None:
    shard = Shard()  # 3 pushes allowed
    a = shard.connect()
    _join(a, 1)
    a.publish("x")
    assert a.deliveries(1) == [(0, 1)]
    shard.advance(10.0)
    shard.advance(20.0)
    assert a.deliveries(1) == [(0, 2), (0, 3)]
    a.unsubscribe(1)  # holding it at its third push: the count survives
    b = shard.connect()
    _join(b, 1)
    assert b.deliveries(1) == []
    [ended] = b.take(P.SUB_ENDED)
    assert ended[2] == errors.SubscriptionInactive.code
    _join(b, 2)  # its count starts afresh now
    assert b.deliveries(2) == [(0, 1)]


def test_first_pushes_of_a_delayed_topic_keep_due_order_per_member() -> None:
    shard = Shard()
    a = shard.connect()
    _join(a, 1)
    reply = a.publish_frame([[TOPIC, ["late"], [b"late"], {"delay": 5.0}]])
    assert reply[0] == P.PUBLISHED
    shard.advance(1.0)
    a.publish("now")
    assert a.deliveries(1) == [(1, 1)]
    shard.advance(6.0)
    assert a.deliveries(1) == [(0, 1)]


def test_a_long_round_forgets_the_delayed_pushes_its_members_acked() -> None:
    long = 1e5
    shard = Shard({"subscriber.timeout": long, "message.ttl": long,
                   "message.dedup_window": long, "subscriber.heartbeat": long,
                   "limits.hello_timeout": long})
    a, b = shard.connect(), shard.connect()
    _join(a, 1, max_in_flight=100, credit=100_000)
    _join(b, 1, max_in_flight=100, credit=100_000)
    n = 12_000
    for start in range(0, n, 500):
        reply = a.publish_frame([[TOPIC, [f"m{i}" for i in range(start, start + 500)],
                                  [b"x"] * 500, {"delay": 1.0}]])
        assert reply[0] == P.PUBLISHED
    for t in range(1, 200):
        shard.advance(float(t))
        for client in (a, b):
            offsets = [o for o, _ in client.deliveries(1)]
            if offsets:
                assert client.ack(1, *offsets)[1] == []
        if shard.topic_stats()["subscriptions"][NAME]["cursor"] == n:
            break
    [sub] = shard.core.topics[TOPIC].subs.values()
    assert sub.cursor == n
    assert len(sub.due_pushed) <= 2 * 4096


@pytest.mark.parametrize("narrow_first", [True, False])
def test_a_run_split_over_unequal_windows_leaves_nothing_out(narrow_first: bool) -> None:
    shard = Shard()
    narrow, wide = shard.connect(), shard.connect()
    for client, window in ((narrow, 1), (wide, 5)) if narrow_first else ((wide, 5), (narrow, 1)):
        _join(client, 1, max_in_flight=window)
    for extra in range(3):  # (the member order turns with every push round)
        narrow.publish(*[f"m{extra}-{i}" for i in range(6)])
        got = sorted(o for client in (narrow, wide) for o, _ in client.deliveries(1))
        held = _held(shard)
        assert sorted(held) == list(range(6 * extra, 6 * extra + 6)), (extra, got, held)
        for client in (narrow, wide):
            offsets = [o for o, m in held.items() if m == client.conn]
            if offsets:
                client.ack(1, *offsets)
        first = 6 * (extra + 1)
        assert shard.topic_stats()["subscriptions"][NAME]["cursor"] == first


# -- nak, term, in_progress and dead letters in a shared subscription (G11) -------------

def _settle(client: Client, sid: int, **body: Any) -> list[list[Any]]:
    reply = client.request([P.ACK, client.rid(), sid, client.shard.generation, [], -1, body])
    assert reply[0] == P.ACKED, reply
    return list(reply[4])


def test_a_nak_frees_the_slot_and_the_message_comes_back_after_its_delay() -> None:
    shard = Shard()
    a, b = shard.connect(), shard.connect()
    _join(a, 1, max_in_flight=1)
    a.publish("x", "y")
    [(o, attempt)] = a.deliveries(1)
    assert attempt == 1 and _settle(a, 1, nak=[[o, 2.0]]) == []
    assert a.deliveries(1) == [(1 - o, 1)]  # the slot is free at once
    _join(b, 1, max_in_flight=1)
    shard.advance(1.9)
    assert b.deliveries(1) == []            # not before its delay
    shard.advance(2.0)
    assert b.deliveries(1) == [(o, 2)]      # the re-push counts, to a member with room


def test_only_the_holder_may_nak_term_or_extend() -> None:
    shard, a, b = _two_members_with_one_each()
    [(oa, _)] = a.deliveries(1)
    refused = _settle(b, 1, nak=[[oa, 0]], term=[[oa, "no"]], progress=[oa])
    assert [r[1] for r in refused] == [errors.NotDelivered.code] * 3
    assert _held(shard)[oa] == a.conn


def test_in_progress_puts_off_the_ack_deadline() -> None:
    shard = Shard()  # timeout 7, retry_interval 3
    a = shard.connect()
    _join(a, 1)
    a.publish("x")
    [(o, _)] = a.deliveries(1)
    shard.advance(5.0)
    assert _settle(a, 1, progress=[o]) == []
    shard.advance(13.0)   # the first deadline (7) was put off to 12; re-push at 15
    assert a.deliveries(1) == []
    shard.advance(15.0)
    assert a.deliveries(1) == [(o, 2)]


def test_term_without_a_policy_acks_and_with_one_dead_letters() -> None:
    shard = Shard({"dead_letter.enabled": True})
    a = shard.connect()
    _join(a, 1)
    a.publish("x", "y")
    assert [o for o, _ in a.deliveries(1)] == [0, 1]
    assert _settle(a, 1, term=[[0, "bad input"]]) == []
    assert 0 not in _held(shard)
    dlq = shard.topic_stats(dead_letter_topic(TOPIC, NAME))
    assert dlq["next_offset"] == 1
    stats = shard.topic_stats()["subscriptions"][NAME]
    assert stats["cursor"] == 1 and stats["dead_lettered"] == 1


def test_with_a_dead_letter_policy_an_exhausted_message_goes_there_and_the_pool_goes_on() -> None:
    shard = Shard({"dead_letter.enabled": True})  # 3 pushes allowed
    a, b = shard.connect(), shard.connect()
    _join(a, 1, max_in_flight=1)
    _join(b, 1, max_in_flight=1)
    a.publish("poison")
    assert len(a.deliveries(1) + b.deliveries(1)) == 1
    shard.advance(30.0)   # pushes at 0, 10 and 20; its third times out at 27
    assert a.take(P.SUB_ENDED) == [] and b.take(P.SUB_ENDED) == []
    assert shard.topic_stats(dead_letter_topic(TOPIC, NAME))["next_offset"] == 1
    a.publish("next")
    assert len(a.deliveries(1) + b.deliveries(1)) >= 1
@pytest.mark.parametrize("wide_first", [True, False])
def test_a_run_of_new_messages_all_go_out_when_windows_differ(wide_first: bool) -> None:
    # an even split of a run gives a narrow window less; what it cannot take goes to a
    # wider one, whatever the members' order (none skipped, never pushed)
    shard = Shard()
    a, b = shard.connect(), shard.connect()
    _join(a, 1, max_in_flight=6 if wide_first else 1)
    _join(b, 1, max_in_flight=1 if wide_first else 6)
    a.publish(*[f"m{i}" for i in range(7)])
    got = [o for o, _ in a.deliveries(1) + b.deliveries(1)]
    assert sorted(got) == list(range(min(got), min(got) + 7))


def test_a_handed_off_message_out_of_pushes_pins_its_key_to_no_member() -> None:
    """Found by the stateful model: a hand-off that used all its pushes went to the
    dead-letter topic after a member was chosen for it, and its key stayed pinned to
    that member, which held none of it: the key's next message waited for that member
    though another had room."""
    shard = Shard({"subscriber.retry_count": 1, "dead_letter.enabled": True})
    a, b, c = shard.connect(), shard.connect(), shard.connect()
    _join(a, 1, key_ordered=True, max_in_flight=3)
    _publish_keyed(a, ["k"])
    shard.advance(10.0)  # offset 0 times out and is pushed again: its last push
    _publish_keyed(a, [None, "k"])
    assert a.deliveries() == [(0, 1), (0, 2), (1, 1), (2, 1)]
    _join(b, 1, key_ordered=True, max_in_flight=1, credit=0)
    a.unsubscribe(1)  # 0 is a dead letter, 1 goes to b, 2 waits for room
    assert b.deliveries() == [(1, 2)]
    _join(c, 1, key_ordered=True, max_in_flight=1, credit=0)
    assert c.deliveries() == [(2, 2)]  # "k" is on no member: c may take it
    assert shard.topic_stats()["dead_letter_held"] == 1


def test_a_message_a_nak_exhausted_is_held_no_more_by_the_frames_later_items() -> None:
    """Found by the stateful model: a member's nak on a message's last push left it in
    the member's window until the frame ended, so a term (counted as an ack) or another
    nak of it in the same frame was accepted; a plain subscription refuses them."""
    shard = Shard({"subscriber.retry_count": 0})
    a = shard.connect()
    _join(a, 1)
    a.publish("x")
    assert a.deliveries() == [(0, 1)]
    reply = a.request([P.ACK, a.rid(), 1, shard.generation, [], -1,
                       {"nak": [[0, 0.0], [0, 0.0]], "term": [[0, "r"]]}])
    assert [r[:2] for r in reply[4]] == [[0, errors.NotDelivered.code]] * 2
    assert reply[3] == 0  # not acked: it used its pushes, and the pool ends
    assert a.sub_ended() == [(1, errors.SubscriptionInactive.code)]


def test_a_members_in_progress_in_the_retry_interval_puts_the_re_push_off() -> None:
    """As for a plain subscription (test_core_naks): found by the shared model."""
    shard = Shard()  # timeout 7, retry_interval 3
    a = shard.connect()
    _join(a, 1)
    a.publish("x")
    assert a.deliveries() == [(0, 1)]
    shard.advance(8.0)
    reply = a.request([P.ACK, a.rid(), 1, shard.generation, [], -1, {"progress": [0]}])
    assert reply[0] == P.ACKED and reply[4] == []
    shard.advance(17.9)
    assert a.deliveries() == []
    shard.advance(18.0)
    assert a.timed_deliveries() == [(18.0, 0, 2)]
