"""The sans-IO client core, driven frame by frame: routing, publishing, retries.

No sockets, no clock, no trio: frames go in with ``receive``, come out of
``take_output``; time passes only through ``tick(now)``.
"""

from __future__ import annotations

import pytest
from test_client_core_support import GEN, open_shard, out, ready_core, reopen_shard

from flux import errors
from flux import protocol as P

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
    assert frame[0] == P.PUBLISH and [i[1] for i in frame[2]] == ["id0", "id1", "id2"]
    core.receive(conn.id, [P.PUBLISHED, frame[1], GEN,
                           [[0, 10, False], [0, 11, False], [0, 3, True]]], 0.0)
    acks = [item.result() for item in items]
    assert [(a.offset, a.duplicate, a.generation) for a in acks] == [
        (10, False, GEN), (11, False, GEN), (3, True, GEN)]


def test_publish_frames_hold_at_most_256_items() -> None:
    core = ready_core()
    for _i in range(600):
        core.publish("t", b"x", None, 0.0)
    conn = open_shard(core)
    assert [len(f[2]) for f in out(core, conn)] == [256, 256, 88]


def test_generated_id_is_drawn_once_and_reused_on_retry() -> None:
    core = ready_core()
    item = core.publish("t", b"x", None, 0.0)
    conn = open_shard(core)
    [first] = out(core, conn)
    core.connection_lost(conn.id, 1.0)
    conn2, now = reopen_shard(core, 1.0)
    [second] = out(core, conn2, now)
    assert first[2][0][1] == second[2][0][1] == item.id and len(item.id) == 32


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
    assert [i[1] for i in frame[2]] == ["a", "b", "c"]


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
    assert frame[2][0][1] == "a"


def test_busy_is_retried_after_a_backoff_with_the_same_id() -> None:
    core = ready_core()
    item = core.publish("t", b"a", "a", 0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    core.receive(conn.id, [P.PUBLISHED, frame[1], GEN, [[errors.Busy.code, "busy", None]]], 0.0)
    assert out(core, conn) == [] and not item.done
    due = core.next_deadline()
    assert 0 < due <= 0.1
    core.tick(due)
    [again] = out(core, conn, due)
    assert again[2][0][1] == "a"


def test_item_errors_fail_only_their_item_and_topic_full_is_not_retried() -> None:
    core = ready_core()
    ok = core.publish("t", b"a", None, 0.0)
    full = core.publish("t", b"b", None, 0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    core.receive(conn.id, [P.PUBLISHED, frame[1], GEN,
                           [[0, 0, False], [errors.TopicFull.code, "full", None]]], 0.0)
    assert ok.result().offset == 0
    with pytest.raises(errors.TopicFull):
        full.result()


def test_wrong_shard_asks_the_router_for_a_new_map() -> None:
    core = ready_core()
    core.publish("t", b"a", None, 0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    core.receive(conn.id, [P.PUBLISHED, frame[1], GEN,
                           [[errors.WrongShard.code, "not mine", None]]], 0.0)
    assert [c.role for c in core.take_connects()] == ["router"]


def test_abandoned_publish_is_skipped_if_not_sent_yet() -> None:
    core = ready_core()
    gone = core.publish("t", b"a", "gone", 0.0)
    core.publish("t", b"b", "kept", 0.0)
    core.abandon(gone)
    conn = open_shard(core)
    [frame] = out(core, conn)
    assert [i[1] for i in frame[2]] == ["kept"]
    with pytest.raises(errors.ClientClosed):
        gone.result()


def test_invalid_topic_raises_before_anything_is_queued() -> None:
    core = ready_core()
    with pytest.raises(errors.InvalidTopic):
        core.publish("no spaces", b"x", None, 0.0)
    assert core.take_connects() == []
