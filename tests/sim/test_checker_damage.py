"""G9 damage on hand-written histories: a bit flipped while the shard runs (``rot``)
may end a disk topic's generation later, but only one that began before it; and no
damage stops a shard (only an fsync error, or a power loss at that instant, does)."""

from __future__ import annotations

from flux.sim import history as h
from sim.test_checker import Story

D0, D1, D2 = 0xD0, 0xD1, 0xD2   # a disk topic's generations (no shard answered with them)


def _fault(s: Story, t: float, fault: str, detail: str = "instant") -> Story:
    return s.add(h.FaultInjected(t, fault, "shard-0", detail))


def _rules(s: Story) -> list[str]:
    return s.end(20.0).rules()


def _acked(*generations: tuple[float, int]) -> Story:
    s = Story(liveness=False).hello(0.0)
    for i, (t, generation) in enumerate(generations):
        s.publish(t, f"m{i}", i, generation)
    return s


def test_a_rot_ends_a_disk_topics_generation_found_any_time_later() -> None:
    s = _acked((1.0, D1), (5.0, D1), (9.0, D2))  # acks of D1 go on after the rot at 2.0
    _fault(s, 2.0, "rot", "/data/flux/shard-0/t/00000000000000000000.log@90")
    assert "G9/generation-kept" not in _rules(s)


def test_a_rot_before_a_generation_began_does_not_explain_its_end() -> None:
    """D1 began after D0's last ack (0.5), by a recovery that read every record it kept:
    the rot at 0.2 was found then (the flip at 0.7 explains D0 to D1), not later."""
    s = _acked((0.5, D0), (1.0, D1), (9.0, D2))
    _fault(s, 0.2, "rot")
    _fault(s, 0.7, "flip")
    assert "G9/generation-kept" in _rules(s)


def test_damage_read_back_never_explains_a_shard_stopping_on_its_log() -> None:
    s = _acked((1.0, D1))
    _fault(s, 2.0, "rot")
    _fault(s, 3.0, "storage-failed", "shard 0: the log of topic 't' ... failed")
    assert "G9/storage-failed-unexplained" in _rules(s)


def test_a_power_loss_explains_a_log_failure_at_that_instant_only() -> None:
    at_once = _fault(_fault(_acked((1.0, D1)), 2.0, "power"), 2.0, "storage-failed")
    assert "G9/storage-failed-unexplained" not in _rules(at_once)
    later = _fault(_fault(_acked((1.0, D1)), 2.0, "power"), 6.0, "storage-failed")
    assert "G9/storage-failed-unexplained" in _rules(later)
    after_eio = _fault(_fault(_acked((1.0, D1)), 2.0, "eio"), 6.0, "storage-failed")
    assert "G9/storage-failed-unexplained" not in _rules(after_eio)
