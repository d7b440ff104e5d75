"""The catalogue of checker rules: complete and enforced."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flux.sim import checker
from flux.sim.checker import RULES, Report

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
