"""Durable topics beside the peers' durable modes, in the same run.

Every row is the same workload: end to end, 100-byte messages, one producer
keeping ``Plan.in_flight`` publishes in flight (calls of 256 messages) and one
push consumer acking each message, through each system's Python client:

- Flux: a memory topic, and disk topics with ``storage.fsync: always`` and
  ``interval`` (``flux serve --data-dir DIR`` with a config file giving
  ``storage.fsync``);
- JetStream: a file stream, with the server's default sync and with
  ``sync_interval: always`` (two servers: the setting is the server's);
- Redis Streams with an append-only file, ``appendfsync everysec`` and ``always``.

Then Flux's publish latency at a fixed rate (``Plan.rate``) with ``fsync:
always`` beside a memory topic, and the disk's own fsync time measured in the same
directory just before and just after the ``always`` latency run
(:func:`flux.bench.disklog.fsync_p50`; a disk shared with other work changes
from one second to the next). A system that
cannot start (the server refuses the config, a peer is not installed) gets its
row marked "not available: <reason>" and the bench goes on.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flux.bench import systems
from flux.bench.measure import median
from flux.bench.worker import Spec

if TYPE_CHECKING:  # the runner imports this module
    from flux.bench.runner import Plan, Runner

BATCH = 256                 # messages per publish call on every durable row
FSYNC_INTERVAL = 1.0        # Flux's storage.fsync_interval, as Redis's everysec
JS_STREAM = {"stream": "BENCHF", "subjects": "jsf.>", "storage": "file"}


@dataclass(frozen=True)
class DurableSystem:
    """One row: how its broker starts and what a run of it is."""

    key: str
    label: str
    kind: str               # the worker's system: flux | jetstream | redis
    peer: str               # what enables the row: flux | nats | redis (``--vs``)
    scale: float            # messages per run relative to Plan.count
    start: Callable[[Plan], systems.Broker]


def _flux(storage: systems.FluxStorage | None) -> Callable[[Plan], systems.Broker]:
    return lambda plan: systems.start_flux(1, storage=storage, data_dir=plan.data_dir)


DURABLE: tuple[DurableSystem, ...] = (
    DurableSystem("flux-memory", "Flux, memory topic", "flux", "flux", 1.0, _flux(None)),
    DurableSystem("flux-always", "Flux, disk, fsync always", "flux", "flux", 1.0,
                  _flux(systems.FluxStorage("always"))),
    DurableSystem("flux-interval", f"Flux, disk, fsync interval {FSYNC_INTERVAL:g} s", "flux", "flux",
                  1.0, _flux(systems.FluxStorage("interval", FSYNC_INTERVAL))),
    DurableSystem("jetstream-file", "JetStream, file, default sync (2 min)", "jetstream", "nats", 0.2,
                  lambda plan: systems.start_nats(sync_always=False)),
    DurableSystem("jetstream-always", "JetStream, file, sync_interval always", "jetstream", "nats",
                  0.05, lambda plan: systems.start_nats(sync_always=True)),
    DurableSystem("redis-everysec", "Redis Streams, AOF everysec", "redis", "redis", 0.5,
                  lambda plan: systems.start_redis("everysec")),
    DurableSystem("redis-always", "Redis Streams, AOF always", "redis", "redis", 0.2,
                  lambda plan: systems.start_redis("always")),
)
BY_KEY = {d.key: d for d in DURABLE}
# rows whose publish latency is measured at Plan.rate (publish to ack, and end to end)
LATENCY_ROWS = ("flux-memory", "flux-always")
FSYNC_ROW = "flux-always"   # the disk's own fsync is measured just before and after its run


@dataclass
class DurableFigures:
    """One durable row's figures: e2e msg/s (median), latencies in us."""

    label: str
    in_flight: int = 0
    e2e: float | None = None
    runs: list[float] = field(default_factory=list)
    server_cpu_us: float | None = None
    ack_latency: dict[str, float] = field(default_factory=dict)
    latency: dict[str, float] = field(default_factory=dict)
    unavailable: str | None = None      # "not available: why", when it could not run
    errors: list[str] = field(default_factory=list)
    background: list[float] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    version: str = ""


@dataclass
class DurableReport:
    """What the durable section measured."""

    rows: dict[str, DurableFigures] = field(default_factory=dict)
    fsync: dict[str, Any] = field(default_factory=dict)   # the disk's own fsync figures
    rate: float = 0.0

    def e2e(self, key: str) -> float | None:
        row = self.rows.get(key)
        return row.e2e if row is not None else None

    def goals(self) -> list[tuple[str, float | None, str]]:
        """(what, measured ratio, the goal) for issue 16's performance goals."""
        def ratio(a: str, b: str) -> float | None:
            x, y = self.e2e(a), self.e2e(b)
            return x / y if x and y else None

        always = self.rows.get("flux-always")
        p50 = always.ack_latency.get("p50") if always else None
        fsync = self.fsync.get("fsync_p50_ms")
        latency = (p50 / 1000 / fsync) if p50 and fsync else None
        return [
            ("Flux always / Flux memory", ratio("flux-always", "flux-memory"), ">= 0.5"),
            ("Flux always / JetStream sync always", ratio("flux-always", "jetstream-always"), ">= 30"),
            ("Flux always / Redis AOF always", ratio("flux-always", "redis-always"), ">= 5"),
            ("Flux interval / Flux memory", ratio("flux-interval", "flux-memory"), ">= 0.8"),
            ("Flux interval / Redis AOF everysec", ratio("flux-interval", "redis-everysec"), ">= 5"),
            (f"publish p50 at {self.rate:,.0f}/s, always / disk fsync p50", latency, "<= 2"),
        ]


def chosen(plan: Plan) -> list[DurableSystem]:
    """The rows this plan runs: Flux's unless --no-flux, the peers named by --vs."""
    peers = {"flux": "flux" in plan.systems,
             "nats": "nats" in plan.systems or "jetstream" in plan.systems,
             "redis": "redis" in plan.systems}
    return [d for d in DURABLE if peers[d.peer]]


def steps(plan: Plan) -> int:
    rows = chosen(plan)
    latency = len([d for d in rows if d.key in LATENCY_ROWS])
    return len(rows) * plan.repeat + latency + (2 if latency else 0)


def run(runner: Runner) -> DurableReport:
    """Start every chosen row's broker, then take turns, row by row, ``repeat`` times."""
    plan = runner.plan
    report = DurableReport(rate=plan.rate)
    rows = chosen(plan)
    with contextlib.ExitStack() as stack:
        brokers: dict[str, systems.Broker] = {}
        for d in rows:
            fig = report.rows[d.key] = DurableFigures(d.label, in_flight=plan.in_flight)
            try:
                broker = stack.enter_context(d.start(plan))
            except systems.BenchError as exc:
                fig.unavailable = f"not available: {exc}"
                continue
            brokers[d.key] = broker
            fig.config, fig.version = dict(broker.settings), broker.version
            if d.kind == "jetstream":
                fig.config["jetstream"] = (f"{JS_STREAM['storage']} storage, stream"
                                           f" {JS_STREAM['stream']} ({JS_STREAM['subjects']})")
        cpus: dict[str, list[float]] = {}
        for r in range(plan.repeat):
            for d in rows:
                n = max(1000, int(plan.count * d.scale))
                runner.advance(f"{d.label}: end to end {n:,} x 100 B, {plan.in_flight:,} in flight"
                               f" ({r + 1}/{plan.repeat})")
                if d.key not in brokers:
                    continue
                out = runner._measure(d.key, brokers[d.key], [_producer(runner, d, brokers[d.key], n)],
                                      consumer=True, figures=report.rows[d.key])
                if out is not None:
                    report.rows[d.key].runs.append(out["rate"])
                    if out["server_cpu_us"] is not None:
                        cpus.setdefault(d.key, []).append(out["server_cpu_us"])
        for key, fig in report.rows.items():
            if fig.runs:
                fig.e2e = median(fig.runs)
            if cpus.get(key):
                fig.server_cpu_us = median(cpus[key])
        latency_rows = [d for d in rows if d.key in LATENCY_ROWS]
        probes: list[dict[str, Any]] = []
        for d in latency_rows:
            if d.key == FSYNC_ROW:  # the disk's own fsync just before and just after it:
                runner.advance("the disk's own fsync time")  # a shared disk changes quickly
                probes.append(_fsync(plan))
            runner.advance(f"{d.label}: publish latency at {plan.rate:,.0f} msg/s")
            if d.key not in brokers:
                continue
            n = max(100, int(plan.rate * plan.latency_seconds))
            spec = _producer(runner, d, brokers[d.key], n)
            spec.mode, spec.rate = "latency", plan.rate
            out = runner._measure(d.key, brokers[d.key], [spec], consumer=True,
                                  figures=report.rows[d.key])
            if out is not None:
                report.rows[d.key].latency = out["latency_us"]
                report.rows[d.key].ack_latency = out["ack_latency_us"]
        if probes:
            runner.advance("the disk's own fsync time, again")
            probes.append(_fsync(plan))
            report.fsync = _around(probes)
    return report


def _producer(runner: Runner, d: DurableSystem, broker: systems.Broker, n: int) -> Spec:
    """``in_flight`` publishes in flight: calls of :data:`BATCH` messages, as many at once
    as make it (Flux: ``publish_many``; JetStream: ``publish_async`` with that many
    pending; Redis: pipelines)."""
    plan = runner.plan
    window = max(1, plan.in_flight // BATCH)
    options = runner._options()
    if d.kind == "jetstream":
        options = {**options, "stream": dict(JS_STREAM)}
    prefix = "jsf" if d.kind == "jetstream" else "bench"
    topic = f"{prefix}.{d.key}.{os.getpid()}.{next(runner._topics)}"
    return Spec(d.kind, "producer", broker.url, topic, n, size=100, window=window,
                batch=min(BATCH, plan.in_flight), options=options)


def _around(probes: list[dict[str, Any]]) -> dict[str, Any]:
    """The fsync figures of the probes just before and after a latency run, as one: the
    mean of their p50s, the larger p99, and each probe's p50 (``probe_p50_ms``)."""
    good = [p for p in probes if "fsync_p50_ms" in p]
    if not good:
        return probes[0]
    out = dict(good[0])
    out["fsync_p50_ms"] = sum(p["fsync_p50_ms"] for p in good) / len(good)
    out["fsync_p99_ms"] = max(p["fsync_p99_ms"] for p in good)
    out["probe_p50_ms"] = [p["fsync_p50_ms"] for p in good]
    return out


def _fsync(plan: Plan) -> dict[str, Any]:
    """The disk's own fsync figures where the disk rows keep their logs."""
    from flux.bench.disklog import fsync_p50

    directory = plan.data_dir or tempfile.gettempdir()
    try:
        figures = fsync_p50(directory, seconds=min(2.0, max(0.5, plan.latency_seconds / 2)))
    except OSError as exc:
        return {"error": f"could not measure fsync in {directory}: {exc}"}
    return {"directory": directory, "in_flight": figures.in_flight,
            "fsync_p50_ms": figures.fsync_p50_ms, "fsync_p99_ms": figures.fsync_p99_ms,
            "fsyncs_per_s": figures.fsyncs_per_s}
