"""ShardCore: message keys and headers, and delayed delivery (G12): due times, the push
order (due, offset), the timer index, cleanup holding a delayed message until ttl after
it is due, FETCH of what is not due, lag and the delayed figure, bad input."""

from __future__ import annotations

from typing import Any

import pytest
from test_core_support import GEN, TOPIC, Client, Shard

from flux import errors
from flux import protocol as P
from flux.message_meta import read_columns


def _publish(client: Client, ids: list[str], options: dict[str, Any] | None = None,
             topic: str = TOPIC) -> list[Any]:
    group: list[Any] = [topic, ids, [i.encode() for i in ids]]
    if options is not None:
        group.append(options)
    reply = client.publish_frame([group])
    assert reply[0] == P.PUBLISHED, reply
    result: list[Any] = reply[3][0]
    return result


def _delivered(client: Client) -> list[tuple[int, str | None, dict[str, str] | None,
                                           float | None]]:
    """(offset, key, headers, due) of every message pushed so far, in push order."""
    out = []
    for r in client.take(P.DELIVER):
        f = r.frame if hasattr(r, "frame") else r
        count = P.check_deliver(f)
        meta = read_columns(f[8], count) if len(f) > 8 else ([None] * count,) * 3
        for o, k, h, d in zip(P.offsets_of(f[4], count), *meta, strict=True):
            out.append((o, k, h, d))
    return out


def test_keys_and_headers_are_delivered_and_fetched_as_published() -> None:
    shard = Shard()
    client = shard.connect()
    client.subscribe(1, topic=TOPIC)
    _publish(client, ["a", "b"], {"keys": ["k1", None], "headers": [None, {"h": "v"}]})
    _publish(client, ["c"])
    assert _delivered(client) == [(0, "k1", None, None), (1, None, {"h": "v"}, None),
                                  (2, None, None, None)]
    fetched = client.fetch(offset=0)
    assert read_columns(fetched[7], 3) == (["k1", None, None], [None, {"h": "v"}, None],
                                           [None, None, None])


def test_headers_and_keys_count_in_the_topics_bytes() -> None:
    shard = Shard()
    client = shard.connect()
    _publish(client, ["a"])
    plain = shard.topic_stats()["held_bytes"]
    _publish(client, ["b"], {"keys": ["kk"], "headers": [{"n": "vvv"}]})
    assert shard.topic_stats()["held_bytes"] - plain == plain + 2 + 4  # key "kk", n + vvv


@pytest.mark.parametrize(("options", "error"), [
    ({"keys": [""]}, errors.InvalidKey),
    ({"keys": ["k" * 256]}, errors.InvalidKey),
    ({"keys": [5]}, errors.InvalidKey),
    ({"headers": [{"flux-offset": "1"}]}, errors.InvalidHeaders),
    ({"headers": [{"a": 1}]}, errors.InvalidHeaders),
    ({"headers": [["a"]]}, errors.InvalidHeaders),
    ({"delay": -1}, errors.InvalidDelay),
    ({"delay": "soon"}, errors.InvalidDelay),
    ({"delay": 10 ** 9}, errors.InvalidDelay),
    ({"delay": 1, "deliver_at": 5.0}, errors.InvalidDelay),
])
def test_bad_keys_headers_and_delays_are_refused_per_item_and_store_nothing(
        options: dict[str, Any], error: type[errors.FluxError]) -> None:
    shard = Shard()
    client = shard.connect()
    result = _publish(client, ["a"], options)
    assert result[0] == [P.REFUSED] and result[2][0][1] == error.code
    assert shard.topic_stats()["next_offset"] == 0
    ok = _publish(client, ["b"], {"delay": 1.0})  # the same group shape is fine otherwise
    assert ok[0] == 0


def test_a_malformed_options_column_refuses_the_whole_frame() -> None:
    shard = Shard()
    client = shard.connect()
    reply = client.publish_frame([[TOPIC, ["a", "b"], [b"a", b"b"], {"keys": ["only one"]}]])
    assert reply[0] == P.ERROR and reply[2] == errors.InvalidRequest.code


def test_a_delayed_message_is_acked_at_once_with_its_due_time_and_pushed_when_due() -> None:
    shard = Shard()
    client = shard.connect()
    client.subscribe(1, topic=TOPIC)
    result = _publish(client, ["late"], {"delay": 10.0})
    assert result[0] == 0 and result[4] == [shard.core.epoch + 10.0]
    _publish(client, ["now"])
    assert [o for o, *_ in _delivered(client)] == [1]
    client.ack(1, 1)
    shard.advance(9.5)
    assert _delivered(client) == []
    shard.advance(10.0)
    assert _delivered(client) == [(0, None, None, 10.0)]


def test_first_pushes_go_in_due_then_offset_order_for_a_late_subscriber() -> None:
    shard = Shard({"subscriber.max_in_flight": 100})
    client = shard.connect()
    _publish(client, ["d5"], {"delay": 5.0})   # 0, due 5
    _publish(client, ["d2"], {"delay": 2.0})   # 1, due 2
    shard.advance(1.0)
    _publish(client, ["p1"])                   # 2, due 1
    shard.advance(3.0)
    _publish(client, ["p3"])                   # 3, due 3
    shard.advance(6.0)
    client.subscribe(1, topic=TOPIC, read_old=True)
    assert [o for o, *_ in _delivered(client)] == [2, 1, 3, 0]


def test_strict_mode_sees_exactly_the_due_order() -> None:
    shard = Shard()
    client = shard.connect()
    client.subscribe(1, topic=TOPIC, max_in_flight=1, credit=100)
    _publish(client, ["d"], {"delay": 3.0})
    _publish(client, ["a", "b"])
    seen = []
    for _ in range(3):
        shard.advance(shard.now + 4.0)
        pushed = _delivered(client)
        seen += [o for o, *_ in pushed]
        for o, *_ in pushed:
            client.ack(1, o)
    assert seen == [1, 2, 0]


def test_an_ack_through_never_acks_a_delayed_message_not_pushed() -> None:
    shard = Shard()
    client = shard.connect()
    client.subscribe(1, topic=TOPIC)
    _publish(client, ["d"], {"delay": 5.0})
    _publish(client, ["a", "b"])
    assert [o for o, *_ in _delivered(client)] == [1, 2]
    client.ack(1, through=2)
    sub = shard.stats()["topics"][TOPIC]["subscriptions"]
    (stats,) = sub.values()
    assert stats["cursor"] == 0 and stats["delayed"] == 1 and stats["lag"] == 0
    shard.advance(5.0)
    assert [o for o, *_ in _delivered(client)] == [0]
    client.ack(1, 0)
    (stats,) = shard.stats()["topics"][TOPIC]["subscriptions"].values()
    assert stats["cursor"] == 3 and stats["delayed"] == 0


def test_fetch_returns_a_delayed_message_whatever_is_due_with_its_due_time() -> None:
    shard = Shard()
    client = shard.connect()
    _publish(client, ["d"], {"delay": 50.0})
    fetched = client.fetch(offset=0)
    assert fetched[4] == ["d"]
    assert read_columns(fetched[7], 1)[2] == [shard.core.epoch + 50.0]


def test_a_pending_message_is_held_until_ttl_after_it_is_due() -> None:
    shard = Shard({"message.ttl": 20.0})
    client = shard.connect()
    _publish(client, ["d"], {"delay": 30.0})
    shard.advance(45.0)  # stored 45 s ago, due 15 s ago: not yet ttl past its due time
    assert shard.topic_stats()["held"] == 1
    shard.advance(56.0)
    assert shard.topic_stats()["held"] == 0


def test_the_timer_index_fires_only_what_is_due() -> None:
    shard = Shard()
    client = shard.connect()
    _publish(client, [f"m{i}" for i in range(50)], {"delay": [float(i + 1) for i in range(50)]})
    delayed = shard.core.topics[TOPIC].delayed
    assert len(shard.core._delays) == 1  # one timer entry for the run of 50
    assert delayed.pending(0, set(), 0.0) == 50
    shard.advance(10.5)
    assert len(shard.core._delays) == 1
    assert delayed.pending(0, set(), 10.5) == 40
    assert shard.core.next_deadline() == 11.0


def test_delay_over_a_topic_policy_max_delay_is_refused() -> None:
    shard = Shard({"topics": [{"match": "orders.>", "message": {"max_delay": 5}}]})
    client = shard.connect()
    result = _publish(client, ["a", "b"], {"delay": [4.0, 6.0]})
    assert result[0] == [0, P.REFUSED] and result[2][0][1] == errors.InvalidDelay.code


def test_deliver_at_in_the_past_means_now() -> None:
    shard = Shard()
    client = shard.connect()
    client.subscribe(1, topic=TOPIC)
    result = _publish(client, ["a"], {"deliver_at": shard.core.epoch - 100.0})
    assert len(result) == 3
    assert [o for o, *_ in _delivered(client)] == [0]


def test_a_duplicate_of_a_delayed_message_reports_the_originals_due_time() -> None:
    shard = Shard()
    client = shard.connect()
    _publish(client, ["a"], {"delay": 8.0})
    again = _publish(client, ["a"], {"delay": 1.0})
    assert again[1] == [0] and again[4] == [shard.core.epoch + 8.0]
    assert GEN


def test_a_cumulative_ack_never_covers_a_delayed_message_pushed_after_a_higher_offset() -> None:
    shard = Shard()
    client = shard.connect()
    client.subscribe(1, topic=TOPIC)
    _publish(client, ["d"], {"delay": 2.0})
    _publish(client, ["a", "b"])
    assert [o for o, *_ in _delivered(client)] == [1, 2]
    shard.advance(2.0)  # offset 0 is pushed now, while the client acks through 2
    assert [o for o, *_ in _delivered(client)] == [0]
    cursor, refused = client.ack(1, through=2)
    assert (cursor, refused) == (0, [])  # 1 and 2 acked, not 0: the client never saw it
    cursor, refused = client.ack(1, 0)
    assert (cursor, refused) == (3, [])


def test_a_pending_message_does_not_hold_back_the_cleanup_of_others() -> None:
    long = 1e4
    shard = Shard({"message.ttl": 20.0, "subscriber.heartbeat": long,
                   "subscriber.timeout": long, "limits.hello_timeout": long})
    client = shard.connect()
    _publish(client, ["d"], {"delay": 100.0})  # offset 0, due at 100
    _publish(client, ["a", "b"])              # offsets 1, 2
    shard.advance(10.0)
    _publish(client, ["c"])                   # offset 3, stored at 10
    shard.advance(26.0)                       # 1 and 2 past their ttl; 0 is not due yet
    stats = shard.topic_stats()
    assert (stats["held"], stats["oldest"]) == (2, 3)
    fetched = client.fetch(offset=0)
    assert fetched[2]["oldest"] == 0 and fetched[3] == [0, 3] and fetched[4] == ["d", "c"]
    assert read_columns(fetched[7], 2)[2] == [100.0, None]
    # a reader of old messages starts at the oldest message held, the kept one (G6)
    assert client.subscribe(1, topic=TOPIC, read_old=True)["start_offset"] == 0
    assert {o for o, *_ in _delivered(client)} == {3}
    shard.advance(100.0)
    assert {o for o, *_ in _delivered(client)} == {0}  # once due (G12)
    client.unsubscribe(1)
    shard.advance(125.0)                       # ttl past its due time: gone
    assert shard.topic_stats()["held"] == 0


def test_a_from_offset_below_the_oldest_in_line_is_kept_down_to_a_kept_message() -> None:
    """G6 with G12: a from_offset at or above a kept message is the start even in a hole
    (offsets gone around it); one below the oldest held is raised to it. Each gets the
    kept messages at or above its start when they are due, none below."""
    long = 1e4
    shard = Shard({"message.ttl": 20.0, "subscriber.heartbeat": long,
                   "subscriber.timeout": long, "limits.hello_timeout": long})
    client = shard.connect()
    _publish(client, ["a"])                   # offset 0
    _publish(client, ["d"], {"delay": 100.0})  # offset 1, due at 100
    _publish(client, ["b"])                   # offset 2
    shard.advance(10.0)
    _publish(client, ["c"])                   # offset 3, stored at 10
    shard.advance(26.0)                       # 0 and 2 go; 1 is kept out of line
    assert shard.topic_stats()["oldest"] == 3
    starts = {sid: client.subscribe(sid, topic=TOPIC, from_offset=offset)
              for sid, offset in ((1, 0), (2, 1), (3, 2))}
    assert [(r["start_offset"], r["clamped"]) for r in starts.values()] == [
        (1, True), (1, False), (2, False)]
    shard.advance(100.0)
    got: dict[int, set[int]] = {}
    for r in client.take(P.DELIVER):
        got.setdefault(r[1], set()).update(P.offsets_of(r[4], P.check_deliver(r)))
    assert got == {1: {1, 3}, 2: {1, 3}, 3: {3}}


def test_a_shared_read_old_subscription_starts_at_a_kept_message() -> None:
    """G6 with G10 and G12: a shared subscription made with read_old after a trim kept a
    pending delayed message out of line starts at it; a member gets it when due."""
    long = 1e4
    shard = Shard({"message.ttl": 20.0, "subscriber.heartbeat": long,
                   "subscriber.timeout": long, "limits.hello_timeout": long})
    client = shard.connect()
    _publish(client, ["d"], {"delay": 100.0, "keys": ["k"]})  # offset 0, due at 100
    _publish(client, ["a", "b"], {"keys": ["k", "j"]})        # offsets 1, 2
    shard.advance(30.0)                                        # 1 and 2 go; 0 is kept
    reply = client.subscribe(1, topic=TOPIC, name="w", shared=True, key_ordered=True,
                             read_old=True)
    assert (reply["start_offset"], reply["clamped"]) == (0, False)
    _publish(client, ["c"], {"keys": ["k"]})                   # offset 3
    assert client.deliveries(1) == [(3, 1)]
    shard.advance(101.0)
    assert client.deliveries(1) == [(0, 1)]


def test_a_cursor_left_in_a_hole_holds_back_no_cleanup_and_counts_in_no_lag() -> None:
    """G5 with G12: a read_old subscription that started at a kept message and acked it
    keeps its cursor in the hole above it (offsets gone before it was made); once the
    kept message is released, the messages it acks in line are cleaned up as usual,
    and its lag counts only what it has not acked."""
    long = 1e4
    shard = Shard({"message.ttl": 20.0, "subscriber.heartbeat": long,
                   "subscriber.timeout": long, "limits.hello_timeout": long})
    client = shard.connect()
    _publish(client, ["d"], {"delay": 40.0})  # offset 0, due at 40
    _publish(client, ["a", "b"])              # offsets 1, 2
    shard.advance(30.0)                       # 1 and 2 go; 0 is kept
    assert client.subscribe(1, topic=TOPIC, read_old=True)["start_offset"] == 0
    _publish(client, ["c", "e"])              # offsets 3, 4
    shard.advance(41.0)
    assert sorted(o for o, _ in client.deliveries(1)) == [0, 3, 4]
    cursor, refused = client.ack(1, 0, 3)
    assert (cursor, refused) == (1, [])       # in the hole: 1 and 2 were never its
    assert shard.topic_stats()["subscriptions"]["~1.1"]["lag"] == 1  # offset 4
    client.ack(1, 4)
    shard.advance(61.0)                       # 0 is ttl past due, 3 and 4 ttl old: all go
    assert (shard.topic_stats()["held"], shard.topic_stats()["oldest"]) == (0, 5)
    _publish(client, ["f"])                   # offset 5: no delayed message is held now
    assert client.deliveries(1) == [(5, 1)]
    assert client.ack(1, 5) == (1, [])
    shard.advance(90.0)                       # ttl old, and a cleanup pass since
    stats = shard.topic_stats()
    assert (stats["held"], stats["oldest"]) == (0, 6)
    assert stats["subscriptions"]["~1.1"]["lag"] == 0


def test_a_kept_message_counts_toward_the_topics_bytes_until_it_goes() -> None:
    shard = Shard({"message.ttl": 5.0})
    client = shard.connect()
    _publish(client, ["d"], {"delay": 50.0, "keys": ["key"]})
    _publish(client, ["x"])
    held = shard.topic_stats()["held_bytes"]
    shard.advance(11.0)
    assert shard.topic_stats()["held_bytes"] == held - 2  # x went (payload and id); d stays
    shard.advance(60.0)
    assert shard.topic_stats()["held"] == 0


def test_dues_brought_forward_again_and_again_keep_the_timer_heap_to_one_entry_per_run(
) -> None:
    long = 1e5  # nothing times out, expires or is cleaned up meanwhile
    shard = Shard({"subscriber.max_in_flight": 5000, "subscriber.timeout": long,
                   "message.ttl": long, "message.dedup_window": long,
                   "subscriber.heartbeat": long, "limits.hello_timeout": long})
    client = shard.connect()
    client.subscribe(1, topic=TOPIC, credit=5000)
    n = 3000
    for start in range(0, n, 500):  # published latest first, one message a group
        groups = [[TOPIC, [f"m{i}"], [b"x"], {"delay": float(n - i)}]
                  for i in range(start, start + 500)]
        assert client.publish_frame(groups)[0] == P.PUBLISHED
    assert len(shard.core._delays) < 2 * 1024 + 10  # stale entries swept, not one a message
    shard.advance(n + 1.0)
    assert [o for o, _, _, _ in _delivered(client)] == list(range(n - 1, -1, -1))


def test_a_long_session_forgets_the_delayed_pushes_it_acked_and_still_takes_their_acks(
) -> None:
    long = 1e5
    shard = Shard({"subscriber.timeout": long, "message.ttl": long,
                   "message.dedup_window": long, "subscriber.heartbeat": long,
                   "limits.hello_timeout": long})
    client = shard.connect()
    client.subscribe(1, topic=TOPIC, credit=100_000)
    n = 10_000
    for start in range(0, n, 500):
        _publish(client, [f"m{i}" for i in range(start, start + 500)], {"delay": 1.0})
    for t in range(1, 101):  # pushed max_in_flight (100) at a time, each acked as it comes
        shard.advance(float(t))
        offsets = [o for o, _, _, _ in _delivered(client)]
        assert client.ack_frame(1, offsets)[4] == []
    [sub] = shard.core.topics[TOPIC].subs.values()
    assert sub.cursor == n
    assert len(sub.due_pushed) <= 2 * 4096
    assert client.ack_frame(1, [0, 5000])[4] == []  # acked long ago: not refused


def test_a_pending_message_at_a_subscriptions_cursor_does_not_hold_back_the_others(
) -> None:
    shard = Shard({"message.ttl": 20.0})
    client = shard.connect()
    client.subscribe(1, topic=TOPIC, credit=100)
    _publish(client, ["d"], {"delay": 100.0})  # offset 0, due at 100: the cursor stays at 0
    _publish(client, ["a", "b", "c"])         # offsets 1..3
    pushed = [o for o, *_ in _delivered(client)]
    assert pushed == [1, 2, 3]
    assert client.ack_frame(1, [1, 3])[4] == []  # 2 stays unacked
    shard.advance(26.0)                         # 1..3 past their ttl; 0 not due yet
    stats = shard.topic_stats()
    assert (stats["held"], stats["oldest"]) == (3, 2)  # 0 kept out of line, 2 unacked
    assert client.ack_frame(1, [2])[4] == []
    shard.advance(30.0)
    assert shard.topic_stats()["held"] == 1     # only the pending one
    assert 0 not in {o for o, *_ in _delivered(client)}  # (2 was pushed again meanwhile)
    shard.advance(100.0)
    assert [o for o, *_ in _delivered(client)] == [0]
    assert client.ack_frame(1, [0])[4] == []
    [sub] = shard.core.topics[TOPIC].subs.values()
    assert sub.cursor == 4 and not sub.acked
    shard.advance(125.0)                        # ttl past its due time, acked: gone
    assert shard.topic_stats()["held"] == 0


def test_a_kept_message_acked_above_another_pending_one_goes_ttl_after_it_is_due() -> None:
    shard = Shard({"message.ttl": 20.0})
    client = shard.connect()
    client.subscribe(1, topic=TOPIC, credit=100)
    _publish(client, ["late"], {"delay": 500.0})  # offset 0 holds the cursor for long
    _publish(client, ["soon"], {"delay": 50.0})   # offset 1
    shard.advance(50.0)
    assert [o for o, *_ in _delivered(client)] == [1]
    assert client.ack_frame(1, [1])[4] == []
    shard.advance(75.0)                           # 1 is ttl past due and acked: gone
    assert shard.topic_stats()["held"] == 1


def test_a_duplicate_of_a_delayed_message_of_its_own_group_carries_its_due_time() -> None:
    """Found by the stateful model: a duplicate of a delayed message stored by the same
    PUBLISH group was acked without the due time (the group indexes its delays last)."""
    shard = Shard()
    client = shard.connect()
    result = _publish(client, ["a", "a"], {"delay": [4.0, None]})
    due = shard.core.epoch + 4.0
    assert result[:2] == [[0, 0], [1]] and result[4] == [due, due]
    assert _publish(client, ["a"])[4] == [due]  # as a later frame's duplicate is
