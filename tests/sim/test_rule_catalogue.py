"""The catalogue of checker rules: complete, enforced, and counted by ``--rule-stats``."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from flux.cli import main
from flux.sim import checker
from flux.sim.checker import RULES, Report
from flux.sim.command import run_one
from flux.sim.rule_stats import RuleStats

CHECKER = Path(checker.__file__).parent
# rule ids pull.py builds at run time from what a cursor reply was
BUILT = {"G6/commit-moved-back", "G6/resume-below-commit"}


def _reported() -> set[str]:
    """Every ``report.add("G", "rule"`` written out in the checker's source."""
    found: set[str] = set()
    for path in CHECKER.glob("*.py"):
        text = path.read_text()
        found |= {f"{g}/{r}" for g, r in re.findall(r'report\.add\(\s*"([^"]+)",\s*"([^"]+)"',
                                                    text)}
    return found


def test_every_rule_the_checker_reports_is_in_the_catalogue() -> None:
    reported = _reported()
    assert reported, "found no report.add( calls: has the checker moved?"
    assert reported - set(RULES) == set()
    assert set(RULES) - reported == BUILT


def test_every_rule_has_a_description() -> None:
    for rule, text in RULES.items():
        assert re.fullmatch(r"(G\d+|liveness)/[a-z0-9-]+", rule), rule
        assert text and "\n" not in text, rule


def test_report_refuses_a_rule_outside_the_catalogue() -> None:
    report = Report()
    with pytest.raises(ValueError, match="G1/ordre"):
        report.add("G1", "ordre", 1.0, "a typo")
    with pytest.raises(ValueError, match="G1/ordre"):
        report.examine("G1", "ordre")
    report.add("G1", "order", 1.0, "a known rule")
    assert report.rules() == ["G1/order"]


def test_rule_stats_counts_runs_facts_and_breaks() -> None:
    stats = RuleStats()
    stats.add({"G1/order": 5, "G2/lost": 0}, ["G1/order", "crash"])
    stats.add({"G1/order": 2}, [])
    assert stats.runs == 2
    assert stats.examined_runs["G1/order"] == 2 and stats.facts["G1/order"] == 7
    assert stats.broken_runs == {"G1/order": 1}
    assert "G2/lost" in stats.idle() and "G1/order" not in stats.idle()
    assert len(stats.idle()) == len(RULES) - 1


@pytest.mark.sim
def test_a_worker_sends_back_what_each_rule_examined() -> None:
    outcome = run_one((0, "default", None, False))
    outcome = pickle.loads(pickle.dumps(outcome))   # as it comes back from a worker
    assert outcome.ok and outcome.examined
    assert set(outcome.examined) <= set(RULES)
    assert outcome.examined["G1/order"] > 0


@pytest.mark.sim
def test_sim_rule_stats_prints_every_rule_and_marks_idle_ones() -> None:
    result = CliRunner().invoke(main, ["sim", "--seeds", "0:2", "--scenario", "no-faults",
                                       "--workers", "1", "--rule-stats"], terminal_width=120)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    for rule in RULES:
        row = next((line for line in lines if f" {rule} " in line), None)
        assert row is not None, f"{rule} missing from the table"
        numbers = [int(n) for n in re.findall(r"│\s+(\d+)\s+(?=│)", row)]
        assert len(numbers) == 3, row
        runs, facts, broken = numbers
        assert broken == 0 and runs <= 2
        assert ("examined nothing" in row) == (facts == 0), row
    # a run without faults never restarts a shard: that rule judges nothing there
    assert "examined nothing" in next(line for line in lines if " G7/reset-start " in line)
    assert "G1/order" in result.output and "examined nothing." in result.output
