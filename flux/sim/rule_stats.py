"""``flux sim --rule-stats``: how often each checker rule judged something in a sweep.

A rule that examined no fact in any run could not have failed there, so a sweep
that never exercises it says nothing about it; the table makes such rules visible.
Counts come from :attr:`flux.sim.checker.Report.examined`, carried back per run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from rich.table import Table

from flux.sim.checker import RULES


@dataclass
class RuleStats:
    """Per ``guarantee/rule``: runs that examined it, facts examined, runs that broke it."""

    runs: int = 0
    examined_runs: dict[str, int] = field(default_factory=dict)
    facts: dict[str, int] = field(default_factory=dict)
    broken_runs: dict[str, int] = field(default_factory=dict)

    def add(self, examined: dict[str, int], broken: Iterable[str]) -> None:
        """Count one run: what its rules examined, and which rules it broke."""
        self.runs += 1
        for rule, n in examined.items():
            if n > 0:
                self.examined_runs[rule] = self.examined_runs.get(rule, 0) + 1
                self.facts[rule] = self.facts.get(rule, 0) + n
        for rule in set(broken):
            if rule in RULES:   # not "crash": a run that raised is no rule's
                self.broken_runs[rule] = self.broken_runs.get(rule, 0) + 1

    def idle(self) -> list[str]:
        """Rules of the catalogue that examined nothing in any run."""
        return [rule for rule in sorted(RULES) if not self.facts.get(rule)]

    def table(self) -> Table:
        table = Table(title=f"Checker rules over {self.runs} run(s)", title_justify="left",
                      caption=f"runs: runs in which the rule examined a fact; facts: in all;"
                              f" broken: runs that broke it.  {len(self.idle())} of"
                              f" {len(RULES)} rules examined nothing.",
                      caption_justify="left")
        table.add_column("rule", no_wrap=True)
        table.add_column("runs", justify="right")
        table.add_column("facts", justify="right")
        table.add_column("broken", justify="right")
        table.add_column("", no_wrap=True)
        for rule in sorted(RULES):
            facts = self.facts.get(rule, 0)
            broken = self.broken_runs.get(rule, 0)
            note = "[yellow]examined nothing[/]" if not facts else ""
            table.add_row(rule, str(self.examined_runs.get(rule, 0)), str(facts),
                          f"[red]{broken}[/]" if broken else "0", note)
        return table
