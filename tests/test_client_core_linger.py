"""``linger`` in the sans-IO client core: a partial PUBLISH batch may wait to fill.

Without it (the default) a publish goes out as soon as the connection is free;
with it, a partial batch waits until its oldest item has waited ``linger``, a
full one goes at once, and a retry never waits again.
"""

from __future__ import annotations

import math

import pytest
from test_client_core_support import ids_of, open_shard, out, published, ready_core, reopen_shard

from flux import protocol as P


def test_without_linger_a_lone_publish_goes_out_at_once() -> None:
    core = ready_core()
    core.publish("t", b"x", "a", 0.0)
    conn = open_shard(core)
    [frame] = out(core, conn)
    assert frame[0] == P.PUBLISH and ids_of(frame) == ["a"]


def test_partial_batch_waits_for_linger_then_goes_in_one_frame() -> None:
    core = ready_core(linger=0.5)
    core.publish("t", b"a", "a", 0.0)
    conn = open_shard(core)
    assert out(core, conn, 0.1) == []
    core.publish("t", b"b", "b", 0.2)
    assert out(core, conn, 0.3) == []
    assert core.next_deadline() == 0.5
    core.tick(0.5)
    assert conn.id in core.take_writable()
    [frame] = out(core, conn, 0.5)
    assert frame[2] == [["t", ["a", "b"], [b"a", b"b"]]]
    assert core.next_deadline() > 0.5  # nothing left due: the shell's timer does not spin


def test_a_full_batch_does_not_linger() -> None:
    core = ready_core(linger=1.0)
    for i in range(300):
        core.publish("t", b"x", f"id{i}", 0.0)
    conn = open_shard(core)
    assert [len(ids_of(f)) for f in out(core, conn, 0.0)] == [256]
    assert core.next_deadline() == 1.0  # the 44 left wait for more, at most until then


def test_a_due_linger_timer_with_a_full_window_is_not_rearmed_until_a_reply() -> None:
    core = ready_core(linger=0.5)
    for i in range(33 * 256):  # 32 frames fill the in-flight window; one more batch waits
        core.publish("t", b"x", f"id{i}", 0.0)
    conn = open_shard(core)
    frames = out(core, conn, 0.0)
    assert len(frames) == 32
    core.tick(0.5)
    assert out(core, conn, 0.5) == [] and core.next_deadline() > 0.5
    first = frames[0]
    published(core, conn, first, list(range(256)), now=0.6)
    assert [len(ids_of(f)) for f in out(core, conn, 0.6)] == [256]


def test_a_retried_publish_does_not_linger_again() -> None:
    core = ready_core(linger=0.5)
    core.publish("t", b"x", "a", 0.0)
    conn = open_shard(core)
    core.tick(0.5)
    [first] = out(core, conn, 0.5)
    core.connection_lost(conn.id, 0.6)
    conn2, now = reopen_shard(core, 0.6)
    [again] = out(core, conn2, now)
    assert again[2] == first[2]


@pytest.mark.parametrize("linger", [-1.0, 60.0, math.inf])
def test_linger_must_be_below_retry_deadline(linger: float) -> None:
    with pytest.raises(ValueError, match="linger"):
        ready_core(linger=linger, retry_deadline=60.0)
