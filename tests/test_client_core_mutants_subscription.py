"""The client core's subscriptions and publish retries, in the cases mutants showed unchecked:
acks across generations, waking the iterator, and naming a retried publish.

Each test pins a behaviour that a surviving mutant of the client core showed no
test checked (``make mutate``). Sans-IO: frames in, frames and errors out.
"""

from __future__ import annotations

import pytest
from test_client_core_support import (
    deliver,
    open_shard,
    out,
    published,
    ready_core,
    reopen_shard,
    warm_subscription,
)

from flux import errors
from flux import protocol as P


def test_an_ack_of_the_old_generation_never_acks_the_same_offset_of_the_new_one() -> None:
    core, conn, sub, sid = warm_subscription()
    deliver(core, conn, sid, (0, 1))
    old = core.next_message(sub)
    assert old is not None
    core.connection_lost(conn.id, 1.0)
    conn2, now = reopen_shard(core, 1.0)
    [frame] = [f for f in out(core, conn2, now) if f[0] == P.SUBSCRIBE and f[3]["name"] == "s"]
    core.receive(conn2.id, [P.SUBSCRIBED, frame[1], frame[2], {
        "created": False, "start_offset": 0, "cursor": 0, "generation": 99, "clamped": False,
        "reset": True, "next_offset": 0, "max_in_flight": 1000}], now)
    deliver(core, conn2, frame[2], (0, 1), generation=99)
    new = core.next_message(sub)
    assert new is not None and new.generation == 99
    assert core.ack(sub, old, now) is False
    core.tick(now + 1.0)
    assert [f for f in out(core, conn2, now + 1.0) if f[0] == P.ACK] == []


def test_a_redelivery_wakes_the_iterator_only_when_its_buffer_was_empty() -> None:
    core, conn, sub, sid = warm_subscription()
    sub.waker = object()  # a shell task waits on it
    core.take_woken()
    deliver(core, conn, sid, (0, 2))
    assert sub in core.take_woken()
    deliver(core, conn, sid, (1, 2))
    assert sub not in core.take_woken()


def test_a_first_delivery_wakes_the_iterator_only_when_its_buffer_was_empty() -> None:
    core, conn, sub, sid = warm_subscription()
    sub.waker = object()  # a shell task waits on it
    core.take_woken()
    deliver(core, conn, sid, (0, 1))
    assert sub in core.take_woken()
    deliver(core, conn, sid, (1, 1))
    assert sub not in core.take_woken()


def test_a_retried_item_of_a_batch_is_named_alone_when_its_deadline_passes() -> None:
    core = ready_core(retry_deadline=1.0)
    batch = core.publish_many("t", [b"a", b"b"], ["a", "b"], 0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    published(core, conn, frame, [0, P.REFUSED], refused=[[1, errors.Busy.code, "busy"]])
    now = 0.0
    while not batch.done and now < 10.0:
        now = max(now, core.next_deadline())
        core.tick(now)
        for f in out(core, conn, now):
            if f[0] == P.PUBLISH:
                published(core, conn, f, [P.REFUSED], refused=[[0, errors.Busy.code, "busy"]],
                          now=now)
    with pytest.raises(errors.RetryDeadlineExceeded, match=r"^publish of id 'b' to 't' kept failing"):
        batch.result()


def test_an_unsubscribe_answered_after_the_shard_ended_the_session_still_finishes() -> None:
    core, conn, sub, sid = warm_subscription()
    done = core.unsubscribe(sub, 0.0)
    [frame] = [f for f in out(core, conn) if f[0] == P.UNSUBSCRIBE]
    core.receive(conn.id, [P.SUB_ENDED, sid, errors.SubscriptionTakenOver.code, "taken"], 0.0)
    core.receive(conn.id, [P.UNSUBSCRIBED, frame[1]], 0.0)
    assert done.done and done.result() is None
    assert core.take_closes() == []


def test_a_redelivery_below_this_session_s_first_deliveries_is_kept_in_order() -> None:
    core, conn, sub, sid = warm_subscription(cursor=3)
    deliver(core, conn, sid, (5, 1), (6, 1))
    deliver(core, conn, sid, (3, 2))  # pushed before this session began, not acked
    got = [core.next_message(sub) for _ in range(3)]
    assert [(m.offset, m.attempt) for m in got if m] == [(5, 1), (6, 1), (3, 2)]
    assert core.take_closes() == []
    for msg in got[:2]:
        assert msg is not None
        core.ack(sub, msg, 0.0)
    core.tick(0.005)
    [ack] = [f for f in out(core, conn, 0.005) if f[0] == P.ACK]
    assert ack[4:] == [[5, 6], -1]  # never cumulative over 3, which the user did not ack
