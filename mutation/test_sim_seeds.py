"""A fixed, small set of simulator seeds for mutation runs: one seed per scenario.

The simulator runs the real shard and client cores under faults and checks the
history against G1-G8, so it kills mutants the unit tests miss. ``make test``
does not collect this file (its test paths are ``tests/``); the seed regression
set proper is ``tests/sim``.
"""

from __future__ import annotations

import pytest

from flux.sim.runner import describe, run
from flux.sim.scenarios import SCENARIOS

SEED = 0


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_seed_passes_every_check(scenario: str) -> None:
    result = run(SEED, scenario)
    assert result.ok, "\n".join(describe(result, limit=10))
