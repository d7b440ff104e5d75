"""G5 and G2 beside dead letters (G11), on hand-written histories: a message that went to
its subscription's dead-letter topic counts as acked from when it was written, as far
as the reads of that topic can tell, and need never reach the subscriber."""

from __future__ import annotations

from flux.hashing import dead_letter_topic
from flux.sim import history as h
from flux.sim.checker import check
from flux.sim.checker.index import Index
from flux.sim.simhost import EPOCH
from sim.test_checker import CONFIG, G2, G, Story

DLQ = dead_letter_topic("t", "n")


def _story() -> Story:
    """Subscription ``n`` on ``t``, whose policy sends exhausted messages to ``DLQ``;
    offset 0 is published at 0.1 and pushed once, never acked."""
    s = Story(oracle=True)
    s.h.meta["config"] = {**CONFIG, "dead_letter": {"enabled": True}}
    s.hello(0.0).subscribe(0.01)
    return s.publish(0.1, "a", 0)


def _read(s: Story, sent: float, letters: dict[int, float], generation: int = G,
          pushes: int = 3) -> Story:
    """A whole read of ``DLQ``, sent at ``sent``: the dead letters of ``t``'s offsets
    ``letters``, each written at the simulated time given, out of pushes after
    ``pushes`` (retry_count is 2)."""
    metas = tuple(h.meta_key(None, {
        "flux-topic": "t", "flux-generation": str(G), "flux-offset": str(offset),
        "flux-subscription": "n", "flux-reason": "exhausted", "flux-pushes": str(pushes),
        "flux-time": f"{EPOCH + at:.6f}"}) for offset, at in letters.items())
    ids = tuple("a" for _ in letters)
    return s.add(h.Fetched(sent + 0.002, "d0/~", "d0", 0, DLQ, None, generation, None, 0,
                           1000, 0, len(ids), 0, ids, sent, ("",) * len(ids), metas))


def _rules(s: Story) -> list[str]:
    s.h.meta["liveness"] = []
    return s.end(20.0).rules()


def test_a_dead_letter_counts_acked_from_the_instant_flux_time_names() -> None:
    """flux-time is printed to the microsecond and read back as a float near 1.7e9:
    8.411 comes back a little later than the trim at 8.411 that followed the letter."""
    s = _story().deliver(0.12, 0, "a")
    s.add(h.Trimmed(8.411, 0, G, "t", 0, 1))
    _read(s, 8.42, {0: 8.411})
    index = Index(s.end(20.0).h)
    inc = index.incarnations[0]
    assert index.dead_letters[("t", G, "n")][0].at > 8.411   # the float error itself
    assert index.settled(inc)[0] <= 8.411


def test_a_trim_of_a_dead_letter_lost_with_its_shard_before_any_read_passes() -> None:
    """The letter written between the last read (0.5) and the trim (3.0) is gone with
    the memory topic's shard at 3.2: no read of that generation shows it."""
    s = _story().deliver(0.12, 0, "a")
    _read(s, 0.5, {})
    s.add(h.Trimmed(3.0, 0, G, "t", 0, 1))
    s.add(h.FaultInjected(3.2, "crash", "shard-0", "instant"))
    s.add(h.ShardStopped(3.2, 0, G))
    s.hello(3.5, G2, client="d0")
    _read(s, 4.0, {}, generation=G2)
    assert "G5/deleted-unacked" not in _rules(s)


def test_a_trim_that_a_later_whole_read_shows_no_dead_letter_for_breaks_g5() -> None:
    s = _story().deliver(0.12, 0, "a")
    _read(s, 0.5, {})
    s.add(h.Trimmed(3.0, 0, G, "t", 0, 1))
    _read(s, 3.1, {})        # sent after the trim: a letter written by then is in it
    assert "G5/deleted-unacked" in _rules(s)


def test_a_dead_letter_written_after_the_trim_breaks_g5() -> None:
    s = _story().deliver(0.12, 0, "a")
    _read(s, 0.5, {})
    s.add(h.Trimmed(3.0, 0, G, "t", 0, 1))
    _read(s, 3.6, {0: 3.5})
    assert "G5/deleted-unacked" in _rules(s)


def _disk_story() -> Story:
    """As ``_story``, on a disk topic (its generation G is no shard incarnation's)."""
    s = Story(oracle=True)
    s.h.meta["config"] = {**CONFIG, "dead_letter": {"enabled": True}}
    s.hello(0.0, G2).subscribe(0.01)
    return s.publish(0.1, "a", 0).deliver(0.12, 0, "a")


def test_a_disk_topics_dead_letter_is_looked_for_in_later_reads() -> None:
    """A disk topic's dead letter shows only once durable, so a read without it proves
    nothing of when it was written; but it stays, so some read shows it in the end,
    unless a storage fault of its machine took it away."""
    s = _disk_story()
    _read(s, 0.5, {})
    s.add(h.Trimmed(3.0, 0, G, "t", 0, 1))
    assert "G5/deleted-unacked" in _rules(s)
    s = _disk_story()
    _read(s, 0.5, {})
    s.add(h.Trimmed(3.0, 0, G, "t", 0, 1))
    s.add(h.FaultInjected(3.2, "power", "shard-0", "instant"))
    assert "G5/deleted-unacked" not in _rules(s)


def test_a_dead_lettered_message_its_subscriber_never_got_is_not_lost() -> None:
    """Its pushes all went to a session whose link lost them (G11: it ran out of pushes);
    the dead letter settles it. One without a dead letter is lost (G2)."""
    s = _story().publish(0.2, "b", 1)
    _read(s, 5.0, {0: 4.0})
    lost = [v.message for v in check(s.end(20.0).h).violations if v.rule == "lost"]
    assert len(lost) == 1 and lost[0].endswith("offsets 1"), lost


def test_a_dead_letter_out_of_pushes_before_it_used_them_all_breaks_g11() -> None:
    s = _story().deliver(0.12, 0, "a").deliver(1.62, 0, "a", attempt=2)
    _read(s, 3.0, {0: 2.9}, pushes=2)
    assert "G11/dead-letter-record" in _rules(s)
    s = _story().deliver(0.12, 0, "a").deliver(1.62, 0, "a", attempt=2)
    _read(s, 3.0, {0: 2.9}, pushes=3)
    assert "G11/dead-letter-record" not in _rules(s)
