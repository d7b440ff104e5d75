"""A tiny run of the dedup-window micro-benchmark: it fills, holds and reports (no
figure is asserted: speed lives in the benchmark's own runs)."""

from __future__ import annotations

from flux.bench.dedup import measure


def test_a_small_dedup_bench_fills_holds_and_reports() -> None:
    figures = measure(3000, 64)
    assert figures.size == 3000 and figures.group == 64
    assert figures.group_max_ms >= figures.group_p999_ms >= 0
    assert figures.slice_max_ms >= figures.slice_p999_ms >= 0
    assert figures.group_wall_max_ms >= 0 and figures.slice_wall_max_ms >= 0
    assert "groups of 64" in figures.line()
