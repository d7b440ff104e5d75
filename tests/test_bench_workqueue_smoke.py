"""A tiny run of the work-queue bench (``flux bench --sections workqueue``): every row
is measured and the goals are printed beside their figures. Never asserts a speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from flux.bench import workqueue
from flux.bench.pool import PoolCounter, make_tally
from flux.bench.runner import Plan
from flux.bench.worker import Spec
from flux.cli import main

pytestmark = pytest.mark.integration


def test_rows_follow_the_peers_asked_for() -> None:
    flux_rows = ["single", "single-keyed", "shared", "key-ordered", "poison"]
    plan = Plan(["flux", "redis"], sections=("workqueue",), repeat=2)
    assert [s.key for s in workqueue.chosen(plan)] == [*flux_rows, "redis"]
    assert workqueue.steps(plan) == 12
    assert [s.key for s in workqueue.chosen(Plan(["nats", "jetstream"]))] == ["jetstream"]


def test_members_of_a_pool_count_together(tmp_path: Path) -> None:
    path = make_tally(3)
    try:
        spec = Spec("flux", "consumer", "", "t", 5, options={"tally": path, "members": 3})
        counters = [PoolCounter(Spec(**{**spec.__dict__, "options": {**spec.options, "slot": i}}))
                    for i in range(3)]
        counters[0].took(2)
        counters[2].took()
        assert [c.total() for c in counters] == [3, 3, 3]
        counters[1].took(2)
        assert counters[1].total() == 5 and counters[1].n == 2
        for c in counters:
            c.close()
    finally:
        Path(path).unlink()


def test_a_tiny_work_queue_bench_measures_every_flux_row(tmp_path: Path) -> None:
    out = tmp_path / "results"
    result = CliRunner().invoke(main, ["bench", "--quick", "--count", "3000", "--sections",
                                       "workqueue", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "bench.json").read_text())["workqueue"]
    for key in ("single", "single-keyed", "shared", "key-ordered", "poison"):
        assert data["rows"][key]["rates"][0] is not None, (key, data["rows"][key]["errors"])
    assert data["config"]["flux"]["topics"] == workqueue.POLICIES
    assert "Goals (issue 17)" in result.output
    assert "goal >= 0.9" in result.output and "msg/s" in result.output
