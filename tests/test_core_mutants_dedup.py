"""Dedup-window and observer-hook details that surviving mutants showed unchecked
(``make mutate``): bytes of an id accepted again after its window, and the
takeover event the shard core reports to its observer.
"""

from __future__ import annotations

from flux.shard.dedup import EXPIRE_SLICE, DedupWindow


def test_an_id_accepted_again_after_its_window_counts_its_bytes_once() -> None:
    dedup = DedupWindow(10.0)
    many = [f"{i:05d}" for i in range(EXPIRE_SLICE + 10)]
    dedup.remember_all(many, 0, 0.0)
    dedup.remember("aa", len(many), 0.0)
    # past its window, and behind more due ids than one call forgets: still known
    dedup.remember("aa", 5000, 12.0)
    assert dedup.live_bytes(12.0) == 2
    assert dedup.lookup("aa", 13.0) == 5000
    dedup.expire(30.0)
    assert dedup.held_bytes == 0 and dedup.live_bytes(30.0) == 0


def test_a_lookup_forgets_at_most_one_slice_of_due_ids() -> None:
    dedup = DedupWindow(10.0)
    dedup.remember_all([f"{i:05d}" for i in range(3 * EXPIRE_SLICE)], 0, 0.0)
    assert dedup.lookup("other", 20.0) is None
    assert len(dedup) == 2 * EXPIRE_SLICE
