"""``python -m fuzz`` (``make fuzz``): fuzz a real ``flux serve`` over the wire.

Exit status 0: no violation; 1: a violation (a process died or was replaced, a
connection closed without a listed reason, a request went unanswered, the good
client's data changed); 3: the run itself broke.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import trio
from rich.console import Console
from rich.table import Table

from fuzz.runner import FuzzSettings, Tally, run


def parse_args(argv: list[str] | None) -> FuzzSettings:
    base = FuzzSettings()
    p = argparse.ArgumentParser(prog="python -m fuzz",
                                description="Structured and byte-level mutations of every"
                                            " client frame against a real flux serve.")
    p.add_argument("--frames", type=int, default=base.frames,
                   help="frames to send (default %(default)s)")
    p.add_argument("--connections", type=int, default=base.connections,
                   help="fuzzing connections at once (default %(default)s)")
    p.add_argument("--seed", type=int, default=base.seed)
    p.add_argument("--shards", type=int, default=base.shards)
    p.add_argument("--storage", choices=("memory", "disk", "mixed"), default=base.storage,
                   help="topics on memory, on disk, or both (default %(default)s)")
    p.add_argument("--rounds", type=int, default=base.rounds,
                   help="good-client rounds over the run (default %(default)s)")
    p.add_argument("--auth", action="store_true",
                   help="run the broker with an auth section: HELLOs prove users (good,"
                        " limited, wrong and missing credentials), every item is checked")
    p.add_argument("--out", type=Path, default=base.out, help="where the report goes")
    a = p.parse_args(argv)
    if a.frames < 1 or a.connections < 1 or a.shards < 1:
        p.error("--frames, --connections and --shards must be at least 1")
    return FuzzSettings(frames=a.frames, connections=a.connections, seed=a.seed,
                        shards=a.shards, storage=a.storage, rounds=a.rounds, auth=a.auth,
                        out=a.out)


def report(tally: Tally, console: Console) -> None:
    table = Table(title="fuzz: what was sent and what came back")
    table.add_column("frame kinds sent")
    table.add_column("mutations")
    table.add_column("answers")
    table.add_column("closes")
    cols = [sorted(tally.sent.items()), sorted(tally.mutations.items()),
            sorted(tally.answers.items(), key=lambda kv: -kv[1]), sorted(tally.closes.items())]
    for row in range(max(len(c) for c in cols)):
        table.add_row(*(f"{c[row][0]}: {c[row][1]:,}" if row < len(c) else "" for c in cols))
    console.print(table)
    console.print(f"{tally.frames:,} frames ({tally.damaged:,} damaged), {tally.connections:,}"
                  f" connections; good client: {tally.good_rounds} rounds,"
                  f" {tally.good_messages:,} messages read back")
    for v in tally.violations[:30]:
        console.print(f"[red]violation[/red]: {v}")
    console.print("[green]PASS[/green]" if not tally.violations else
                  f"[red]FAIL[/red]: {len(tally.violations)} violations")


def main(argv: list[str] | None = None) -> int:
    settings = parse_args(argv)
    console = Console()
    workdir = settings.out / time.strftime("fuzz-%Y%m%d-%H%M%S")
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        tally = trio.run(run, settings, workdir, console.print)
    except (RuntimeError, OSError, AssertionError) as exc:
        console.print(f"[red]the run broke[/red]: {exc} (see {workdir})")
        return 3
    report(tally, console)
    (workdir / "report.json").write_text(json.dumps({
        "frames": tally.frames, "connections": tally.connections, "damaged": tally.damaged,
        "sent": tally.sent, "mutations": tally.mutations, "answers": tally.answers,
        "closes": tally.closes, "good_rounds": tally.good_rounds,
        "good_messages": tally.good_messages, "violations": tally.violations}, indent=2))
    return 1 if tally.violations else 0


if __name__ == "__main__":
    sys.exit(main())
