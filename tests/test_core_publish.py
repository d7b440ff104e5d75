"""ShardCore publishing: offsets (G1), publish acks (G2), dedup (G3), TopicFull and Busy (G5)."""

from __future__ import annotations

import copy
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_core_support import GEN, OK, TOPIC, Shard, deliver_messages, fetched_messages, item_rows

from flux import errors
from flux import protocol as P
from flux.message_meta import read_columns
from flux.shard.core import ShardCore
from flux.shard.dedup import COMPACT_ID_COST, COMPACT_IDS, DICT_ID_COST


def test_offsets_start_at_zero_and_increase_in_accept_order() -> None:
    """G1: a topic's offsets are 0, 1, 2, ... in the order the shard accepts publishes."""
    shard = Shard()
    client = shard.connect()
    assert client.publish("a", "b", "c") == [[OK, 0, False], [OK, 1, False], [OK, 2, False]]
    assert client.publish("d") == [[OK, 3, False]]


def test_each_topic_has_its_own_offsets() -> None:
    """G1: offsets are per topic."""
    shard = Shard()
    client = shard.connect()
    assert client.publish_one("a", topic="t.one") == 0
    assert client.publish_one("b", topic="t.two") == 0
    assert client.publish_one("c", topic="t.one") == 1


def test_publish_ack_carries_offset_generation_and_duplicate_flag() -> None:
    """G2: the PUBLISHED reply answers the rid with the generation and per-item results."""
    shard = Shard()
    client = shard.connect()
    reply = client.request([P.PUBLISH, 77, [[TOPIC, ["x", "x"], [b"1", b"2"]]]])
    assert reply == [P.PUBLISHED, 77, GEN, [[[0, 0], [1], []]]]


def test_offsets_are_never_reused_after_cleanup() -> None:
    """G1/G5: after every message is cleaned up, the next publish gets the next offset."""
    shard = Shard()
    client = shard.connect()
    client.publish("a", "b")
    shard.advance(40.0)  # past ttl (20) and a cleanup pass, with no subscription
    assert shard.topic_stats()["held"] == 0
    assert client.publish_one("c") == 2


def test_stored_payload_is_what_a_fetch_returns() -> None:
    """G2: a publish is acked after the message is stored."""
    shard = Shard()
    client = shard.connect()
    client.publish("m1", payload=b"\x00\xffdata")
    reply = client.fetch(offset=0)
    assert reply[0] == P.FETCHED
    [[offset, mid, payload, _ts]] = fetched_messages(reply)
    assert (offset, mid, payload) == (0, "m1", b"\x00\xffdata")


def test_duplicate_publish_returns_original_offset() -> None:
    """G3: a second publish of an id gets the first offset and duplicate=True, and is not stored."""
    shard = Shard()
    client = shard.connect()
    client.publish("a", "b")
    assert client.publish("a") == [[OK, 0, True]]
    assert shard.topic_stats()["next_offset"] == 2
    assert client.publish_one("c") == 2


def test_duplicate_from_another_connection_is_detected() -> None:
    """G3: the dedup window is per topic, not per connection."""
    shard = Shard()
    first, second = shard.connect(), shard.connect()
    first.publish("a", "b")
    assert second.publish("b") == [[OK, 1, True]]


def test_same_id_on_another_topic_is_not_a_duplicate() -> None:
    """G3: dedup is keyed by (topic, id)."""
    shard = Shard()
    client = shard.connect()
    client.publish("a", topic="t.one")
    assert client.publish("a", topic="t.two") == [[OK, 0, False]]


def test_duplicate_returns_original_offset_after_the_message_was_cleaned_up() -> None:
    """G3: the window outlives the message (ttl 20 < dedup_window 50)."""
    shard = Shard()
    client = shard.connect()
    client.publish("a", "b")
    shard.advance(30.0)
    assert shard.topic_stats()["held"] == 0
    assert client.publish("a") == [[OK, 0, True]]


def test_id_is_stored_anew_after_the_dedup_window() -> None:
    """G3: once ``dedup_window`` has passed since acceptance the same id is a new message."""
    shard = Shard()
    client = shard.connect()
    client.publish("a")
    shard.advance(49.0)
    assert client.publish("a") == [[OK, 0, True]]
    shard.advance(50.0)
    assert client.publish("a") == [[OK, 1, False]]
    assert client.publish("a") == [[OK, 1, True]]


def test_duplicate_does_not_extend_the_dedup_window() -> None:
    """G3: the window runs from the original acceptance, not from retries."""
    shard = Shard()
    client = shard.connect()
    client.publish("a")
    shard.advance(45.0)
    assert client.publish("a") == [[OK, 0, True]]
    shard.advance(51.0)
    assert client.publish("a") == [[OK, 1, False]]


def test_new_generation_starts_with_an_empty_dedup_window() -> None:
    """G3/G7: a restarted shard (new ShardCore, new generation) stores a retried id again."""
    old = Shard()
    old.connect().publish("a", "b")
    new = Shard(generation=GEN + 1)
    client = new.connect()
    assert client.publish("b") == [[OK, 0, False]]


def test_publish_that_would_pass_max_bytes_gets_topic_full() -> None:
    """G5: payload + id + remembered-id bytes count; going over max_bytes is TopicFull."""
    # each message costs 10 (payload) + 2 * 3 (id in the log and in the dedup window) = 16
    shard = Shard({"topic.max_bytes": 48})
    client = shard.connect()
    results = client.publish("id0", "id1", "id2", "id3", payload=b"0123456789")
    assert results[:3] == [[OK, 0, False], [OK, 1, False], [OK, 2, False]]
    assert results[3][0] == errors.TopicFull.code
    assert results[3][2] is None
    assert shard.topic_stats()["next_offset"] == 3
    assert shard.topic_stats()["held_bytes"] == 48


def test_topic_full_is_exact_at_the_limit() -> None:
    """G5: a publish that exactly reaches max_bytes is stored; one byte more is refused."""
    shard = Shard({"topic.max_bytes": 16})
    client = shard.connect()
    assert client.publish("abc", payload=b"x" * 11)[0][0] == errors.TopicFull.code
    assert client.publish("abc", payload=b"x" * 10) == [[OK, 0, False]]


def test_dedup_check_comes_before_topic_full() -> None:
    """G3: a duplicate of a stored id is answered with its offset even when the topic is full."""
    shard = Shard({"topic.max_bytes": 32})
    client = shard.connect()
    client.publish("id0", "id1", payload=b"0123456789")
    assert client.publish("id2", payload=b"0123456789")[0][0] == errors.TopicFull.code
    assert client.publish("id1", payload=b"0123456789") == [[OK, 1, True]]


def test_topic_full_clears_after_cleanup_frees_messages_and_ids() -> None:
    """G5: back-pressure, not loss: once messages and ids expire, publishes are accepted."""
    shard = Shard({"topic.max_bytes": 32})
    client = shard.connect()
    client.publish("id0", "id1", payload=b"0123456789")
    assert client.publish("id2", payload=b"0123456789")[0][0] == errors.TopicFull.code
    shard.advance(30.0)  # messages trimmed (ttl 20), ids still remembered (window 50)
    assert shard.topic_stats()["held"] == 0
    assert client.publish("id2", payload=b"0123456789")[0][0] == OK


def test_topic_full_refusal_is_not_remembered_as_accepted() -> None:
    """G3: an id refused with TopicFull was not accepted, so a later retry stores it."""
    shard = Shard({"topic.max_bytes": 16})
    client = shard.connect()
    client.publish("id0", payload=b"0123456789")
    assert client.publish("id1", payload=b"0123456789")[0][0] == errors.TopicFull.code
    shard.advance(60.0)
    assert client.publish("id1", payload=b"0123456789") == [[OK, 1, False]]


# -- shard.max_memory: what all topics of a shard hold ---------------------------------

# a 10-byte payload with a 3-character id: 10 + 3 + MESSAGE_COST (60) in the log,
# 3 + REMEMBERED_ID_COST (100) in the dedup window
COST = 10 + 3 + 60 + 3 + 100


def test_shard_memory_counts_every_topic_and_refuses_past_max_memory() -> None:
    shard = Shard({"shard.max_memory": 3 * COST})
    client = shard.connect()
    assert client.publish("id0", "id1", payload=b"0123456789")[1] == [OK, 1, False]
    results = client.publish_rows([["other.topic", "id2", b"0123456789"],
                                   ["other.topic", "id3", b"0123456789"]])
    assert results[0] == [OK, 0, False]
    assert results[1][0] == errors.TopicFull.code
    stats = shard.stats()
    assert (stats["memory"], stats["max_memory"]) == (3 * COST, 3 * COST)
    # G3 before the limit: a duplicate is still answered with its offset
    assert client.publish("id1", payload=b"0123456789") == [[OK, 1, True]]


def test_shard_memory_is_released_as_messages_and_ids_go_and_topics_retire() -> None:
    shard = Shard({"shard.max_memory": 2 * COST})
    client = shard.connect()
    client.publish("id0", "id1", payload=b"0123456789")
    assert client.publish("id2", payload=b"0123456789")[0][0] == errors.TopicFull.code
    shard.advance(30.0)   # messages trimmed (ttl 20), ids remembered (window 50)
    assert shard.stats()["memory"] == 2 * (3 + 100)
    assert client.publish("id2", payload=b"0123456789")[0][0] == errors.TopicFull.code
    shard.advance(100.0)  # everything gone: the topic is retired
    assert shard.stats()["memory"] == 0 and TOPIC in shard.core.retired
    assert client.publish("id2", payload=b"0123456789") == [[OK, 2, False]]
    assert shard.stats()["memory"] == COST


def test_shard_memory_matches_a_recount_after_any_publishes() -> None:
    """The running figure equals the sum of the topics' footprints (fast and slow paths,
    duplicates, refusals, several topics in one frame)."""
    shard = Shard({"topic.max_bytes": 200, "shard.max_memory": 100_000})
    client = shard.connect()
    client.publish_rows([["a.b", "x", b"1" * 50], ["c.d", "y", b"2"], ["a.b", "x", b"3"],
                         ["a.b", "z" * 40, b"4" * 90], ["e.f", "w", "not bytes"]])
    client.publish("m1", "m2", "m3", payload=b"p" * 20)
    client.publish("m2", "m4", payload=b"q" * 5)
    core = shard.core
    assert core.memory == sum(t.footprint() for t in core.topics.values()) > 0
    shard.advance(30.0)
    assert core.memory == sum(t.footprint() for t in core.topics.values()) > 0


def test_a_compact_dedup_window_is_counted_at_what_its_ids_take() -> None:
    """Past ``COMPACT_IDS`` ids a window packs them (``DedupWindow.id_cost`` falls from
    a dict's 100 B to 48 B an id): the running figure follows at once, fast and slow
    paths alike, and still equals a recount."""
    shard = Shard({"shard.max_memory": 1 << 30})
    client = shard.connect()
    core = shard.core
    group = 1000
    for g in range(COMPACT_IDS // group + 2):
        client.publish(*[f"g{g}-{i:05d}" for i in range(group)], payload=b"x")
        topic = core.topics[TOPIC]
        assert core.memory == sum(t.footprint() for t in core.topics.values())
    assert topic.dedup.compact and topic.dedup.id_cost == COMPACT_ID_COST < DICT_ID_COST
    ids = len(topic.dedup)
    assert core.memory == topic.log.held_bytes + len(topic.log) * 60 + \
        topic.dedup.held_bytes + ids * COMPACT_ID_COST
    client.publish_rows([[TOPIC, "slow-1", b"y"], [TOPIC, "g0-00001", b"dup"]])  # slow path
    assert core.memory == sum(t.footprint() for t in core.topics.values())


def test_more_than_buffer_publishes_of_one_topic_in_a_frame_get_busy() -> None:
    """G5/§2 topic.buffer: items past the buffer get Busy; the others are stored."""
    shard = Shard({"topic.buffer": 3})
    client = shard.connect()
    results = client.publish("a", "b", "c", "d", "e")
    assert results[:3] == [[OK, 0, False], [OK, 1, False], [OK, 2, False]]
    assert [r[0] for r in results[3:]] == [errors.Busy.code, errors.Busy.code]
    assert shard.topic_stats()["next_offset"] == 3
    # Busy is retryable with the same id: the ids were not accepted
    assert client.publish("d", "e") == [[OK, 3, False], [OK, 4, False]]


def test_buffer_is_counted_per_topic_within_a_frame() -> None:
    """topic.buffer limits publishes of *one* topic per frame, not of the whole frame."""
    shard = Shard({"topic.buffer": 2})
    client = shard.connect()
    rows = client.publish_rows([["t.a", "1", b""], ["t.b", "1", b""], ["t.a", "2", b""],
                                ["t.b", "2", b""], ["t.a", "3", b""]])
    assert [r[0] for r in rows] == [OK, OK, OK, OK, errors.Busy.code]


def test_busy_limit_resets_with_each_frame() -> None:
    shard = Shard({"topic.buffer": 2})
    client = shard.connect()
    assert [r[0] for r in client.publish("a", "b")] == [OK, OK]
    assert [r[0] for r in client.publish("c", "d")] == [OK, OK]


def test_bad_item_in_a_group_gets_its_own_error_and_others_are_stored() -> None:
    """G8: inside a group each item gets its own result; the good ones are stored."""
    shard = Shard()
    client = shard.connect()
    ids: list[object] = ["ok1", "", "ok3", "i" * 129, 5, "ok5", None]
    payloads: list[object] = [b"x", b"x", "not bytes", b"x", b"x", b"y", b"z"]
    reply = client.publish_frame([[TOPIC, ids, payloads]])
    [[offsets, duplicates, refused]] = reply[3]
    assert offsets == [0, -1, -1, -1, -1, 1, -1]
    assert duplicates == []
    assert [(i, code) for i, code, _ in refused] == [
        (1, errors.InvalidMessageId.code), (2, errors.InvalidRequest.code),
        (3, errors.InvalidMessageId.code), (4, errors.InvalidMessageId.code),
        (6, errors.InvalidMessageId.code)]
    assert all(isinstance(message, str) and message for *_, message in refused)
    assert [m[:3] for m in fetched_messages(client.fetch())] == [[0, "ok1", b"x"], [1, "ok5", b"y"]]


def test_a_bad_topic_refuses_every_item_of_its_group_only() -> None:
    """G8: InvalidTopic is per group; the other groups of the frame are stored."""
    shard = Shard()
    client = shard.connect()
    reply = client.publish_frame([["bad topic!", ["a", "b"], [b"", b""]],
                                  [TOPIC, ["a"], [b""]], [7, ["c"], [b""]]])
    bad, good, not_a_name = reply[3]
    assert bad[0] == [-1, -1] and bad[1] == []
    assert [(i, code) for i, code, _ in bad[2]] == [(0, errors.InvalidTopic.code),
                                                    (1, errors.InvalidTopic.code)]
    assert good == [0, [], []]
    assert not_a_name[0] == [-1] and not_a_name[2][0][:2] == [0, errors.InvalidTopic.code]
    assert list(shard.stats()["topics"]) == [TOPIC]


@pytest.mark.parametrize("groups", [
    None, {"topic": TOPIC}, "groups", [[TOPIC, ["a"], [b""]], "not a group"],
    [[TOPIC, ["a"], [b""]], [TOPIC, ["b"]]], [[TOPIC, ["a"], [b""]], [TOPIC, ["b"], [b""], 1]],
    [[TOPIC, ["a"], [b""]], [TOPIC, "b", b""]], [[TOPIC, ["a"], [b""]], [TOPIC, ["b"], b""]],
    [[TOPIC, ["a"], [b""]], [TOPIC, ["b", "c"], [b""]]], [[TOPIC, ["a"], [b"", b""]]],
    [[TOPIC, ["a"], [b""]], ("t", ["b"], [b""])],
])
def test_a_badly_built_group_refuses_the_whole_frame_and_stores_nothing(groups: Any) -> None:
    """G8: the structure of every group is checked before anything is stored."""
    shard = Shard()
    client = shard.connect()
    reply = client.request([P.PUBLISH, 9, groups])
    assert reply[:3] == [P.ERROR, 9, errors.InvalidRequest.code]
    assert shard.stats()["topics"] == {}
    assert client.publish("a") == [[OK, 0, False]]  # "a" was not remembered either


def test_a_topic_in_two_groups_of_a_frame_shares_offsets_dedup_and_buffer() -> None:
    """G1/G3: groups of one topic are handled in order: offsets continue, an id of an
    earlier group is a duplicate, and topic.buffer counts the items of every group."""
    shard = Shard({"topic.buffer": 4})
    client = shard.connect()
    reply = client.publish_frame([
        [TOPIC, ["a", "b"], [b"1", b"2"]],
        ["t.other", ["a"], [b"3"]],
        [TOPIC, ["c", "a"], [b"4", b"5"]],
        [TOPIC, ["d", "e"], [b"6", b"7"]],
    ])
    assert reply[3][:3] == [[0, [], []], [0, [], []], [[2, 0], [1], []]]
    # the duplicate counted toward the buffer: "d" is the fifth item of the topic
    offsets, duplicates, refused = reply[3][3]
    assert (offsets, duplicates) == ([-1, -1], [])
    assert [(i, code) for i, code, _ in refused] == [(0, errors.Busy.code), (1, errors.Busy.code)]
    assert shard.topic_stats()["next_offset"] == 3


def test_an_id_twice_in_one_group_is_stored_once() -> None:
    """G3: the second copy in the same group is a duplicate of the first."""
    shard = Shard()
    client = shard.connect()
    reply = client.publish_frame([[TOPIC, ["a", "b", "a", "a"], [b"1", b"2", b"3", b"4"]]])
    assert reply[3] == [[[0, 1, 0, 0], [2, 3], []]]
    assert shard.topic_stats()["next_offset"] == 2


def test_with_no_dedup_window_an_id_twice_in_one_group_is_stored_twice() -> None:
    """G3: a zero window remembers nothing, not even within a frame."""
    shard = Shard({"message.dedup_window": 0.0})
    client = shard.connect()
    reply = client.publish_frame([[TOPIC, ["a", "a"], [b"1", b"2"]], [TOPIC, ["a"], [b"3"]]])
    assert reply[3] == [[0, [], []], [2, [], []]]


def test_an_empty_group_gets_an_empty_result_and_creates_no_topic() -> None:
    shard = Shard()
    client = shard.connect()
    reply = client.publish_frame([[TOPIC, [], []], ["bad topic!", [], []]])
    assert reply[3] == [[[], [], []], [[], [], []]]
    assert shard.stats()["topics"] == {}


def test_publish_while_draining_is_refused_as_shutting_down() -> None:
    shard = Shard()
    client = shard.connect()
    shard.core.drain()
    reply = client.publish_frame([[TOPIC, ["a"], [b""]]])
    assert reply[0] == P.ERROR and reply[2] == errors.ShuttingDown.code
    assert TOPIC not in shard.stats()["topics"]


def test_expired_ids_stop_counting_toward_max_bytes_before_the_next_cleanup_pass() -> None:
    """G5: an id whose dedup window has passed no longer holds bytes, even between passes.

    "abc" (3-byte id, 10-byte payload) fills max_bytes=16 at t=1; the message is
    trimmed at t=25 and the id expires at t=51, between the passes at t=50 and t=55.
    """
    shard = Shard({"topic.max_bytes": 16})
    client = shard.connect()
    shard.advance(1.0)
    assert client.publish("abc", payload=b"0123456789") == [[OK, 0, False]]
    shard.advance(52.0)
    assert shard.topic_stats()["held"] == 0
    assert client.publish("xyz", payload=b"0123456789") == [[OK, 1, False]]


def test_message_that_could_not_be_delivered_in_one_frame_is_refused_as_too_large() -> None:
    """G8: the PUBLISH fits in max_frame_bytes, but its DELIVER (which adds the offset,
    generation, timestamp and attempt) would not; storing it would make a message no
    subscriber can ever receive, so it gets MessageTooLarge and nothing is stored."""
    shard = Shard({"max_frame_bytes": 1024})
    client = shard.connect()
    client.subscribe(1, name="s")
    publish = [P.PUBLISH, 5, [["t", ["i"], [b"x" * 1000]]]]
    assert len(P.encode(publish)) - 4 <= 1024  # the request itself is a legal frame
    reply = client.publish_frame(publish[2])
    assert reply[3][0][2][0][:2] == [0, errors.MessageTooLarge.code]
    assert "t" not in shard.stats()["topics"] or shard.stats()["topics"]["t"]["next_offset"] == 0


def test_largest_accepted_message_can_be_delivered_and_fetched_in_one_frame() -> None:
    """G2/G8: whatever is stored fits in the DELIVER and FETCHED frames that carry it."""
    shard = Shard({"max_frame_bytes": 1024})
    client = shard.connect()
    client.subscribe(1, name="s")
    mid = "i" * 128
    size = 1024
    while True:  # the largest payload the shard accepts with a 128-byte id
        [[status, *_]] = client.publish(f"{mid[:-4]}{size:04d}", payload=b"x" * size)
        if status == OK:
            break
        assert status == errors.MessageTooLarge.code
        size -= 1
    assert size >= 512
    decoder = P.FrameDecoder(1024)
    [deliver] = client.take(P.DELIVER)
    assert decoder.feed(P.encode(deliver)) == [deliver]
    fetched = client.fetch(offset=0)
    assert decoder.feed(P.encode(fetched)) == [fetched]


def test_every_frame_carrying_large_messages_fits_max_frame_bytes() -> None:
    """G8: first pushes, redeliveries due together and FETCH replies are split or bounded
    so a client with the same max_frame_bytes can decode them."""
    shard = Shard({"max_frame_bytes": 1024, "message.cleanup_time": 1000.0,
                   "subscriber.cleanup_time": 1000.0})
    client = shard.connect()
    client.subscribe(1, name="s", credit=100)
    client.publish(*[f"m{i}" for i in range(5)], payload=b"x" * 700)
    shard.advance(10.0)  # all five are re-pushed at once
    decoder = P.FrameDecoder(1024)
    frames = client.take(P.DELIVER)
    assert sorted((o, f[3]) for f in frames for o, *_ in deliver_messages(f)) == \
        sorted([(o, a) for o in range(5) for a in (1, 2)])
    for frame in [*frames, client.fetch(offset=0, max_bytes=1 << 20)]:
        assert decoder.feed(P.encode(frame)) == [frame]


def test_a_split_push_keeps_each_message_its_offset_and_store_time() -> None:
    """A push too large for one frame is cut into frames of consecutive offsets, each with
    the store-time runs of its own messages."""
    shard = Shard({"max_frame_bytes": 1024, "message.cleanup_time": 1000.0,
                   "subscriber.cleanup_time": 1000.0})
    client = shard.connect()
    for t, ids in ((1.0, ["a", "b"]), (2.0, ["c"]), (3.0, ["d", "e"])):
        shard.advance(t)
        client.publish(*ids, payload=b"x" * 300)
    client.subscribe(1, name="s", read_old=True, credit=100)
    frames = client.take(P.DELIVER)
    assert len(frames) > 1 and all(type(f[4]) is int for f in frames)
    assert [(o, mid, ts) for f in frames for o, mid, _, ts in deliver_messages(f)] == \
        [(0, "a", 1.0), (1, "b", 1.0), (2, "c", 2.0), (3, "d", 3.0), (4, "e", 3.0)]


# -- the fast path and the per-item path agree ----------------------------------------------

# mostly the usual items (short new or repeated ids, binary payloads), some odd ones
_ODD_IDS: list[Any] = ["é" * 32, "x" * 33, "y" * 128, "z" * 129, "é" * 65, "w" * 300, "", 0,
                        None]
# with max_frame_bytes 1024, 766 bytes is the largest payload a 2-character id may carry
_ODD_PAYLOADS: list[Any] = [b"r" * 700, b"s" * 766, "text", None]
_ids = st.tuples(st.integers(0, 9), st.integers(0, 15)).map(
    lambda t: f"m{t[1]}" if t[0] < 8 else _ODD_IDS[t[1] % len(_ODD_IDS)])
_payloads = st.tuples(st.integers(0, 9), st.integers(0, 40)).map(
    lambda t: b"p" * t[1] if t[0] < 8 else _ODD_PAYLOADS[t[1] % len(_ODD_PAYLOADS)])
# keys (the fast path takes a group whose keys are all short ASCII): mostly those
_ODD_KEYS: list[Any] = [None, "", "é", "k" * 255, "k" * 256, "é" * 200, 7]
_keys = st.tuples(st.integers(0, 9), st.integers(0, 20)).map(
    lambda t: f"k{t[1]}" if t[0] < 8 else _ODD_KEYS[t[1] % len(_ODD_KEYS)])


def _group(topic: str, items: list[tuple[Any, Any, Any]], keyed: bool) -> list[Any]:
    group = [topic, [i for i, _, _ in items], [p for _, p, _ in items]]
    if keyed:
        group.append({"keys": [k for _, _, k in items]})
    return group


_groups = st.lists(
    st.builds(_group, st.sampled_from([TOPIC, TOPIC, "t.two", "bad topic"]),
              st.lists(st.tuples(_ids, _payloads, _keys), max_size=10), st.booleans()),
    max_size=4)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames=st.lists(st.tuples(_groups, st.sampled_from([0.0, 1.0, 30.0])), min_size=1,
                       max_size=6),
       overrides=st.fixed_dictionaries({
           "topic.buffer": st.sampled_from([3, 8, 1024]),
           "topic.max_bytes": st.sampled_from([200, 1000, 1 << 20]),
           "message.dedup_window": st.sampled_from([0.0, 50.0]),
           "max_frame_bytes": st.sampled_from([1024, 1 << 20])}))
def test_fast_and_per_item_publish_paths_give_the_same_results(
        frames: list[tuple[list[list[Any]], float]], overrides: dict[str, Any]) -> None:
    """G1-G3/G8: every PUBLISHED reply, and what is stored, is the same whether a group
    takes the bulk fast path or is checked item by item."""
    shards = [Shard(overrides), Shard(overrides)]
    clients = [s.connect() for s in shards]
    replies: list[list[Any]] = [[], []]
    with mock.patch.object(ShardCore, "_publish_fast", lambda *args: None):
        for groups, dt in frames:
            shards[0].after(dt)
            replies[0].append(clients[0].publish_frame(copy.deepcopy(groups)))
    for groups, dt in frames:
        shards[1].after(dt)
        replies[1].append(clients[1].publish_frame(copy.deepcopy(groups)))
    assert replies[0] == replies[1]
    for reply, (groups, _) in zip(replies[1], frames, strict=True):
        item_rows(groups, reply)  # well-formed: one result per group and item
    stats = [s.stats() for s in shards]
    for st_ in stats:
        st_.pop("uptime")
    assert stats[0] == stats[1]
    for topic in (TOPIC, "t.two"):
        assert clients[0].fetch(topic=topic) == clients[1].fetch(topic=topic)


def test_a_group_with_short_ascii_keys_is_stored_without_the_per_item_path() -> None:
    shard = Shard()
    client = shard.connect()
    client.subscribe(1, credit=10)
    with mock.patch.object(ShardCore, "_publish_slow", side_effect=AssertionError):
        reply = client.publish_frame([[TOPIC, ["a", "b"], [b"1", b"2"],
                                       {"keys": ["k1", "k22"]}]])
    assert reply[3] == [[0, [], []]]
    assert shard.topic_stats()["held_bytes"] == 2 + 2 + 2 + 5  # ids twice (log, dedup), keys
    [frame] = client.take(P.DELIVER)
    assert read_columns(frame[8], 2)[0] == ["k1", "k22"]


def test_a_plain_group_is_stored_without_the_per_item_path() -> None:
    """The usual group (new short ids, binary payloads, room) takes the bulk path."""
    shard = Shard()
    client = shard.connect()
    with mock.patch.object(ShardCore, "_publish_slow", side_effect=AssertionError):
        reply = client.publish_frame([[TOPIC, ["a", "b"], [b"1", b"2"]],
                                      [TOPIC, ["c"], [b"3"]]])
    assert reply[3] == [[0, [], []], [2, [], []]]
    assert shard.topic_stats()["held_bytes"] == 3 + 2 * 3
    assert shard.topic_stats()["dedup_ids"] == 3


def test_a_publish_after_a_burst_came_due_forgets_only_a_slice_and_stays_exact() -> None:
    """G3/G5 without stalls: when a burst's ids are past their window and no cleanup
    pass has forgotten them yet, a publish forgets a slice of them, not the burst
    (a 400k-id burst took tens of ms at once), yet counts none of them as held or
    known: an id of the burst is stored anew and then remembered as the new one."""
    from flux.shard.dedup import EXPIRE_SLICE

    shard = Shard({"topic.buffer": 4 * EXPIRE_SLICE})
    client = shard.connect()
    burst = [f"b{i}" for i in range(3 * EXPIRE_SLICE)]
    client.publish(*burst)
    shard.now = 60.0  # the burst's window (50 s) has passed; no cleanup pass ran since
    assert client.publish("late") == [[OK, len(burst), False]]
    stats = shard.topic_stats()
    # a slice forgotten before the checks, not the burst
    assert stats["dedup_ids"] == 2 * EXPIRE_SLICE + 1
    logged = sum(2 * len(i) for i in [*burst, "late"])  # id and payload (the id) in the log
    assert stats["held_bytes"] == logged + len("late")
    assert client.publish(burst[-1]) == [[OK, len(burst) + 1, False]]
    shard.now = 61.0
    for _ in range(8):  # the pass forgets the rest of the burst, a slice a tick
        shard.core.tick(shard.now)
    shard.collect()
    assert shard.topic_stats()["dedup_ids"] == 2
    assert client.publish(burst[-1]) == [[OK, len(burst) + 1, True]]
