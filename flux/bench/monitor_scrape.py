"""How long rendering ``/metrics`` takes at the router for a given number of series.

``python -m flux.bench.monitor_scrape [--series 10000] [--repeat 7]`` builds a synthetic
snapshot (two shards, topics with one subscription each) of about that many series and
times a fresh render (what the first scrape after each gathering costs) and a cached one.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from flux.monitor.gather import ShardEntry, ShardView, Snapshot
from flux.monitor.metrics import MetricsPage

SERIES_PER_TOPIC = 10  # five topic series and five of its subscription


def synthetic(series: int, shards: int = 2) -> Snapshot:
    """A snapshot whose metrics page has about ``series`` series."""
    topics = max(1, series // SERIES_PER_TOPIC)
    replies: list[dict[str, Any]] = [{
        "generation": 0x1234 + i, "uptime": 100.0, "sessions": 3, "memory": 1 << 20,
        "max_memory": 1 << 30, "retired_topics": 0,
        "counters": {"published": 1000, "duplicates": 1, "delivered": 900, "redelivered": 5,
                     "acked": 800, "trimmed": 10, "bytes_in": 100000},
        "publish_ack_seconds": {"bounds": [0.001, 0.01], "counts": [5, 2, 1], "sum": 0.05},
        "fsync_seconds": {"bounds": [0.001, 0.01], "counts": [0, 3, 1], "sum": 0.04},
        "topics": {}} for i in range(shards)]
    for t in range(topics):
        replies[t % shards]["topics"][f"orders.region-{t}"] = {
            "oldest": 10, "next_offset": 1000 + t, "held": 990, "held_bytes": 99000,
            "dedup_ids": 990, "storage": {"log_bytes": 4096} if t == 0 else None,
            "subscriptions": {"billing": {
                "mode": "push", "cursor": 500, "active": True, "in_flight": 20,
                "ephemeral": False, "lag": 500 + t, "redelivered": 3}}}
    return Snapshot(0.0, 0.0, tuple(ShardView(ShardEntry(i, True, 100 + i, 0x1234 + i, "x:1"), r)
                                    for i, r in enumerate(replies)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    snap = synthetic(args.series)
    fresh: list[float] = []
    cached: list[float] = []
    size = count = 0
    for _ in range(args.repeat):
        page = MetricsPage(lambda: snap)
        started = time.perf_counter()  # seam-ok: a benchmark of a pure function, not broker code
        text = page.render()
        fresh.append(time.perf_counter() - started)  # seam-ok
        started = time.perf_counter()  # seam-ok
        page.render()
        cached.append(time.perf_counter() - started)  # seam-ok
        size = len(text)
        count = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
    print(f"{count} series, {size / 1024:.0f} KiB: fresh render median"
          f" {statistics.median(fresh) * 1000:.1f} ms (min {min(fresh) * 1000:.1f},"
          f" max {max(fresh) * 1000:.1f}); cached {statistics.median(cached) * 1e6:.1f} us")


if __name__ == "__main__":
    main()
