"""A soak worker process: one producer or consumer of many topics, through the trio client.

``python -m flux.bench.soak_worker '<spec as JSON>'`` connects, prints ``ready``,
waits for a ``go`` line on stdin, then runs until a ``stop`` line, printing one
``minute`` event a minute and a ``result`` at the end (JSON lines on stdout).

A producer publishes to its topics at ``rate`` messages per second in all (or flat
out when ``rate`` is 0), each payload stamped with its send time, and keeps the
offsets its publishes were acked at, per topic and generation, as ranges. A
consumer holds a named push subscription per topic, acks every message, and keeps
the offsets delivered, as ranges, and each minute's publish-to-delivery latencies.
"""

from __future__ import annotations

import gc
import json
import math
import struct
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import trio

from flux import errors
from flux.client.trio import connect

STAMP = struct.Struct("<q")      # perf_counter_ns at send: the first 8 bytes of a payload
TICK = 0.01                      # seconds between two paced publish rounds
_LOG_STEP = math.log(1.02)       # latency buckets 2 % wide, from 1 us
LATE_US = 100_000.0              # a delivery this late is listed with its time (at most
LATE_LISTED = 20                 # ... this many a minute, one per LATE_GAP seconds)
LATE_GAP = 0.1
LAG_TICK = 0.01                  # the loop-lag watch sleeps this long, again and again


@dataclass
class Ranges:
    """Integers kept as sorted, merged half-open ranges (offsets arrive mostly in order)."""

    spans: list[list[int]] = field(default_factory=list)

    def add(self, lo: int, hi: int) -> None:
        spans = self.spans
        if spans and spans[-1][1] >= lo and spans[-1][0] <= hi:
            spans[-1][0], spans[-1][1] = min(spans[-1][0], lo), max(spans[-1][1], hi)
            while len(spans) > 1 and spans[-2][1] >= spans[-1][0]:  # it reached the one before
                low = spans.pop()
                spans[-1][0], spans[-1][1] = min(spans[-1][0], low[0]), max(spans[-1][1], low[1])
            return
        spans.append([lo, hi])
        if len(spans) > 1 and spans[-2][0] > lo:  # out of order: merge the whole list
            spans.sort()
            merged = [spans[0]]
            for a, b in spans[1:]:
                if a <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], b)
                else:
                    merged.append([a, b])
            self.spans = merged


class Latencies:
    """A log-bucketed histogram of microseconds (2 % resolution) and the exact max."""

    def __init__(self) -> None:
        self.buckets: Counter[int] = Counter()
        self.n = 0
        self.max = 0.0

    def add(self, micros: float) -> None:
        self.buckets[int(math.log(max(micros, 1.0)) / _LOG_STEP)] += 1
        self.n += 1
        if micros > self.max:
            self.max = micros

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (0..1) in microseconds, to the bucket's upper edge."""
        if not self.n:
            return 0.0
        want, seen = q * self.n, 0
        for b in sorted(self.buckets):
            seen += self.buckets[b]
            if seen >= want:
                return float(math.exp((b + 1) * _LOG_STEP))
        return self.max

    def summary(self) -> dict[str, float]:
        return {"n": self.n, "p50_us": self.quantile(0.5), "p99_us": self.quantile(0.99),
                "p999_us": self.quantile(0.999), "max_us": self.max}


class _GcPauses:
    """The longest garbage collection of this process since the last look."""

    def __init__(self) -> None:
        self.started = 0.0
        self.longest = 0.0

    def install(self) -> None:
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
        else:
            self.longest = max(self.longest, time.perf_counter() - self.started)

    def take_max(self) -> float:
        longest, self.longest = self.longest, 0.0
        return longest


class _LoopLag:
    """How late this process's trio loop woke a short sleep: the longest since the last
    look and when it was (wall time, to line up with the other processes' reports). A
    garbage collection, a long call or the machine not running the process all show."""

    def __init__(self) -> None:
        self.longest = 0.0
        self.at = 0.0

    async def watch(self) -> None:
        while True:
            start = time.perf_counter()
            await trio.sleep(LAG_TICK)
            lag = time.perf_counter() - start - LAG_TICK
            if lag > self.longest:
                self.longest, self.at = lag, time.time()

    def take(self) -> dict[str, float]:
        out = {"loop_lag_max_ms": round(self.longest * 1e3, 1), "loop_lag_at": self.at}
        self.longest, self.at = 0.0, 0.0
        return out


def _settle_heap() -> None:
    """Move what start-up made (modules, the client, its connection) out of the collector's
    reach, as a latency-minded application does: a full collection then walks only what
    the run made since. (Without it a consumer's full collection took 30-80 ms every few
    minutes, 6 ms at most with it; at 80 % load the backlog a pause leaves takes several
    times as long to drain.)"""
    gc.collect()
    gc.freeze()


def say(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


async def _wait_line(stop: trio.Event) -> None:
    await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
    stop.set()


async def produce(spec: dict[str, Any]) -> None:
    topics: list[str] = spec["topics"]
    rate = float(spec["rate"])
    acked: dict[str, dict[int, Ranges]] = {t: {} for t in topics}
    counts: Counter[str] = Counter()
    minute = Counter[str]()
    async with connect(spec["url"], retry_deadline=30.0) as client:
        for topic in topics:
            await client.publish(topic, STAMP.pack(time.perf_counter_ns()))
        _settle_heap()
        say("ready")
        await trio.to_thread.run_sync(sys.stdin.readline)
        stop = trio.Event()
        in_flight = trio.Semaphore(int(spec.get("window", 64)))

        async def publish(topic: str, n: int) -> None:
            async with in_flight:
                payloads = [STAMP.pack(time.perf_counter_ns()) + bytes(92) for _ in range(n)]
                try:
                    acks = await client.publish_many(topic, payloads)
                except errors.FluxError as exc:
                    counts[f"error {type(exc).__name__}"] += n
                    minute["errors"] += n
                    return
            generation, lo = acks[0].generation, acks[0].offset
            acked[topic].setdefault(generation, Ranges()).add(lo, acks[len(acks) - 1].offset + 1)
            counts["acked"] += n
            minute["acked"] += n

        lag = _LoopLag()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_wait_line, stop)
            nursery.start_soon(lag.watch)
            started, next_minute = time.perf_counter(), time.perf_counter() + 60
            sent, i = 0, 0
            while not stop.is_set():
                if rate > 0:
                    due = int((time.perf_counter() - started) * rate)
                    while sent < due:   # round-robin over the topics, in small calls
                        n = min(64, due - sent)
                        nursery.start_soon(publish, topics[i % len(topics)], n)
                        sent += n
                        i += 1
                    await trio.sleep(TICK)
                else:
                    await in_flight.acquire()
                    in_flight.release()
                    nursery.start_soon(publish, topics[i % len(topics)], 256)
                    i += 1
                    await trio.lowlevel.checkpoint()
                if time.perf_counter() >= next_minute:
                    next_minute += 60
                    say("minute", **minute, **lag.take())
                    minute.clear()
            nursery.cancel_scope.cancel()
    say("result", counts=dict(counts),
        acked={t: {str(g): r.spans for g, r in gens.items()} for t, gens in acked.items()})


async def consume(spec: dict[str, Any]) -> None:
    topics: list[str] = spec["topics"]
    delivered: dict[str, dict[int, Ranges]] = {t: {} for t in topics}
    total, now_minute = Latencies(), Latencies()
    # the minute's latency of memory and of disk topics apart (a disk topic's delivery
    # waits for its fsync), and this consumer's own longest garbage collection
    by_kind: dict[str, Latencies] = {"mem": Latencies(), "disk": Latencies()}
    kind_of = {t: "disk" if ".disk." in t else "mem" for t in topics}
    pauses = _GcPauses()
    pauses.install()
    counts: Counter[str] = Counter()
    last_arrival = [time.monotonic()]
    late: list[list[Any]] = []  # this minute's late deliveries: [wall time, ms, topic]
    lag = _LoopLag()
    async with connect(spec["url"], retry_deadline=30.0) as client:
        subs = [client.subscribe(t, "soak", read_old=True, prefetch=2000) for t in topics]
        for sub in subs:
            await sub.__aenter__()
        _settle_heap()
        say("ready")
        await trio.to_thread.run_sync(sys.stdin.readline)
        stop = trio.Event()

        async def drain(sub: Any) -> None:
            async for msg in sub:
                now = time.perf_counter_ns()
                if len(msg.payload) >= STAMP.size:
                    micros = (now - STAMP.unpack_from(msg.payload)[0]) / 1000.0
                    total.add(micros)
                    now_minute.add(micros)
                    by_kind[kind_of[msg.topic]].add(micros)
                    if micros > LATE_US and len(late) < LATE_LISTED:
                        wall = time.time()
                        if not late or wall - late[-1][0] >= LATE_GAP:
                            late.append([wall, round(micros / 1e3, 1), msg.topic])
                delivered[msg.topic].setdefault(msg.generation, Ranges()).add(
                    msg.offset, msg.offset + 1)
                counts["delivered"] += 1
                last_arrival[0] = time.monotonic()
                if msg.attempt > 1:
                    counts["redelivered"] += 1
                await msg.ack()

        async def minutes() -> None:
            nonlocal now_minute
            while True:
                await trio.sleep(60)
                say("minute", **now_minute.summary(),
                    by_kind={k: v.summary() for k, v in by_kind.items()},
                    consumer_gc_max_us=pauses.take_max() * 1e6, late=list(late),
                    **lag.take())
                late.clear()
                now_minute = Latencies()
                for k in by_kind:
                    by_kind[k] = Latencies()

        async def commands() -> None:
            """``count``: say how many arrived so far; ``stop``: stop once caught up."""
            while True:
                line = await trio.to_thread.run_sync(sys.stdin.readline,
                                                     abandon_on_cancel=True)
                if line.strip() == "count":
                    say("count", delivered=counts["delivered"])
                else:
                    stop.set()
                    return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(commands)
            nursery.start_soon(minutes)
            nursery.start_soon(lag.watch)
            for sub in subs:
                nursery.start_soon(drain, sub)
            await stop.wait()
            # what was published and not yet read arrives: read until quiet for a while
            give_up = time.monotonic() + float(spec.get("linger", 120.0))
            while time.monotonic() - last_arrival[0] < 3.0 and time.monotonic() < give_up:
                await trio.sleep(0.5)
            nursery.cancel_scope.cancel()
        for sub in subs:
            await sub.__aexit__(None, None, None)
    say("result", counts=dict(counts), latency=total.summary(),
        delivered={t: {str(g): r.spans for g, r in gens.items()}
                   for t, gens in delivered.items()})


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    trio.run(produce if spec["role"] == "producer" else consume, spec)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
