"""Shrinking a failing fault plan by delta debugging (Zeller's ddmin).

Given a plan whose run fails, find a small sub-plan whose run still fails the
same way (breaks at least one of the same rules). Every candidate is a full
deterministic re-run of the seed, so the budget of re-runs is bounded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from flux.sim.faults import FaultPlan
from flux.sim.runner import RunResult, run


def ddmin(items: Sequence[int], fails: Callable[[list[int]], bool], budget: int) -> list[int]:
    """A 1-minimal-ish subset of ``items`` for which ``fails`` holds (within ``budget`` tests).

    ``fails(list(items))`` is assumed true.
    """
    current = list(items)
    tests = 0

    def test(candidate: list[int]) -> bool:
        nonlocal tests
        tests += 1
        return fails(candidate)

    if current and test([]):
        return []
    n = 2
    while len(current) >= 2 and tests < budget:
        size = -(-len(current) // n)
        chunks = [current[i:i + size] for i in range(0, len(current), size)]
        for chunk in chunks:
            if tests >= budget:
                break
            if test(chunk):
                current, n = chunk, 2
                break
        else:
            for chunk in chunks:
                if tests >= budget:
                    break
                rest = [i for i in current if i not in chunk]
                if len(chunks) > 2 and test(rest):
                    current, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(current):
                    break
                n = min(len(current), 2 * n)
    return current


def shrink(result: RunResult, plan: FaultPlan, budget: int = 40) -> tuple[FaultPlan, RunResult]:
    """The smallest plan found that still fails like ``result``, and its run."""
    wanted = set(result.rules)
    best: dict[str, RunResult] = {}

    def fails(keep: list[int]) -> bool:
        candidate = plan.subset(keep)
        again = run(result.seed, result.scenario, candidate)
        if not again.ok and wanted & set(again.rules):
            best[candidate.encode()] = again
            return True
        return False

    keep = ddmin(range(len(plan)), fails, budget)
    smaller = plan.subset(keep)
    return smaller, best.get(smaller.encode(), result)
