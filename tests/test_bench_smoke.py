"""A tiny run of the bench code (``flux bench``): it runs end to end and writes its JSON.

Never asserts a speed: only that each figure was measured and reported.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from flux.bench.measure import percentile
from flux.bench.runner import Plan, _topics_per_shard
from flux.cli import main
from flux.hashing import shard_for

pytestmark = pytest.mark.integration


def test_percentile_is_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([7.0], 99.9) == 7.0


def test_scaling_topics_land_on_distinct_shards() -> None:
    topics = _topics_per_shard(2, "bench.x")
    assert [shard_for(t, 2) for t in topics] == [0, 1]


def test_plan_counts_every_step_it_reports() -> None:
    plan = Plan(["flux", "nats"], sizes=(100,), repeat=2, shard_counts=(1, 2), sections=("main",))
    assert plan.steps() == (2 * 1 * 2 + 2) * 2 + 2
    # durable: five rows (Flux memory, always, interval; JetStream default, always) per
    # repeat, the fsync probe before and after the fsync-always latency run, two latency
    # runs; recovery: one run per dedup window
    plan.sections = ("main", "durable", "recovery")
    assert plan.steps() == (2 * 1 * 2 + 2) * 2 + 2 + 5 * 2 + 2 + 2 + 2


@pytest.mark.parametrize("client", ["asyncio", "trio"])
def test_quick_bench_of_flux_writes_its_figures(tmp_path: Path, client: str) -> None:
    out = tmp_path / "results"
    result = CliRunner().invoke(main, ["bench", "--quick", "--count", "2000", "--sizes", "100",
                                       "--sections", "main,durable", "--client", client,
                                       "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "bench.json").read_text())
    figures = data["figures"]
    for label in ("publish 100 B", "end to end 100 B", "server CPU 100 B",
                  "latency p99 @ 5,000/s", "memory per held message", "2 shards, 2 pairs"):
        assert figures[label]["values"]["flux"] is not None, label
    assert data["config"]["flux"]["message.ttl"] == 1
    assert data["config"]["flux"]["client"]["flavour"] == client
    assert (out / "bench-throughput.png").exists()
    assert "Flux" in result.output


def _gone(pid: int) -> bool:
    """Whether ``pid`` exited (a zombie nobody reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_a_broker_the_bench_started_dies_with_it_even_by_sigkill() -> None:
    """Brokers run in sessions of their own: a bench killed outright must not leave
    them running."""
    script = ("import subprocess, sys, time\n"
              "from flux.bench.systems import _die_with_parent\n"
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
              " start_new_session=True, preexec_fn=_die_with_parent)\n"
              "print(p.pid, flush=True)\n"
              "time.sleep(60)\n")
    bench = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert bench.stdout is not None
        broker = int(bench.stdout.readline())
        assert not _gone(broker)
        bench.kill()
        bench.wait(timeout=10)
        deadline = time.monotonic() + 10
        while not _gone(broker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(broker)
    finally:
        bench.kill()
        bench.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.kill(broker, signal.SIGKILL)
