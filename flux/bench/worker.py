"""A bench worker process: one producer or consumer of one system, driven over stdin/stdout.

``python -m flux.bench.worker '<spec as JSON>'`` connects, prints ``{"event": "ready"}``,
waits for a line on stdin (the go signal, so every consumer is subscribed before any
producer starts), runs, and prints ``{"event": "result", ...}``. The per-system code
is in :mod:`flux.bench.flux_worker` (trio) and :mod:`flux.bench.peer_workers` (asyncio).
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

STAMP = struct.Struct("<q")   # perf_counter_ns at send, first 8 bytes of a latency payload
QUANTILES = (50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.99, 100.0)


@dataclass
class Spec:
    """What one worker does."""

    system: str                 # flux | nats | jetstream | redis
    role: str                   # producer | consumer
    address: str                # flux://host:port, nats://host:port, redis://host:port
    topic: str
    count: int                  # messages to publish, or to receive before reporting
    size: int = 100             # payload bytes
    mode: str = "throughput"    # throughput | latency
    rate: float = 0.0           # latency mode: messages per second offered
    batch: int = 256            # messages per publish call (publish_many, pipeline)
    window: int = 8             # publish calls in flight at once
    prefetch: int = 1000        # consumer credit / pending limit
    idle_timeout: float = 20.0  # consumer gives up after this long without a message
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Result:
    """What a worker reports; times are ``time.perf_counter()`` seconds (system-wide)."""

    role: str
    count: int = 0
    first: float = 0.0
    last: float = 0.0
    start: float = 0.0
    cpu: float = 0.0                         # this worker's CPU seconds while running
    latency_us: dict[str, float] = field(default_factory=dict)   # quantile -> microseconds
    # producers in latency mode: from each publish call to its ack, per message
    ack_latency_us: dict[str, float] = field(default_factory=dict)
    error: str | None = None


def payload(size: int) -> bytes:
    """A random payload of ``size`` bytes (brokers copy it; reusing one object is fair)."""
    return os.urandom(size)


def stamped(size: int) -> bytes:
    """A latency payload: the send time, padded to ``size`` bytes."""
    return STAMP.pack(time.perf_counter_ns()) + bytes(max(0, size - STAMP.size))


async def paced(spec: Spec, send: Callable[[list[bytes]], Awaitable[object]]) -> None:
    """asyncio: call ``send(payloads)`` with the latency payloads due at ``spec.rate``
    per second (everything due at once goes in one call)."""
    import asyncio

    interval = 1.0 / spec.rate
    start = time.perf_counter()
    sent = 0
    while sent < spec.count:
        due = min(spec.count, int((time.perf_counter() - start) / interval) + 1)
        if due > sent:
            await send([stamped(spec.size) for _ in range(due - sent)])
            sent = due
        await asyncio.sleep(max(0.0, start + sent * interval - time.perf_counter()))


async def flat_out(spec: Spec, send: Callable[[list[bytes]], Awaitable[object]]) -> None:
    """asyncio: ``spec.count`` payloads as fast as they go, ``spec.window`` calls of
    ``send`` (``spec.batch`` payloads each) in flight at once."""
    import asyncio

    body = payload(spec.size)
    sizes = batch_sizes(spec)

    async def sender() -> None:
        for n in sizes:
            await send([body] * n)

    await asyncio.gather(*(sender() for _ in range(spec.window)))


def batch_sizes(spec: Spec) -> Iterator[int]:
    """Sizes of ``spec.batch`` (the last one less) that add up to ``spec.count``; one
    iterator shared by concurrent senders hands each its next batch."""
    for start in range(0, spec.count, spec.batch):
        yield min(spec.batch, spec.count - start)


def latency_of(payload: bytes, now_ns: int) -> float:
    """Microseconds since ``payload`` was stamped."""
    sent: int = STAMP.unpack_from(payload)[0]
    return (now_ns - sent) / 1000.0


def summarise(latencies: list[float]) -> dict[str, float]:
    from flux.bench.measure import percentile

    latencies.sort()
    return {f"p{q:g}": percentile(latencies, q) for q in QUANTILES} if latencies else {}


class Tally:
    """What a consumer counts: messages, the first and last arrival, latencies."""

    def __init__(self, spec: Spec, result: Result) -> None:
        self.spec, self.result = spec, result
        self.n = 0
        self.latencies: list[float] = []
        self.measure = spec.mode == "latency"

    def took(self, data: bytes) -> bool:
        """One message arrived; True once all of them have."""
        if self.measure:
            self.latencies.append(latency_of(data, time.perf_counter_ns()))
        self.n += 1
        if self.n == 1:
            self.result.first = time.perf_counter()
        return self.n >= self.spec.count

    def timed_out(self) -> None:
        """Nothing came for ``spec.idle_timeout``: say so in the result."""
        self.result.error = (f"received {self.n} of {self.spec.count} messages, then nothing"
                             f" for {self.spec.idle_timeout}s")

    def finish(self) -> Result:
        """The result, with the last arrival now."""
        result = self.result
        result.last = time.perf_counter()
        result.count = self.n
        result.latency_us = summarise(self.latencies)
        if math.isnan(result.first):
            result.first = 0.0
        return result


def say(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


_cpu_at_go = [0.0]


def ready_then_go() -> float:
    """Report ready, wait for the go line; returns the start time."""
    say("ready")
    sys.stdin.readline()
    _cpu_at_go[0] = time.process_time()
    return time.perf_counter()


def main(argv: list[str]) -> int:
    spec = Spec(**json.loads(argv[0]))
    if os.environ.get("FLUX_BENCH_NOGC"):
        import gc
        gc.disable()
    if spec.system == "flux":
        from flux.bench.flux_worker import run
    else:
        from flux.bench.peer_workers import run
    try:
        result = run(spec)
    except Exception as exc:  # reported to the bench, which shows it beside the figure
        result = Result(spec.role, error=f"{type(exc).__name__}: {exc}")
    result.cpu = time.process_time() - _cpu_at_go[0] if _cpu_at_go[0] else 0.0
    say("result", **asdict(result))
    return 0


if __name__ == "__main__":
    # run the imported module's main, so the per-system code shares its state (_cpu_at_go)
    from flux.bench import worker as _self

    sys.exit(_self.main(sys.argv[1:]))
