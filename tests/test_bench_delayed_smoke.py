"""A tiny run of the delayed-delivery benchmark: both core fills, the kept-on-disk fill,
and a short lateness run through a real server (no figure is asserted: speed and size
live in its own runs)."""

from __future__ import annotations

import pytest

from flux.bench.delayed import fill, kept, kept_line, lateness, lateness_line, memory_line

pytestmark = pytest.mark.integration


def test_the_memory_fills_hold_every_message_and_report() -> None:
    plain, delayed = fill(2000, 100, False), fill(2000, 100, True)
    assert (plain.count, delayed.count, plain.delayed, delayed.delayed) == (2000, 2000, False, True)
    assert plain.bytes_per_message > 0 and delayed.bytes_per_message > 0
    assert "B per pending message" in memory_line(plain, delayed)


def test_the_kept_fill_keeps_every_message_out_of_line_and_reports() -> None:
    figures = kept(1000, 100)  # (it raises unless all 1000 are kept below the oldest)
    assert figures.count == 1000 and figures.bytes_per_message > 0
    assert "kept out of line" in kept_line(figures)


def test_a_short_lateness_run_receives_every_message_and_reports() -> None:
    figures = lateness(500.0, 0.5, backlog=1000)
    assert figures.received == figures.sent == 250
    assert figures.max >= figures.p99 >= figures.p50
    assert "p99" in lateness_line(figures)
