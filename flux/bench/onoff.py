"""What auth or TLS costs: end-to-end throughput with the feature on and off.

``python -m flux.bench.onoff --feature auth|tls [--pairs 5] [--count 400000]`` runs the
bench's end-to-end workload (a producer and a consumer process, 100-byte messages,
push delivery with acks) against a fresh ``flux serve --shards 2`` per run, in pairs
whose order alternates (on/off, off/on, ...).

- ``auth``: both clients log in with a token whose user has ``--patterns`` allow
  patterns (and as many deny patterns, none matching) for publish and subscribe, the
  bench topic matched by the last allow: the worst case for a matcher without its
  decision cache.
- ``tls``: the router and shards speak TLS with a certificate of a throwaway CA
  (trustme, a dev dependency); the clients verify it.

Prints each pair, then medians and spreads of throughput and the shards' CPU per message.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import tempfile
from collections.abc import Iterator

from flux.auth.credentials import token_digest
from flux.bench import systems
from flux.bench.runner import Plan, Runner
from flux.tls import throwaway_pki

TOKEN = "bench-token-0123456789abcdef"


def users(patterns: int) -> list[dict[str, object]]:
    """One user whose rules' last allow matches the bench topics (bench.>)."""
    rule = {"allow": [f"other{i}.>" for i in range(patterns - 1)] + ["bench.>"],
            "deny": [f"bench.denied{i}.>" for i in range(patterns)]}
    return [{"name": "bench", "token_sha256": token_digest(TOKEN), "publish": rule,
             "subscribe": rule}]


@contextlib.contextmanager
def certificates() -> Iterator[dict[str, str]]:
    """Files of a throwaway CA and a server certificate for 127.0.0.1."""
    with tempfile.TemporaryDirectory(prefix="flux-bench-tls-") as tmp:
        yield throwaway_pki(tmp)


@dataclasses.dataclass
class Run:
    rate: float              # end-to-end messages per second
    shard_cpu_us: float      # shard CPU per message (microseconds)


def one_run(runner: Runner, count: int, feature: str, on: bool, patterns: int,
            files: dict[str, str]) -> Run:
    settings = {"http.enabled": "false"}
    if on and feature == "auth":
        settings["auth.users"] = json.dumps(users(patterns))
    elif on:
        settings.update({"tls.cert": files["cert"], "tls.key": files["key"]})
    broker = systems.start_flux(2, settings)
    try:
        if on and feature == "auth":  # every worker proves the token (it is in the URL)
            broker = dataclasses.replace(broker, url=f"{broker.url}?token={TOKEN}")
        elif on:
            address = broker.url.split("://", 1)[1]
            broker = dataclasses.replace(broker, url=f"flux+tls://{address}?ca={files['ca']}")
        spec = runner._producer("flux", broker, 100, count)
        out = runner._measure("flux", broker, [spec], consumer=True)
        if out is None:
            raise systems.BenchError("; ".join(runner.figures["flux"].errors[-3:]))
        return Run(float(out["rate"]), float(out["server_cpu_us"] or 0.0))
    finally:
        broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--feature", choices=("auth", "tls"), required=True)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--count", type=int, default=400_000)
    parser.add_argument("--patterns", type=int, default=100)
    args = parser.parse_args()
    runner = Runner(Plan(["flux"], count=args.count), lambda description: None)
    runs: dict[bool, list[Run]] = {True: [], False: []}
    ratios: list[float] = []
    with contextlib.ExitStack() as stack:
        files = stack.enter_context(certificates()) if args.feature == "tls" else {}
        for pair in range(args.pairs):
            order = (True, False) if pair % 2 == 0 else (False, True)
            done = {on: one_run(runner, args.count, args.feature, on, args.patterns, files)
                    for on in order}
            for on, run in done.items():
                runs[on].append(run)
            ratios.append(done[True].rate / done[False].rate)
            print(f"pair {pair + 1}: " + "; ".join(
                f"{'on' if on else 'off'} {r.rate:,.0f} msg/s, shard {r.shard_cpu_us:.2f}"
                " us/msg" for on, r in done.items()) + f"; on/off {ratios[-1]:.1%}", flush=True)
    for on in (True, False):
        rs = runs[on]
        print(f"{args.feature} {'on ' if on else 'off'}: median"
              f" {statistics.median(r.rate for r in rs):,.0f} msg/s"
              f" (spread {min(r.rate for r in rs):,.0f} .. {max(r.rate for r in rs):,.0f}),"
              f" shard {statistics.median(r.shard_cpu_us for r in rs):.2f} us/msg")
    print(f"on/off throughput: median {statistics.median(ratios):.1%}"
          f" (spread {min(ratios):.1%} .. {max(ratios):.1%})")


if __name__ == "__main__":
    main()
