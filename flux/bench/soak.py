"""A soak run (``make soak``, ``python -m flux.bench.soak --minutes 10``).

Starts ``flux serve`` with its defaults (a data directory, so that half of the topics
are disk topics: ``soak.disk.*``; the 120 s dedup window), over ``--topics`` topics
that every shard holds some of, memory and disk. First it measures what this setup
does flat out (``--calibrate`` seconds of producers publishing as fast as they can
while consumers read); then producers publish at ``--load`` (80 %) of that, through
the real client, for ``--minutes``, while consumers read and ack everything. Each
minute it samples every process's RSS and the consumers report that minute's
publish-to-delivery latencies. It then checks that every message acked to a
producer was delivered (offset ranges per topic and generation), that nothing was
refused with TopicFull and no process restarted, and fits a line to each process's
RSS after the warm-up. It writes ``report.json`` and ``soak.png``.

Passes when nothing was lost, nothing refused, no process restarted and every
process's RSS is flat after the warm-up (it grows by less than ``FLAT_GROWTH`` of
itself, or ``FLAT_BYTES``, over the rest of the run).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from flux.hashing import shard_for

ROOT = Path(__file__).resolve().parents[2]
FLAT_GROWTH = 0.05      # RSS may grow by this share of itself after the warm-up ...
FLAT_BYTES = 16 << 20   # ... or by this many bytes, whichever is larger
WARMUP_SHARE = 0.25     # the first quarter of the run (at least a minute) is the warm-up
LATE_SHOWN = 8          # late deliveries printed a minute (report.json has them all)
LINGER = 120.0          # seconds consumers may keep reading after the producers stop


@dataclass
class SoakSettings:
    minutes: float = 10.0
    calibrate: float = 20.0
    load: float = 0.8
    topics: int = 24
    shards: int = 2
    producers: int = 2
    consumers: int = 2
    out: Path = Path("soak-results")
    broker_set: list[str] = field(default_factory=list)   # more ``flux serve --set`` items
    rate: float = 0.0   # msg/s to soak at instead of ``load`` of the measured rate (0: that)


@dataclass
class Proc:
    """A worker process and the JSON events it printed."""

    name: str
    process: trio.Process
    events: list[dict[str, Any]] = field(default_factory=list)
    ready: trio.Event = field(default_factory=trio.Event)
    done: trio.Event = field(default_factory=trio.Event)

    async def read(self) -> None:
        assert self.process.stdout is not None
        buffer = b""
        async for chunk in self.process.stdout:
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                event = json.loads(line)
                self.events.append(event)
                if event.get("event") == "ready":
                    self.ready.set()
        self.ready.set()
        self.done.set()

    async def send(self, line: bytes) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send_all(line)

    def result(self) -> dict[str, Any]:
        return next((e for e in self.events if e.get("event") == "result"), {})

    def minutes(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == "minute"]


def pick_topics(count: int, shards: int) -> list[str]:
    """``count`` topics, half ``soak.mem.*`` and half ``soak.disk.*``, spread so that
    every shard holds topics of both kinds."""
    out: list[str] = []
    for kind in ("mem", "disk"):
        want = count // 2 if kind == "mem" else count - count // 2
        per_shard: dict[int, list[str]] = {i: [] for i in range(shards)}
        i = 0
        while sum(len(v) for v in per_shard.values()) < want:
            name = f"soak.{kind}.t{i}"
            owner = shard_for(name, shards)
            if len(per_shard[owner]) < -(-want // shards):
                per_shard[owner].append(name)
            i += 1
        out += [t for v in per_shard.values() for t in v]
    return out


def rss_of(pid: int) -> int | None:
    """Resident bytes of process ``pid`` (None if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


async def start_worker(name: str, spec: dict[str, Any], nursery: trio.Nursery) -> Proc:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "flux.bench.soak_worker", json.dumps(spec)],
        stdin=-1, stdout=-1, env=env)
    proc = Proc(name, process)
    nursery.start_soon(proc.read)
    return proc


async def run_workers(url: str, topics: list[str], s: SoakSettings, rate: float,
                      seconds: float, nursery: trio.Nursery, tick: Any = None,
                      started_workers: list[Proc] | None = None
                      ) -> tuple[list[Proc], list[Proc]]:
    """Consumers, then producers (``rate`` in all, 0 for flat out) for ``seconds``;
    ``tick`` is awaited every minute meanwhile (``started_workers`` gets every worker
    as it starts). Returns both lists once all reported."""
    consumers = [await start_worker(f"consumer-{i}", {
        "role": "consumer", "url": url, "topics": topics[i::s.consumers], "linger": LINGER},
        nursery) for i in range(s.consumers)]
    for c in consumers:
        await c.ready.wait()
    producers = [await start_worker(f"producer-{i}", {
        "role": "producer", "url": url, "topics": topics[i::s.producers],
        "rate": rate / s.producers}, nursery) for i in range(s.producers)]
    for p in producers:
        await p.ready.wait()
    if started_workers is not None:
        started_workers.extend(consumers + producers)
    for w in consumers + producers:
        await w.send(b"go\n")
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        await trio.sleep(min(60.0, seconds - (time.monotonic() - started)))
        if tick is not None and time.monotonic() - started < seconds:
            await tick()
    for c in consumers:   # what arrived while the producers ran
        await c.send(b"count\n")
    for p in producers:
        await p.send(b"stop\n")
    for p in producers:
        await p.done.wait()
    for c in consumers:
        await c.send(b"stop\n")
    for c in consumers:
        await c.done.wait()
    return producers, consumers


def lost(producers: list[Proc], consumers: list[Proc]) -> tuple[int, int, list[str]]:
    """(acked, delivered, problems): every acked offset of every topic and generation must
    have been delivered."""
    delivered: dict[tuple[str, str], list[list[int]]] = {}
    count = 0
    for c in consumers:
        for topic, gens in c.result().get("delivered", {}).items():
            for gen, spans in gens.items():
                delivered.setdefault((topic, gen), []).extend(spans)
                count += sum(b - a for a, b in spans)
    problems: list[str] = []
    acked = 0
    for p in producers:
        for topic, gens in p.result().get("acked", {}).items():
            for gen, spans in gens.items():
                have = sorted(delivered.get((topic, gen), []))
                for a, b in spans:
                    acked += b - a
                    missing = _uncovered(a, b, have)
                    if missing:
                        problems.append(f"{topic} generation {gen}: {missing} acked messages"
                                        f" in [{a}, {b}) never delivered")
    return acked, count, problems


def _uncovered(a: int, b: int, spans: list[list[int]]) -> int:
    covered = 0
    for x, y in spans:
        lo, hi = max(a, x), min(b, y)
        if hi > lo:
            covered += hi - lo
    return (b - a) - covered


def slope(points: list[tuple[float, int]]) -> float:
    """Least-squares bytes per minute of ``points`` (minute, bytes)."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    den = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else 0.0


async def soak(s: SoakSettings, workdir: Path, say: Any = print) -> dict[str, Any]:
    from chaos.cluster import Cluster, ProcessGroup
    from chaos.runner import free_ports

    ports = free_ports(1 + s.shards)
    data_dir = (workdir / "data").resolve()
    policy = json.dumps([{"match": "soak.disk.>", "storage": "disk"}])
    group = ProcessGroup(budget=s.minutes * 60 + s.calibrate + 600)
    cluster = Cluster(group, workdir, port=ports[0], shard_ports=ports[1:],
                      proxy_ports=ports[1:], settings=[], plant=None,
                      extra_args=["--set", f"storage.dir={data_dir}", "--set", f"topics={policy}",
                                  *(a for item in s.broker_set for a in ("--set", item))])
    url = f"flux://127.0.0.1:{ports[0]}"
    report: dict[str, Any] = {"settings": {k: str(v) for k, v in vars(s).items()}}
    await group.start()
    try:
        async with trio.open_nursery() as nursery:
            await cluster.start_router(nursery)
            stats = await cluster.stats()
            assert stats is not None, "the router does not answer STATS"
            pids = {f"shard-{sh['index']}": sh["pid"] for sh in stats["shards"]}
            assert cluster.router is not None
            pids["router"] = cluster.router.process.pid
            topics = pick_topics(s.topics, s.shards)
            say(f"soak: broker on {url}, {s.shards} shards, {len(topics)} topics (half on disk)")
            cal_topics = [t.replace("soak.", "soak.cal.") for t in topics]
            started = time.monotonic()
            producers, consumers = await run_workers(url, cal_topics, s, 0.0, s.calibrate,
                                                     nursery)
            took = time.monotonic() - started
            acked = sum(p.result().get("counts", {}).get("acked", 0) for p in producers)
            # what the consumers had read when the producers stopped: the rate the
            # whole pipeline sustains, not what piled up to be read later
            got = sum(next((e["delivered"] for e in c.events if e.get("event") == "count"), 0)
                      for c in consumers)
            measured = min(acked, got) / max(s.calibrate, 1e-9)
            rate = s.rate or s.load * measured
            report["calibration"] = {"seconds": s.calibrate, "acked": acked, "delivered": got,
                                     "wall": took, "msg_per_s": measured, "soak_rate": rate}
            say(f"soak: flat out {measured:,.0f} msg/s end to end; soaking at"
                f" {'the rate given' if s.rate else f'{s.load:.0%}'}: {rate:,.0f} msg/s for"
                f" {s.minutes:g} min")
            samples: list[dict[str, Any]] = []
            t0 = time.monotonic()
            workers: list[Proc] = []

            async def sample() -> None:
                row: dict[str, Any] = {"minute": (time.monotonic() - t0) / 60}
                for name, pid in pids.items():
                    row[name] = rss_of(pid)
                for w in workers:
                    row[w.name] = rss_of(w.process.pid)
                samples.append(row)
                say(f"soak: minute {row['minute']:.1f}: RSS " + ", ".join(
                    f"{k} {v / 2**20:.0f} MB" for k, v in row.items()
                    if k != "minute" and v is not None))

            await sample()
            producers, consumers = await run_workers(url, topics, s, rate, s.minutes * 60,
                                                     nursery, sample, workers)
            await sample()
            after = await cluster.stats()
            restarts = sum(sh.get("restarts", 0) for sh in (after or {}).get("shards", []))
            await cluster.stop()
            nursery.cancel_scope.cancel()
    finally:
        cluster.kill_shards()
        group.kill_all()
        with trio.CancelScope(shield=True):
            await group.reap()
        shutil.rmtree(data_dir, ignore_errors=True)
    acked, delivered, problems = lost(producers, consumers)
    refused: dict[str, int] = {}
    for p in producers:
        for key, n in p.result().get("counts", {}).items():
            if key.startswith("error"):
                refused[key] = refused.get(key, 0) + n
    minutes = [_merge_minute([c.minutes()[i] for c in consumers if i < len(c.minutes())],
                             [p.minutes()[i] for p in producers if i < len(p.minutes())])
               for i in range(max((len(c.minutes()) for c in consumers), default=0))]
    warm = max(1.0, s.minutes * WARMUP_SHARE)
    flat: dict[str, Any] = {}
    for name in pids:
        points = [(r["minute"], r[name]) for r in samples
                  if r.get(name) is not None and r["minute"] >= warm]
        if not points:
            continue
        per_min = slope(points)
        span = points[-1][0] - points[0][0]
        growth = per_min * span
        mean = sum(y for _, y in points) / len(points)
        flat[name] = {"slope_bytes_per_min": per_min, "growth_bytes": growth,
                      "mean_bytes": mean,
                      "flat": growth <= max(FLAT_GROWTH * mean, FLAT_BYTES)}
    report.update({
        "acked": acked, "delivered_offsets": delivered, "lost": problems,
        "refused": refused, "restarts": restarts, "latency_per_minute": minutes,
        "consumers": [c.result().get("latency", {}) for c in consumers],
        "redelivered": sum(c.result().get("counts", {}).get("redelivered", 0)
                           for c in consumers),
        "rss_samples": samples, "rss": flat,
    })
    report["pass"] = (not problems and not refused.get("error TopicFull") and not restarts
                      and all(v["flat"] for v in flat.values()) and acked > 0)
    return report


def _merge_minute(rows: list[dict[str, Any]],
                  producer_rows: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """One minute of every consumer: the worst of each quantile, messages summed, the
    late deliveries in time order; and the longest loop lag of consumers and producers
    (with when it was)."""
    if not rows:
        return {}
    keys = ("p50_us", "p99_us", "p999_us", "max_us")
    merged: dict[str, Any] = {"n": sum(r.get("n", 0) for r in rows),
                              **{k: max(r.get(k, 0.0) for r in rows) for k in keys}}
    kinds = {kind for r in rows for kind in r.get("by_kind", {})}
    if kinds:  # memory and disk topics apart (a disk topic's delivery waits for its fsync)
        merged["by_kind"] = {kind: {k: max(r.get("by_kind", {}).get(kind, {}).get(k, 0.0)
                                           for r in rows) for k in keys}
                             for kind in sorted(kinds)}
    if any("consumer_gc_max_us" in r for r in rows):
        merged["consumer_gc_max_us"] = max(r.get("consumer_gc_max_us", 0.0) for r in rows)
    late = sorted(item for r in rows for item in r.get("late", ()))
    if late:
        merged["late"] = late
    for role, some in (("consumers", rows), ("producers", producer_rows)):
        lags = [r for r in some if "loop_lag_max_ms" in r]
        if lags:
            worst = max(lags, key=lambda r: r["loop_lag_max_ms"])
            merged[f"{role}_loop_lag"] = [worst["loop_lag_max_ms"], worst["loop_lag_at"]]
    return merged


def plot(report: dict[str, Any], path: Path) -> None:
    """RSS of every process and the latency quantiles, per minute."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    samples = report["rss_samples"]
    names = sorted({k for r in samples for k in r if k != "minute"})
    for name in names:
        points = [(r["minute"], r[name] / 2**20) for r in samples if r.get(name)]
        if points:
            top.plot(*zip(*points, strict=True), marker=".", label=name)
    top.set_ylabel("RSS (MB)")
    top.legend(fontsize=7, ncol=3)
    top.set_title("soak: resident memory and publish-to-delivery latency per minute")
    minutes = report["latency_per_minute"]
    xs = [i + 1 for i in range(len(minutes))]
    for key, label in (("p50_us", "p50"), ("p99_us", "p99"), ("p999_us", "p99.9"),
                       ("max_us", "max")):
        bottom.plot(xs, [m.get(key, 0) / 1000 for m in minutes], marker=".", label=label)
    bottom.axhline(5, color="grey", linestyle=":", linewidth=1)
    bottom.axhline(25, color="grey", linestyle="--", linewidth=1)
    bottom.set_yscale("log")
    bottom.set_ylabel("latency (ms)")
    bottom.set_xlabel("minute")
    bottom.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    base = SoakSettings()
    p = argparse.ArgumentParser(prog="python -m flux.bench.soak", description=__doc__.split(
        "\n\n")[0])
    p.add_argument("--minutes", type=float, default=base.minutes)
    p.add_argument("--calibrate", type=float, default=base.calibrate,
                   help="seconds of the flat-out measurement first (default %(default)s)")
    p.add_argument("--load", type=float, default=base.load,
                   help="share of the flat-out rate to soak at (default %(default)s)")
    p.add_argument("--rate", type=float, default=base.rate,
                   help="msg/s to soak at, whatever the calibration measured (to compare runs"
                        " on a machine whose spare CPU changes; default: --load of it)")
    p.add_argument("--topics", type=int, default=base.topics)
    p.add_argument("--shards", type=int, default=base.shards)
    p.add_argument("--out", type=Path, default=base.out)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="broker_set",
                   help="a config item for the broker (flux serve --set), e.g."
                        " storage.segment_bytes=25165824 so that segments seal within minutes")
    a = p.parse_args(argv)
    if a.minutes <= 0 or a.calibrate <= 0 or not 0 < a.load <= 1 or a.topics < 2 or a.rate < 0:
        p.error("--minutes and --calibrate must be positive, --load in (0, 1], --topics >= 2,"
                " --rate >= 0")
    s = SoakSettings(minutes=a.minutes, calibrate=a.calibrate, load=a.load, topics=a.topics,
                     shards=a.shards, out=a.out, broker_set=a.broker_set,
                     rate=a.rate)
    workdir = s.out / time.strftime("soak-%Y%m%d-%H%M%S")
    workdir.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))   # chaos/ and fuzz/ sit beside the package
    report = trio.run(soak, s, workdir)
    log_file = workdir / "broker.log"  # the shards' stall warnings (flux.shard.stalls)
    report["stalls"] = [line.strip() for line in (
        log_file.read_text(errors="replace").splitlines() if log_file.exists() else ())
        if "held the event loop" in line or "the event loop woke" in line]
    (workdir / "report.json").write_text(json.dumps(report, indent=2))
    plot(report, workdir / "soak.png")
    for i, m in enumerate(report["latency_per_minute"], 1):
        print(f"minute {i}: {m.get('n', 0):,} delivered; latency p50 {m.get('p50_us', 0):,.0f}"
              f" us, p99 {m.get('p99_us', 0):,.0f} us, p99.9 {m.get('p999_us', 0):,.0f} us,"
              f" max {m.get('max_us', 0):,.0f} us" + "".join(
                  f"; {kind} p99.9 {v.get('p999_us', 0):,.0f} max {v.get('max_us', 0):,.0f}"
                  for kind, v in m.get("by_kind", {}).items())
              + (f"; consumers' longest gc {m['consumer_gc_max_us']:,.0f} us"
                 if "consumer_gc_max_us" in m else "")
              + "".join(f"; {role} loop lag {m[f'{role}_loop_lag'][0]:,.1f} ms at"
                        f" {time.strftime('%H:%M:%S', time.localtime(m[f'{role}_loop_lag'][1]))}"
                        for role in ("consumers", "producers") if f"{role}_loop_lag" in m))
        if m.get("late"):
            print("  late deliveries (wall time, ms, topic): " + ", ".join(
                f"{time.strftime('%H:%M:%S', time.localtime(at))}.{int(at % 1 * 10)}"
                f" {ms:,.0f} {topic}" for at, ms, topic in m["late"][:LATE_SHOWN]))
    for name, v in report["rss"].items():
        print(f"{name}: RSS {v['mean_bytes'] / 2**20:.0f} MB after warm-up, slope"
              f" {v['slope_bytes_per_min'] / 2**20:+.2f} MB/min"
              f" ({'flat' if v['flat'] else 'GROWING'})")
    print(f"acked {report['acked']:,}, lost {len(report['lost'])} ranges, refused"
          f" {report['refused']}, restarts {report['restarts']}, redelivered"
          f" {report['redelivered']:,}; report and plot in {workdir}")
    print(f"{len(report['stalls'])} stall warnings in the shards' log"
          + "".join(f"\n  {line}" for line in report["stalls"][:10]))
    print("PASS" if report["pass"] else "FAIL")
    for line in report["lost"][:10]:
        print("lost:", line)
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
