"""One simulated run: build the world from a seed, run it on the sim clock, check it.

A run is: draw the workload and fault plan from the seed; in ONE trio run on a
:class:`~flux.sim.determinism.SimClock`, start the real router (which launches
the real shards) and the real clients; inject the faults; heal everything; give
the system a liveness phase; then check the history. Same seed, same digest.
"""

from __future__ import annotations

import logging
import random
import time
import traceback
from dataclasses import dataclass, field

import trio

from flux import config as config_mod
from flux.shard import dedup as dedup_mod
from flux.sim import history as h
from flux.sim.checker import check
from flux.sim.determinism import SimClock, WallWatchdog, seed_scheduler, task_tree
from flux.sim.faults import FaultPlan, draw_plan
from flux.sim.scenarios import (
    SCENARIOS,
    with_client_ids,
    with_delays,
    with_late_readers,
    with_vandals,
)
from flux.sim.simhost import EPOCH, derive_seed
from flux.sim.workload import Actors, Workload
from flux.sim.world import World, leaf_errors

LATENCY_BOUND = 0.1   # one-way latency the checker may assume outside slow links
WALL_BUDGET = 120.0   # real seconds one run may take before it is stopped as stuck


@dataclass
class RunResult:
    seed: int
    scenario: str
    plan: str
    ok: bool
    violations: list[str] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    tracebacks: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    # ``guarantee/rule`` -> facts the rule judged (``flux sim --rule-stats``)
    examined: dict[str, int] = field(default_factory=dict)
    sim_time: float = 0.0
    wall_time: float = 0.0
    cpu_time: float = 0.0
    digest: str = ""
    history: h.History | None = None

    def problems(self) -> list[str]:
        return self.failures + self.violations


def workload_for(seed: int, scenario: str) -> Workload:
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    workload = SCENARIOS[scenario](random.Random(derive_seed(seed, "workload", scenario)))
    workload = with_client_ids(workload, random.Random(derive_seed(seed, "client-ids", scenario)))
    # "delays" delays every producer's publishes itself; "default" and "no-faults" keep
    # the workloads their seeds always had
    if scenario not in ("delays", "default", "no-faults"):
        workload = with_delays(workload, random.Random(derive_seed(seed, "delays", scenario)))
    if scenario in ("delays", "delays-disk", "kept-disk"):
        workload = with_late_readers(
            workload, random.Random(derive_seed(seed, "late-readers", scenario)))
    return with_vandals(workload, random.Random(derive_seed(seed, "vandals", scenario)))


def plan_for(seed: int, workload: Workload) -> FaultPlan:
    shards = int(workload.config.get("shards", 1))  # type: ignore[call-overload]
    clients = tuple(p.name for p in workload.producers) if workload.mix.producers_only \
        else workload.clients
    return draw_plan(random.Random(derive_seed(seed, "faults", workload.scenario)), workload.mix,
                     shards=shards, clients=clients, start=workload.warmup,
                     end=workload.warmup + workload.fault_phase)


def run(seed: int, scenario: str = "default", plan: FaultPlan | None = None, *,
        keep_history: bool = False, wall_budget: float = WALL_BUDGET) -> RunResult:
    """Run one seed (with ``plan`` instead of the seed's own, when given) and check it."""
    workload = workload_for(seed, scenario)
    config = config_mod.from_dict(workload.config)
    if plan is None:
        plan = plan_for(seed, workload)
    history = h.History(meta={
        "seed": seed, "scenario": scenario, "plan": plan.encode(), "config": config.to_dict(),
        "epoch": EPOCH, "latency_bound": LATENCY_BOUND, "oracle": True, "close_reasons": True,
        "liveness": [{"subscriber": s.subscriber, "topic": s.topic, "from_offset": s.from_offset,
                      "pull": s.behaviour == "puller",
                      # members of one shared subscription are given its messages together
                      "group": s.sub_name if s.shared else None}
                     for s in workload.subscribers if s.live],
        "canaries": [[t, f"canary-{t}"] for t in workload.topics],
        # the user each client logs in as (G13; "*": every client not named)
        "logins": {client: login["as"] for client, login in workload.logins.items()},
    })
    failures: list[str] = []
    tracebacks: list[str] = []
    clock = SimClock()
    logging.getLogger("flux").setLevel(logging.CRITICAL)
    seed_scheduler(derive_seed(seed, "scheduler"))
    started = time.perf_counter()  # seam-ok: measuring the wall time of a run
    cpu_started = time.process_time()  # seam-ok
    # half the seeds' topics turn their dedup windows compact after a few ids (packed ids,
    # the hash index), as a busy topic's do after 8,192, and their publishes join the
    # newest mark up to a second apart (a busy topic's, 50 ms); a draw of its own, so
    # the workloads stay what their seeds made
    compact = random.Random(derive_seed(seed, "compact-ids", scenario)).choice((0, 0, 4, 32))
    defaults = dedup_mod.COMPACT_IDS, dedup_mod.MERGE_SPAN, dedup_mod.MERGE_SHARE
    if compact:
        dedup_mod.COMPACT_IDS, dedup_mod.MERGE_SPAN, dedup_mod.MERGE_SHARE = compact, 3.0, 0.5
    try:
        trio.run(_main, seed, workload, config, plan, history, (failures, tracebacks), clock,
                 wall_budget, clock=clock)
    except Exception as exc:
        failures.append(f"a client or the simulator raised: {leaf_errors(exc)}")
        tracebacks.append("".join(traceback.format_exception(exc)).rstrip())
    finally:
        dedup_mod.COMPACT_IDS, dedup_mod.MERGE_SPAN, dedup_mod.MERGE_SHARE = defaults
    wall = time.perf_counter() - started  # seam-ok
    cpu = time.process_time() - cpu_started  # seam-ok
    report = check(history)
    result = RunResult(seed, scenario, plan.encode(), ok=not failures and report.ok,
                       violations=[str(v) for v in report.violations], rules=report.rules(),
                       failures=failures, tracebacks=tracebacks, counts=report.counts,
                       examined=report.examined,
                       sim_time=clock.current_time(), wall_time=wall, cpu_time=cpu, digest=history.digest(),
                       history=history if keep_history else None)
    if failures:
        result.rules = ["crash", *result.rules]
    return result


async def _main(seed: int, workload: Workload, config: config_mod.Config, plan: FaultPlan,
                history: h.History, sinks: tuple[list[str], list[str]], clock: SimClock,
                wall_budget: float) -> None:
    failures, tracebacks = sinks
    token = trio.lowlevel.current_trio_token()
    async with trio.open_nursery() as root:

        def stop(why: str) -> None:
            failures.append(f"{why} at t={trio.current_time():.6f}:\n  "
                            + "\n  ".join(task_tree()))
            root.cancel_scope.cancel()

        clock.on_deadlock = lambda: token.run_sync_soon(
            stop, "deadlock: every task waits and none has a deadline")
        watchdog = WallWatchdog(wall_budget, lambda: stop(
            f"stuck: over {wall_budget:g}s of real time"))
        watchdog.start()
        try:
            world = World(seed, config, history, root)
            world.record(h.Phase(trio.current_time(), "start"))
            await world.router.start()
            await _drive(world, workload, plan, seed)
            failures.extend(world.failures)
            tracebacks.extend(world.tracebacks)
        finally:
            watchdog.stop()
            root.cancel_scope.cancel()


async def _drive(world: World, workload: Workload, plan: FaultPlan, seed: int) -> None:
    actors = Actors(world, workload, seed)
    fault_end = workload.warmup + workload.fault_phase
    async with trio.open_nursery() as clients:
        for p in workload.producers:
            clients.start_soon(actors.producer, p, name=f"producer {p.name}")
        for s in workload.subscribers:
            clients.start_soon(actors.subscriber, s, name=f"subscriber {s.name}")
        for name in workload.vandals:
            clients.start_soon(actors.vandal, name, name=f"vandal {name}")
        for name in workload.auditors:
            clients.start_soon(actors.auditor, name, name=f"auditor {name}")
        for name in workload.dead_letter_readers:
            clients.start_soon(actors.dead_letter_reader, name, name=f"dead letters {name}")
        for name in workload.intruders:
            clients.start_soon(actors.intruder, name, name=f"intruder {name}")
        async with trio.open_nursery() as faults:
            faults.start_soon(world.run_plan, list(plan))
            world.record(h.Phase(trio.current_time(), "faults"))
            await trio.sleep_until(fault_end)
            actors.publishing_over.set()
            world.heal()
            faults.cancel_scope.cancel()
        world.record(h.Phase(trio.current_time(), "heal"))
        actors.healed.set()
        await trio.sleep(2.0)
        clients.start_soon(actors.canary, workload.topics, name="canary")
        await trio.sleep_until(fault_end + workload.liveness_phase)
        world.record(h.Phase(trio.current_time(), "end"))
        world.recorder.stopped = True
        clients.cancel_scope.cancel()


def summary_line(result: RunResult) -> str:
    state = "ok" if result.ok else "FAIL " + ",".join(result.rules[:4])
    return (f"seed {result.seed} [{result.scenario}] {state} sim={result.sim_time:.1f}s"
            f" wall={result.wall_time:.2f}s digest={result.digest[:12]}")


def describe(result: RunResult, limit: int = 12) -> list[str]:
    lines = [summary_line(result)]
    lines += [f"  {p}" for p in result.problems()[:limit]]
    return lines


__all__ = ["RunResult", "describe", "plan_for", "run", "summary_line", "workload_for"]
