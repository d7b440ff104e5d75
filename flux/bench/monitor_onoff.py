"""What the router's HTTP endpoint costs: end-to-end throughput with it on and off.

``python -m flux.bench.monitor_onoff [--pairs 5] [--count 400000]`` runs the bench's
end-to-end workload (a producer and a consumer process, 100-byte messages, push
delivery with acks) against a fresh ``flux serve --shards 2`` per run, in pairs
whose order alternates (on/off, off/on, ...). While the endpoint is on, a scraper
asks for ``/metrics`` every ``--scrape-every`` seconds (default half a second, far
busier than Prometheus' usual 15 s).
Prints each pair, then medians and spreads: throughput, the shards' CPU per message
and the router's CPU per run (on a busy machine the CPU figures are the steadier ones).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import statistics
import threading
import urllib.request

from flux.bench import systems
from flux.bench.measure import total_cpu
from flux.bench.runner import Plan, Runner

SCRAPE_EVERY = 0.5  # default of --scrape-every


def _scrape(url: str, every: float, stop: threading.Event, counts: list[int]) -> None:
    while not stop.is_set():
        try:
            with urllib.request.urlopen(url + "metrics", timeout=5) as response:
                response.read()
            counts[0] += 1
        except OSError:
            counts[1] += 1
        stop.wait(every)


@dataclasses.dataclass
class Run:
    """One run's figures."""

    rate: float              # end-to-end messages per second
    shard_cpu_us: float      # shard CPU per message (microseconds)
    router_cpu_ms: float     # the router process's CPU during the run (milliseconds)
    scrapes: int


def one_run(runner: Runner, count: int, on: bool, scrape_every: float = SCRAPE_EVERY) -> Run:
    """The end-to-end workload against a fresh broker with the endpoint on or off."""
    settings = {"http.enabled": "true" if on else "false", "http.port": 0}
    broker = systems.start_flux(2, settings)
    stop = threading.Event()
    counts = [0, 0]
    scraper = None
    try:
        if on:
            assert broker.process.stdout is not None
            line = broker.process.stdout.readline().decode()
            match = re.match(r"flux: http listening on (\S+)", line)
            if match is None:
                raise systems.BenchError(f"no http line from flux serve: {line!r}")
            scraper = threading.Thread(target=_scrape, args=(match.group(1), scrape_every, stop,
                                                           counts))
            scraper.start()
        spec = runner._producer("flux", broker, 100, count)
        before = total_cpu([broker.process.pid]) or 0.0
        out = runner._measure("flux", broker, [spec], consumer=True)
        router = (total_cpu([broker.process.pid]) or 0.0) - before
        if out is None:
            raise systems.BenchError("; ".join(runner.figures["flux"].errors[-3:]))
        return Run(float(out["rate"]), float(out["server_cpu_us"] or 0.0), 1000 * router,
                   counts[0])
    finally:
        stop.set()
        if scraper is not None:
            scraper.join()
        broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--count", type=int, default=400_000)
    parser.add_argument("--scrape-every", type=float, default=SCRAPE_EVERY,
                        help="seconds between two scrapes of /metrics while the endpoint is on")
    args = parser.parse_args()
    runner = Runner(Plan(["flux"], count=args.count), lambda description: None)
    runs: dict[bool, list[Run]] = {True: [], False: []}
    diffs: list[float] = []
    for pair in range(args.pairs):
        order = (True, False) if pair % 2 == 0 else (False, True)
        done = {on: one_run(runner, args.count, on, args.scrape_every) for on in order}
        for on, run in done.items():
            runs[on].append(run)
        diffs.append(done[True].rate / done[False].rate - 1)
        print(f"pair {pair + 1}: " + "; ".join(
            f"{'on' if on else 'off'} {r.rate:,.0f} msg/s, shard {r.shard_cpu_us:.2f} us/msg,"
            f" router {r.router_cpu_ms:.0f} ms CPU" + (f" ({r.scrapes} scrapes)" if on else "")
            for on, r in done.items()) + f"; on/off {diffs[-1]:+.1%}", flush=True)
    for on in (True, False):
        rs = runs[on]
        print(f"{'on ' if on else 'off'}: median {statistics.median(r.rate for r in rs):,.0f} msg/s"
              f" (spread {min(r.rate for r in rs):,.0f} .. {max(r.rate for r in rs):,.0f}),"
              f" shard {statistics.median(r.shard_cpu_us for r in rs):.2f} us/msg,"
              f" router {statistics.median(r.router_cpu_ms for r in rs):.0f} ms CPU a run")
    print(f"on/off throughput difference: median {statistics.median(diffs):+.1%}"
          f" (spread {min(diffs):+.1%} .. {max(diffs):+.1%})")

if __name__ == "__main__":
    main()
