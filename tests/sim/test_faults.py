"""Fault plans: drawn from a seed, written as one line, shrunk by delta debugging."""

from __future__ import annotations

import random

import pytest

from flux.sim.faults import Fault, FaultMix, FaultPlan, decode_plan, draw_plan
from flux.sim.scenarios import ALL_FAULTS
from flux.sim.shrink import ddmin


def draw(seed: int) -> FaultPlan:
    return draw_plan(random.Random(seed), FaultMix(ALL_FAULTS, count=(5, 15)), shards=3,
                     clients=("p0", "s1"), start=1.0, end=31.0)


def test_a_plan_is_a_function_of_its_seed() -> None:
    assert draw(4) == draw(4)
    assert draw(4) != draw(5)


def test_plans_round_trip_through_their_one_line_form() -> None:
    for seed in range(20):
        plan = draw(seed)
        assert decode_plan(plan.encode()) == plan
    assert decode_plan("-") == FaultPlan()


def test_faults_stay_in_the_fault_phase_and_name_real_hosts() -> None:
    hosts = {"shard-0", "shard-1", "shard-2", "router", "p0", "s1"}
    for seed in range(20):
        for fault in draw(seed):
            assert 1.0 <= fault.at <= 31.0
            for part in fault.target.replace("<->", " ").replace("->", " ").split():
                assert part in hosts


def test_bad_fault_text_is_refused() -> None:
    with pytest.raises(ValueError):
        decode_plan("explode:shard-0@3")
    with pytest.raises(ValueError):
        Fault.decode("crash:@3")


def test_ddmin_finds_the_faults_that_matter() -> None:
    culprits = {3, 11}
    tried: list[list[int]] = []

    def fails(keep: list[int]) -> bool:
        tried.append(keep)
        return culprits <= set(keep)

    assert sorted(ddmin(range(16), fails, budget=200)) == [3, 11]
    assert len(tried) < 100


def test_ddmin_gives_up_at_its_budget() -> None:
    calls = 0

    def fails(keep: list[int]) -> bool:
        nonlocal calls
        calls += 1
        return 5 in keep and 6 in keep

    result = ddmin(range(30), fails, budget=5)
    assert calls <= 6
    assert {5, 6} <= set(result)
