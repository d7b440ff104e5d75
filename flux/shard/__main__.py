"""A shard process: ``python -m flux.shard --spec '<ShardSpec as JSON>'``.

The router's process launcher starts this; it runs :func:`flux.shard.server.run_shard`
on a RealHost and, once the shard serves, pins the process to its CPU (recovering
disk topics before that may use every CPU) and imports in a thread what only a large
dedup window needs (numpy: a tenth of a second that a restart no longer waits
for). The broker's secret is not in
the spec: the shard reads it as one line from its standard input (a pipe from the
launcher), so no command line shows it. SIGTERM or SIGINT drains the shard and
exits 0. Exit status 1: the port could not be bound; 2: a bad spec or no secret;
3: a disk topic's log failed (one line says which and where; the router restarts
the shard and its recovery runs).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator

import trio

from flux import errors, process_log
from flux.host import RealHost, ShardSpec
from flux.shard.dedup import load_compact
from flux.shard.server import ShardServer, StorageFailed, run_shard
from flux.shard.stalls import StallWatch, watch_lag


def pin_to_cpu(cpu: int | None) -> None:
    """Pin this process (each of its threads) to the ``cpu``-th CPU it may use (wrapping),
    where the OS allows."""
    if cpu is None:
        return
    try:
        allowed = sorted(os.sched_getaffinity(0))
        target = {allowed[cpu % len(allowed)]}
        try:
            threads = [int(t) for t in os.listdir("/proc/self/task")]
        except OSError:  # no procfs: the calling thread (and those it starts later)
            threads = [0]
        for tid in threads:
            with contextlib.suppress(ProcessLookupError):  # a thread that has ended
                os.sched_setaffinity(tid, target)
    except (AttributeError, OSError):  # not Linux, or not permitted: run unpinned
        pass


def import_and_freeze() -> None:
    """Import what a compact dedup window needs, then move what that import made (some
    7,000 objects numpy keeps for the process's life) out of the collector's view, as
    :func:`main` does with the start-up heap. Done once, so what it freezes cannot grow:
    the few cyclic objects alive at that moment (or garbage then) are never collected,
    once; everything else frozen is still freed by its reference count."""
    load_compact()
    gc.freeze()


def once_serving(cpu: int | None) -> None:
    """Pin the shard to its CPU, then import ahead what a compact dedup window needs."""
    pin_to_cpu(cpu)
    threading.Thread(target=import_and_freeze, name="flux-imports", daemon=True).start()


# the process's stall watch (set by main): STATS reports its collector figures (``gc``)
watch: StallWatch | None = None


async def serve(spec: ShardSpec) -> None:
    """Run the shard until drained; SIGTERM/SIGINT start the drain."""
    def on_start(server: ShardServer) -> None:
        if watch is not None:
            server.core.process_stats = watch.stats

    stop = trio.Event()

    async def on_signal(signals: AsyncIterator[int]) -> None:
        async for _ in signals:
            stop.set()

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(on_signal, signals)
            host = RealHost(f"shard-{spec.index}")
            nursery.start_soon(watch_lag, host, spec.index)  # logs a loop busy for long
            # pinned once serving: recovering disk topics before it may use every CPU
            # (reading the log ahead on one while checking records on another)
            await run_shard(host, spec, pid=os.getpid(), stop=stop, on_start=on_start,
                            on_serving=functools.partial(once_serving, spec.cpu))
            nursery.cancel_scope.cancel()

FULL_COLLECTION_EVERY = 100  # generation-1 collections per full one (CPython: 10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flux.shard")
    parser.add_argument("--spec", required=True, help="ShardSpec fields as a JSON object")
    args = parser.parse_args(argv)
    try:
        fields = json.loads(args.spec)
        if not isinstance(fields, dict) or "secret" in fields:
            raise ValueError("expected a JSON object without the secret (it comes on stdin)")
        spec = ShardSpec(**fields, secret=sys.stdin.readline().strip())
    except (ValueError, TypeError) as exc:
        print(f"flux shard: bad --spec: {exc}", file=sys.stderr)
        return 2
    process_log.configure(f"flux shard {spec.index}")
    # Everything imported so far lives as long as the process: moved out of the
    # collector's view, it no longer makes full collections cost tens of ms
    # (measured: 25k startup objects, 12 ms; the p99 latency followed them).
    gc.freeze()
    # A serving shard makes next to no cyclic garbage (a 5-minute soak: every full
    # collection found none), and each full collection holds the loop for as long as it
    # walks what the shard tracks (its held runs' columns no longer: flux.shard.columns).
    # Ten times fewer full collections (what the few cycles of closed connections wait
    # for in the meantime is small).
    gen0, gen1, _ = gc.get_threshold()
    gc.set_threshold(gen0, gen1, FULL_COLLECTION_EVERY)
    global watch
    watch = StallWatch(spec.index)  # logs what held the loop for long (a latency spike)
    watch.install()
    try:
        trio.run(serve, spec, instruments=[watch])
    except (errors.ConfigError, OSError, StorageFailed, ExceptionGroup) as exc:
        failed = errors.first_of(exc, StorageFailed)
        if failed is not None:  # expected, and said in full: no traceback but at debug
            log = logging.getLogger("flux.shard")
            log.error("%s", failed)
            log.debug("where the shard stopped", exc_info=exc)
            return 3
        config_error = errors.first_of(exc, errors.ConfigError)
        if config_error is not None:
            print(f"flux shard {spec.index}: {config_error}", file=sys.stderr)
            return 2
        os_error = errors.first_of(exc, OSError)
        if os_error is None:
            raise
        print(f"flux shard {spec.index}: cannot serve on port {spec.port}: {os_error}",
              file=sys.stderr)
        return 1
    finally:
        # what the run held is freed now (a shard with a full cache: a collection of
        # 0.5 s or more); no client waits on it, so it is no stall to warn about
        watch.uninstall()
    return 0


if __name__ == "__main__":
    sys.exit(main())
