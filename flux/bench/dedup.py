"""A micro-benchmark of one topic's dedup window alone (no shard, no network).

``python -m flux.bench.dedup``: fills a :class:`~flux.shard.dedup.DedupWindow` to
each size (default 1M, 4M and 10M ids of 32 hex digits, as the clients make them)
through the calls the shard's publish path makes for a group of new ids (a slice of
expiry, :meth:`keys_for`, :meth:`known_any`, :meth:`remember_all`), then keeps it at
that size for one more window (ids expire as many as arrive), with the cleanup
passes' slices in between. It reports the worst call (max) and the p99.9 of the
publish groups and of the cleanup slices, in the thread's CPU time (page faults
included; on a shared machine wall time also counts the time slices other processes
took, so the worst wall-clock call is given beside it), the mean time per id of a
group, and the bytes each remembered id costs beyond its own bytes (RSS growth of
the fill, the window's own copy of the ids included, as when the log no longer holds
them). Each size runs in its own process, so one's memory does not hide in the next
one's figures. Figures for a person, never asserted by tests.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from array import array
from dataclasses import asdict, dataclass

from flux.shard.cleanup import CLEANUP_SLICE
from flux.shard.dedup import EXPIRE_SLICE, DedupWindow

WINDOW = 10.0  # simulated seconds; the rate is chosen so that a window holds `size` ids
CLEANUP_EVERY = 0.5  # simulated seconds between cleanup passes
PAGE = 4096
SIZES = (1_000_000, 4_000_000, 10_000_000)  # ids in the window (10M: about 1.3 GB)
GROUP = 256  # ids a publish group stores (a client call of 256 messages)


@dataclass
class DedupFigures:
    """What :func:`measure` found for one window size."""

    size: int
    group: int
    group_max_ms: float
    group_wall_max_ms: float
    group_p999_ms: float
    group_ns_per_id: float
    slice_max_ms: float
    slice_wall_max_ms: float
    slice_p999_ms: float
    bytes_per_id: float  # beyond the id's own bytes

    def line(self) -> str:
        return (f"{self.size / 1e6:5.1f}M ids, groups of {self.group}: group max"
                f" {self.group_max_ms:6.2f} ms (wall {self.group_wall_max_ms:6.2f}) p99.9"
                f" {self.group_p999_ms:5.2f} ms {self.group_ns_per_id:4.0f} ns/id; cleanup slice"
                f" max {self.slice_max_ms:5.2f} ms (wall {self.slice_wall_max_ms:5.2f}) p99.9"
                f" {self.slice_p999_ms:5.2f} ms; {self.bytes_per_id:5.1f} B/id beyond its bytes")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def _quantile(values: array[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(size: int, group: int, seed: int = 0) -> DedupFigures:
    """Fill a window to ``size`` ids in groups of ``group``, then hold it there."""
    rng = random.Random(seed)
    rate = size / WINDOW
    step = group / rate  # simulated seconds between groups
    dedup = DedupWindow(WINDOW)
    clock = time.thread_time  # seam-ok: a benchmark's own CPU time
    wall = time.perf_counter  # seam-ok: and its own wall time
    # the bench's own record of each call: 8 bytes a group, counted off the RSS growth
    # (a list of floats took 32 B a call, as much as the window's own cost of an id
    # with single publishes)
    groups = array("d")
    slices = array("d")
    group_wall = slice_wall = 0.0
    fill_ns = 0.0
    offset = 0
    now = 0.0
    next_cleanup = CLEANUP_EVERY
    base = _rss()
    fill_rss = 0
    rounds = 2 * size // group
    for r in range(rounds):
        if r == size // group:
            fill_rss = _rss() - base - 8 * (len(groups) + len(slices))
        ids: list[str] = rng.randbytes(16 * group).hex(" ", 16).split()
        id_bytes = 32 * group
        w0, t0 = wall(), clock()
        dedup.expire(now, EXPIRE_SLICE)
        keys = dedup.keys_for(ids)
        if len(keys) != group or dedup.known_any(keys):
            raise AssertionError("a random 128-bit id was taken for a duplicate")
        chunk = tuple(ids)
        dedup.remember_all(chunk, offset, now, id_bytes, keys)
        spent = clock() - t0
        group_wall = max(group_wall, wall() - w0)
        groups.append(spent)
        fill_ns += spent
        del ids, chunk, keys
        offset += group
        now += step
        if now >= next_cleanup:
            next_cleanup += CLEANUP_EVERY
            while dedup.due_at() <= now:
                w0, t0 = wall(), clock()
                dedup.expire(now, CLEANUP_SLICE)
                slices.append(clock() - t0)
                slice_wall = max(slice_wall, wall() - w0)
    held = len(dedup)
    return DedupFigures(
        size=size, group=group, group_max_ms=max(groups) * 1e3, group_wall_max_ms=group_wall * 1e3,
        group_p999_ms=_quantile(groups, 0.999) * 1e3,
        group_ns_per_id=fill_ns / (rounds * group) * 1e9,
        slice_max_ms=max(slices, default=0.0) * 1e3, slice_wall_max_ms=slice_wall * 1e3,
        slice_p999_ms=_quantile(slices, 0.999) * 1e3 if slices else 0.0,
        bytes_per_id=fill_rss / (size // group * group) - 32 if held else 0.0)


def run(sizes: list[int], group: int) -> list[DedupFigures]:
    """:func:`measure` each size in a process of its own."""
    out = []
    for size in sizes:
        done = subprocess.run([sys.executable, "-m", "flux.bench.dedup", "--one", str(size),
                               "--group", str(group)], check=True, capture_output=True, text=True)
        out.append(DedupFigures(**json.loads(done.stdout)))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flux.bench.dedup", description=__doc__)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)),
                        help="window sizes in ids, comma-separated")
    parser.add_argument("--group", type=int, default=GROUP, help="ids per publish group")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one is not None:
        print(json.dumps(asdict(measure(args.one, args.group))))
        return
    for figures in run([int(s) for s in args.sizes.split(",")], args.group):
        print(figures.line(), flush=True)


if __name__ == "__main__":
    main()
