"""A fixed-bucket histogram of durations, kept by a shard and reported in STATS.

A shard keeps two: each PUBLISH frame's time from arrival to its PUBLISHED reply
(``publish_ack_seconds``, observed by the shell) and each fsync of its disk
topics' logs (``fsync_seconds``, observed by the log writers). STATS carries the
bucket counts, and the router's ``/metrics`` shows them as Prometheus histograms.
One observation per frame or per fsync, never per message.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

# upper bounds in seconds (a value equal to a bound counts in that bucket)
BOUNDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
          1.0, 2.5, 5.0)


class LatencyHistogram:
    """Counts of durations per bucket of :data:`BOUNDS` (the last bucket: above them all)."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(BOUNDS) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        """Count one duration (a negative one, from a clock step, as 0)."""
        seconds = max(0.0, seconds)
        self.counts[bisect_left(BOUNDS, seconds)] += 1
        self.total += seconds

    def as_dict(self) -> dict[str, Any]:
        """``{"bounds": [...], "counts": [...], "sum": s}``; ``counts`` per bucket (not
        cumulative), one more than ``bounds``."""
        return {"bounds": list(BOUNDS), "counts": list(self.counts), "sum": self.total}
