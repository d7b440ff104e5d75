"""The rules that close the simulator's blind spots, on hand-written histories: each
fires on the fact it is about and stays quiet on the nearest legitimate history."""

from __future__ import annotations

from flux.sim import history as h
from sim.test_checker import G2, G, Story
from sim.test_checker_pull import Reader


def _call(s: Story, t: float, call: int, payloads: tuple[str, ...]) -> Story:
    return s.add(h.PublishCalled(t, "p", call, "t", payloads, None))


def _attempt(s: Story, t: float, rid: int, message_id: str, payload: str) -> Story:
    return s.add(h.PublishAttempted(t, "p", rid, "t", message_id, 1, payload))


def _deliver(s: Story, t: float, offset: int, message_id: str, payload: str,
             attempt: int = 1) -> Story:
    return s.add(h.Delivered(t, "c1/n", 1, "t", G, offset, message_id, attempt, 0.0, payload))


def test_a_call_whose_message_is_stored_twice_under_two_ids_breaks_g3() -> None:
    s = Story().hello(0.0).subscribe(0.01)
    _call(s, 0.1, 1, ("p.1.0",))
    _attempt(s, 0.1, 1, "id-a", "p.1.0")      # stored, reply lost
    _attempt(s, 0.6, 2, "id-b", "p.1.0")      # the retry under another id, stored again
    s.add(h.PublishAcked(0.61, "p", 2, "t", "id-b", G, 1, False))
    s.add(h.PublishReturned(0.62, "p", 1, "t", ("id-b",), (1,), (G,), (False,)))
    _deliver(s, 0.7, 0, "id-a", "p.1.0")
    _deliver(s, 0.7, 1, "id-b", "p.1.0")
    assert "G3/call-stored-twice" in s.end().rules()


def test_a_call_stored_once_per_generation_passes_the_call_rules() -> None:
    s = Story().hello(0.0).subscribe(0.01)
    _call(s, 0.1, 1, ("p.1.0",))
    _attempt(s, 0.1, 1, "id-a", "p.1.0")
    s.add(h.PublishAcked(0.11, "p", 1, "t", "id-a", G, 0, False))
    s.add(h.PublishReturned(0.12, "p", 1, "t", ("id-a",), (0,), (G,), (False,)))
    _deliver(s, 0.2, 0, "id-a", "p.1.0")
    # the same message stored again in the generation after a restart: allowed (G3)
    s.add(h.Delivered(0.3, "c1/n", 1, "t", G2, 0, "id-a", 1, 0.0, "p.1.0"))
    rules = s.end().rules()
    assert "G3/call-stored-twice" not in rules and "G2/call-ack-mismatch" not in rules


def test_an_ack_naming_another_calls_message_breaks_g2() -> None:
    s = Story().hello(0.0).subscribe(0.01)
    _call(s, 0.1, 1, ("p.1.0", "p.1.1"))
    _attempt(s, 0.1, 1, "id-a", "p.1.0")
    _attempt(s, 0.1, 1, "id-b", "p.1.1")
    # the client hands back the acks in the wrong order
    s.add(h.PublishReturned(0.12, "p", 1, "t", ("id-b", "id-a"), (1, 0), (G, G),
                            (False, False)))
    assert "G2/call-ack-mismatch" in s.end().rules()


def test_re_pushes_of_one_attempt_out_of_offset_order_break_g1() -> None:
    s = Story().hello(0.0).subscribe(0.01)
    s.publish(0.1, "a", 0).publish(0.1, "b", 1)
    s.deliver(0.2, 0, "a").deliver(0.2, 1, "b")
    s.deliver(1.7, 1, "b", attempt=2).deliver(1.7, 0, "a", attempt=2)
    assert "G1/repush-order" in s.end().rules()


def test_re_pushes_in_offset_order_pass() -> None:
    s = Story().hello(0.0).subscribe(0.01)
    s.publish(0.1, "a", 0).publish(0.1, "b", 1)
    s.deliver(0.2, 0, "a").deliver(0.2, 1, "b")
    s.deliver(1.7, 0, "a", attempt=2).deliver(1.7, 1, "b", attempt=2)
    s.ack(1.8, 0, 1).ack(1.81, 1, 2)
    assert "G1/repush-order" not in s.end().rules()


def test_a_cursor_past_an_offset_never_acked_breaks_g6() -> None:
    s = Story().hello(0.0).subscribe(0.01)
    s.publish(0.1, "a", 0).publish(0.1, "b", 1)
    s.deliver(0.2, 0, "a").deliver(0.2, 1, "b")
    s.ack(0.3, 1, 2)    # only offset 1 acked, yet the shard says the cursor is 2
    assert "G6/cursor-past-unacked" in s.end().rules()


def test_a_cursor_at_the_lowest_unacked_offset_passes() -> None:
    s = Story().hello(0.0).subscribe(0.01)
    s.publish(0.1, "a", 0).publish(0.1, "b", 1)
    s.deliver(0.2, 0, "a").deliver(0.2, 1, "b")
    s.ack(0.3, 1, 0).ack(0.4, 0, 2)
    assert "G6/cursor-past-unacked" not in s.end().rules()


def _fetched(s: Story, t: float, oldest: int, nxt: int, name: str | None = None) -> Story:
    return s.add(h.Fetched(t, "c2/~", "c2", 0, "t", name, G, None, 0, 10, oldest, nxt,
                           oldest, (), t - 0.002))


def test_a_fetch_showing_a_message_gone_within_its_ttl_breaks_g5() -> None:
    s = Story(oracle=True).hello(0.0)
    s.publish(0.1, "a", 0).publish(0.1, "b", 1)
    _fetched(s, 1.0, 1, 2)                      # ttl is 2 s: offset 0 went too soon
    assert "G5/gone-before-ttl" in s.end().rules()


def test_a_fetch_showing_a_message_gone_that_a_subscription_held_breaks_g5() -> None:
    s = Story(oracle=True).hello(0.0).subscribe(0.01)
    s.publish(0.1, "a", 0).deliver(0.2, 0, "a")
    _fetched(s, 3.0, 1, 1)                      # past ttl, but n never acked it
    assert "G5/gone-unacked" in s.end().rules()


def test_a_fetch_showing_acked_and_expired_messages_gone_passes() -> None:
    s = Story(oracle=True).hello(0.0).subscribe(0.01)
    s.publish(0.1, "a", 0).deliver(0.2, 0, "a").ack(0.3, 0, 1)
    _fetched(s, 3.0, 1, 1)
    rules = s.end().rules()
    assert "G5/gone-unacked" not in rules and "G5/gone-before-ttl" not in rules


def test_topic_full_for_an_id_stored_in_the_window_breaks_g3() -> None:
    s = Story().hello(0.0)
    s.publish(0.1, "a", 0)                      # stored and acked at 0.102
    s.add(h.PublishAttempted(0.5, "p", 2, "t", "a", 2))
    s.add(h.PublishFailed(0.51, "p", 2, "t", "a", "TopicFull", G))
    assert "G3/full-before-dedup" in s.end().rules()


def test_topic_full_in_another_generation_passes() -> None:
    s = Story().hello(0.0)
    s.publish(0.1, "a", 0)
    s.add(h.PublishAttempted(0.5, "p", 2, "t", "a", 2))
    s.add(h.PublishFailed(0.51, "p", 2, "t", "a", "TopicFull", G2))
    assert "G3/full-before-dedup" not in s.end().rules()


def test_a_pull_cursor_past_every_commit_breaks_g6() -> None:

    s = Reader().hello(0.0).pull(0.01)
    s.publish(0.1, "a", 0).publish(0.1, "b", 1).publish(0.1, "c", 2)
    s.fetch(0.2, 0, ("a", "b", "c")).commit(0.3, 2, cursor=3)   # COMMIT 2 moved it to 3
    assert "G6/cursor-past-commit" in s.end().rules()


def test_a_pull_cursor_at_its_last_commit_passes() -> None:

    s = Reader().hello(0.0).pull(0.01)
    s.publish(0.1, "a", 0).publish(0.1, "b", 1)
    s.fetch(0.2, 0, ("a", "b")).commit(0.3, 2).pull(0.4, created=False, cursor=2)
    assert "G6/cursor-past-commit" not in s.end().rules()


def _bad(s: Story, t: float, what: str, valid: tuple[int, ...] = ()) -> Story:
    return s.add(h.BadRequestSent(t, "v0", 0, 11, what, valid))


def test_a_valid_item_refused_beside_a_bad_one_breaks_g8() -> None:
    s = _bad(Story(liveness=False).hello(0.0), 0.1, "publish-mixed", (0, 2))
    s.add(h.BadRequestAnswered(0.11, "v0", 0, 11, "publish-mixed", "InvalidMessageId"))
    assert "G8/batch-item" in s.end().rules()


def test_each_item_judged_on_its_own_passes_g8() -> None:
    s = _bad(Story(liveness=False).hello(0.0), 0.1, "publish-mixed", (0, 2))
    s.add(h.BadRequestAnswered(0.11, "v0", 0, 11, "publish-mixed", "", (0,),
                               ("1:InvalidMessageId", "2:TopicFull")))
    rules = s.end().rules()
    assert "G8/batch-item" not in rules and "G8/untyped-error" not in rules


def test_an_untyped_answer_breaks_g8() -> None:
    s = _bad(Story(liveness=False).hello(0.0), 0.1, "unknown-kind")
    s.add(h.BadRequestAnswered(0.11, "v0", 0, 11, "unknown-kind", "RemoteError"))
    assert "G8/untyped-error" in s.end().rules()


def test_a_bad_request_left_unanswered_on_a_quiet_link_breaks_g8() -> None:
    s = _bad(Story(liveness=False).hello(0.0), 0.1, "unknown-kind")
    s.add(h.BadRequestUnanswered(0.2, "v0", 0, 11, "unknown-kind", "closed", 0.1))
    assert "G8/unanswered" in s.end().rules()


def test_a_bad_request_unanswered_across_a_shard_pause_passes() -> None:
    s = _bad(Story(liveness=False).hello(0.0), 0.1, "unknown-kind")
    s.add(h.FaultInjected(0.15, "pause", "shard-0", "begin"))
    s.add(h.BadRequestUnanswered(2.1, "v0", 0, 11, "unknown-kind", "timeout", 0.1))
    s.add(h.FaultInjected(3.0, "pause", "shard-0", "end"))
    assert "G8/unanswered" not in s.end().rules()
