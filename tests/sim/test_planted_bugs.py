"""The checker is worth trusting: each bug planted in the broker or client trips the rule
it is meant to, within a few seeds, and every rule of the catalogue has such a bug."""

from __future__ import annotations

import pytest

from flux.sim.checker import RULES
from flux.sim.runner import run
from sim.planted import EXPECT, FIRST_SEED, NO_PLANT, PLANTED, SCENARIO

MAX_SEEDS = 50


@pytest.mark.sim
@pytest.mark.parametrize("bug", list(PLANTED))
def test_planted_bug_trips_its_rule(bug: str) -> None:
    expected = set(EXPECT[bug])
    seen: set[str] = set()
    first = FIRST_SEED.get(bug, 0)
    with PLANTED[bug]():
        for seed in range(first, first + MAX_SEEDS):
            result = run(seed, SCENARIO.get(bug, "default"))
            assert "crash" not in result.rules, result.problems()[:3]
            seen.update(result.rules)
            if expected <= seen:
                return
    pytest.fail(f"planted bug {bug!r} did not trip {sorted(expected - seen)} in"
                f" {MAX_SEEDS} seeds (it tripped {sorted(seen)})")


def test_every_planted_bug_names_rules_of_the_catalogue() -> None:
    assert set(EXPECT) == set(PLANTED)
    for bug, rules in EXPECT.items():
        assert rules and set(rules) <= set(RULES), bug
    assert set(SCENARIO) <= set(PLANTED) and set(FIRST_SEED) <= set(PLANTED)


def test_every_rule_of_the_catalogue_is_some_planted_bugs_catch() -> None:
    expected = {rule for rules in EXPECT.values() for rule in rules}
    assert set(NO_PLANT) <= set(RULES)
    assert not expected & set(NO_PLANT)
    assert set(RULES) - expected == set(NO_PLANT)


@pytest.mark.sim
def test_without_planted_bugs_the_same_seeds_pass() -> None:
    for seed in range(3):
        result = run(seed, "default")
        assert result.ok, result.problems()[:3]
