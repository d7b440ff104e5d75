"""Client-core behaviours that surviving mutants of a third sample showed unchecked
(``make mutate``): the reply to a SUBSCRIBED that comes after an unsubscribe, what
a lost connection and a new shard map do to queued work, the text of malformed
PUBLISHED and retry-deadline errors, publish frames kept 1 KiB under a large frame
limit, a re-push that repeats an offset, and what the core and an ack session say
in their repr.

Sans-IO: frames in, frames and errors out.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from test_client_core_support import (
    GEN,
    SHARD_HELLO,
    answer_router,
    full_publish_window,
    ids_of,
    open_shard,
    out,
    published,
    ready_core,
    warm_subscription,
)

from flux import errors
from flux import protocol as P
from flux.client.connection import BACKOFF_BASE, Conn
from flux.client.core import ClientCore
from flux.client.requests import (
    GROUP_OVERHEAD,
    ITEM_OVERHEAD,
    deadline_exceeded,
)
from flux.client.subscription import AckSession
from flux.hashing import shard_for

# -- SUBSCRIBED after an unsubscribe ----------------------------------------------------------


def test_a_subscribed_reply_after_the_unsubscribe_detaches_the_session_it_made() -> None:
    core = ready_core()
    sub = core.subscribe("t", "s", now=0.0)
    conn = open_shard(core)
    [frame] = [f for f in out(core, conn) if f[0] == P.SUBSCRIBE]
    core.unsubscribe(sub, 0.0)
    core.receive(conn.id, [P.SUBSCRIBED, frame[1], frame[2], {
        "created": True, "start_offset": 0, "cursor": 0, "generation": 7,
        "clamped": False, "reset": False, "next_offset": 0, "max_in_flight": 1000}], 0.0)
    unsubscribes = [f for f in out(core, conn) if f[0] == P.UNSUBSCRIBE]
    assert [f[2] for f in unsubscribes] == [frame[2]]


# -- closed shard connections ---------------------------------------------------------------


def test_losing_a_ready_shard_connection_retries_it_after_the_shortest_backoff() -> None:
    core, conn, _, _ = warm_subscription()
    core.connection_lost(conn.id, 1.0)
    [slot] = core.slots
    assert slot.failures == 0
    assert 1.0 < slot.retry_at <= 1.0 + BACKOFF_BASE


def test_a_subscription_of_a_shard_that_left_the_map_moves_to_the_shard_now_owning_it() -> None:
    core = ClientCore(("r", 1), rng=random.Random(1), now=0.0)
    [router] = core.take_connects()
    core.connected(router.id, 0.0)
    [hello] = core.take_output(router.id, 0.0) or []
    core.receive(router.id, [P.HELLO_OK, hello[1], {"version": P.VERSION, "shard_count": 2,
                                                     "shards": [[0, "s:1", GEN], [1, "s:2", GEN]]}],
                 0.0)
    topic = next(t for t in (f"t{i}" for i in range(100)) if shard_for(t, 2) == 1)
    sub = core.subscribe(topic, "s", now=0.0)
    [conn] = core.take_connects()
    assert conn.address == ("s", 2)
    core.connected(conn.id, 0.0)
    [hello] = core.take_output(conn.id, 0.0) or []
    core.receive(conn.id, [P.HELLO_OK, hello[1], {**SHARD_HELLO, "index": 1, "shard_count": 2}],
                 0.0)
    [frame] = [f for f in out(core, conn) if f[0] == P.SUBSCRIBE]
    core.receive(conn.id, [P.SUBSCRIBED, frame[1], frame[2], {
        "created": True, "start_offset": 0, "cursor": 0, "generation": GEN,
        "clamped": False, "reset": False, "next_offset": 0, "max_in_flight": 1000}], 0.0)
    assert sub.status == "active"
    core._refresh_map(1.0)  # the shards were merged: the router now names one
    [router] = core.take_connects()
    core.connected(router.id, 1.0)
    [hello] = core.take_output(router.id, 1.0) or []
    core.receive(router.id, [P.HELLO_OK, hello[1], {"version": P.VERSION, "shard_count": 1,
                                                     "shards": [[0, "s:1", GEN]]}], 1.0)
    assert conn.id in core.take_closes()
    assert sub.status == "waiting"
    assert sub in core.slots[0].subs.values()
    [new] = [c for c in core.take_connects() if c.role == "shard"]
    assert new.address == ("s", 1)


def test_a_map_refresh_naming_the_same_shards_leaves_queued_publishes_waiting() -> None:
    core, conn, frames = full_publish_window()
    core._refresh_map(1.0)
    [router] = core.take_connects()
    answer_router(core, router, 1.0)
    # the window is still full: nothing to write until a reply frees it
    assert conn.id not in core.take_writable()
    published(core, conn, frames[0], 0, now=1.0)
    assert conn.id in core.take_writable()
    [last] = out(core, conn, 1.0)
    assert len(ids_of(last)) == 1


# -- a malformed PUBLISHED ----------------------------------------------------------------


def test_a_first_offset_with_duplicates_fails_the_publish_as_malformed() -> None:
    core = ready_core()
    item = core.publish("t", b"a", "a", 0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    core.receive(conn.id, [P.PUBLISHED, frame[1], GEN, [[0, [0], []]]], 0.0)
    with pytest.raises(errors.ProtocolError, match="malformed PUBLISHED: a first offset stands"
                                                   " for items all stored new"):
        item.result()


# -- retry-deadline errors -------------------------------------------------------------------


def test_a_subscribe_refused_past_its_deadline_fails_naming_the_subscribe() -> None:
    core = ready_core()
    sub = core.subscribe("t", "s", now=0.0)
    conn = open_shard(core)
    [frame] = [f for f in out(core, conn) if f[0] == P.SUBSCRIBE]
    late = core.retry_deadline + 1.0
    core.receive(conn.id, [P.ERROR, frame[1], errors.Busy.code, "busy"], late)
    assert sub.ready.done
    exc = sub.ready.error
    assert isinstance(exc, errors.RetryDeadlineExceeded)
    assert str(exc).startswith("subscribe kept failing until retry_deadline: last error Busy")


def test_a_deadline_with_no_error_before_it_names_no_last_error() -> None:
    exc = deadline_exceeded("publish of id 'a' to 't'", None)
    assert str(exc) == "publish of id 'a' to 't' kept failing until retry_deadline"
    assert exc.__cause__ is None


# -- publish frames under a large frame limit -------------------------------------------------


def _shard_with_frames_of(core: ClientCore, max_frame_bytes: int) -> Conn:
    [conn] = core.take_connects()
    core.connected(conn.id, 0.0)
    [hello] = core.take_output(conn.id, 0.0) or []
    core.receive(conn.id, [P.HELLO_OK, hello[1],
                           {**SHARD_HELLO, "max_frame_bytes": max_frame_bytes}], 0.0)
    return conn


def _estimate(frame: list[Any]) -> int:
    return 64 + sum(len(g[0]) + GROUP_OVERHEAD + sum(
        len(p) + len(i) + ITEM_OVERHEAD for i, p in zip(g[1], g[2], strict=True))
        for g in frame[2])


def test_publish_frames_keep_a_kibibyte_under_a_large_shard_frame_limit() -> None:
    core = ready_core()
    for _ in range(40):
        core.publish("t", b"p" * 400, None, 0.0)
    conn = _shard_with_frames_of(core, 16384)
    frames = [f for f in out(core, conn) if f[0] == P.PUBLISH]
    assert len(frames) > 1
    assert max(_estimate(f) for f in frames) <= 16384 - 1024
    assert sum(len(g[1]) for f in frames for g in f[2]) == 40


# -- a re-push that repeats an offset --------------------------------------------------------


def test_a_re_push_listing_an_offset_twice_buffers_it_once() -> None:
    core, conn, sub, sid = warm_subscription()
    core.receive(conn.id, [P.DELIVER, sid, 7, 2, [3, 3], ["id3", "id3"], [b"p3", b"p3"],
                           [1.5, 2]], 0.0)
    offsets = []
    while (msg := core.next_message(sub)) is not None:
        offsets.append(msg.offset)
    assert offsets == [3]


# -- reprs ----------------------------------------------------------------------------------


def test_the_core_s_repr_counts_the_shards_of_its_map() -> None:
    core = ready_core()
    assert " shards=1 " in repr(core)


def test_an_ack_session_s_repr_counts_only_deliveries_not_acked_once_low_moved() -> None:
    session = AckSession(1, 7, 0)
    session.deliver_first(range(10))
    for offset in range(6):
        session.ack(offset)
    assert session.low() == 6
    assert " unacked=4 " in repr(session)
    assert not session.delivered(0) and session.delivered(6)


def test_low_past_many_acked_deliveries_drops_them_and_goes_on_counting() -> None:
    session = AckSession(1, 7, 0)
    session.deliver_first(range(3000))
    for offset in range(2000):
        session.ack(offset)
    assert session.low() == 2000
    assert " unacked=1000 " in repr(session)
    session.ack(2000)
    assert session.low() == 2001
    session.deliver_first(range(3000, 3001))
    assert session.delivered(3000) and not session.delivered(1999)
