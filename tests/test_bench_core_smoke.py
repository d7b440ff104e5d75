"""A tiny run of the shard core benchmark in every mode: each message is delivered once
and acked (no figure is asserted: speed lives in the benchmark's own runs)."""

from __future__ import annotations

import pytest

from flux.bench.core import MODES, main, run


@pytest.mark.parametrize("mode", list(MODES))
def test_a_small_core_bench_delivers_and_acks_every_message(mode: str) -> None:
    figures = run(mode, 1000, 50)
    assert figures.messages == figures.delivered == figures.acked == 1000
    assert figures.cpu >= 0 and figures.us_per_message >= 0


def test_acks_that_lag_leave_the_last_groups_unacked() -> None:
    figures = run("shared", 1000, 50, lag=3)
    assert figures.delivered == 1000 and 1000 - 4 * 50 <= figures.acked < 1000
    assert run("single", 1000, 50, through=True).acked == 1000


def test_the_command_prints_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--mode", "keyed", "--count", "200", "--group", "20", "--repeat", "2"])
    out = capsys.readouterr().out
    assert out.startswith("keyed: ") and "us of process CPU a message (best of 2" in out
