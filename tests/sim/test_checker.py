"""The checker on hand-written histories: a clean one passes, each broken rule is named."""

from __future__ import annotations

from typing import Any

import pytest

from flux.sim import history as h
from flux.sim.checker import check
from flux.sim.checker.index import Index
from flux.sim.simhost import EPOCH

G, G2 = 0xAAAA, 0xBBBB
CONFIG = {"message": {"ttl": 2.0, "cleanup_time": 1.0, "dedup_window": 60.0},
          "subscriber": {"retry_count": 2, "retry_interval": 0.5, "timeout": 1.0,
                         "cleanup_time": 1.0, "inactive_time": 4.0, "heartbeat": 1.0,
                         "max_in_flight": 100}}
PERIOD = 1.5  # timeout + retry_interval


class Story:
    """Builds a history: one client ``c1`` with subscription ``n`` on topic ``t``."""

    def __init__(self, *, oracle: bool = False, liveness: bool = True) -> None:
        self.h = h.History(meta={"config": CONFIG, "epoch": EPOCH, "latency_bound": 0.01,
                                 "oracle": oracle, "close_reasons": True, "liveness": [],
                                 "canaries": []})
        if liveness:
            self.h.meta["liveness"] = [{"subscriber": "c1/n", "topic": "t"}]
        self.stored: dict[tuple[int, int], float] = {}

    def add(self, event: h.Event) -> Story:
        self.h.add(event)
        return self

    def hello(self, t: float, generation: int = G, client: str = "c1",
              requested: float | None = None) -> Story:
        return self.add(h.ShardHello(t, client, 0, generation, requested))

    def subscribe(self, t: float, session: int = 1, *, generation: int = G, created: bool = True,
                  start: int = 0, cursor: int = 0, asked: int | None = None,
                  subscriber: str = "c1/n", requested: float | None = None) -> Story:
        return self.add(h.Subscribed(t, subscriber, session, subscriber.split("/")[0], 0, "t",
                                     subscriber.split("/")[1], generation, created, start,
                                     cursor, False, asked or 100, asked,
                                     t - 0.002 if requested is None else requested, None))

    def publish(self, t: float, message_id: str, offset: int, generation: int = G,
                duplicate: bool = False) -> Story:
        self.add(h.PublishAttempted(t, "p", 1, "t", message_id, 1))
        self.stored.setdefault((generation, offset), t + 0.001)
        return self.add(h.PublishAcked(t + 0.002, "p", 1, "t", message_id, generation, offset,
                                       duplicate))

    def deliver(self, t: float, offset: int, message_id: str, attempt: int = 1,
                session: int = 1, generation: int = G, subscriber: str = "c1/n") -> Story:
        stored = self.stored.get((generation, offset), t)
        self.add(h.Delivered(t, subscriber, session, "t", generation, offset, message_id, attempt,
                             EPOCH + stored))
        return self.add(h.Consumed(t, subscriber, "t", generation, offset, message_id, attempt))

    def ack(self, t: float, offset: int, cursor: int, session: int = 1,
            generation: int = G, subscriber: str = "c1/n") -> Story:
        self.ack_sent(t, offset, session, generation, subscriber)
        return self.ack_confirmed(t + 0.002, offset, cursor, session, generation, subscriber,
                                  sent=t)

    def ack_sent(self, t: float, offset: int, session: int = 1, generation: int = G,
                 subscriber: str = "c1/n") -> Story:
        return self.add(h.AckSent(t, subscriber, session, "t", generation, (offset,), -1))

    def ack_confirmed(self, t: float, offset: int, cursor: int, session: int = 1,
                      generation: int = G, subscriber: str = "c1/n", *,
                      sent: float) -> Story:
        """The ACKED reply, at ``t``, to the ACK of ``offset`` sent at ``sent``."""
        return self.add(h.AckConfirmed(t, subscriber, session, "t", generation, (offset,), -1,
                                       cursor, sent))

    def end(self, t: float = 10.0) -> Story:
        self.add(h.Phase(1.0 if not self.h.events else min(t, 5.0), "heal"))
        return self.add(h.Phase(t, "end"))

    def rules(self) -> list[str]:
        return check(self.h).rules()


def clean() -> Story:
    s = Story().hello(0.0).subscribe(0.01)
    s.publish(0.1, "a", 0).deliver(0.12, 0, "a").ack(0.13, 0, 1)
    s.publish(0.2, "b", 1).deliver(0.22, 1, "b").ack(0.23, 1, 2)
    return s


def test_a_clean_history_passes() -> None:
    report = check(clean().end().h)
    assert report.ok, report.summary()
    assert report.counts["acked"] == 2


def test_acked_message_never_delivered_after_heal_is_lost() -> None:
    s = clean().publish(0.3, "c", 2).end()
    assert "G2/lost" in s.rules()


def test_loss_in_a_generation_that_crashed_is_explained_not_a_violation() -> None:
    s = clean().publish(0.3, "c", 2)
    s.add(h.FaultInjected(0.4, "crash", "shard-0", "instant"))
    s.hello(0.5, G2).subscribe(0.51, 2, generation=G2, start=0)
    report = check(s.end().h)
    assert report.ok, report.summary()
    assert report.counts["lost_explained_by_crash"] == 1


def test_message_nobody_published_is_unexpected() -> None:
    s = clean().deliver(0.3, 2, "zzz").end()
    assert "G2/unexpected" in s.rules()


def test_first_deliveries_out_of_order_break_g1() -> None:
    s = Story().hello(0.0).subscribe(0.01)
    s.publish(0.1, "a", 0).publish(0.1, "b", 1)
    s.deliver(0.2, 1, "b").deliver(0.2, 0, "a").ack(0.3, 0, 1).ack(0.31, 1, 2).end()
    assert "G1/order" in s.rules()


def test_one_id_stored_twice_in_a_generation_breaks_g3() -> None:
    s = clean().publish(0.3, "a", 2).deliver(0.32, 2, "a").ack(0.33, 2, 3).end()
    assert "G3/stored-twice" in s.rules()


def test_two_messages_at_one_offset_break_g1() -> None:
    s = clean().publish(0.3, "c", 1).end()
    assert "G1/offset-reused" in s.rules()


def test_redelivery_after_a_confirmed_ack_is_caught() -> None:
    s = clean().deliver(0.5, 0, "a", attempt=2).end()
    assert {"G1/redelivered-acked", "G4/redelivered-after-ack"} <= set(s.rules())


def test_a_push_of_an_offset_acked_before_the_session_was_asked_for_breaks_g1() -> None:
    """G1: a new session never gets an offset whose ack was confirmed before its
    SUBSCRIBE was sent; an ack confirmed after that may cross a held-up push."""
    for requested, rules in ((0.4, ["G1/redelivered-acked"]), (0.2, [])):
        s = Story().hello(0.0).subscribe(0.01)
        s.publish(0.1, "a", 0).publish(0.1, "b", 1)
        s.deliver(0.15, 0, "a").deliver(0.15, 1, "b").ack(0.3, 1, 0)  # offset 1 confirmed
        s.add(h.SessionEnded(0.35, "c1/n", 1, "t", "taken_over"))
        s.subscribe(0.5, 2, created=False, cursor=0, requested=requested)
        s.deliver(0.55, 0, "a", session=2).deliver(0.55, 1, "b", session=2)
        rules_seen = [r for r in s.end().rules() if r == "G1/redelivered-acked"]
        assert rules_seen == rules, requested


def test_redelivery_before_the_ack_timeout_is_early() -> None:
    s = Story().hello(0.0).subscribe(0.01).publish(0.1, "a", 0)
    s.deliver(0.12, 0, "a").deliver(0.5, 0, "a", attempt=2).ack(0.6, 0, 1).end()
    assert "G4/early-redelivery" in s.rules()


def test_redelivery_on_schedule_passes() -> None:
    s = Story().hello(0.0).subscribe(0.01).publish(0.1, "a", 0)
    s.deliver(0.12, 0, "a").deliver(0.12 + PERIOD, 0, "a", attempt=2)
    s.ack(0.12 + PERIOD + 0.01, 0, 1).end()
    report = check(s.h)
    assert report.ok, report.summary()


def test_more_pushes_than_retry_count_allows_break_g4() -> None:
    s = Story().hello(0.0).subscribe(0.01).publish(0.1, "a", 0)
    for k in range(4):
        s.deliver(0.12 + k * PERIOD, 0, "a", attempt=k + 1)
    s.ack(0.12 + 3 * PERIOD + 0.01, 0, 1).end()
    assert "G4/too-many-pushes" in s.rules()


def test_unacked_message_that_is_never_pushed_again_is_missed() -> None:
    s = Story().hello(0.0).subscribe(0.01).publish(0.1, "a", 0).deliver(0.12, 0, "a").end()
    assert "G4/missed-redelivery" in s.rules()


def test_push_beyond_max_in_flight_breaks_g1() -> None:
    s = Story().hello(0.0).subscribe(0.01, asked=1).publish(0.1, "a", 0).publish(0.1, "b", 1)
    s.deliver(0.12, 0, "a").deliver(0.13, 1, "b").ack(0.2, 0, 1).ack(0.21, 1, 2).end()
    assert "G1/window" in s.rules()


def test_inactive_without_an_exhausted_message_is_spurious() -> None:
    s = clean().add(h.SessionEnded(0.5, "c1/n", 1, "t", "inactive")).subscribe(0.6, 2,
                                                                               created=False)
    assert "G4/spurious-inactive" in s.end().rules()


def test_delivery_of_another_generation_on_a_session_breaks_g7() -> None:
    s = clean().publish(0.3, "c", 2, generation=G2).deliver(0.32, 2, "c", generation=G2)
    assert "G7/generations-mixed" in s.end().rules()


def test_an_old_generation_answering_after_a_new_one_breaks_g7() -> None:
    s = clean().add(h.FaultInjected(0.3, "crash", "shard-0", "instant"))
    s.hello(0.4, G2, client="c2").hello(0.5, G, client="c3")
    assert "G7/two-incarnations" in s.end().rules()


def _crash_and_restart() -> Story:
    """Generation G serves shard 0 until it crashes at 0.3; c2 reaches the new generation
    G2 with a HELLO sent at 0.39, answered at 0.4."""
    s = clean().add(h.FaultInjected(0.3, "crash", "shard-0", "instant"))
    return s.hello(0.4, G2, client="c2", requested=0.39)


def _partition(s: Story, begin: float, end: float, client: str = "c3") -> Story:
    s.add(h.FaultInjected(begin, "partition", f"{client}<->shard-0", "begin"))
    return s.add(h.FaultInjected(end, "partition", f"{client}<->shard-0", "end"))


def test_an_old_generation_reply_held_up_past_the_new_one_is_not_two_incarnations() -> None:
    """G7: a HELLO sent before the crash may have its HELLO_OK held by a partition until
    long after the new generation answered; the old incarnation sent it while it was up."""
    s = _crash_and_restart()
    s.add(h.FaultInjected(0.26, "partition", "c3<->shard-0", "begin"))
    s.hello(2.0, G, client="c3", requested=0.25)
    s.add(h.FaultInjected(2.0, "partition", "c3<->shard-0", "end"))
    s.hello(2.5, G2, client="c3", requested=2.45)
    s.hello(2.6, G2, requested=2.55).subscribe(2.7, session=2, generation=G2, requested=2.65)
    report = check(s.end().h)
    assert report.ok, report.summary()


def test_an_old_generation_seen_only_after_the_new_one_is_not_two_incarnations() -> None:
    """G7: the partition held every reply of the old generation, so the new one was seen
    first; seeing the new one again afterwards is no return of an old incarnation."""
    s = Story(liveness=False).add(h.FaultInjected(0.01, "partition", "c1<->shard-0", "begin"))
    s.add(h.FaultInjected(0.3, "crash", "shard-0", "instant"))
    s.hello(0.4, G2, client="c2", requested=0.39)
    s.hello(2.0, G, client="c1", requested=0.0)
    s.add(h.FaultInjected(2.0, "partition", "c1<->shard-0", "end"))
    s.hello(2.5, G2, client="c2", requested=2.45)
    report = check(s.end().h)
    assert report.ok, report.summary()


def test_an_old_generation_answering_a_hello_sent_after_the_new_one_answered_breaks_g7() -> None:
    """G7: however long a partition held it, a reply to a HELLO sent after the new
    generation had answered comes from an old incarnation still up after the new one."""
    s = _crash_and_restart()
    s.add(h.FaultInjected(0.45, "partition", "c3<->shard-0", "begin"))
    s.hello(2.0, G, client="c3", requested=0.5)
    s.add(h.FaultInjected(2.0, "partition", "c3<->shard-0", "end"))
    assert "G7/two-incarnations" in s.end().rules()


def test_an_old_generation_reply_late_over_a_quiet_link_breaks_g7() -> None:
    """G7: over a link no fault touched, a reply arrives within the latency bound of being
    sent, so one arriving well after the new generation answered was sent after it too."""
    s = _crash_and_restart().hello(0.6, G, client="c3", requested=0.25)
    assert "G7/two-incarnations" in s.end().rules()


def test_an_old_generation_publish_ack_held_up_is_not_two_incarnations() -> None:
    """G7: a publish sent before the crash may be acked by the old generation long after
    the new one answered, when a partition held the PUBLISHED reply."""
    s = _crash_and_restart()
    s.add(h.PublishAttempted(0.25, "p", 7, "t", "x", 1))
    _partition(s, 0.26, 2.0, client="p")
    s.add(h.PublishAcked(2.0, "p", 7, "t", "x", G, 2, False))
    report = check(s.end().h)
    assert "G7/two-incarnations" not in report.rules(), report.summary()


def test_an_old_generation_acking_a_publish_sent_after_the_new_one_answered_breaks_g7() -> None:
    """G7: a PUBLISHED reply names the generation that stored the message: the old one
    stored a publish sent after the new one answered, however long its reply was held."""
    s = _crash_and_restart()
    s.add(h.PublishAttempted(0.5, "p", 7, "t", "x", 1))
    _partition(s, 0.45, 2.0, client="p")
    s.add(h.PublishAcked(2.0, "p", 7, "t", "x", G, 2, False))
    assert "G7/two-incarnations" in s.end().rules()


def test_an_old_generation_subscribed_reply_to_a_later_subscribe_breaks_g7() -> None:
    """G7: a SUBSCRIBED names the shard and its generation too: the old generation answered
    a SUBSCRIBE sent after the new one answered a HELLO."""
    s = _crash_and_restart()
    s.add(h.FaultInjected(0.45, "partition", "c1<->shard-0", "begin"))
    s.subscribe(2.0, session=2, created=False, requested=0.5)
    s.add(h.FaultInjected(2.0, "partition", "c1<->shard-0", "end"))
    assert "G7/two-incarnations" in s.end().rules()


def test_deleting_a_message_before_its_ttl_breaks_g5() -> None:
    s = clean()
    s.add(h.Trimmed(0.5, 0, G, "t", 0, 1))
    assert "G5/deleted-before-ttl" in s.end().rules()


def test_deleting_a_message_a_subscription_has_not_acked_breaks_g5() -> None:
    s = Story().hello(0.0).subscribe(0.01).publish(0.1, "a", 0).deliver(0.12, 0, "a")
    s.add(h.Trimmed(3.0, 0, G, "t", 0, 1))
    s.ack(3.5, 0, 1)
    assert "G5/deleted-unacked" in s.end().rules()


def _ephemeral(*, gone: float | None, trim_first: bool = False,
               fault: bool = True, ended: float = 3.0) -> Story:
    """Ephemeral session 1 of ``c1`` is pushed offset 0 and never acks it; the shard
    deletes the subscription at ``gone`` (the oracle) and trims offset 0 at 2.5 (past
    its ttl), while (with ``fault``) a partition keeps the client from hearing of it:
    the client closes the session only at ``ended``."""
    s = Story(oracle=True, liveness=False).hello(0.0)
    s.add(h.Subscribed(0.01, "c1/~1", 1, "c1", 0, "t", None, G, True, 0, 0, False, 100, None,
                       0.008, None))
    s.publish(0.1, "a", 0).deliver(0.12, 0, "a", subscriber="c1/~1")
    if fault:
        s.add(h.FaultInjected(0.5, "partition", "shard-0->c1", "begin"))
    trim = h.Trimmed(2.5, 0, G, "t", 0, 1)
    if trim_first:
        s.add(trim)
    if gone is not None:
        s.add(h.EphemeralGone(gone, 0, G, "t", 1))
    if not trim_first:
        s.add(trim)
    s.add(h.SessionEnded(ended, "c1/~1", 1, "t", "closed"))
    if fault:
        s.add(h.FaultInjected(3.5, "partition", "shard-0->c1", "end"))
    return s.end()


def test_trimming_what_a_deleted_ephemeral_subscription_had_not_acked_is_allowed() -> None:
    """G5: the shard deleted the ephemeral subscription (its session ended there, say an
    UNSUBSCRIBE whose reply the partition holds), so its unacked messages may go, though
    the client still counts the session as open when they are trimmed."""
    report = check(_ephemeral(gone=1.0).h)
    assert report.ok, report.summary()


def test_trimming_what_a_live_ephemeral_subscription_has_not_acked_breaks_g5() -> None:
    """G5: while the shard still has the ephemeral subscription, its unacked messages
    are held: no word of a deletion, or one that came after the trim (even at the same
    instant) excuses nothing."""
    for gone, trim_first in ((None, False), (2.8, True), (2.5, True)):
        rules = _ephemeral(gone=gone, trim_first=trim_first).rules()
        assert rules == ["G5/deleted-unacked"], (gone, trim_first, rules)


def test_deleting_an_ephemeral_subscription_whose_session_goes_on_breaks_g6() -> None:
    """G6: a shard deletes an ephemeral subscription only when its session ends; with no
    fault near, the client hears of that at once (or ended the session itself)."""
    assert "G6/deleted-without-cause" in _ephemeral(gone=1.0, fault=False).rules()
    assert _ephemeral(gone=1.0, fault=False, ended=1.01).rules() == []  # an UNSUBSCRIBED
    assert _ephemeral(gone=1.0, fault=False, ended=0.9).rules() == []   # the client closed


def _named_gone(trim_first: bool, gone: float = 5.0) -> Story:
    """Subscription ``n`` is pushed offset 0 and unsubscribes at 0.5 without acking it;
    its shard deletes it at ``gone`` (past inactive_time) and trims offset 0 at 5.0."""
    s = Story(oracle=True, liveness=False).hello(0.0).subscribe(0.01)
    s.publish(0.1, "a", 0).deliver(0.12, 0, "a")
    s.add(h.SessionEnded(0.5, "c1/n", 1, "t", "unsubscribed"))
    trim, deletion = h.Trimmed(5.0, 0, G, "t", 0, 1), h.SubscriptionGone(gone, 0, G, "t", "n")
    for event in (trim, deletion) if trim_first else (deletion, trim):
        s.add(event)
    return s.end(20.0)


def test_trimming_what_a_deleted_named_subscription_had_not_acked_is_allowed() -> None:
    """G5: once its shard deleted the subscription (the oracle), its unacked messages
    may go, at the same instant too if the deletion came first."""
    for gone in (4.9, 5.0):
        report = check(_named_gone(trim_first=False, gone=gone).h)
        assert report.ok, (gone, report.summary())


def test_trimming_what_a_named_subscription_has_not_acked_before_deleting_it_breaks_g5() -> None:
    """G5: a trim before the deletion in the history broke the rule, even at the same
    instant (the shard's cleanup still had the subscription's cursor to respect)."""
    for gone in (5.0, 5.1):
        rules = _named_gone(trim_first=True, gone=gone).rules()
        assert rules == ["G5/deleted-unacked"], (gone, rules)


def test_deleting_a_subscription_before_inactive_time_breaks_g6() -> None:
    s = clean().add(h.SessionEnded(1.0, "c1/n", 1, "t", "unsubscribed"))
    s.add(h.SubscriptionGone(2.0, 0, G, "t", "n"))
    assert "G6/deleted-too-early" in Story.rules(s)


def _held_up_pushes(*, partition: bool) -> Story:
    """Subscription ``n`` never acks offset 0: pushes at 27.01 and 28.51 (period 1.5),
    the third sent at 30.01 and SubscriptionInactive at 30.51, when its timeout ran out.
    With ``partition``, c1<->shard-0 holds both from 29.0 until 31.0; without, they
    arrive at 31.0 anyway (late). The shard deletes it at 34.6 (inactive_time 4 s)."""
    s = Story(oracle=True, liveness=False).hello(0.0).subscribe(26.0).publish(26.5, "a", 0)
    s.deliver(27.01, 0, "a").deliver(28.51, 0, "a", attempt=2)
    if partition:
        s.add(h.FaultInjected(29.0, "partition", "c1<->shard-0", "begin"))
        s.add(h.FaultInjected(31.0, "partition", "c1<->shard-0", "end"))
    s.deliver(31.0, 0, "a", attempt=3)
    s.add(h.SessionEnded(31.0, "c1/n", 1, "t", "inactive"))
    s.add(h.SubscriptionGone(34.6, 0, G, "t", "n"))
    return s.end(40.0)


def test_a_deletion_after_pushes_held_up_by_a_partition_is_not_too_early() -> None:
    """G6: a push that arrives when a partition heals may have been sent long before,
    so it shows the session attached only as late as the last push over a quiet link."""
    report = check(_held_up_pushes(partition=True).h)
    assert report.ok, report.summary()
    assert "G6/deleted-too-early" in _held_up_pushes(partition=False).rules()


def test_a_deletion_within_inactive_time_of_a_confirmed_ack_is_too_early() -> None:
    """G6: the shard handled a confirmed ACK after it was sent, attached, however long
    its reply took: inactive_time runs from then at the earliest."""
    s = Story(oracle=True, liveness=False).hello(0.0).subscribe(26.0).publish(26.5, "a", 0)
    s.deliver(27.01, 0, "a")
    s.add(h.FaultInjected(29.0, "partition", "c1<->shard-0", "begin"))
    s.ack_sent(30.9, 0)
    s.add(h.FaultInjected(31.0, "partition", "c1<->shard-0", "end"))
    s.ack_confirmed(31.0, 0, 1, sent=30.9)
    s.add(h.SessionEnded(31.05, "c1/n", 1, "t", "unsubscribed"))
    s.add(h.SubscriptionGone(34.6, 0, G, "t", "n"))
    assert "G6/deleted-too-early" in s.end(40.0).rules()


def test_keeping_an_inactive_subscription_too_long_breaks_g6() -> None:
    s = Story(oracle=True, liveness=False).hello(0.0).subscribe(0.01)
    s.add(h.SessionEnded(1.0, "c1/n", 1, "t", "unsubscribed"))
    s.add(h.Phase(2.0, "heal")).add(h.Phase(20.0, "end"))
    assert "G6/kept-too-long" in s.rules()


def test_recreated_subscription_proves_it_was_deleted() -> None:
    s = Story(liveness=False).hello(0.0).subscribe(0.01)
    s.add(h.SessionEnded(1.0, "c1/n", 1, "t", "unsubscribed"))
    s.subscribe(2.0, 2, created=True)   # re-created after 1 s; inactive_time is 4 s
    assert "G6/deleted-too-early" in s.end().rules()


def test_a_resume_below_a_cursor_confirmed_before_it_was_asked_for_breaks_g6() -> None:
    """G6: acks confirmed before the SUBSCRIBE was sent are in the cursor it reports; acks
    confirmed while its reply was held up on the way (a stall) may not be."""
    for requested, rules in ((0.5, ["G6/cursor-moved-back"]), (0.1, [])):
        s = clean()  # session 1: cursor 1 confirmed at t=0.132, cursor 2 at t=0.232
        s.add(h.SessionEnded(0.3, "c1/n", 1, "t", "closed"))
        s.subscribe(0.6, 2, created=False, cursor=0, requested=requested)
        s.add(h.SessionEnded(0.61, "c1/n", 2, "t", "taken_over"))
        s.subscribe(0.7, 3, created=False, cursor=2)
        assert [r for r in s.end().rules() if r.startswith("G6")] == rules, requested


def _held_up_ack(sent: float) -> Story:
    """Session 1 (client c1) is pushed offset 2 and acks it at ``sent``; a stall of the
    shard->c1 link from 0.34 holds the ACKED reply (cursor 3) until 0.9. Meanwhile c2
    takes the subscription over (cursor 3), acks offset 3 and gets cursor 4 at 0.632."""
    s = clean()  # session 1: cursor 1 confirmed at 0.132, cursor 2 at 0.232
    s.h.meta["liveness"] = []
    s.publish(0.3, "c", 2).deliver(0.32, 2, "c")
    if sent < 0.34:
        s.ack_sent(sent, 2)
    s.add(h.FaultInjected(0.34, "stall", "shard-0->c1", "begin"))
    s.subscribe(0.5, 2, created=False, cursor=3, subscriber="c2/n")
    s.publish(0.6, "d", 3).deliver(0.62, 3, "d", session=2, subscriber="c2/n")
    s.ack(0.63, 3, 4, session=2, subscriber="c2/n")
    if sent >= 0.34:
        s.ack_sent(sent, 2)
    s.add(h.FaultInjected(0.9, "stall", "shard-0->c1", "end"))
    s.ack_confirmed(0.9, 2, 3, sent=sent)
    s.add(h.SessionEnded(0.9, "c1/n", 1, "t", "taken_over"))
    return s.end()


def test_an_ack_reply_held_up_past_a_takeover_is_no_cursor_moving_back() -> None:
    """G6: an ACKED reports the cursor of when the shard answered it, which may be any
    time before it arrives (a stall): acks another session got confirmed meanwhile need
    not be in it, only those confirmed before the ACK was sent."""
    report = check(_held_up_ack(0.33).h)
    assert report.ok, report.summary()


def test_an_ack_reply_below_a_cursor_confirmed_before_the_ack_was_sent_breaks_g6() -> None:
    """G6: the shard had cursor 4 before it could see an ACK sent after that was
    confirmed (to any session), so its ACKED cannot report cursor 3."""
    assert "G6/cursor-moved-back" in _held_up_ack(0.7).rules()


def test_an_ack_reply_below_one_earlier_on_its_own_session_breaks_g6() -> None:
    """G6: one connection keeps the order of replies, so an ACKED that arrives after
    another on its session reports a cursor at least as high, however close the two
    (here the second ACK was sent before the first reply came: no other rule applies)."""
    for second, rules in ((4, []), (2, ["G6/cursor-moved-back"])):
        s = clean()  # session 1 acks 0 and 1: cursor 2 confirmed at 0.232
        s.publish(0.3, "c", 2).publish(0.3, "d", 3)
        s.deliver(0.32, 2, "c").deliver(0.32, 3, "d")
        s.ack_sent(0.33, 2).ack_sent(0.331, 3)
        s.ack_confirmed(0.34, 2, 3, sent=0.33).ack_confirmed(0.341, 3, second, sent=0.331)
        assert [r for r in s.end().rules() if r.startswith("G6")] == rules, second


def test_subscriber_left_on_an_old_generation_is_not_live() -> None:
    s = clean().add(h.FaultInjected(0.3, "crash", "shard-0", "instant")).hello(0.4, G2, "c2")
    assert "liveness/stale-generation" in s.end().rules()


def test_a_subscriber_never_subscribed_is_not_live_unless_it_asked_past_the_end() -> None:
    """A from_offset past the end of the topic's final generation is refused every time
    (OffsetOutOfRange), rightly; one inside it must be subscribed by the end."""
    for from_offset, rules in ((3, []), (2, ["liveness/never-subscribed"]),
                               (None, ["liveness/never-subscribed"])):
        s = Story().hello(0.0)
        s.h.meta["liveness"] = [{"subscriber": "c1/n", "topic": "t", "from_offset": from_offset}]
        s.publish(0.1, "a", 0).publish(0.2, "b", 1)
        assert s.end().rules() == rules, from_offset
    # left on an old generation whose topic reached offset 3, when the new one did not
    s = Story().hello(0.0)
    s.h.meta["liveness"] = [{"subscriber": "c1/n", "topic": "t", "from_offset": 3}]
    for offset, message_id in enumerate("abc"):
        s.publish(0.1, message_id, offset)
    s.subscribe(0.2, start=3, cursor=3)
    s.add(h.FaultInjected(0.3, "crash", "shard-0", "instant")).hello(0.4, G2)
    s.publish(0.5, "d", 0, generation=G2)
    assert s.end().rules() == []


def test_publish_after_heal_that_never_succeeds_is_not_live() -> None:
    s = clean()
    s.h.meta["canaries"] = [["t", "canary-t"]]
    assert "liveness/publish-stuck" in s.end().rules()


@pytest.mark.parametrize("event", [
    h.PublishAttempted(1.5, "p", 3, "t", "x", 2),
    h.Subscribed(2.0, "c/n", 4, "c", 1, "t", None, G, True, 0, 0, False, 5, None, 1.9, G2),
    h.AckSent(3.0, "c/n", 4, "t", G, (1, 2), -1),
    h.AckConfirmed(3.5, "c/n", 4, "t", G, (1,), -1, 3, 3.0),
    h.FaultInjected(4.0, "partition", "a->b", "begin"),
])
def test_events_round_trip_through_json(event: h.Event, tmp_path: Any) -> None:
    history = h.History(meta={"seed": 1}, events=[event])
    path = str(tmp_path / "history.jsonl")
    history.dump(path)
    again = h.History.load(path)
    assert again.events == [event]
    assert again.digest() == history.digest()


def test_digest_changes_with_any_event() -> None:
    a = clean().end().h
    b = clean().publish(0.3, "c", 2).end().h
    assert a.digest() != b.digest()
    assert a.digest() == clean().end().h.digest()


def test_new_subscription_starting_before_the_next_offset_breaks_g6() -> None:
    s = Story(liveness=False).hello(0.0).publish(0.1, "a", 0).publish(0.2, "b", 1)
    s.subscribe(0.5, start=1)   # default start, but offset 1 was acked before it subscribed
    assert "G6/start-not-next" in s.end().rules()


def test_read_old_must_start_at_a_message_still_within_its_ttl() -> None:
    s = Story(liveness=False).hello(0.0).publish(0.1, "a", 0).publish(0.2, "b", 1)
    s.add(h.Subscribed(0.5, "c1/n", 1, "c1", 0, "t", "n", G, True, 2, 2, False, 100, None,
                       0.498, None, True))   # read_old, yet starts past both young messages
    assert "G5/start-past-held" in s.end().rules()


def test_reset_subscription_restarts_at_zero_of_the_new_generation() -> None:
    s = Story(liveness=False).hello(0.0, G2).publish(0.1, "a", 0, generation=G2)
    s.add(h.Subscribed(0.5, "c1/n", 1, "c1", 0, "t", "n", G2, True, 1, 1, True, 100, None,
                       0.498, G))
    assert "G7/reset-start" in s.end().rules()


def test_broker_closing_a_healthy_session_breaks_g6() -> None:
    s = clean().add(h.SessionEnded(0.5, "c1/n", 1, "t", "lost"))
    s.subscribe(0.6, 2, created=False, cursor=2)
    assert "G6/dropped-without-cause" in s.end().rules()
    calm = clean().add(h.FaultInjected(0.45, "reset", "c1<->shard-0", "instant"))
    calm.add(h.SessionEnded(0.5, "c1/n", 1, "t", "lost")).subscribe(0.6, 2, created=False,
                                                                    cursor=2)
    assert "G6/dropped-without-cause" not in calm.end().rules()


def test_a_slow_links_backlog_after_it_ends_is_not_quiet() -> None:
    """G4: what a slow link (latency x factor) sent arrives late even after the spell
    ends, so a first push and its re-push may arrive together; well after, timing counts."""
    for first, rules in ((1.2, []), (5.0, ["G4/early-redelivery"])):
        s = Story(liveness=False).hello(0.0).subscribe(0.01).publish(0.1, "a", 0)
        s.h.meta["plan"] = "slow:c1<->shard-0@0.5+0.5x30"
        s.add(h.FaultInjected(0.5, "slow", "c1<->shard-0", "begin"))
        s.add(h.FaultInjected(1.0, "slow", "c1<->shard-0", "end"))
        s.deliver(first, 0, "a").deliver(first + 0.01, 0, "a", attempt=2)
        s.ack(first + 0.02, 0, 1)
        assert [r for r in s.end().rules() if r.startswith("G4")] == rules, first


def _with_policy(s: Story, policy: dict[str, Any]) -> Story:
    s.h.meta["config"] = {**CONFIG, "topics": [{"match": "other"}, policy]}
    return s


def test_the_checker_resolves_each_topic_policy_as_the_shards_do() -> None:
    s = _with_policy(Story(), {"match": ">", "message": {"ttl": 9.0},
                               "subscriber": {"timeout": 3.0}})
    s.h.meta["config"]["topics"].insert(0, {"match": "t", "subscriber": {"retry_count": 0}})
    index = Index(s.end().h)
    first = index.params_for("t")  # the first match wins: only retry_count differs
    assert (first.retry_count, first.ttl, first.timeout) == (0, 2.0, 1.0)
    other = index.params_for("u.v")
    assert (other.retry_count, other.ttl, other.timeout, other.period) == (2, 9.0, 3.0, 3.5)
    assert index.params_for("other") == index.params


def test_a_trim_after_the_global_ttl_but_before_the_topic_policy_ttl_breaks_g5() -> None:
    s = clean()
    s.add(h.Trimmed(3.0, 0, G, "t", 0, 1))  # global ttl 2: fine, unless t holds for 5
    assert "G5/deleted-before-ttl" not in s.end().rules()
    s = _with_policy(clean(), {"match": "t", "message": {"ttl": 5.0}})
    s.add(h.Trimmed(3.0, 0, G, "t", 0, 1))
    assert "G5/deleted-before-ttl" in s.end().rules()


def test_redelivery_on_the_topic_policy_schedule_passes_and_on_the_global_one_is_early() -> None:
    policy = {"match": "t", "subscriber": {"timeout": 2.0, "retry_interval": 1.0}}
    on_time = _with_policy(Story(), policy).hello(0.0).subscribe(0.01).publish(0.1, "a", 0)
    on_time.deliver(0.12, 0, "a").deliver(3.12, 0, "a", attempt=2).ack(3.13, 0, 1).end()
    report = check(on_time.h)
    assert report.ok, report.summary()
    early = _with_policy(Story(), policy).hello(0.0).subscribe(0.01).publish(0.1, "a", 0)
    early.deliver(0.12, 0, "a").deliver(0.12 + PERIOD, 0, "a", attempt=2)
    early.ack(0.12 + PERIOD + 0.01, 0, 1).end()
    assert "G4/early-redelivery" in early.rules()
