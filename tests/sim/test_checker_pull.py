"""The pull-path rules on hand-written histories: a clean reader passes, each broken
rule is named, and what delays or deletions explain is not called a violation."""

from __future__ import annotations

from flux import protocol as P
from flux.sim import history as h
from flux.sim.checker import check
from flux.sim.tap import Recorder, WireTap
from sim.test_checker import G2, G, Story

READER = "c1/n"


class Reader(Story):
    """A Story whose client ``c1`` reads topic ``t`` through pull subscription ``n``."""

    def __init__(self, *, oracle: bool = True, live: bool = False) -> None:
        super().__init__(oracle=oracle, liveness=False)
        if live:
            self.h.meta["liveness"] = [{"subscriber": READER, "topic": "t", "pull": True}]
        self.sessions = 0

    def pull(self, t: float, *, created: bool = True, start: int = 0, cursor: int | None = None,
             generation: int = G, requested: float | None = None) -> Reader:
        self.sessions += 1
        self.add(h.Subscribed(t, READER, self.sessions, "c1", 0, "t", "n", generation, created,
                              start, start if cursor is None else cursor, False, 1, None,
                              t - 0.002 if requested is None else requested, None,
                              read_old=True, mode="pull"))
        return self

    def fetch(self, t: float, offset: int, ids: tuple[str, ...], *, first: int | None = None,
              oldest: int = 0, next: int | None = None, generation: int = G,
              asked: int | None = G, max_messages: int = 10) -> Reader:
        first = max(offset, oldest) if first is None else first
        next = first + len(ids) if next is None else next
        self.add(h.FetchSent(t - 0.002, READER, "c1", 0, "t", "n", asked, offset, max_messages))
        self.add(h.Fetched(t, READER, "c1", 0, "t", "n", generation, asked, offset, max_messages,
                           oldest, next, first, ids, t - 0.002))
        return self

    def commit(self, t: float, offset: int, cursor: int | None = None, *,
               requested: float | None = None, generation: int = G) -> Reader:
        sent = t - 0.002 if requested is None else requested
        if requested is None:
            self.commit_sent(sent, offset, generation)
        return self.add(h.Committed(t, READER, "c1", 0, "t", "n", generation, offset,
                                    offset if cursor is None else cursor, sent))

    def commit_sent(self, t: float, offset: int, generation: int = G) -> Reader:
        return self.add(h.CommitSent(t, READER, "c1", 0, "t", "n", generation, offset))


def reading() -> Reader:
    """Three messages, read in two pages and committed after each."""
    s = Reader(live=True).hello(0.0).pull(0.01)
    s.publish(0.1, "a", 0).publish(0.1, "b", 1).publish(0.1, "c", 2)
    assert isinstance(s, Reader)
    return s.fetch(0.2, 0, ("a", "b"), next=3).commit(0.3, 2).fetch(0.4, 2, ("c",)).commit(0.5, 3)


def test_a_clean_pull_reader_passes() -> None:
    report = check(reading().end().h)
    assert report.ok, report.summary()
    assert report.counts["fetched_pages"] == 2


def test_a_page_with_another_message_at_an_offset_breaks_g1() -> None:
    s = reading().fetch(0.6, 1, ("c",), next=3)   # offset 1 holds "b"
    assert "G1/fetch-id" in s.end().rules()


def test_a_page_with_a_message_nobody_published_is_unexpected() -> None:
    s = reading().publish(0.55, "d", 3).fetch(0.6, 3, ("zzz",))
    assert "G2/fetch-unexpected" in s.end().rules()


def test_a_page_that_does_not_start_at_the_offset_asked_breaks_g1() -> None:
    s = reading().fetch(0.6, 0, ("b",), first=1, next=3)   # oldest 0: it had to start at 0
    assert "G1/fetch-range" in s.end().rules()


def test_an_empty_page_while_messages_are_held_breaks_g2() -> None:
    s = reading().fetch(0.6, 1, (), next=3)
    assert "G2/fetch-empty" in s.end().rules()
    # asking for no message at all gets none, rightly
    s = reading().fetch(0.6, 1, (), next=3, max_messages=0)
    assert check(s.end().h).ok


def test_a_page_whose_next_is_below_an_acked_offset_breaks_g1() -> None:
    s = reading().fetch(0.6, 3, (), next=2, oldest=2, first=3)
    assert "G1/fetch-next" in s.end().rules()


def test_a_page_of_another_generation_than_asked_breaks_g7() -> None:
    s = reading().fetch(0.6, 0, (), generation=G2, asked=G, next=0)
    assert "G7/fetch-generation" in s.end().rules()


def _skipped(*, committed: int, deleted: bool = False, oracle: bool = True) -> Reader:
    """Offsets 0-2 stored; the reader committed to ``committed``; then a FETCH from 1
    finds offsets below 2 cleaned up."""
    s = Reader(oracle=oracle).hello(0.0).pull(0.01)
    s.publish(0.1, "a", 0).publish(0.1, "b", 1).publish(0.1, "c", 2)
    assert isinstance(s, Reader)
    s.fetch(0.2, 0, ("a",), next=3).commit(0.3, committed)
    if deleted:
        s.add(h.SubscriptionGone(3.0, 0, G, "t", "n"))
    s.add(h.Trimmed(3.5, 0, G, "t", 0, 2))
    return s.fetch(4.0, 1, ("c",), oldest=2)


def test_a_fetch_that_finds_uncommitted_messages_cleaned_up_breaks_g5() -> None:
    assert "G5/fetch-skipped" in _skipped(committed=1).end().rules()


def test_cleanup_below_the_committed_cursor_is_not_a_skip() -> None:
    report = check(_skipped(committed=2).end().h)
    assert report.ok, report.summary()


def test_messages_of_a_deleted_pull_subscription_may_go() -> None:
    """G5: once the oracle saw it deleted, what it held may be cleaned up."""
    rules = _skipped(committed=1, deleted=True).end().rules()
    assert "G5/fetch-skipped" not in rules and "G5/deleted-unacked" not in rules


def _undone(*, stopped: bool) -> Reader:
    """A disk topic's pull subscription, committed to 1, is deleted and offsets 0-1 are
    trimmed; the shard's log fails before either is durable (``stopped``), and the
    reader resumes the subscription its recovery brought back, at cursor 1."""
    s = Reader().hello(0.0, generation=0x5A)   # the shard's generation; the topic's is G
    s.pull(0.01)
    s.publish(0.1, "a", 0).publish(0.1, "b", 1).publish(0.1, "c", 2)
    s.fetch(0.2, 0, ("a",), next=3).commit(0.3, 1)
    s.add(h.SubscriptionGone(3.0, 0, G, "t", "n")).add(h.Trimmed(3.5, 0, G, "t", 0, 2))
    if stopped:
        s.add(h.ShardStopped(3.6, 0, 0x5A)).hello(4.5, generation=0x5B)
    s.pull(5.0, created=False, start=0, cursor=1)
    return s.fetch(5.1, 1, ("b", "c"), oldest=0).commit(5.2, 3)


def test_a_trim_a_crash_undid_with_the_deletion_before_it_is_not_judged() -> None:
    """G9: neither the deletion nor the trim was durable; recovery brought both the
    subscription and the messages back (disk-errors seed 172: G5/deleted-unacked)."""
    report = check(_undone(stopped=True).end().h)
    assert "G5/deleted-unacked" not in report.rules(), report.summary()


def test_a_subscription_found_again_without_a_crash_held_what_was_trimmed() -> None:
    """With no stop between, the trim of what it had not committed breaks G5."""
    assert "G5/deleted-unacked" in _undone(stopped=False).end().rules()


def test_without_an_oracle_a_skip_is_not_judged() -> None:
    assert "G5/fetch-skipped" not in _skipped(committed=1, oracle=False).end().rules()


def test_cleanup_of_what_a_pull_subscription_has_not_committed_breaks_g5() -> None:
    assert "G5/deleted-unacked" in _skipped(committed=1).end().rules()


def test_a_committed_cursor_below_the_commit_offset_breaks_g6() -> None:
    s = reading().commit(0.6, 3, cursor=2)
    assert "G6/commit-not-applied" in s.end().rules()


def test_a_cursor_that_moves_back_breaks_g6() -> None:
    s = reading().commit(0.6, 1, cursor=1)   # a stale commit: the cursor stays at 3
    assert "G6/commit-moved-back" in s.end().rules()


def test_a_commit_reply_that_crossed_a_later_one_is_not_a_move_back() -> None:
    """Sent before the reply to the commit to 3 arrived, a commit may be answered first."""
    s = Reader().hello(0.0).pull(0.01).publish(0.1, "a", 0).publish(0.1, "b", 1)
    assert isinstance(s, Reader)
    s.fetch(0.2, 0, ("a", "b")).commit_sent(0.25, 1).commit(0.3, 2)
    s.commit(0.9, 1, cursor=1, requested=0.25)    # held up on its way
    report = check(s.end().h)
    assert report.ok, report.summary()


def test_a_resume_below_the_committed_cursor_breaks_g6() -> None:
    s = reading().pull(1.0, created=False, start=0, cursor=1)
    assert "G6/resume-below-commit" in s.end().rules()


def test_a_resume_after_the_subscription_was_deleted_may_start_lower() -> None:
    s = reading().add(h.SubscriptionGone(2.0, 0, G, "t", "n"))
    assert isinstance(s, Reader)
    report = check(s.pull(3.0, created=True, start=0).end().h)
    assert "G6/resume-below-commit" not in report.rules(), report.summary()


def test_a_live_reader_that_stops_short_of_the_end_is_behind() -> None:
    s = reading().publish(0.6, "d", 3)
    assert "liveness/pull-behind" in s.end().rules()
    assert "liveness/pull-behind" not in reading().end().rules()


def test_pull_events_survive_serialisation() -> None:
    events = reading().end().h.events
    for event in events:
        assert h.event_from_dict(event.to_dict()) == event


def test_the_tap_records_fetch_and_commit_both_ways() -> None:
    now = [0.0]
    history = h.History()
    tap = WireTap(Recorder(history, clock=lambda: now[0]), "c1")
    tap.outgoing(P.encode([P.SUBSCRIBE, 1, 7, {"topic": "t", "name": "n", "mode": "pull"}]))
    now[0] = 0.1
    tap.incoming(P.encode([P.SUBSCRIBED, 1, 7, {
        "created": True, "start_offset": 0, "cursor": 0, "generation": 5}]))
    tap.outgoing(P.encode([P.FETCH, 2, {"topic": "t", "name": "n", "generation": 5,
                                        "offset": 0, "max_messages": 2}]))
    now[0] = 0.2
    tap.incoming(P.encode([P.FETCHED, 2, {"generation": 5, "oldest": 0, "next": 3}, 0,
                           ["a", "b"], [b"a", b"b"], [1.0, 2]]))
    tap.outgoing(P.encode([P.COMMIT, 3, {"topic": "t", "name": "n", "generation": 5,
                                         "offset": 2}]))
    tap.outgoing(P.encode([P.COMMIT, 4, {"topic": "t", "name": "n", "generation": 4,
                                         "offset": 2}]))
    now[0] = 0.3
    tap.incoming(P.encode([P.COMMITTED, 3, {"cursor": 2}]))
    tap.incoming(P.encode([P.ERROR, 4, 50, "reset", {"old": 4, "new": 5}]))
    tap.closed()
    assert [e.mode for e in history.of(h.Subscribed)] == ["pull"]
    assert not history.of(h.SessionEnded)   # a pull SUBSCRIBE attaches nothing
    (fetched,) = history.of(h.Fetched)
    assert (fetched.first, fetched.ids, fetched.next, fetched.requested) == (0, ("a", "b"), 3, 0.1)
    (committed,) = history.of(h.Committed)
    assert (committed.offset, committed.cursor, committed.requested) == (2, 2, 0.2)
    (refused,) = history.of(h.PullRefused)
    assert (refused.request, refused.error, refused.generation) == ("commit", "TopicReset", 4)
    assert len(history.of(h.CommitSent)) == 2 and len(history.of(h.FetchSent)) == 1


def test_a_pull_subscription_deleted_while_it_is_read_breaks_g6() -> None:
    """G6: a FETCH naming it keeps it active; deleted sooner than inactive_time (4 s)
    after one was sent is too early, after that it is fine."""
    for fetched, rules in ((3.0, ["G6/deleted-too-early"]), (1.0, [])):
        s = Reader().hello(0.0).pull(0.01).publish(0.1, "a", 0)
        assert isinstance(s, Reader)
        s.fetch(0.2, 0, ("a",)).commit(0.3, 1).fetch(fetched, 1, ())
        s.add(h.SubscriptionGone(6.0, 0, G, "t", "n"))
        assert [r for r in s.end().rules() if r.startswith("G6")] == rules, fetched


def _resumed_past_durable(*, stopped: bool) -> Reader:
    """A disk topic's pull subscription is committed to 1 (COMMITTED: durable); a COMMIT
    to 3 moves it in memory, and a resume at 0.5 reports cursor 3 before that COMMIT's
    record is durable. ``stopped``: the shard then stops (its COMMITTED never comes),
    and recovery brings the subscription back at its last durable cursor, 1."""
    s = Reader().hello(0.0, generation=0x5A)   # the shard's generation; the topic's is G
    s.pull(0.01)
    s.publish(0.1, "a", 0).publish(0.1, "b", 1).publish(0.1, "c", 2)
    s.fetch(0.2, 0, ("a", "b", "c")).commit(0.3, 1).commit_sent(0.4, 3)
    s.pull(0.5, created=False, cursor=3)
    if stopped:
        s.add(h.ShardStopped(0.6, 0, 0x5A)).hello(1.5, generation=0x5B)
    return s.pull(2.0, created=False, cursor=1)


def test_a_resumed_cursor_a_crash_undid_is_no_floor_for_the_next_resume() -> None:
    """G9 waits for durability before COMMITTED, not before a resuming SUBSCRIBED: the
    cursor a resume reports may hold a commit the crash lost (same generation)."""
    report = check(_resumed_past_durable(stopped=True).end().h)
    assert "G6/resume-below-commit" not in report.rules(), report.summary()


def test_a_resume_below_the_last_one_without_a_stop_between_breaks_g6() -> None:
    assert "G6/resume-below-commit" in _resumed_past_durable(stopped=False).end().rules()
