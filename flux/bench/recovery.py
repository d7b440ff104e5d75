"""Recovery of a disk topic: how long a shard killed with SIGKILL takes to serve again.

``python -m flux.bench.recovery [--bytes 1G] [--dedup expired|full|both] [--dir DIR]``
(also ``flux bench --sections recovery``):

1. ``flux serve --shards 1 --data-dir DIR`` (``storage.fsync: always``, a long
   ``message.ttl``); one topic filled with ``--bytes`` of 100-byte messages through
   the public client (``publish_many``, many calls in flight);
2. ``expired``: a short dedup window that has passed before the kill, so recovery
   only has to read messages; ``full``: a dedup window of an hour, every id in it;
3. ``sync``, then the page cache dropped (``/proc/sys/vm/drop_caches``, needs root;
   the figure says when it could not), then SIGKILL of the shard;
4. the router restarts the shard; the time is from the kill until a FETCH of the
   topic's oldest message, with the generation it had, returns it.

A shard that came back with another generation, or holding fewer messages, has not
recovered the topic: the figure says so instead of a time. A server that refuses
``--data-dir`` or the storage keys makes the run "not available: <reason>".
Figures for a person; no test asserts a time.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from flux import errors
from flux.bench import systems
from flux.client.trio import connect
from flux.client.types import FetchResult

if TYPE_CHECKING:  # the runner imports this module
    from flux.bench.runner import Runner

SIZE = 100
BATCH = 256
WINDOW = 16                  # publish_many calls in flight while filling
EXPIRED_WINDOW = 5.0         # message.dedup_window of the "expired" run (seconds)
FULL_WINDOW = 3600.0
SETTINGS = {"message.ttl": 7 * 86400, "message.cleanup_time": 5}
POLL_DEADLINE = 0.02         # retry deadline of each FETCH try after the kill (seconds)


@dataclass
class RecoveryFigures:
    """One recovery run."""

    dedup: str                        # expired | full
    bytes: int
    messages: int = 0
    fill_seconds: float | None = None
    cache: str = ""
    seconds: float | None = None      # SIGKILL until a FETCH was served
    shard_seconds: float | None = None  # the restarted shard's own recovery (its STATS)
    outcome: str = ""                 # what the restarted shard held, or why there is no time

    def line(self) -> str:
        what = (f"recovery of {self.bytes / (1 << 20):,.1f} MiB ({self.messages:,} x {SIZE} B),"
                f" dedup window {self.dedup}")
        if self.seconds is None:
            return f"{what}{', ' + self.cache if self.cache else ''}: {self.outcome}"
        per_gib = self.seconds / (self.bytes / (1 << 30)) if self.bytes else 0.0
        own = ("" if self.shard_seconds is None
               else f", the shard's own recovery {self.shard_seconds:.2f} s")
        return (f"{what}, {self.cache}: served after {self.seconds:.2f} s"
                f" ({per_gib:.2f} s per GiB{own}); {self.outcome}")


def steps(plan: object) -> int:
    return len(getattr(plan, "recovery_dedup", ()))


def run(runner: Runner) -> list[RecoveryFigures]:
    """The plan's recovery runs; the first "not available" ends them (the next would be too)."""
    plan = runner.plan
    out: list[RecoveryFigures] = []
    for dedup in plan.recovery_dedup:
        runner.advance(f"Flux: recovery of {plan.recovery_bytes / (1 << 20):,.1f} MiB,"
                       f" dedup window {dedup}")
        figures = measure(plan.recovery_bytes, dedup, plan.data_dir,
                          drop_cache=plan.recovery_drop_cache)
        out.append(figures)
        if figures.outcome.startswith("not available"):
            break
    return out


DISK = systems.FluxStorage("always")


def measure(total_bytes: int, dedup: str, data_dir: str | None = None,
            timeout: float | None = None, storage: systems.FluxStorage | None = DISK,
            drop_cache: bool = True) -> RecoveryFigures:
    """Fill, kill, time the restart (see the module docstring). Never raises for a
    server that cannot do it: the figures say why. ``storage=None`` runs the same
    steps on a memory topic (which a restart loses: the figures say so);
    ``drop_cache=False`` leaves the machine's page cache alone (tests)."""
    figures = RecoveryFigures(dedup, total_bytes, messages=max(1, total_bytes // SIZE))
    window = EXPIRED_WINDOW if dedup == "expired" else FULL_WINDOW
    try:
        broker = systems.start_flux(1, {**SETTINGS, "message.dedup_window": window},
                                    storage=storage, data_dir=data_dir)
    except systems.BenchError as exc:
        figures.outcome = f"not available: {exc}"
        return figures
    with broker:
        limit = timeout if timeout is not None else max(60.0, 60.0 * total_bytes / (1 << 30))
        trio.run(_fill_kill_fetch, broker, figures, window, limit, drop_cache)
    return figures


async def _fill_kill_fetch(broker: systems.Broker, figures: RecoveryFigures, window: float,
                           limit: float, drop_cache: bool) -> None:
    topic = f"bench.recovery.{os.getpid()}.{figures.dedup}"
    body = os.urandom(SIZE)
    started = time.perf_counter()
    async with connect(broker.url, retry_deadline=min(30.0, window - 1.0)) as client:
        left = [figures.messages]

        async def publisher() -> None:
            while left[0] > 0:
                n = min(BATCH, left[0])
                left[0] -= n
                await client.publish_many(topic, [body] * n)

        failed: list[BaseException] = []
        try:
            async with trio.open_nursery() as nursery:
                for _ in range(WINDOW):
                    nursery.start_soon(publisher)
        except* errors.FluxError as group:
            failed.extend(group.exceptions)
        if failed:
            figures.outcome = f"could not fill the topic: {failed[0]}"
            return
        figures.fill_seconds = time.perf_counter() - started
        before = await client.fetch(topic, 0, 1)
    if figures.dedup == "expired":
        await trio.sleep(window + 1.0)   # every id has left the dedup window
    figures.cache = _drop_page_cache() if drop_cache else "page cache kept (not asked to drop it)"
    shard = broker.pids[0]
    killed = time.perf_counter()
    os.kill(shard, signal.SIGKILL)
    served = await _first_fetch(broker, topic, before.oldest, before.generation, killed, limit)
    figures.shard_seconds = await _remember_new_shard(broker, topic)
    if isinstance(served, str):
        figures.outcome = served
        return
    figures.seconds = served[0] - killed
    after = served[1]
    kept = after.next - after.oldest
    held = before.next - before.oldest
    figures.outcome = (f"same generation {after.generation:#x}, {kept:,} of {held:,} messages held"
                       + ("" if kept >= held else " (MISSING SOME)"))


async def _first_fetch(broker: systems.Broker, topic: str, offset: int, generation: int,
                       killed: float, limit: float) -> tuple[float, FetchResult] | str:
    """(when, FetchResult) of the first FETCH the restarted shard served, or why none was.

    Every try is a new client that gives up at once (a short retry deadline), then the
    next follows 5 ms later: a client's own reconnect backoff (50 ms doubling up to 2 s)
    would otherwise add its wait to the figure after many refused tries."""
    deadline = killed + limit
    while time.perf_counter() < deadline:
        try:
            async with connect(broker.url, retry_deadline=POLL_DEADLINE,
                               request_timeout=1.0) as client:
                result = await client.fetch(topic, offset, 1, generation=generation)
        except errors.TopicReset as exc:
            return (f"not recovered: the restarted shard answered after"
                    f" {time.perf_counter() - killed:.2f} s with another generation"
                    f" ({exc}); its disk topics are not recovered yet")
        except (OSError, errors.FluxError):
            await trio.sleep(0.005)
            continue
        if result.messages:
            return time.perf_counter(), result
        return (f"not recovered: the restarted shard served an empty topic"
                f" (held [{result.oldest}, {result.next}))")
    return f"not recovered: the shard did not serve the topic within {limit:.0f} s of the kill"


async def _remember_new_shard(broker: systems.Broker, topic: str) -> float | None:
    """Add the restarted shard's pid, so stopping the broker waits for it too; returns
    how long its recovery of ``topic`` took, as its STATS say (None: not said)."""
    try:
        async with connect(broker.url, retry_deadline=5.0) as client:
            stats = await client.stats()
    except errors.FluxError:
        return None
    took: float | None = None
    for reply in stats.values():
        pid = reply.get("pid")
        if isinstance(pid, int) and pid not in broker.pids:
            broker.pids.append(pid)
        storage = (reply.get("topics", {}).get(topic) or {}).get("storage") or {}
        if isinstance(storage.get("recovery_seconds"), (int, float)):
            took = float(storage["recovery_seconds"])
    return took


def _drop_page_cache() -> str:
    """Sync and drop the page cache; what happened, for the figure."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError as exc:
        return f"page cache NOT dropped ({exc.strerror or exc}; dropping it needs root)"
    return "page cache dropped"


def parse_bytes(text: str) -> int:
    """``1G``, ``200M``, ``64K``, ``1000`` (binary units) as a byte count."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGkmg]?)(?:i?[Bb])?\s*", text)
    if not m:
        raise ValueError(f"expected a size like 1G, 200M, 64K or 1000, got {text!r}")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", default="1G", help="payload bytes to fill the topic with")
    parser.add_argument("--dedup", default="both", choices=["expired", "full", "both"])
    parser.add_argument("--dir", default=None, help="where the data directory goes (a real disk)")
    parser.add_argument("--keep-page-cache", action="store_true",
                        help="do not drop the page cache before the kill")
    parser.add_argument("--memory", action="store_true",
                        help="the same steps on a memory topic (a restart loses it)")
    args = parser.parse_args()
    for dedup in ("expired", "full") if args.dedup == "both" else (args.dedup,):
        figures = measure(parse_bytes(args.bytes), dedup, args.dir,
                          storage=None if args.memory else DISK,
                          drop_cache=not args.keep_page_cache)
        print(figures.line(), flush=True)
        if figures.outcome.startswith("not available"):
            break


if __name__ == "__main__":
    main()
