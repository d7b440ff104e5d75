"""The checker is worth trusting: each bug planted in the shard is caught within a few seeds."""

from __future__ import annotations

import pytest

from flux.sim.runner import run
from sim.planted import PLANTED, SCENARIO

MAX_SEEDS = 20


@pytest.mark.sim
@pytest.mark.parametrize("bug", list(PLANTED))
def test_planted_bug_is_caught(bug: str) -> None:
    with PLANTED[bug]():
        for seed in range(MAX_SEEDS):
            result = run(seed, SCENARIO.get(bug, "default"))
            if not result.ok:
                assert result.rules and "crash" not in result.rules, result.problems()[:3]
                return
    pytest.fail(f"planted bug {bug!r} survived {MAX_SEEDS} seeds")


@pytest.mark.sim
def test_without_planted_bugs_the_same_seeds_pass() -> None:
    for seed in range(3):
        result = run(seed, "default")
        assert result.ok, result.problems()[:3]
