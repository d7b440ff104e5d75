"""A benchmark of delayed delivery (G12): memory per pending message, and lateness.

``python -m flux.bench.delayed [--count 1000000] [--rate 20000] [--seconds 10]``

Memory: a :class:`~flux.shard.core.ShardCore` driven directly (no network), with one
push subscription attached and not reading, is filled through PUBLISH frames with
``count`` messages (100-byte payloads, 32-character ids, groups of ``group``), once
with a distinct delay per message (due in one to two hours) and once without. The
figure is the bytes Python allocated while filling (``tracemalloc``, current traced
memory after a full collection, the frames' own garbage gone), divided by the count;
the difference is what a pending message costs beyond an ordinary held one. Each
fill runs in a process of its own.

Kept on disk (``--kept N``): the same core with a disk topic whose log is a plain file
(every record durable once written), filled with ``N`` messages each due a day away, then
``ttl`` and the dedup window let pass and cleanup run until every message is kept out of
line (G12: in KEEP records at the log's tail). The figure is the bytes Python holds
for them then (traced as above, the file not counted), per kept message.

Lateness: a real ``flux serve`` (one shard, memory topics) on loopback; a producer
publishes messages ``lead`` seconds ahead of their due times (``deliver_at``), due
at ``rate`` a second for ``seconds``; a subscriber (the asyncio client, auto-ack)
records, for each message, the time it was handed over minus its due time (wall
clocks of one machine). Reported: p50, p99 and max lateness, and how many arrived.

Figures for a person beside the goals of issue 17; never asserted by tests.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import subprocess
import sys
import tempfile
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from flux import protocol as P
from flux.config import Config
from flux.shard.core import ShardCore
from flux.shard.journal import TopicJournal
from flux.storage import Appended, Record
from flux.storage import record as R

TOPIC = "bench.delayed"
PAYLOAD = 100
ID_CHARS = 32
GROUP = 100           # messages a publish group carries (a client's batch)
MEMORY_GOAL = 40.0    # bytes a pending message may cost beyond an ordinary held one
LATENESS_GOAL = 0.020  # seconds: p99 of push time minus due time at 20k due a second


@dataclass
class MemoryFigures:
    """What one fill of the core found."""

    count: int
    group: int
    delayed: bool
    bytes_per_message: float  # all of it: payload, id, log, dedup, index
    publish_us: float         # wall time per message of the fill (tracemalloc slows it)


def fill(count: int, group: int, delayed: bool) -> MemoryFigures:
    """Fill a fresh shard core with ``count`` messages; the bytes they take, traced."""
    import time

    config = Config().replace(**{"message.ttl": 86400.0, "message.dedup_window": 86400.0,
                                 "subscriber.heartbeat": 1e6, "limits.hello_timeout": 1e6,
                                 "shard.max_memory": 1 << 40, "topic.max_bytes": 1 << 40})
    core = ShardCore(config, now=0.0)
    conn = core.connect(0.0)
    core.receive(conn, [P.SUBSCRIBE, 1, 1, {"topic": TOPIC, "name": "workers", "mode": "push",
                                            "credit": 0}], 0.0)
    core.take_output()
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    started = time.perf_counter()  # seam-ok: a benchmark's own wall time

    def due_in_an_hour_or_two(first: int, n: int) -> dict[str, Any]:
        return {"delay": [3600.0 + ((first + i) * 7919 % count) * 3600.0 / count
                          for i in range(n)]}

    _publish_all(core, conn, count, group, due_in_an_hour_or_two if delayed else None, 1.0)
    spent = time.perf_counter() - started  # seam-ok
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    held = core.stats(1.0)["topics"][TOPIC]["held"]
    if held != count:
        raise AssertionError(f"the core holds {held} messages, not {count}")
    return MemoryFigures(count, group, delayed, used / count, spent / count * 1e6)


def _publish_all(core: ShardCore, conn: int, count: int, group: int,
                 options: Callable[[int, int], dict[str, Any]] | None, now: float) -> None:
    """Publish ``count`` messages of ``PAYLOAD`` bytes in groups of ``group``, each group's
    options (a PUBLISH group's fourth field) ``options(first, n)`` if given."""
    payload = bytes(PAYLOAD)
    rid = 1
    for first in range(0, count, group):
        n = min(group, count - first)
        item: list[Any] = [TOPIC, [f"{first + i:0{ID_CHARS}x}" for i in range(n)],
                           [payload] * n]
        if options is not None:
            item.append(options(first, n))
        rid += 1
        core.receive(conn, [P.PUBLISH, rid, [item]], now)
        core.take_output()


class FileLog:
    """A disk topic's log as one plain file, each record durable once written (no
    segments, no fsync): the writer and reader a shard core's journal needs."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self.generation = 1
        self.appended = self.durable = self.synced = 0
        self.snapshot: Any = None

    @property
    def size(self) -> int:
        return self.appended

    def append(self, rtype: int, body: bytes) -> Appended:
        data = R.encode(rtype, bytes(body))
        position = self.appended
        os.pwrite(self.fd, data, position)
        self.appended = self.durable = self.synced = position + len(data)
        return Appended(position, self.appended)

    def read(self, position: int, size_hint: int = 0) -> Record:
        head = os.pread(self.fd, R.HEADER_SIZE, position)
        length = R.body_length(head, 0)
        return R.decode(os.pread(self.fd, R.HEADER_SIZE + length, position), 0, position)


def kept(count: int, group: int) -> MemoryFigures:
    """Fill a disk topic with ``count`` messages due a day away and let cleanup keep them
    all out of line; the bytes Python holds for them then, traced, per message."""
    import time

    config = Config().replace(**{"message.ttl": 1.0, "message.dedup_window": 1.0,
                                 "message.cleanup_time": 1.0, "message.max_delay": 7 * 86400.0,
                                 "storage.dir": "/unused", "storage.kind": "disk",
                                 "shard.max_memory": 1 << 40, "topic.max_bytes": 1 << 40})
    core = ShardCore(config, now=0.0)
    with tempfile.TemporaryDirectory() as directory:
        log = FileLog(os.path.join(directory, "log"))
        core.open_journal = lambda name, start: TopicJournal(name, log, exposed=start,
                                                              reader=log)
        conn = core.connect(0.0)
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        started = time.perf_counter()  # seam-ok: a benchmark's own wall time
        _publish_all(core, conn, count, group, lambda first, n: {"delay": 86400.0}, 0.0)
        now = 0.0
        while True:  # every message ttl old and its id out of the window: cleanup keeps them
            now = max(now + 0.5, core.next_deadline())
            core.tick(now)
            core.take_output()
            topic = core.topics[TOPIC]
            if topic.log.oldest == topic.log.next_offset and not len(topic.dedup) \
                    and now > 10.0:
                break
        spent = time.perf_counter() - started  # seam-ok
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        held = core.stats(now)["topics"][TOPIC]["held"]
        if held != count or topic.log.lowest != 0:
            raise AssertionError(f"the core holds {held} messages, not {count} kept")
        os.close(log.fd)
    return MemoryFigures(count, group, True, used / count, spent / count * 1e6)


def kept_line(f: MemoryFigures) -> str:
    return (f"kept on disk, {f.count:,} messages of {PAYLOAD} B with {ID_CHARS}-char ids due a"
            f" day away, all kept out of line: {f.bytes_per_message:.1f} B/msg in memory")


def memory(count: int, group: int) -> tuple[MemoryFigures, MemoryFigures]:
    """Both fills, each in a process of its own: (ordinary, delayed)."""
    out = []
    for delayed in (False, True):
        proc = subprocess.run(
            [sys.executable, "-m", "flux.bench.delayed", "--fill", str(count), "--group",
             str(group)] + (["--delayed"] if delayed else []),
            check=True, capture_output=True, text=True)
        out.append(MemoryFigures(**json.loads(proc.stdout.strip().splitlines()[-1])))
    return out[0], out[1]


def memory_line(plain: MemoryFigures, delayed: MemoryFigures) -> str:
    extra = delayed.bytes_per_message - plain.bytes_per_message
    verdict = "met" if extra <= MEMORY_GOAL else "NOT met"
    return (f"memory, {plain.count:,} messages of {PAYLOAD} B with {ID_CHARS}-char ids, groups"
            f" of {plain.group}: ordinary {plain.bytes_per_message:.1f} B/msg, pending delayed"
            f" {delayed.bytes_per_message:.1f} B/msg: {extra:+.1f} B per pending message"
            f" (goal <= {MEMORY_GOAL:.0f} B: {verdict})")


@dataclass
class LatenessFigures:
    """What one lateness run found (seconds)."""

    rate: float
    seconds: float
    backlog: int      # messages pending far in the future all along
    sent: int
    received: int
    p50: float
    p99: float
    max: float
    early: int        # messages handed over before their due time (G12 says none)


def produce(url: str, start: float, rate: float, seconds: float, group: int) -> None:
    """Publish ``rate * seconds`` messages due from wall time ``start`` on, ``rate`` a
    second (each group of ``group`` due together), each published about a second ahead
    of its due time."""
    import asyncio
    import time

    from flux.client.asyncio import connect

    async def run() -> None:
        payload = bytes(PAYLOAD)
        total = int(rate * seconds)
        async with connect(url) as client:
            pending: set[asyncio.Task[Any]] = set()
            for first in range(0, total, group):
                due = start + first / rate
                ahead = due - 1.0 - time.time()  # seam-ok: the producer's own clock
                if ahead > 0:
                    await asyncio.sleep(ahead)
                task = asyncio.ensure_future(client.publish_many(
                    TOPIC, [payload] * min(group, total - first), deliver_at=due))
                pending.add(task)
                task.add_done_callback(pending.discard)
            await asyncio.gather(*pending)

    asyncio.run(run())


def lateness(rate: float, seconds: float, backlog: int, group: int = 20) -> LatenessFigures:
    """Lateness at ``rate`` due messages a second through a real ``flux serve`` (see the
    module's docstring), with ``backlog`` more messages pending an hour away."""
    import asyncio
    import time

    from flux.bench.systems import start_flux
    from flux.client.asyncio import connect

    broker = start_flux(1, {"message.ttl": 30, "message.dedup_window": 30,
                            "subscriber.max_in_flight": 4000})
    late: list[float] = []
    total = int(rate * seconds)

    async def run() -> None:
        async with connect(broker.url) as client:
            for first in range(0, backlog, 1000):  # pending all along, an hour away:
                # firing what is due must not look at them
                await client.publish_many(TOPIC, [bytes(PAYLOAD)] * min(1000, backlog - first),
                                          delay=3600.0 + first * 1e-6)
            start = time.time() + 2.0  # seam-ok: the producer starts a second ahead
            producer = subprocess.Popen(
                [sys.executable, "-m", "flux.bench.delayed", "--produce", broker.url,
                 "--start", repr(start), "--rate", str(rate), "--seconds", str(seconds),
                 "--group", str(group)])
            try:
                async with client.subscribe(TOPIC, prefetch=4000) as sub:
                    wall = time.time  # seam-ok: the subscriber's own clock
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(start + seconds + 10.0 - wall()):
                            async for msg in sub:
                                late.append(wall() - (msg.due or 0.0))
                                await msg.ack()
                                if len(late) >= total:
                                    break
            finally:
                producer.wait()

    try:
        asyncio.run(run())
    finally:
        broker.stop()
    ordered = sorted(late) or [math.nan]
    return LatenessFigures(
        rate=rate, seconds=seconds, backlog=backlog, sent=total, received=len(late),
        p50=ordered[len(ordered) // 2], p99=ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        max=ordered[-1], early=sum(1 for x in late if x < 0))


def lateness_line(f: LatenessFigures) -> str:
    verdict = "met" if f.p99 <= LATENESS_GOAL else "NOT met"
    return (f"lateness, {f.rate:,.0f} due a second for {f.seconds:g} s, {f.backlog:,} more"
            f" pending an hour away: p50 {f.p50 * 1e3:.2f} ms, p99 {f.p99 * 1e3:.2f} ms, max"
            f" {f.max * 1e3:.2f} ms ({f.received:,} of {f.sent:,} received, {f.early} early;"
            f" goal p99 <= {LATENESS_GOAL * 1e3:.0f} ms: {verdict})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flux.bench.delayed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=1_000_000,
                        help="pending messages of the memory figure")
    parser.add_argument("--group", type=int, default=GROUP, help="messages per publish group")
    parser.add_argument("--rate", type=float, default=20_000.0,
                        help="due messages a second of the lateness figure")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the lateness run")
    parser.add_argument("--backlog", type=int, default=1_000_000,
                        help="messages pending an hour away during the lateness run")
    parser.add_argument("--skip", choices=("memory", "lateness"), default=None,
                        help="leave one figure out")
    parser.add_argument("--kept", type=int, default=None,
                        help="only the kept-on-disk memory figure, with this many messages")
    parser.add_argument("--fill", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--delayed", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--produce", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--start", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.fill is not None:  # one fill, in this process: its figures as JSON
        print(json.dumps(asdict(fill(args.fill, args.group, args.delayed))))
        return
    if args.kept is not None:
        print(kept_line(kept(args.kept, args.group)))
        return
    if args.produce is not None:  # the lateness run's producer
        produce(args.produce, args.start, args.rate, args.seconds, args.group)
        return
    for line in run(args.count, args.group, args.rate, args.seconds, args.backlog, args.skip):
        print(line, flush=True)


def run(count: int, group: int, rate: float, seconds: float, backlog: int,
        skip: str | None = None) -> Iterator[str]:
    """Both figures as lines beside their goals (``skip``: leave one out)."""
    if skip != "memory":
        yield memory_line(*memory(count, group))
    if skip != "lateness":
        yield lateness_line(lateness(rate, seconds, backlog))


if __name__ == "__main__":
    main()
