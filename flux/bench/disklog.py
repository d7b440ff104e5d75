"""A micro-benchmark of the disk log alone (no shard, no network), on the real disk.

``python -m flux.bench.disklog --dir DIR``: appends of 100-byte records with
``fsync: always`` at several in-flight windows (records/s, fsyncs/s, fsync
time), then a recovery scan of a ~100 MB log (records/s, MB/s). Figures for a
person, never asserted by tests. DIR must be on the disk you care about (not tmpfs).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from collections import deque
from dataclasses import dataclass

import trio

from flux.host import RealDisk
from flux.storage import FsyncMode, LogWriter, Record, recover
from flux.storage.writer import SYNC_LANES

BODY = b"m" * 100


@dataclass
class AppendFigures:
    """What :func:`append_figures` measured."""

    mode: str
    in_flight: int
    records_per_s: float
    fsyncs_per_s: float
    records_per_fsync: float
    fsync_p50_ms: float
    fsync_p99_ms: float

    def line(self) -> str:
        return (f"append {self.mode:8} in flight {self.in_flight:6}: {self.records_per_s:10,.0f}"
                f" records/s  {self.fsyncs_per_s:6.1f} fsyncs/s  {self.records_per_fsync:8.1f}"
                f" records/fsync  fsync p50 {self.fsync_p50_ms:5.2f} ms p99 {self.fsync_p99_ms:5.2f} ms")


async def append_figures(directory: str, in_flight: int, seconds: float,
                         mode: FsyncMode, sync_lanes: int = SYNC_LANES) -> AppendFigures:
    """Keep ``in_flight`` appends waiting for the durable mark, for ``seconds``
    (``sync_lanes``: fsyncs under way at once, as the writer's own)."""
    disk = RealDisk()
    table, _ = await recover(disk, directory, owner="bench")
    writer = LogWriter(disk, table, owner="bench", generation=1, boot_id=disk.boot_id(), fsync=mode,
                       fsync_interval=1.0, sync_lanes=sync_lanes)
    acked = 0
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        window: deque[int] = deque()
        started = time.perf_counter()  # seam-ok: a benchmark's own wall time
        syncs0 = writer.stats.syncs
        while time.perf_counter() - started < seconds:  # seam-ok
            while len(window) < in_flight:
                window.append(writer.append(1, BODY).end)
            mark = await writer.wait_durable(window[0])
            while window and window[0] <= mark:
                window.popleft()
                acked += 1
        elapsed = time.perf_counter() - started  # seam-ok
        syncs = writer.stats.syncs - syncs0
        await writer.close()
    recent = sorted(writer.stats.recent_syncs)
    p50 = statistics.median(recent) * 1e3 if recent else 0.0
    p99 = recent[int(len(recent) * 0.99)] * 1e3 if recent else 0.0
    return AppendFigures(mode.value, in_flight, acked / elapsed, syncs / elapsed,
                         acked / max(syncs, 1), p50, p99)


async def append_run(directory: str, in_flight: int, seconds: float, mode: FsyncMode) -> str:
    """:func:`append_figures` as one line for a person."""
    return (await append_figures(directory, in_flight, seconds, mode)).line()


def fsync_p50(directory: str, seconds: float = 2.0, in_flight: int = 64) -> AppendFigures:
    """The disk's own fsync time in ``directory`` (appends of 100 B records, ``in_flight``
    waiting, ``fsync: always``, one fsync at a time: overlapping ones each take longer),
    for the bench to show beside publish latency; the log it writes is removed."""
    path = os.path.join(directory, f"fsync-probe-{os.getpid()}")
    try:
        return trio.run(append_figures, path, in_flight, seconds, FsyncMode.ALWAYS, 1)
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def recovery_run(directory: str, megabytes: int, drop_cache: bool, record_bytes: int) -> str:
    """Write ~``megabytes`` of ``record_bytes``-byte records, then time a recovery scan of them."""
    disk = RealDisk()
    table, _ = await recover(disk, directory, owner="bench")
    writer = LogWriter(disk, table, owner="bench", generation=1, boot_id=disk.boot_id(),
                       fsync=FsyncMode.NEVER)
    target = megabytes * 1_000_000
    body = b"m" * record_bytes
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        while writer.appended < target:
            for _ in range(1_000_000 // record_bytes):
                writer.append(1, body)
            await writer.wait_durable(writer.appended)
        await writer.close()
    cache = "page cache warm"
    if drop_cache:
        os.sync()
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:  # seam-ok: benchmark set-up
                f.write("3\n")
            cache = "page cache dropped"
        except OSError:
            cache = "page cache warm (could not drop it)"
    count = 0

    def on_record(rec: Record) -> None:
        nonlocal count
        count += 1
    started = time.perf_counter()  # seam-ok
    table, report = await recover(disk, directory, owner="bench", on_record=on_record)
    elapsed = time.perf_counter() - started  # seam-ok
    table.close()
    return (f"recovery of {report.bytes / 1e6:.0f} MB, {report.records:,} records of {record_bytes} B in "
            f"{report.segments} segments ({cache}): {elapsed:.2f} s, {report.records / elapsed:,.0f}"
            f" records/s, {report.bytes / 1e6 / elapsed:.0f} MB/s")


async def main(args: argparse.Namespace) -> None:
    for in_flight in args.in_flight:
        path = os.path.join(args.dir, f"append-{in_flight}")
        print(await append_run(path, in_flight, args.seconds, FsyncMode(args.fsync)), flush=True)
        shutil.rmtree(path)
    path = os.path.join(args.dir, "recovery")
    for size in args.record_bytes:
        for drop in (False, True) if args.drop_cache else (False,):
            print(await recovery_run(path, args.megabytes, drop, size), flush=True)
            shutil.rmtree(path)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="a scratch directory on the disk to measure")
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 100, 1000, 4000])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--fsync", default="always", choices=[m.value for m in FsyncMode])
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--record-bytes", type=int, nargs="+", default=[100, 6400],
                        help="body sizes of the recovery runs (6400: a group of 64 messages)")
    parser.add_argument("--drop-cache", action="store_true",
                        help="also time recovery after dropping the page cache (needs root)")
    trio.run(main, parser.parse_args())
