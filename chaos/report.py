"""The end of a chaos run: the printed report (rich tables), ``report.json`` and the verdict.

Numbers come from :mod:`chaos.accounting`; violations from the shared checker.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.console import Console
from rich.table import Table

from chaos.accounting import FATAL_RULES, Tally
from chaos.runner import RunOutput
from chaos.schedule import KINDS
from flux.sim import checker

MAX_VIOLATIONS_SHOWN = 25


def as_json(out: RunOutput, t: Tally, report: checker.Report, wall: float, ok: bool,
            history_path: str) -> dict[str, Any]:
    s = out.settings
    phases = out.phases
    return {
        "ok": ok, "seed": s.seed, "wall_seconds": round(wall, 1),
        "fault_phase_seconds": round(phases.get("heal", 0) - phases.get("faults", 0), 1),
        "phases": {name: _rel(t, out) for name, t in phases.items()},
        "settings": {"duration": s.duration, "faults": s.faults, "mix": s.mix, "rate": s.rate,
                     "producers": s.producers, "subscribers": s.subscribers,
                     "topics": out.topics, "broker": s.settings, "plant": s.plant,
                     "latency_bound": s.latency_bound},
        "workers": [{"name": w.name, "role": w.role, "flavour": w.flavour} for w in out.workers],
        "faults": {"injected": sum(t.faults.values()), "by_kind": t.faults,
                   "skipped": t.skipped, "routers_started": out.routers_started,
                   "list": [{"kind": r.kind, "target": r.target, "began": _rel(r.began, out),
                             "ended": _rel(r.ended, out), "skipped": r.skipped,
                             "detail": r.detail,
                             "recovery": None if rec is None else round(rec, 3)}
                            for r, rec in zip(out.faults, t.recovery_of, strict=True)]},
        "messages": {"published": t.published, "acked": t.acked, "delivered": t.delivered,
                     "deliveries": t.deliveries, "duplicated": t.duplicated,
                     "duplicated_messages": t.duplicated_messages,
                     "stored_in_two_generations": t.stored_again,
                     "lost_explained_by_crash": t.lost_explained,
                     "lost_by_every_subscriber": t.lost_by_all,
                     "lost_unexplained": t.lost_unexplained,
                     "dead_lettered": t.dead_letters},
        "storage": {"mode": s.storage, "fsync": None if s.storage == "memory" else s.fsync,
                    "data_dir": None if out.data_dir is None else str(out.data_dir),
                    "data_kept": out.data_dir is not None and s.keep_data,
                    "topics": out.storage,
                    "by_kind": {kind: dataclasses.asdict(st) for kind, st in t.storage.items()},
                    "disk_broken": bool(t.storage.get("disk") and t.storage["disk"].broken())},
        "recovery_seconds": t.recovery,
        "adoption": t.adoption,
        "checker": {"ok": report.ok, "counts": report.counts, "rules": report.rules(),
                    "violations": [str(v) for v in sorted(report.violations)[:500]]},
        "throughput": t.throughput, "proxies": out.proxy_stats, "notes": out.notes,
        "killed_at_stop": out.killed_at_stop, "history": history_path,
        "crashes": out.crashes,
    }


def _rel(t: float | None, out: RunOutput) -> float | None:
    return None if t is None else round(t - out.phases.get("start", 0.0), 3)


def show(console: Console, data: dict[str, Any]) -> None:
    faults = Table(title="Faults injected", title_justify="left")
    faults.add_column("kind")
    faults.add_column("injected", justify="right")
    faults.add_column("skipped", justify="right")
    faults.add_column("recovery median / p90 / max (s)", justify="right")
    by_kind, skipped, recovery = (data["faults"]["by_kind"], data["faults"]["skipped"],
                                  data["recovery_seconds"])
    for kind in KINDS:
        r = recovery.get(kind)
        faults.add_row(kind, str(by_kind.get(kind, 0)), str(skipped.get(kind, 0)),
                       f"{r['median']:.2f} / {r['p90']:.2f} / {r['max']:.2f}" if r else "-")
    faults.add_row("[bold]total", f"[bold]{data['faults']['injected']}",
                   str(sum(skipped.values())), "")
    console.print(faults)

    m = data["messages"]
    messages = Table(title="Messages", title_justify="left")
    messages.add_column("what")
    messages.add_column("count", justify="right")
    for label, key in (("published", "published"), ("acked", "acked"),
                       ("delivered (to at least one subscriber)", "delivered"),
                       ("deliveries (repeats included)", "deliveries"),
                       ("duplicated deliveries (at-least-once)", "duplicated"),
                       ("stored in two generations (retry across a crash)",
                        "stored_in_two_generations"),
                       ("lost, explained by a shard crash (G7)*", "lost_explained_by_crash"),
                       ("  of which no subscriber got (messages)", "lost_by_every_subscriber"),
                       ("lost, unexplained*", "lost_unexplained")):
        style = "[bold red]" if key == "lost_unexplained" and m[key] else ""
        messages.add_row(label, f"{style}{m[key]}")
    console.print(messages)
    console.print("* (subscriber, message) pairs: an acked message a live subscriber never got",
                  markup=False)

    _show_storage(console, data)

    violations = data["checker"]["violations"]
    if violations:
        console.print(f"[bold red]checker: {len(violations)} violation(s);"
                      f" rules {', '.join(data['checker']['rules'])}")
        for line in violations[:MAX_VIOLATIONS_SHOWN]:
            console.print(f"  {line}", markup=False, highlight=False)
    if data["crashes"]:
        console.print(f"[bold red]processes that crashed: {len(data['crashes'])}")
        for line in data["crashes"][:MAX_VIOLATIONS_SHOWN]:
            console.print(f"  {line}", markup=False, highlight=False)
    fatal = [r for r in data["checker"]["rules"] if r in FATAL_RULES]
    if fatal:
        console.print(f"[bold red]fatal: {', '.join(fatal)}")
    a = data["adoption"]
    console.print(f"router restarts: {a['router_restarts']}, shards adopted {a['adopted']},"
                  f" replaced {a['replaced']} (without a fault to explain it:"
                  f" {a['replaced_without_cause']})", markup=False)
    for note in data["notes"]:
        console.print(f"note: {note}", markup=False)
    verdict = "[bold green]PASS" if data["ok"] else "[bold red]FAIL"
    per_kind = "".join(f" {kind}: acked={st['acked']} lost={st['lost_unexplained']}"
                       f" gen-changes={st['generation_changes']}"
                       for kind, st in data["storage"]["by_kind"].items())
    console.print(f"{verdict}[/] seed={data['seed']} faults={data['faults']['injected']}"
                  f" published={m['published']} acked={m['acked']}"
                  f" lost(unexplained)={m['lost_unexplained']}{per_kind}"
                  f" dead-letters={m['dead_lettered']}"
                  f" wall={data['wall_seconds']}s", highlight=False)


STORAGE_ROWS = (
    ("topics", "topics"),
    ("acked", "acked"),
    ("delivered (to at least one subscriber)", "delivered"),
    ("deliveries (repeats included)", "deliveries"),
    ("lost, explained by a shard crash (G7)†", "lost_explained"),
    ("lost, unexplained†", "lost_unexplained"),
    ("  acked, no subscriber got (messages)", "lost_by_all"),
    ("generations seen", "generations"),
    ("generation changes", "generation_changes"),
    ("replies with a shard's generation", "shard_generation"),
    ("process kills of a shard holding them", "kills"),
)
# rows that must be 0 for disk topics (G9), shown red otherwise
DISK_ZERO = ("lost_unexplained", "lost_by_all", "generation_changes", "shard_generation")


def _show_storage(console: Console, data: dict[str, Any]) -> None:
    storage = data["storage"]
    kinds = storage["by_kind"]
    title = f"By storage ({storage['mode']}" + (
        f", fsync {storage['fsync']})" if storage["fsync"] else ")")
    table = Table(title=title, title_justify="left")
    table.add_column("what")
    for kind in kinds:
        table.add_column(kind, justify="right")
    for label, key in STORAGE_ROWS:
        cells = []
        for kind, st in kinds.items():
            value = st[key]
            if key == "topics":
                cells.append(str(len(value)))
                continue
            bad = kind == "disk" and key in DISK_ZERO and value
            cells.append(f"[bold red]{value}" if bad else str(value))
        table.add_row(label, *cells)
    console.print(table)
    console.print("† (live subscriber, acked message id) pairs never received in any"
                  " generation; nothing explains a disk topic's (G9)", markup=False)
    disk = kinds.get("disk")
    if disk and (disk["lost_ids"] or disk["changed"]):
        console.print("[bold red]disk topics broke G9 across process kills:")
        for line in disk["lost_ids"] + [f"generation changed: {c}" for c in disk["changed"]]:
            console.print(f"  {line}", markup=False, highlight=False)
