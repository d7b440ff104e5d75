"""Client-core behaviours that surviving mutants of a fourth sample showed unchecked
(``make mutate``): the limits and texts of argument errors, the generation a pull
subscribe sends, a PUBLISHED with too many results, the reply to an unsubscribe sent
for a late SUBSCRIBED, a shard the map has no address for, a call's repr, the
backoff growing with each refusal, and held acks sent with a later delivery's wake.

Sans-IO: frames in, frames and errors out.
"""

from __future__ import annotations

import random

import pytest
from test_client_core_support import GEN, deliver, open_shard, out, ready_core, warm_subscription

from flux import errors
from flux import protocol as P
from flux.client.connection import BACKOFF_BASE
from flux.client.core import ClientCore
from flux.client.requests import Call
from flux.client.subscription import ACK_DELAY

# -- argument errors --------------------------------------------------------------------------


def test_a_subscription_name_of_255_bytes_is_accepted_and_256_refused_with_the_rule() -> None:
    core = ready_core()
    core.subscribe("t", "n" * 255, now=0.0)
    with pytest.raises(errors.InvalidRequest) as info:
        core.subscribe("t", "n" * 256, now=0.0)
    assert str(info.value) == "subscription name must be 1-255 bytes, not starting '~'"


def test_a_core_with_a_non_positive_timeout_says_which_settings_must_be_positive() -> None:
    with pytest.raises(ValueError) as info:
        ClientCore(("r", 1), rng=random.Random(1), now=0.0, request_timeout=0.0)
    assert str(info.value) == "request_timeout and retry_deadline must be positive"


def test_the_result_of_an_unfinished_batch_says_it_is_not_finished() -> None:
    batch = ready_core().publish_many("t", [b"a"], ["a"], 0.0)
    with pytest.raises(RuntimeError) as info:
        batch.result()
    assert str(info.value) == "result() called before the batch finished"


# -- what goes out ------------------------------------------------------------------------------


def test_a_pull_subscribe_sends_the_generation_it_was_given() -> None:
    core = ready_core()
    core.subscribe_pull("t", "p", generation=5, now=0.0)
    conn = open_shard(core)
    [frame] = [f for f in out(core, conn) if f[0] == P.SUBSCRIBE]
    assert frame[-1]["generation"] == 5


# -- replies ----------------------------------------------------------------------------------


def test_a_published_with_more_results_than_groups_fails_the_publish_as_malformed() -> None:
    core = ready_core()
    item = core.publish("t", b"a", "a", 0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    core.receive(conn.id, [P.PUBLISHED, frame[1], GEN, [[0, [], []], [1, [], []]]], 0.0)
    with pytest.raises(errors.ProtocolError) as info:
        item.result()
    assert str(info.value) == "malformed PUBLISHED: 2 results for 1 groups"


def test_the_reply_to_the_unsubscribe_of_a_late_subscribed_is_taken_quietly() -> None:
    core = ready_core()
    sub = core.subscribe("t", "s", now=0.0)
    conn = open_shard(core)
    [frame] = [f for f in out(core, conn) if f[0] == P.SUBSCRIBE]
    core.unsubscribe(sub, 0.0)
    core.receive(conn.id, [P.SUBSCRIBED, frame[1], frame[2], {
        "created": True, "start_offset": 0, "cursor": 0, "generation": GEN,
        "clamped": False, "reset": False, "next_offset": 0, "max_in_flight": 1000}], 0.0)
    [unsubscribe] = [f for f in out(core, conn) if f[0] == P.UNSUBSCRIBE]
    core.receive(conn.id, [P.UNSUBSCRIBED, unsubscribe[1], unsubscribe[2]], 0.0)
    assert frame[2] not in conn.subs
    assert conn.state == "ready" and core.take_closes() == []


# -- a shard with no address ------------------------------------------------------------------


def test_a_publish_to_a_shard_without_an_address_fails_at_its_deadline_saying_so() -> None:
    core = ClientCore(("r", 1), rng=random.Random(1), now=0.0, retry_deadline=1.0)
    [router] = core.take_connects()
    core.connected(router.id, 0.0)
    [hello] = core.take_output(router.id, 0.0) or []
    core.receive(router.id, [P.HELLO_OK, hello[1], {"version": P.VERSION, "shard_count": 1,
                                                     "shards": []}], 0.0)
    item = core.publish("t", b"a", "a", 0.0)
    now = 0.0
    while not item.done:
        now = max(now, core.next_deadline())
        core.tick(now)
        for conn in core.take_connects():
            core.connect_failed(conn.id, now)
    with pytest.raises(errors.RetryDeadlineExceeded) as info:
        item.result()
    assert "the shard map has no address for shard 0" in str(info.value)


# -- repr ---------------------------------------------------------------------------------------


def test_a_call_s_repr_names_its_topic_or_else_its_shard() -> None:
    assert repr(Call("fetch", topic="t", shard=None, body={}, deadline=1.0)) \
        == "<Call fetch t attempts=0>"
    assert repr(Call("stats", topic=None, shard=3, body={}, deadline=1.0)) \
        == "<Call stats shard 3 attempts=0>"


# -- retry backoff ----------------------------------------------------------------------------


def test_each_refusal_of_a_publish_doubles_the_backoff_before_it_is_sent_again() -> None:
    core = ready_core()
    item = core.publish("t", b"a", "a", 0.0)
    conn = open_shard(core)
    now = 0.0
    waits = []
    for _ in range(3):
        [frame] = out(core, conn, now)
        core.receive(conn.id, [P.PUBLISHED, frame[1], GEN,
                               [[[P.REFUSED], [], [[0, errors.Busy.code, "busy"]]]]], now)
        due = core.next_deadline()
        waits.append(due - now)
        now = due
        core.tick(now)
    assert not item.done
    # backoff(attempt) lies in [0.5, 1] x BACKOFF_BASE x 2**attempt: attempts 1, 2, 3
    for attempt, wait in enumerate(waits, 1):
        assert BACKOFF_BASE * 2 ** attempt / 2 <= wait <= BACKOFF_BASE * 2 ** attempt


# -- held acks ----------------------------------------------------------------------------------


def test_a_delivery_after_the_hold_of_an_ack_ran_out_sends_the_ack_with_its_wake() -> None:
    core, conn, sub, sid = warm_subscription(prefetch=8)  # acks go out in pairs, credit by 2
    deliver(core, conn, sid, (0, 1), (1, 1))
    msg = sub.next_message()
    assert msg is not None and sub.next_message() is not None
    assert [f[0] for f in out(core, conn)] == [P.CREDIT]  # credit_owed back to 0
    core.ack(sub, msg, 0.0)  # held up to ACK_DELAY
    assert out(core, conn) == []
    # the shell's hold timer has not run yet when the next delivery comes, past the hold
    later = ACK_DELAY * 2
    core.receive(conn.id, [P.DELIVER, sid, GEN, 1, 2, ["id2"], [b"p2"], [1.5, 1]], later)
    assert conn.id in core.take_writable()
    assert [f[0] for f in out(core, conn, later)] == [P.ACK]
