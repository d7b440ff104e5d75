"""G1/ack-refused on hand-written histories: a delivered offset's ack refused as not
delivered is a violation while the session lives, whether or not it ends later."""

from __future__ import annotations

from flux.sim import history as h
from sim.test_checker import G, Story


def _refused(ended: float | None) -> Story:
    s = Story().hello(0.0).subscribe(0.01)
    s.publish(0.1, "a", 0).deliver(0.12, 0, "a").ack_sent(0.13, 0)
    s.add(h.AckRefused(0.14, "c1/n", 1, "t", G, 0, "NotDelivered"))
    if ended is not None:
        # the client gives up on a session whose acks fail (the iterator raises)
        s.add(h.SessionEnded(ended, "c1/n", 1, "t", "unsubscribed"))
    return s


def test_ack_of_a_delivered_offset_refused_on_a_live_session_is_caught() -> None:
    assert "G1/ack-refused" in _refused(None).end().rules()


def test_ack_refused_then_session_ended_is_still_caught() -> None:
    assert "G1/ack-refused" in _refused(0.2).end().rules()


def test_ack_refused_after_the_session_ended_is_not_judged() -> None:
    s = Story().hello(0.0).subscribe(0.01)
    s.publish(0.1, "a", 0).deliver(0.12, 0, "a").ack_sent(0.13, 0)
    s.add(h.SessionEnded(0.135, "c1/n", 1, "t", "lost"))
    s.add(h.AckRefused(0.14, "c1/n", 1, "t", G, 0, "NotDelivered"))
    assert "G1/ack-refused" not in s.end().rules()
