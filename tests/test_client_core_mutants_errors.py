"""The client core's errors: which call fails, with which type, and what the message says.

Each test pins a behaviour that a surviving mutant of the client core showed no
test checked (``make mutate``). Sans-IO: frames in, frames and errors out.
"""

from __future__ import annotations

import random

import pytest
from test_client_core_support import GEN, deliver, open_shard, out, ready_core, warm_subscription

from flux import errors
from flux import protocol as P
from flux.client.connection import Conn
from flux.client.core import ClientCore
from flux.client.subscription import SubState
from flux.client.types import SubscribeInfo


def run_until_done(core: ClientCore, waiter: object, now: float, limit: float = 120.0) -> float:
    """Tick the core from ``now`` until ``waiter`` is done, answering no connection."""
    while not getattr(waiter, "done") and now < limit:  # noqa: B009
        for conn in core.take_connects():
            core.connect_failed(conn.id, now)
        now = max(now, core.next_deadline())
        core.tick(now)
    return now


def ack_all(core: ClientCore, conn: Conn, sub: SubState, sid: int, offsets: list[int]) -> list[int]:
    """Deliver ``offsets``, ack each, and return the request ids of the ACK frames sent."""
    deliver(core, conn, sid, *[(o, 1) for o in offsets])
    for _ in offsets:
        msg = core.next_message(sub)
        assert msg is not None
        core.ack(sub, msg, 0.0)
    core.tick(0.005)  # held acks go out within ACK_DELAY
    return [f[1] for f in out(core, conn, 0.005) if f[0] == P.ACK]


def test_an_abandoned_wait_fails_saying_the_caller_stopped_waiting() -> None:
    core = ready_core()
    item = core.publish("t", b"a", "a", 0.0)
    core.abandon(item)
    with pytest.raises(errors.ClientClosed, match="the caller stopped waiting"):
        item.result()


@pytest.mark.parametrize("key", ["max_in_flight", "prefetch"])
def test_a_bad_subscribe_option_is_named_in_the_error(key: str) -> None:
    core = ready_core()
    with pytest.raises(errors.InvalidRequest, match=f"^{key} must be a positive integer"):
        core.subscribe("t", "s", now=0.0, **{key: 0})  # type: ignore[arg-type]


def test_subscribe_sends_the_max_in_flight_it_was_given() -> None:
    core = ready_core()
    core.subscribe("t", "s", max_in_flight=1, now=0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    assert frame[3]["max_in_flight"] == 1 and frame[3]["credit"] == 1


def test_two_subscriptions_opened_together_each_send_their_subscribe() -> None:
    core = ready_core()
    core.subscribe("t", "a", now=0.0)
    core.subscribe("t", "b", now=0.0)
    conn = open_shard(core)
    assert sorted(f[3]["name"] for f in out(core, conn) if f[0] == P.SUBSCRIBE) == ["a", "b"]


@pytest.mark.parametrize("name", ["", 5, None])
def test_a_pull_subscription_without_a_string_name_is_refused(name: object) -> None:
    core = ready_core()
    with pytest.raises(errors.InvalidRequest, match="a pull subscription needs a name"):
        core.subscribe_pull("t", name, now=0.0)  # type: ignore[arg-type]


def test_an_unreachable_router_fails_ready_naming_the_address_it_could_not_reach() -> None:
    core = ClientCore(("r", 1), rng=random.Random(1), now=0.0, retry_deadline=5.0)
    closes: list[int] = []
    now = 0.0
    while not core.ready.done and now < 60.0:
        for conn in core.take_connects():
            core.connect_failed(conn.id, now)
        closes += core.take_closes()
        now = max(now, core.next_deadline())
        core.tick(now)
    assert closes == []  # nothing was opened, so the shell has nothing to close
    with pytest.raises(errors.ConnectionLost,
                       match="cannot reach the router at r:1: cannot connect to r:1"):
        core.ready.result()


def test_a_connection_the_peer_closed_with_an_error_says_why_when_retries_run_out() -> None:
    core = ready_core(retry_deadline=2.0)
    item = core.publish("t", b"a", "a", 0.0)
    conn = open_shard(core)
    out(core, conn)
    core.receive(conn.id, [P.ERROR, 0, errors.ProtocolError.code, "frame too large"], 3.0)
    core.connection_lost(conn.id, 3.0, errors.ConnectionLost("reset"))
    run_until_done(core, item, 3.0)
    with pytest.raises(errors.RetryDeadlineExceeded,
                       match="closed by the peer: frame too large") as raised:
        item.result()
    assert "publish of id 'a' to 't'" in str(raised.value)


def test_a_call_refused_busy_past_its_deadline_fails_with_the_last_error() -> None:
    core = ready_core(retry_deadline=2.0)
    call = core.fetch("t", 0, now=0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    core.receive(conn.id, [P.ERROR, frame[1], errors.Busy.code, "busy now"], 3.0)
    with pytest.raises(errors.RetryDeadlineExceeded, match="fetch of 't' kept failing") as raised:
        call.result()
    assert "last error Busy: busy now" in str(raised.value)


def test_a_call_refused_busy_is_retried_on_the_same_connection_after_a_backoff() -> None:
    core = ready_core()
    call = core.fetch("t", 0, now=0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    core.receive(conn.id, [P.ERROR, frame[1], errors.Busy.code, "busy now"], 0.0)
    assert core.take_closes() == [] and not call.done
    due = core.next_deadline()
    core.tick(due)
    [again] = out(core, conn, due)
    assert again[0] == P.FETCH and again[2] == frame[2]


def test_closing_the_client_fails_a_subscribe_still_in_flight() -> None:
    core = ready_core()
    sub = core.subscribe("t", "s", now=0.0)
    conn = open_shard(core)
    out(core, conn)
    core.close()
    with pytest.raises(errors.ClientClosed):
        sub.ready.result()


def test_sub_ended_error_carries_the_shard_s_message() -> None:
    core, conn, sub, sid = warm_subscription()
    core.receive(conn.id, [P.SUB_ENDED, sid, errors.SubscriptionInactive.code, "pushes ran out"], 0.0)
    with pytest.raises(errors.SubscriptionInactive, match="pushes ran out"):
        core.next_message(sub)


def test_a_subscribe_refused_for_good_closes_the_subscription() -> None:
    core = ready_core()
    sub = core.subscribe("t", "s", now=0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    core.receive(conn.id, [P.ERROR, frame[1], errors.InvalidRequest.code, "no"], 0.0)
    with pytest.raises(errors.InvalidRequest):
        sub.ready.result()
    assert sub.status == "closed"


def test_one_refused_ack_names_its_offset() -> None:
    core, conn, sub, sid = warm_subscription()
    [rid] = ack_all(core, conn, sub, sid, [4])
    core.receive(conn.id, [P.ACKED, rid, sid, 0, [[4, errors.NotDelivered.code, "not delivered"]]], 0.0)
    with pytest.raises(errors.NotDelivered) as raised:
        core.next_message(sub)
    assert str(raised.value) == "ack of offset 4 refused: not delivered"
    assert raised.value.details == {"offset": 4}


def test_several_refused_acks_are_one_error_listing_every_offset() -> None:
    core, conn, sub, sid = warm_subscription()
    [rid] = ack_all(core, conn, sub, sid, [4, 5, 9])
    refused = [[o, errors.NotDelivered.code, "not delivered"] for o in (4, 5, 9)]
    core.receive(conn.id, [P.ACKED, rid, sid, 0, refused], 0.0)
    with pytest.raises(errors.NotDelivered) as raised:
        core.next_message(sub)
    assert str(raised.value) == "ack of offset 4 refused: not delivered (and 2 more)"
    assert raised.value.details == {"offsets": [4, 5, 9]}


def test_an_ack_after_the_subscription_ended_asks_nothing_of_the_shell() -> None:
    core, conn, sub, sid = warm_subscription()
    deliver(core, conn, sid, (0, 1))
    msg = core.next_message(sub)
    assert msg is not None
    core.receive(conn.id, [P.SUB_ENDED, sid, errors.SubscriptionTakenOver.code, "taken"], 0.0)
    assert sub.ack(msg, 0.0) is False and core.ack(sub, msg, 0.0) is False


def test_subscribed_reply_says_whether_the_subscription_was_reset() -> None:
    body = {"created": False, "start_offset": 0, "cursor": 0, "generation": GEN,
            "clamped": False, "next_offset": 0, "max_in_flight": 10}
    assert SubscribeInfo.from_reply({**body, "reset": True}).reset is True
    assert SubscribeInfo.from_reply(body).reset is False
