"""``python -m chaos`` (``make chaos``): a chaos run, its report, and its exit status.

Exit status 0: the shared checker found no violation; 1: it found one (an
unexplained loss, an unexpected message, an order violation, ...); 2: bad
settings; 3: the run itself broke (the broker did not start or recover);
130: interrupted (every process of the run is stopped all the same).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import trio
from rich.console import Console

from chaos import accounting, report, runner, timeline
from chaos.planted import PLANTED
from chaos.recording import MonotonicClock
from chaos.schedule import parse_mix
from chaos.settings import FSYNC_MODES, STORAGE_MODES, ChaosSettings, from_env


def parse_args(argv: list[str] | None, base: ChaosSettings) -> ChaosSettings:
    p = argparse.ArgumentParser(
        prog="python -m chaos",
        description="Real flux processes under injected faults, checked by the shared checker."
                    " Environment: CHAOS_SEED, CHAOS_DURATION, CHAOS_FAULTS, CHAOS_MIX,"
                    " CHAOS_RATE, CHAOS_LIVENESS, CHAOS_OUT, CHAOS_STORAGE, CHAOS_FSYNC"
                    " (flags win).")
    p.add_argument("--seed", type=int, default=base.seed)
    p.add_argument("--duration", type=float, default=base.duration,
                   help="seconds of the fault phase (default %(default)s)")
    p.add_argument("--faults", type=int, default=base.faults,
                   help="faults spread over it (default %(default)s)")
    p.add_argument("--mix", type=parse_mix, default=None,
                   help="fault weights, e.g. 'shard-kill=1,reset=2' (unnamed kinds: 0)")
    p.add_argument("--rate", type=float, default=base.rate,
                   help="messages/s per producer and topic (default %(default)s)")
    p.add_argument("--liveness", type=float, default=base.liveness,
                   help="seconds after the heal for deliveries to complete")
    p.add_argument("--producers", type=int, default=base.producers)
    p.add_argument("--subscribers", type=int, default=base.subscribers)
    p.add_argument("--pullers", type=int, default=base.pullers,
                   help="pull readers (FETCH, COMMIT after each page)")
    p.add_argument("--flavours", default=",".join(base.flavours),
                   help="client flavours to cycle through (trio,asyncio)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra broker setting (flux serve --set), repeatable")
    p.add_argument("--topics", type=int, default=base.topics,
                   help="topics every client uses (default %(default)s)")
    p.add_argument("--storage", choices=STORAGE_MODES, default=base.storage,
                   help="where topics keep their messages: every topic in memory, every"
                        " topic on disk (flux serve --data-dir), or mixed: about half on disk"
                        " by a topic policy (default %(default)s)")
    p.add_argument("--fsync", choices=FSYNC_MODES, default=base.fsync,
                   help="storage.fsync of the disk topics (default %(default)s)")
    p.add_argument("--keep-data", action="store_true",
                   help="keep the broker's data directory (RESULTS/data) after the run")
    p.add_argument("--out", type=Path, default=base.out, help="results directory root")
    p.add_argument("--plant", choices=sorted(PLANTED),
                   help="run with a broker bug planted on purpose (the run should fail)")
    p.add_argument("--no-png", action="store_true", help="skip the PNG timeline")
    p.add_argument("--tls", action="store_true",
                   help="the broker speaks TLS on its client ports (a throwaway CA); every"
                        " worker verifies it")
    a = p.parse_args(argv)
    flavours = tuple(f for f in a.flavours.split(",") if f)
    if not flavours or any(f not in ("trio", "asyncio") for f in flavours):
        p.error("--flavours takes trio and/or asyncio")
    if a.faults < 0 or a.duration <= 0 or a.rate <= 0 or a.producers < 1 or a.subscribers < 1 \
            or a.pullers < 0 or a.topics < 1:
        p.error("--faults >= 0, --duration > 0, --rate > 0, at least one producer,"
                " subscriber and topic, --pullers >= 0")
    return base.replace(seed=a.seed, duration=a.duration, faults=a.faults,
                        mix=a.mix if a.mix is not None else base.mix, rate=a.rate,
                        liveness=a.liveness, producers=a.producers, subscribers=a.subscribers,
                        pullers=a.pullers, topics=a.topics, storage=a.storage, fsync=a.fsync,
                        keep_data=a.keep_data or base.keep_data,
                        flavours=flavours, extra_settings=tuple(a.set), out=a.out,
                        plant=a.plant, png=not a.no_png, tls=a.tls)


def _leaves(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_leaves(e) for e in exc.exceptions)
    return str(exc)


def main(argv: list[str] | None = None) -> int:
    console = Console()
    try:
        settings = parse_args(argv, from_env())
    except ValueError as exc:
        console.print(f"chaos: {exc}", markup=False)
        return 2
    stamp = time.strftime("%Y%m%d-%H%M%S")
    workdir = settings.out / f"{stamp}-seed{settings.seed}"
    workdir.mkdir(parents=True, exist_ok=True)
    console.print(f"chaos: seed {settings.seed}, storage {settings.storage}"
                  + (f" (fsync {settings.fsync})" if settings.storage != "memory" else "")
                  + f", results in {workdir}", markup=False)
    if settings.plant:
        console.print(f"chaos: planted bug {settings.plant!r}: {PLANTED[settings.plant]}",
                      markup=False)
    started = time.monotonic()
    try:
        out = trio.run(runner.run, settings, workdir,
                       lambda line: console.print(line, markup=False, highlight=False),
                       clock=MonotonicClock())
    except KeyboardInterrupt:
        console.print("chaos: interrupted; every process of the run was stopped", markup=False)
        return 130
    except BaseExceptionGroup as group:
        if group.subgroup(KeyboardInterrupt) is not None:
            console.print("chaos: interrupted; every process of the run was stopped",
                          markup=False)
            return 130
        broke = group.subgroup(RuntimeError)
        if broke is None:
            raise
        console.print(f"[bold red]chaos: the run broke: {_leaves(broke)}")
        return 3
    except RuntimeError as exc:
        console.print(f"[bold red]chaos: the run broke: {exc}")
        return 3
    console.print("chaos: checking the history", markup=False)
    history = accounting.merge(out)
    history_path = workdir / "history.jsonl"
    history.dump(str(history_path))
    verdict = accounting.check(history)
    tally = accounting.tally(out, history, verdict)
    out.crashes += accounting.broker_crashes(workdir / "broker.log")
    ok = not accounting.failed(verdict, out.crashes, tally)
    data = report.as_json(out, tally, verdict, time.monotonic() - started, ok, str(history_path))
    runner.write_json(workdir / "report.json", data)
    report.show(console, data)
    if settings.png:
        if timeline.draw(data, workdir / "timeline.png"):
            console.print(f"chaos: timeline in {workdir / 'timeline.png'}", markup=False)
        else:
            console.print("chaos: no timeline: matplotlib is not installed"
                          " (pip install -e '.[chaos]')", markup=False)
    console.print(f"chaos: report in {workdir / 'report.json'}", markup=False)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
