"""Client-core behaviours that surviving mutants of a second sample showed unchecked
(``make mutate``): acks of a message from an earlier session, acks after the
subscription ended, publish frames kept under the shard's max_frame_bytes, the
router's growing backoff, and what the core's objects say in their repr.

Sans-IO: frames in, frames and errors out.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_client_core_support import (
    GEN,
    SHARD_HELLO,
    deliver,
    out,
    ready_core,
    reopen_shard,
    warm_subscription,
)

from flux import errors
from flux import protocol as P
from flux.client.connection import Conn
from flux.client.core import ClientCore
from flux.client.requests import GROUP_OVERHEAD, ITEM_OVERHEAD
from flux.client.subscription import SubState
from flux.client.types import Message, Waiter


def _resubscribed(core: ClientCore, conn: Conn, *offsets: int) -> tuple[Conn, float]:
    """Lose ``conn``, reconnect, confirm "s" again (same generation) and redeliver
    ``offsets`` to the new session; returns the new connection and the time."""
    core.connection_lost(conn.id, 1.0)
    conn2, now = reopen_shard(core, 1.0)
    [frame] = [f for f in out(core, conn2, now) if f[0] == P.SUBSCRIBE and f[3]["name"] == "s"]
    core.receive(conn2.id, [P.SUBSCRIBED, frame[1], frame[2], {
        "created": False, "start_offset": 0, "cursor": 0, "generation": GEN, "clamped": False,
        "reset": False, "next_offset": 0, "max_in_flight": 1000}], now)
    if offsets:
        deliver(core, conn2, frame[2], *((o, 2) for o in offsets))
    return conn2, now


def _first_message(core: ClientCore, conn: Conn, sub: SubState, sid: int) -> Message:
    deliver(core, conn, sid, (0, 1))
    msg = core.next_message(sub)
    assert msg is not None and msg.offset == 0
    return msg


def _acks(core: ClientCore, conn: Conn, now: float) -> list[list[Any]]:
    core.tick(now)
    return [f for f in out(core, conn, now) if f[0] == P.ACK]


# -- acks of a message from an earlier session ---------------------------------------------


def test_an_old_message_redelivered_to_the_new_session_is_acked_there_at_once() -> None:
    core, conn, sub, sid = warm_subscription()
    old = _first_message(core, conn, sub, sid)
    _resubscribed(core, conn, 0)
    assert sub.ack(old, 2.0) is True
    assert sub.session is not None and list(sub.session.queued) == [0]
    assert sub.ack_on_arrival == set()


def test_an_old_message_not_yet_redelivered_waits_for_its_arrival_to_be_acked() -> None:
    core, conn, sub, sid = warm_subscription()
    old = _first_message(core, conn, sub, sid)
    conn2, now = _resubscribed(core, conn)
    acker = core.acker(sub, lambda: now, lambda: None)
    acker(old)
    assert sub.session is not None and list(sub.session.queued) == []
    assert sub.ack_on_arrival == {0}
    assert _acks(core, conn2, now + 10.0) == []


def test_the_acker_stamps_an_old_message_s_ack_with_the_clock() -> None:
    core, conn, sub, sid = warm_subscription()
    old = _first_message(core, conn, sub, sid)
    _resubscribed(core, conn, 0)
    acker = core.acker(sub, lambda: 42.0, lambda: None)
    assert sub.ack_first_at is None
    acker(old)
    assert sub.ack_first_at == 42.0


def test_a_second_ack_of_one_message_is_not_queued_again() -> None:
    core, conn, sub, sid = warm_subscription()
    old = _first_message(core, conn, sub, sid)
    _resubscribed(core, conn, 0)
    assert sub.ack(old, 2.0) is True
    assert sub.ack(old, 2.0) is False
    assert sub.session is not None and list(sub.session.queued) == [0]


def test_a_redelivery_acked_through_the_earlier_message_is_skipped_by_the_iterator() -> None:
    core, conn, sub, sid = warm_subscription()
    first = _first_message(core, conn, sub, sid)
    deliver(core, conn, sid, (0, 2))  # pushed again before the ack
    assert sub.ack(first, 0.0) is True
    assert core.next_message(sub) is None


async def test_a_message_of_a_core_without_an_acker_acks_as_nothing() -> None:
    core, conn, sub, sid = warm_subscription()
    msg = _first_message(core, conn, sub, sid)
    await msg.ack()
    assert sub.session is not None and list(sub.session.queued) == []


# -- acks after the subscription is over ------------------------------------------------------


def test_an_ack_after_the_subscription_ended_is_dropped() -> None:
    core, conn, sub, sid = warm_subscription()
    msg = _first_message(core, conn, sub, sid)
    sub.end(errors.SubscriptionInactive("ended by the shard"))
    assert sub.status == "ended"
    assert sub.ack(msg, 1.0) is False
    assert sub.ack_on_arrival == set()
    assert sub.session is None or list(sub.session.queued) == []


def test_an_ack_after_unsubscribe_is_dropped() -> None:
    core, conn, sub, sid = warm_subscription()
    msg = _first_message(core, conn, sub, sid)
    core.unsubscribe(sub, 1.0)
    assert sub.status == "closed"
    assert sub.ack(msg, 1.0) is False
    assert sub.ack_on_arrival == set()
    assert sub.session is None or list(sub.session.queued) == []


# -- subscribe and close ------------------------------------------------------------------


def test_a_subscribe_never_answered_fails_at_its_deadline() -> None:
    core = ready_core()
    sub = core.subscribe("t", "s", now=0.0)
    assert sub.status == "waiting"
    now = 0.0
    for _ in range(200):
        if sub.ready.done:
            break
        now = max(now, core.next_deadline())
        core.tick(now)
        core.take_connects()  # never answered: the shard stays unreachable
    assert sub.ready.done and isinstance(sub.ready._error, errors.RetryDeadlineExceeded)
    assert sub.status == "closed"


def test_close_fails_a_subscribe_still_in_flight_though_unsubscribed() -> None:
    core = ready_core()
    core.subscribe("t", "warm", now=0.0)
    [conn] = core.take_connects()
    core.connected(conn.id, 0.0)
    [hello] = core.take_output(conn.id, 0.0) or []
    core.receive(conn.id, [P.HELLO_OK, hello[1], SHARD_HELLO], 0.0)
    out(core, conn)
    sub = core.subscribe("t", "s", now=0.0)
    assert [f[0] for f in out(core, conn)] == [P.SUBSCRIBE]
    core.unsubscribe(sub, 0.0)
    core.close()
    assert sub.ready.done and isinstance(sub.ready._error, errors.ClientClosed)


# -- publish frames -------------------------------------------------------------------------


def _small_frames_shard(core: ClientCore) -> Conn:
    [conn] = core.take_connects()
    core.connected(conn.id, 0.0)
    [hello] = core.take_output(conn.id, 0.0) or []
    core.receive(conn.id, [P.HELLO_OK, hello[1], {**SHARD_HELLO, "max_frame_bytes": 1024}], 0.0)
    return conn


def test_a_payload_over_the_shard_s_frame_limit_fails_with_message_too_large() -> None:
    core = ready_core()
    batch = core.publish_many("t", [b"x" * 5000, b"y"], None, 0.0)
    conn = _small_frames_shard(core)
    frames = out(core, conn)
    assert batch.failures and set(batch.failures) == {0}
    assert isinstance(batch.failures[0], errors.MessageTooLarge)
    assert "max_frame_bytes=1024" in str(batch.failures[0])
    assert [i for f in frames if f[0] == P.PUBLISH for g in f[2] for i in g[1]] == [batch.ids[1]]


@pytest.mark.parametrize("payload", [100, 150, 200, 233, 250])
def test_publish_frames_of_many_topics_stay_under_the_shard_s_frame_limit(payload: int) -> None:
    core = ready_core()
    topics = [f"{'t' * 96}{i:04d}" for i in range(24)]
    for topic in topics:
        core.publish(topic, b"p" * payload, None, 0.0)
    conn = _small_frames_shard(core)
    frames = [f for f in out(core, conn) if f[0] == P.PUBLISH]
    limit = 4096  # max(4096, max_frame_bytes - 1024)
    for frame in frames:
        estimate = 64 + sum(len(g[0]) + GROUP_OVERHEAD + sum(
            len(p) + len(i) + ITEM_OVERHEAD for i, p in zip(g[1], g[2], strict=True))
            for g in frame[2])
        assert estimate <= limit
    assert sorted(g[0] for f in frames for g in f[2]) == topics
    assert len(frames) > 1


def test_a_batch_s_size_is_the_sum_of_its_messages_sizes() -> None:
    core = ready_core()
    batch = core.publish_many("t", [b"ab", b"cde", b"f"], None, 0.0)
    whole = batch.size(0, 3)
    assert whole == sum(batch.size(i, i + 1) for i in range(3))
    assert whole == 6 + 3 * 32 + 3 * ITEM_OVERHEAD
    assert batch.size(1, 3) == batch.size(1, 2) + batch.size(2, 3)


# -- the router's backoff ------------------------------------------------------------------


def test_the_router_retry_backs_off_further_after_each_failure() -> None:
    core, conn, _, _ = warm_subscription()
    core.connection_lost(conn.id, 1.0)
    now, router_opens = 1.0, []
    while len(router_opens) < 5:
        for new in core.take_connects():  # neither the router nor the shard answers
            if new.role == "router":
                router_opens.append(now)
            core.connect_failed(new.id, now)
        now = core.next_deadline()
        core.tick(now)
    # about 50 ms doubling with each failure, less at most half of it as jitter
    for failures in range(1, 5):
        gap = router_opens[failures] - router_opens[failures - 1]
        assert gap >= 0.05 * 2 ** failures / 2, (failures, router_opens)


# -- reprs ----------------------------------------------------------------------------------


def test_a_subscription_s_repr_names_it_or_says_it_is_ephemeral() -> None:
    core = ready_core()
    named = core.subscribe("t", "s", now=0.0)
    ephemeral = core.subscribe("t", None, now=0.0)
    assert " name='s' " in repr(named)
    assert " ephemeral " in repr(ephemeral)


def test_a_waiter_s_repr_shows_its_value_or_error_once_done() -> None:
    waiter: Waiter = Waiter()
    assert repr(waiter) == "<Waiter pending>"
    waiter.set_value(3)
    assert repr(waiter) == "<Waiter value=3>"
    failed: Waiter = Waiter()
    failed.set_error(errors.ClientClosed("closed"))
    assert repr(failed).startswith("<Waiter error=")
