"""``flux sim``: run seeds of the deterministic simulator, in parallel, and report.

A thin layer over :mod:`flux.sim.runner` (one run) and :mod:`flux.sim.shrink`:
seeds fan out over worker processes with a progress bar; every failure is
shrunk and printed with the one-line command that replays it exactly.
"""

from __future__ import annotations

import multiprocessing
import os
import shlex
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import click

from flux.sim.scenarios import SCENARIOS


@dataclass
class Outcome:
    """What a worker sends back for one seed (small and picklable: no history)."""

    seed: int
    scenario: str
    ok: bool
    plan: str
    rules: list[str]
    problems: list[str]
    sim_time: float
    wall_time: float
    cpu_time: float
    digest: str
    shrunk_plan: str | None = None
    shrunk_problems: list[str] = field(default_factory=list)
    examined: dict[str, int] = field(default_factory=dict)   # rule -> facts judged

    def replay(self) -> str:
        plan = self.shrunk_plan if self.shrunk_plan is not None else self.plan
        return (f"flux sim --seed {self.seed} --scenario {self.scenario}"
                f" --plan {shlex.quote(plan)}")


def run_one(job: tuple[int, str, str | None, bool]) -> Outcome:
    """Run (and on failure shrink) one seed; the worker processes' entry point."""
    from flux.sim.faults import decode_plan
    from flux.sim.runner import plan_for, run, workload_for
    from flux.sim.shrink import shrink

    seed, scenario, plan_text, do_shrink = job
    plan = decode_plan(plan_text) if plan_text is not None else plan_for(
        seed, workload_for(seed, scenario))
    result = run(seed, scenario, plan)
    outcome = Outcome(seed, scenario, result.ok, result.plan, result.rules, result.problems(),
                      result.sim_time, result.wall_time, result.cpu_time, result.digest,
                      examined=result.examined)
    if not result.ok and do_shrink and len(plan):
        smaller, again = shrink(result, plan)
        outcome.shrunk_plan = smaller.encode()
        outcome.shrunk_problems = again.problems()
    return outcome


def parse_seeds(text: str) -> list[int]:
    """``A:B`` (B excluded), ``A-B`` (B included), or comma-separated seeds."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if ":" in part:
            a, b = part.split(":")
            seeds.extend(range(int(a), int(b)))
        elif "-" in part[1:]:
            a, b = part.split("-", 1)
            seeds.extend(range(int(a), int(b) + 1))
        elif part:
            seeds.append(int(part))
    return seeds


def _outcomes(jobs: list[tuple[int, str, str | None, bool]], workers: int,
              spark: str | None = None) -> Iterator[Outcome]:
    if spark is not None:
        from flux.spark.sweep import run_on_spark

        yield from run_on_spark(jobs, master=spark)
        return
    if workers <= 1 or len(jobs) == 1:
        for job in jobs:
            yield run_one(job)
        return
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        yield from pool.imap_unordered(run_one, jobs)


@click.command(name="sim")
@click.option("--seeds", "seed_range", default=None, metavar="A:B",
              help="Seeds to run: A:B (B excluded), A-B, or a comma list.  [default: 0:100]")
@click.option("--seed", type=int, default=None, help="Run one seed (add --trace to see it).")
@click.option("--scenario", default="default", show_default=True,
              type=click.Choice([*SCENARIOS, "all"]),
              help="Which workload and fault mix; 'all' runs every seed in each.")
@click.option("--workers", type=int, default=None,
              help="Worker processes.  [default: one per CPU]")
@click.option("--plan", default=None, metavar="FAULTS",
              help="Replace the seed's fault plan (as printed for a failure; '-' for none).")
@click.option("--trace", is_flag=True, help="With --seed: print every event and the digest.")
@click.option("--save", type=click.Path(file_okay=False), default=None,
              help="With --seed: write the history as JSON lines into this directory.")
@click.option("--shrink/--no-shrink", default=True, show_default=True,
              help="Shrink failing fault plans before printing them.")
@click.option("--spark", "spark_master", is_flag=False, flag_value="local[*]", default=None,
              metavar="[MASTER]",
              help="Run the seeds on Spark: local[*], or a cluster URL (needs the spark extra).")
@click.option("--rule-stats", is_flag=True,
              help="After the runs, print per checker rule the runs that examined it, the"
                   " facts it examined and the runs that broke it.")
def sim(seed_range: str | None, seed: int | None, scenario: str, workers: int | None,
        plan: str | None, trace: bool, save: str | None, shrink: bool,
        spark_master: str | None, rule_stats: bool) -> None:
    """Run the deterministic simulator: the real router, shards and clients under a fake
    clock and network with injected faults, checked against G1-G7.

    \b
      flux sim --seeds 0:500 --workers 2     # a sweep, with a summary
      flux sim --seed 17 --trace              # one run, every event, its digest
      flux sim --seeds 0:50 --scenario all --rule-stats   # which rules judged anything

    A failing run prints the command that replays it exactly (its fault plan shrunk).
    """
    if seed is not None:
        sys.exit(_single(seed, scenario, plan, trace, save, rule_stats))
    seeds = parse_seeds(seed_range or "0:100")
    scenarios = list(SCENARIOS) if scenario == "all" else [scenario]
    jobs = [(s, sc, plan, shrink) for sc in scenarios for s in seeds]
    sys.exit(_sweep(jobs, workers or os.cpu_count() or 1, spark_master, rule_stats))


def _single(seed: int, scenario: str, plan_text: str | None, trace: bool,
            save: str | None, rule_stats: bool = False) -> int:
    from flux.sim import history as h
    from flux.sim.faults import decode_plan
    from flux.sim.runner import describe, run

    if scenario == "all":
        raise click.UsageError("--seed runs one scenario; name it")
    try:
        plan = decode_plan(plan_text) if plan_text is not None else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--plan") from None
    result = run(seed, scenario, plan, keep_history=True)
    assert result.history is not None
    if trace:
        for event in result.history:
            click.echo(h.describe(event))
    if save:
        Path(save).mkdir(parents=True, exist_ok=True)
        path = Path(save) / f"{scenario}-{seed}.jsonl"
        result.history.dump(str(path))
        click.echo(f"history written to {path}")
    for text in result.tracebacks:
        click.echo(text, err=True)
    for line in describe(result, limit=50):
        click.echo(line)
    click.echo(f"plan {result.plan}")
    click.echo(f"digest {result.digest}")
    if rule_stats:
        from rich.console import Console

        from flux.sim.rule_stats import RuleStats

        stats = RuleStats()
        stats.add(result.examined, result.rules)
        Console().print(stats.table())
    return 0 if result.ok else 1


def _sweep(jobs: list[tuple[int, str, str | None, bool]], workers: int,
           spark: str | None = None, rule_stats: bool = False) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from flux.sim.rule_stats import RuleStats

    console = Console(stderr=True)
    stats = RuleStats()
    failures: list[Outcome] = []
    sim_total = wall_total = cpu_total = 0.0
    started = time.perf_counter()  # seam-ok: the sweep's own wall time
    columns = (TextColumn("[bold]flux sim"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[failed]} failed"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("seeds", total=len(jobs), failed=0)
        for outcome in _outcomes(jobs, workers, spark):
            sim_total += outcome.sim_time
            wall_total += outcome.wall_time
            cpu_total += outcome.cpu_time
            stats.add(outcome.examined, outcome.rules)
            if not outcome.ok:
                failures.append(outcome)
                progress.console.print(_failure_text(outcome), markup=False, highlight=False,
                                       soft_wrap=True)
            progress.update(task, advance=1, failed=len(failures))
    elapsed = time.perf_counter() - started  # seam-ok
    n = len(jobs)
    ratio = sim_total / wall_total if wall_total else 0.0
    cpu_ratio = sim_total / cpu_total if cpu_total else 0.0
    per_core = n / (wall_total / 60.0) if wall_total else 0.0
    per_cpu = n / (cpu_total / 60.0) if cpu_total else 0.0
    click.echo(f"seeds: {n}  failures: {len(failures)}  workers: {workers}"
               f"  elapsed: {elapsed:.1f}s")
    click.echo(f"simulated: {sim_total:.0f}s  wall (sum over runs): {wall_total:.1f}s"
               f"  cpu: {cpu_total:.1f}s")
    click.echo(f"simulated/real: {ratio:.0f}x wall, {cpu_ratio:.0f}x cpu"
               f"  seeds/min/core: {per_core:.0f} wall, {per_cpu:.0f} cpu")
    for outcome in sorted(failures, key=lambda o: (o.scenario, o.seed)):
        click.echo(f"FAIL seed {outcome.seed} [{outcome.scenario}] {','.join(outcome.rules)}:"
                   f" {outcome.replay()}")
    if rule_stats:
        Console().print(stats.table())
    return 1 if failures else 0


def _failure_text(outcome: Outcome) -> str:
    problems = outcome.shrunk_problems or outcome.problems
    lines = [f"FAIL seed {outcome.seed} [{outcome.scenario}] {', '.join(outcome.rules)}"]
    for problem in problems[:5]:
        lines.append("  " + problem.splitlines()[0][:300])
    if len(problems) > 5:
        lines.append(f"  ... {len(problems) - 5} more")
    lines.append(f"  replay: {outcome.replay()}")
    return "\n".join(lines)
