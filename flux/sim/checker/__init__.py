"""The checker: one pass over a whole history, every violation of G1-G7 named.

Jepsen-style accounting of every published message (acked, delivered, lost and
whether a crash explains it) plus Flux's own rules: order, dedup, redelivery
schedule, cleanup, subscription lifetime, the pull path's pages and cursors, and
liveness once faults heal. Shared
by the simulator and chaos runs; it reads only :mod:`flux.sim.history` data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flux.sim.checker.index import Index, Params
from flux.sim.history import History

__all__ = ["Params", "Report", "Violation", "check"]


@dataclass(frozen=True, order=True)
class Violation:
    """One broken rule: the guarantee (G1-G7 or ``liveness``), a rule id and the evidence."""

    t: float
    guarantee: str
    rule: str
    message: str

    def __str__(self) -> str:
        return f"[{self.guarantee} {self.rule}] t={self.t:.6f}: {self.message}"


@dataclass
class Report:
    violations: list[Violation] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    # ``guarantee/rule`` -> how many facts (events, pages, messages) the rule judged
    examined: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def add(self, guarantee: str, rule: str, t: float, message: str) -> None:
        self.violations.append(Violation(t, guarantee, rule, message))

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n

    def examine(self, guarantee: str, rule: str, n: int = 1) -> None:
        """Rule ``guarantee/rule`` judged ``n`` more facts (whether or not they broke it),
        so a rule that never fires in a scenario set shows up (``flux sim --rule-stats``)."""
        key = f"{guarantee}/{rule}"
        self.examined[key] = self.examined.get(key, 0) + n

    def rules(self) -> list[str]:
        """Distinct ``guarantee/rule`` ids broken, in order of first occurrence."""
        seen: dict[str, None] = {}
        for v in sorted(self.violations):
            seen.setdefault(f"{v.guarantee}/{v.rule}", None)
        return list(seen)

    def summary(self, limit: int = 20) -> str:
        lines = [", ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))]
        ordered = sorted(self.violations)
        lines += [str(v) for v in ordered[:limit]]
        if len(ordered) > limit:
            lines.append(f"... and {len(ordered) - limit} more violations")
        return "\n".join(lines)


def check(history: History) -> Report:
    """Check ``history`` against G1-G7 and liveness; the report lists every violation."""
    from flux.sim.checker import bad_input, calls, delivery, liveness, publish, pull, retention, starts

    report = Report()
    index = Index(history)
    publish.check(index, report)
    calls.check(index, report)
    delivery.check(index, report)
    retention.check(index, report)
    starts.check(index, report)
    liveness.check(index, report)
    pull.check(index, report)
    bad_input.check(index, report)
    # the same fact can break a rule more than once (e.g. one message, many sessions)
    report.violations = sorted(set(report.violations))
    return report
