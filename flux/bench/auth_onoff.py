"""What auth costs (G13): end-to-end throughput with it on and off.

``python -m flux.bench.auth_onoff [--pairs 5] [--count 400000] [--patterns 100]`` runs
the bench's end-to-end workload (a producer and a consumer process, 100-byte
messages, push delivery with acks) against a fresh ``flux serve --shards 2`` per
run, in pairs whose order alternates (on/off, off/on, ...). With auth on, both
clients log in with a token whose user has ``--patterns`` allow patterns (and as
many deny patterns, none matching) for publish and subscribe, the bench topic matched
by the last allow: the worst case for a matcher without its decision cache.
Prints each pair, then medians and spreads of throughput and the shards' CPU per message.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics

from flux.auth.credentials import token_digest
from flux.bench import systems
from flux.bench.runner import Plan, Runner

TOKEN = "bench-token-0123456789abcdef"


def users(patterns: int) -> list[dict[str, object]]:
    """One user whose rules' last allow matches the bench topics (bench.>)."""
    rule = {"allow": [f"other{i}.>" for i in range(patterns - 1)] + ["bench.>"],
            "deny": [f"bench.denied{i}.>" for i in range(patterns)]}
    return [{"name": "bench", "token_sha256": token_digest(TOKEN), "publish": rule,
             "subscribe": rule}]


@dataclasses.dataclass
class Run:
    rate: float              # end-to-end messages per second
    shard_cpu_us: float      # shard CPU per message (microseconds)


def one_run(runner: Runner, count: int, on: bool, patterns: int) -> Run:
    settings = {"http.enabled": "false"}
    if on:
        settings["auth.users"] = json.dumps(users(patterns))
    broker = systems.start_flux(2, settings)
    try:
        if on:  # every worker proves the token (it travels in the URL)
            broker = dataclasses.replace(broker, url=f"{broker.url}?token={TOKEN}")
        spec = runner._producer("flux", broker, 100, count)
        out = runner._measure("flux", broker, [spec], consumer=True)
        if out is None:
            raise systems.BenchError("; ".join(runner.figures["flux"].errors[-3:]))
        return Run(float(out["rate"]), float(out["server_cpu_us"] or 0.0))
    finally:
        broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--count", type=int, default=400_000)
    parser.add_argument("--patterns", type=int, default=100)
    args = parser.parse_args()
    runner = Runner(Plan(["flux"], count=args.count), lambda description: None)
    runs: dict[bool, list[Run]] = {True: [], False: []}
    diffs: list[float] = []
    for pair in range(args.pairs):
        order = (True, False) if pair % 2 == 0 else (False, True)
        done = {on: one_run(runner, args.count, on, args.patterns) for on in order}
        for on, run in done.items():
            runs[on].append(run)
        diffs.append(done[True].rate / done[False].rate - 1)
        print(f"pair {pair + 1}: " + "; ".join(
            f"{'on' if on else 'off'} {r.rate:,.0f} msg/s, shard {r.shard_cpu_us:.2f} us/msg"
            for on, r in done.items()) + f"; on/off {diffs[-1]:+.1%}", flush=True)
    for on in (True, False):
        rs = runs[on]
        print(f"{'on ' if on else 'off'}: median {statistics.median(r.rate for r in rs):,.0f} msg/s"
              f" (spread {min(r.rate for r in rs):,.0f} .. {max(r.rate for r in rs):,.0f}),"
              f" shard {statistics.median(r.shard_cpu_us for r in rs):.2f} us/msg")
    print(f"on/off throughput difference: median {statistics.median(diffs):+.1%}"
          f" (spread {min(diffs):+.1%} .. {max(diffs):+.1%})")


if __name__ == "__main__":
    main()
