"""The sans-IO client core, driven frame by frame: routing, publishing, retries.

No sockets, no clock, no trio: frames go in with ``receive``, come out of
``take_output``; time passes only through ``tick(now)``.
"""

from __future__ import annotations

import pickle

import pytest
from test_client_core_support import GEN, ids_of, open_shard, out, published, ready_core, reopen_shard

from flux import errors
from flux import protocol as P
from flux.client.types import FetchedMessage, PublishAck

# -- publishing ----------------------------------------------------------------------------


def test_shard_connection_is_opened_lazily_and_directly() -> None:
    core = ready_core()
    assert core.take_connects() == []
    core.publish("t", b"x", None, 0.0)
    conn = open_shard(core)
    assert conn.index == 0


def test_publishes_queued_while_busy_go_out_in_one_frame() -> None:
    core = ready_core()
    items = [core.publish("t", b"%d" % i, f"id{i}", 0.0) for i in range(3)]
    conn = open_shard(core)
    [frame] = out(core, conn)
    assert frame[0] == P.PUBLISH and frame[2] == [["t", ["id0", "id1", "id2"], [b"0", b"1", b"2"]]]
    published(core, conn, frame, [10, 11, 3], duplicates=[2])
    acks = [item.result()[0] for item in items]
    assert [(a.offset, a.duplicate, a.generation) for a in acks] == [
        (10, False, GEN), (11, False, GEN), (3, True, GEN)]


def test_publish_frames_hold_at_most_256_items() -> None:
    core = ready_core()
    for _i in range(600):
        core.publish("t", b"x", None, 0.0)
    conn = open_shard(core)
    assert [len(ids_of(f)) for f in out(core, conn)] == [256, 256, 88]


def test_generated_id_is_drawn_once_and_reused_on_retry() -> None:
    core = ready_core()
    item = core.publish("t", b"x", None, 0.0)
    conn = open_shard(core)
    [first] = out(core, conn)
    core.connection_lost(conn.id, 1.0)
    conn2, now = reopen_shard(core, 1.0)
    [second] = out(core, conn2, now)
    assert ids_of(first) == ids_of(second) == item.ids and len(item.ids[0]) == 32


def test_lost_connection_resends_in_flight_items_first_in_order() -> None:
    core = ready_core()
    core.publish("t", b"a", "a", 0.0)
    core.publish("t", b"b", "b", 0.0)
    conn = open_shard(core)
    out(core, conn)
    core.connection_lost(conn.id, 1.0)
    core.publish("t", b"c", "c", 1.0)
    conn2, now = reopen_shard(core, 1.0)
    [frame] = out(core, conn2, now)
    assert frame[2] == [["t", ["a", "b", "c"], [b"a", b"b", b"c"]]]


def test_request_timeout_closes_the_connection_and_retries_the_publish() -> None:
    core = ready_core(request_timeout=3.0)
    item = core.publish("t", b"a", "a", 0.0)
    conn = open_shard(core)
    out(core, conn)
    assert core.next_deadline() == 2.5  # heartbeat first
    core.tick(2.5)
    assert [f[0] for f in out(core, conn, 2.5)] == [P.PING]
    core.tick(3.0)
    assert core.take_closes() == [conn.id]
    assert not item.done
    conn2, now = reopen_shard(core, 3.0)
    [frame] = out(core, conn2, now)
    assert ids_of(frame) == ["a"]


def test_busy_is_retried_after_a_backoff_with_the_same_id() -> None:
    core = ready_core()
    item = core.publish("t", b"a", "a", 0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    published(core, conn, frame, [P.REFUSED], refused=[[0, errors.Busy.code, "busy"]])
    assert out(core, conn) == [] and not item.done
    due = core.next_deadline()
    assert 0 < due <= 0.1
    core.tick(due)
    [again] = out(core, conn, due)
    assert ids_of(again) == ["a"]


def test_item_errors_fail_only_their_item_and_topic_full_is_not_retried() -> None:
    core = ready_core()
    ok = core.publish("t", b"a", None, 0.0)
    full = core.publish("t", b"b", None, 0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    published(core, conn, frame, [0, P.REFUSED], refused=[[1, errors.TopicFull.code, "full"]])
    assert ok.result()[0].offset == 0
    with pytest.raises(errors.TopicFull):
        full.result()


def test_wrong_shard_asks_the_router_for_a_new_map() -> None:
    core = ready_core()
    core.publish("t", b"a", None, 0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    published(core, conn, frame, [P.REFUSED], refused=[[0, errors.WrongShard.code, "not mine"]])
    assert [c.role for c in core.take_connects()] == ["router"]


def test_abandoned_publish_is_skipped_if_not_sent_yet() -> None:
    core = ready_core()
    gone = core.publish("t", b"a", "gone", 0.0)
    core.publish("t", b"b", "kept", 0.0)
    core.abandon(gone)
    conn = open_shard(core)
    [frame] = out(core, conn)
    assert ids_of(frame) == ["kept"]
    with pytest.raises(errors.ClientClosed):
        gone.result()


def test_invalid_topic_raises_before_anything_is_queued() -> None:
    core = ready_core()
    with pytest.raises(errors.InvalidTopic):
        core.publish("no spaces", b"x", None, 0.0)
    assert core.take_connects() == []


# -- v2 columns: groups, split batches, per-item results ---------------------------------------


def test_consecutive_publishes_of_one_topic_share_a_group() -> None:
    core = ready_core()
    core.publish("t", b"a", "a", 0.0)
    core.publish_many("t", [b"b", b"c"], ["b", "c"], 0.0)
    core.publish("u", b"d", "d", 0.0)
    core.publish("t", b"e", "e", 0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    assert frame[2] == [["t", ["a", "b", "c"], [b"a", b"b", b"c"]], ["u", ["d"], [b"d"]],
                        ["t", ["e"], [b"e"]]]


def test_results_of_several_groups_reach_their_batches() -> None:
    core = ready_core()
    first = core.publish_many("t", [b"a", b"b"], ["a", "b"], 0.0)
    other = core.publish("u", b"c", "c", 0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    core.receive(conn.id, [P.PUBLISHED, frame[1], GEN, [[[4, 5], [1], []], [[0], [], []]]], 0.0)
    assert [(a.offset, a.duplicate) for a in first.result()] == [(4, False), (5, True)]
    assert other.result()[0].offset == 0


def test_a_batch_larger_than_a_frame_is_split_and_acked_whole() -> None:
    core = ready_core()
    batch = core.publish_many("t", [b"x"] * 600, None, 0.0)
    conn = open_shard(core)
    frames = out(core, conn)
    assert [len(ids_of(f)) for f in frames] == [256, 256, 88]
    assert [i for f in frames for i in ids_of(f)] == batch.ids
    for n, frame in enumerate(frames):
        assert not batch.done
        published(core, conn, frame, list(range(256 * n, 256 * n + len(ids_of(frame)))))
    assert [a.offset for a in batch.result()] == list(range(600))


def test_a_batch_s_acks_read_as_a_list_of_publish_acks() -> None:
    """publish_many's result is a read-only sequence whose acks are made as read: it
    indexes, slices, iterates and compares like the list of PublishAcks it stands for."""
    core = ready_core()
    batch = core.publish_many("t", [b"a", b"b", b"c"], ["a", "b", "c"], 0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    published(core, conn, frame, [4, 9, 5], duplicates=[1])
    acks = batch.result()
    expected = [PublishAck("t", "a", 4, GEN, False), PublishAck("t", "b", 9, GEN, True),
                PublishAck("t", "c", 5, GEN, False)]
    assert len(acks) == 3 and list(acks) == expected and acks == expected
    assert acks[0] == expected[0] and acks[-1] == expected[-1] and acks[1:] == expected[1:]
    assert acks != expected[:2] and acks != "abc" and acks == batch.result()
    assert [a.offset for a in reversed(acks)] == [5, 9, 4] and expected[1] in acks
    assert acks.index(expected[2]) == 2 and repr(acks) == f"PublishAcks({expected!r})"
    with pytest.raises(IndexError):
        acks[3]
    with pytest.raises(TypeError):
        hash(acks)


def test_only_refused_items_of_a_batch_are_retried_with_their_ids() -> None:
    core = ready_core()
    batch = core.publish_many("t", [b"a", b"b", b"c", b"d"], ["a", "b", "c", "d"], 0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    published(core, conn, frame, [0, P.REFUSED, P.REFUSED, 1],
              refused=[[1, errors.Busy.code, "busy"], [2, errors.Busy.code, "busy"]])
    assert not batch.done and out(core, conn) == []
    due = core.next_deadline()
    core.tick(due)
    [again] = out(core, conn, due)
    assert again[2] == [["t", ["b", "c"], [b"b", b"c"]]]
    published(core, conn, again, [2, 3], now=due)
    assert [a.offset for a in batch.result()] == [0, 2, 3, 1]


def test_a_refused_item_fails_the_batch_with_the_first_error_after_all_finish() -> None:
    core = ready_core()
    batch = core.publish_many("t", [b"a", b"b"], ["a", "b"], 0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    published(core, conn, frame, [P.REFUSED, 0], refused=[[0, errors.TopicFull.code, "full"]])
    assert batch.done
    assert batch.offsets == [P.REFUSED, 0]
    with pytest.raises(errors.TopicFull):
        batch.result()


def test_a_first_offset_answers_every_item_of_its_group() -> None:
    """PUBLISHED's short form: one integer stands for consecutive offsets of all items."""
    core = ready_core()
    batch = core.publish_many("t", [b"a", b"b", b"c"], ["a", "b", "c"], 0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    published(core, conn, frame, 7)
    assert batch.done
    assert batch.offsets == [7, 8, 9] and batch.duplicates == [False] * 3
    assert [ack.offset for ack in batch.result()] == [7, 8, 9]


@pytest.mark.parametrize("results", [
    [[[0, 1], [], []], [[0], [], []]],      # a result too many
    [[[0], [], []]],                         # an offset too few
    [[["x", 1], [], []]],                    # not integers
    [[[0, 1], [5], []]],                     # duplicate index out of range
    [[[0, -1], [], [[1, 41]]]],              # refused entry too short
    [[[0, 1], []]],                          # not [offsets, duplicates, refused]
    [[-1, [], []]],                          # a negative first offset
    [[0, [1], []]],                          # a first offset, yet a duplicate
    [[0, [], [[1, 41, "busy"]]]],            # a first offset, yet a refusal
    [[0.0, [], []]],                         # a float first offset
])
def test_a_malformed_published_fails_the_batch_with_protocol_error(results: list[object]) -> None:
    core = ready_core()
    batch = core.publish_many("t", [b"a", b"b"], ["a", "b"], 0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    core.receive(conn.id, [P.PUBLISHED, frame[1], GEN, results], 0.0)
    with pytest.raises(errors.ProtocolError):
        batch.result()


def test_generated_ids_of_a_batch_are_distinct_hex() -> None:
    core = ready_core()
    batch = core.publish_many("t", [b"x"] * 50, None, 0.0)
    assert len(set(batch.ids)) == 50
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in batch.ids)


def test_a_fetched_reply_becomes_fetched_messages() -> None:
    core = ready_core()
    call = core.fetch("t", 3, now=0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    assert frame[0] == P.FETCH
    core.receive(conn.id, [P.FETCHED, frame[1], {"generation": GEN, "oldest": 1, "next": 9},
                           3, ["c", "d", "e"], [b"x", b"y", b"z"], [1.5, 2, 2.5, 1]], 0.0)
    result = call.result()
    assert (result.oldest, result.next, result.generation) == (1, 9, GEN)
    assert result.messages == [FetchedMessage("t", 3, GEN, "c", b"x", 1.5),
                               FetchedMessage("t", 4, GEN, "d", b"y", 1.5),
                               FetchedMessage("t", 5, GEN, "e", b"z", 2.5)]
    m = result.messages[2]
    assert (m.topic, m.offset, m.generation, m.id, m.payload, m.timestamp) == \
        ("t", 5, GEN, "e", b"z", 2.5)
    assert pickle.loads(pickle.dumps(m)) == m and type(pickle.loads(pickle.dumps(m))) is FetchedMessage


@pytest.mark.parametrize("tail", [
    [-1, [], [], []],                          # a negative first offset
    [0, ["a"], [b"a", b"b"], [1.0, 2]],        # a payload too many
    [0, ["a"], [b"a"], [1.0, 2]],              # runs cover too many
    [0, ["a"], [b"a"]],                        # the times missing
    [0.5, ["a"], [b"a"], [1.0, 1]],            # a float first offset
])
def test_a_malformed_fetched_fails_the_fetch_with_protocol_error(tail: list[object]) -> None:
    core = ready_core()
    call = core.fetch("t", 0, now=0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    core.receive(conn.id, [P.FETCHED, frame[1], {"generation": GEN, "oldest": 0, "next": 1},
                           *tail], 0.0)
    with pytest.raises(errors.ProtocolError):
        call.result()
