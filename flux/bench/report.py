"""How a bench run is shown: the side-by-side rich table, the JSON file and PNG plots.

Every figure is shown for each system with the ratio Flux/peer (for throughput
higher is better; for latency, CPU and memory lower is better).
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from flux.bench.durable import DurableReport
from flux.bench.recovery import RecoveryFigures
from flux.bench.runner import LABELS, Figures, Plan
from flux.bench.workqueue import WorkqueueReport, as_json

Row = tuple[str, str, dict[str, float | None], bool]  # label, unit, value per system, higher wins


def rows(plan: Plan, figures: dict[str, Figures]) -> list[Row]:
    """Every figure, in table order."""
    out: list[Row] = []

    def row(label: str, unit: str, get: Any, higher: bool) -> None:
        values = {s: get(f) for s, f in figures.items()}
        if any(v is not None for v in values.values()):
            out.append((label, unit, values, higher))

    for size in plan.sizes:
        row(f"publish {_size(size)}", "msg/s", lambda f, s=size: f.publish.get(s), True)
        row(f"end to end {_size(size)}", "msg/s", lambda f, s=size: f.e2e.get(s), True)
    for size in plan.sizes:
        row(f"server CPU {_size(size)}", "us/msg", lambda f, s=size: f.cpu.get(s), False)
    for q in ("p50", "p90", "p99", "p99.9"):
        row(f"latency {q} @ {plan.rate:,.0f}/s", "ms",
            lambda f, q=q: f.latency[q] / 1000 if q in f.latency else None, False)
    row("memory per held message", "B", lambda f: f.memory, False)
    for shards in plan.shard_counts:
        if shards > 1:
            row(f"{shards} shards, {shards} pairs", "msg/s", lambda f, n=shards: f.scaling.get(n),
                True)
    return out


def _size(size: int) -> str:
    return f"{size // 1024} KiB" if size >= 1024 and size % 1024 == 0 else f"{size} B"


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "msg/s":
        return f"{value / 1000:,.0f}k" if value >= 10_000 else f"{value:,.0f}"
    if unit == "ms":
        return f"{value:.3f}"
    if unit == "B":
        return f"{value:,.0f}"
    return f"{value:.2f}"


def ratios(table: list[Row]) -> dict[str, dict[str, float]]:
    """Flux/peer for each figure both have."""
    out: dict[str, dict[str, float]] = {}
    for label, _, values, _ in table:
        flux = values.get("flux")
        for peer, value in values.items():
            if peer != "flux" and flux is not None and value:
                out.setdefault(label, {})[peer] = flux / value
    return out


def print_table(console: Console, plan: Plan, figures: dict[str, Figures]) -> None:
    table_rows = rows(plan, figures)
    peers = [s for s in figures if s != "flux"]
    table = Table(title=f"Flux beside its peers (medians of {plan.repeat})", show_lines=False)
    table.add_column("figure")
    table.add_column("unit")
    for system in figures:
        table.add_column(LABELS[system], justify="right")
    if "flux" in figures:
        for peer in peers:
            table.add_column(f"Flux/{LABELS[peer].split()[0]}", justify="right", style="bold")
    for label, unit, values, higher in table_rows:
        cells = [label, unit] + [_fmt(values[s], unit) for s in figures]
        if "flux" in figures:
            for peer in peers:
                flux, other = values.get("flux"), values.get(peer)
                if flux is None or not other:
                    cells.append("-")
                    continue
                ratio = flux / other
                better = ratio > 1 if higher else ratio < 1
                cells.append(f"[{'green' if better else 'red'}]{ratio:.2f}x[/]")
        table.add_row(*cells)
    console.print(table)


def print_durable(console: Console, plan: Plan, report: DurableReport) -> None:
    """The durable rows (end to end 100 B, the same publishes in flight on every row),
    the goals of issue 16 as measured ratios, and publish latency beside the disk's fsync."""
    memory = report.e2e("flux-memory")
    always = report.e2e("flux-always")
    table = Table(title=f"Durable topics: end to end 100 B, {plan.in_flight:,} publishes in flight"
                        f" (medians of {plan.repeat})")
    for name in ("system", "in flight", "msg/s", "server CPU us/msg", "/ Flux memory",
                 "Flux always / this"):
        table.add_column(name, justify="left" if name == "system" else "right")
    for key, row in report.rows.items():
        if row.unavailable is not None or row.e2e is None:
            why = row.unavailable or ("failed: " + row.errors[-1] if row.errors else "no figure")
            table.add_row(row.label, f"{row.in_flight:,}", f"[red]{why}[/]", "", "", "")
            continue
        cpu = f"{row.server_cpu_us:.2f}" if row.server_cpu_us is not None else "-"
        vs_memory = f"{row.e2e / memory:.2f}x" if memory else "-"
        vs_always = (f"{always / row.e2e:.2f}x" if always and key != "flux-always" else "-")
        table.add_row(row.label, f"{row.in_flight:,}", _fmt(row.e2e, "msg/s"), cpu, vs_memory,
                      vs_always)
    console.print(table)
    fsync = report.fsync
    if "fsync_p50_ms" in fsync:
        probes = " / ".join(f"{p:.2f}" for p in fsync.get("probe_p50_ms", []))
        console.print(f"disk fsync in {fsync['directory']} (100 B appends, {fsync['in_flight']} in"
                      f" flight), just before and after the fsync-always latency run:"
                      f" p50 {fsync['fsync_p50_ms']:.2f} ms"
                      f"{f' ({probes} ms)' if probes else ''}, p99 {fsync['fsync_p99_ms']:.2f} ms")
    elif "error" in fsync:
        console.print(f"[red]{fsync['error']}[/]")
    for key in ("flux-memory", "flux-always"):
        if key not in report.rows:
            continue
        row = report.rows[key]
        if row.ack_latency:
            lat, ack = row.latency, row.ack_latency
            console.print(f"{row.label} at {report.rate:,.0f} msg/s: publish to ack p50"
                          f" {ack['p50'] / 1000:.3f} ms, p99 {ack['p99'] / 1000:.3f} ms; end to end"
                          f" p50 {lat.get('p50', float('nan')) / 1000:.3f} ms,"
                          f" p99 {lat.get('p99', float('nan')) / 1000:.3f} ms")
        else:
            console.print(f"{row.label} at {report.rate:,.0f} msg/s: publish latency"
                          f" {row.unavailable or 'not measured (the run failed)'}")
    console.print("[bold]Goals (issue 16), as measured in this run[/]")
    for what, value, goal in report.goals():
        shown = f"{value:.2f}" if value is not None else "- (a row is missing)"
        console.print(f"  {what}: {shown}  (goal {goal})")
    for key, row in report.rows.items():
        for error in dict.fromkeys(row.errors):
            console.print(f"[red]{key}: {error}[/]")
        load = max(row.background, default=0.0)
        if load > 0.25:
            console.print(f"[yellow]{key}: other processes used up to {load:.1f} cores during"
                          " its runs; its figures are lower than on a quiet machine[/]")


def durable_json(report: DurableReport) -> dict[str, Any]:
    return {"rows": {k: r.__dict__ for k, r in report.rows.items()}, "fsync": report.fsync,
            "rate": report.rate,
            "goals": [{"what": w, "measured": v, "goal": g} for w, v, g in report.goals()]}


def write_json(path: Path, plan: Plan, figures: dict[str, Figures], configs: dict[str, Any],
               versions: dict[str, str], runs: list[dict[str, Any]], wall: float,
               durable: DurableReport | None = None,
               recovery: list[RecoveryFigures] | None = None,
               workqueue: WorkqueueReport | None = None) -> None:
    table = rows(plan, figures)
    data = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "plan": plan.__dict__,
        "versions": versions,
        "config": configs,
        "figures": {label: {"unit": unit, "higher_is_better": higher, "values": values}
                    for label, unit, values, higher in table},
        "ratios_flux_over_peer": ratios(table),
        "details": {s: f.__dict__ for s, f in figures.items()},
        "durable": durable_json(durable) if durable is not None else None,
        "recovery": [{**r.__dict__, "line": r.line()} for r in recovery or []],
        "workqueue": as_json(workqueue) if workqueue is not None else None,
        "runs": runs,
        "wall_seconds": wall,
    }
    path.write_text(json.dumps(data, indent=1, default=str))


def write_plots(directory: Path, plan: Plan, figures: dict[str, Figures]) -> list[Path]:
    """PNG plots of the figures; none (and no error) without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    systems = list(figures)
    labels = [LABELS[s] for s in systems]
    written = []

    fig, axes = plt.subplots(1, len(plan.sizes), figsize=(5 * len(plan.sizes), 4), squeeze=False)
    for ax, size in zip(axes[0], plan.sizes, strict=True):
        pub = [figures[s].publish.get(size, 0) / 1000 for s in systems]
        e2e = [figures[s].e2e.get(size, 0) / 1000 for s in systems]
        xs = range(len(systems))
        ax.bar([x - 0.2 for x in xs], pub, 0.4, label="publish")
        ax.bar([x + 0.2 for x in xs], e2e, 0.4, label="end to end, acked")
        ax.set_xticks(list(xs), labels, rotation=15)
        ax.set_title(f"throughput, {_size(size)} payloads")
        ax.set_ylabel("thousand msg/s")
        ax.legend()
    written.append(_save(fig, directory / "bench-throughput.png", plt))

    fig, ax = plt.subplots(figsize=(6, 4))
    for s in systems:
        lat = figures[s].latency
        if lat:
            qs = [k for k in lat if k != "p100"]
            ax.plot(qs, [lat[k] / 1000 for k in qs], marker="o", label=LABELS[s])
    ax.set_yscale("log")
    ax.set_ylabel("ms")
    ax.set_title(f"end-to-end latency at {plan.rate:,.0f} msg/s")
    ax.legend()
    written.append(_save(fig, directory / "bench-latency.png", plt))

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    size = plan.sizes[0]
    axes[0].bar(labels, [figures[s].cpu.get(size, 0) for s in systems])
    axes[0].set_title(f"server CPU per message, {_size(size)}")
    axes[0].set_ylabel("us/msg")
    axes[1].bar(labels, [figures[s].memory or 0 for s in systems])
    axes[1].set_title("memory per held message beyond payload and id")
    axes[1].set_ylabel("bytes")
    scaling = figures["flux"].scaling if "flux" in figures else {}
    if scaling:
        ks = sorted(scaling)
        axes[2].plot(ks, [scaling[k] / 1000 for k in ks], marker="o")
        axes[2].set_xticks(ks)
    axes[2].set_title("Flux end to end against shard count")
    axes[2].set_xlabel("shards (one producer/consumer pair each)")
    axes[2].set_ylabel("thousand msg/s")
    for ax in axes[:2]:
        ax.tick_params(axis="x", rotation=15)
    written.append(_save(fig, directory / "bench-resources.png", plt))
    return written


def _save(fig: Any, path: Path, plt: Any) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
