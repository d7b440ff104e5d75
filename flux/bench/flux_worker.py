"""Flux producers and consumers for the bench, through the public trio client API only.

Producers keep ``window`` :meth:`~flux.client.trio.Client.publish_many` calls of
``batch`` messages in flight (client-generated dedup ids); consumers use a push
subscription and ``await msg.ack()`` every message.
"""

from __future__ import annotations

import math
import time

import trio

from flux.bench.worker import Result, Spec, latency_of, payload, ready_then_go, stamped, summarise
from flux.client.trio import Client, connect


def run(spec: Spec) -> Result:
    return trio.run(_consume if spec.role == "consumer" else _produce, spec)


async def _produce(spec: Spec) -> Result:
    result = Result("producer")
    async with connect(spec.address, retry_deadline=float(spec.options.get("retry_deadline", 60))
                       ) as client:
        # one publish first, so the connection to the shard is made before timing starts
        await client.publish(spec.topic, b"warm-up")
        result.start = ready_then_go()
        if spec.mode == "latency":
            await _produce_at_rate(client, spec)
        else:
            await _produce_flat_out(client, spec)
        result.last = time.perf_counter()
        result.count = spec.count
    return result


async def _produce_flat_out(client: Client, spec: Spec) -> None:
    body = payload(spec.size)
    left = [spec.count]

    async def publisher() -> None:
        while left[0] > 0:
            n = min(spec.batch, left[0])
            left[0] -= n
            await client.publish_many(spec.topic, [body] * n)

    async with trio.open_nursery() as nursery:
        for _ in range(spec.window):
            nursery.start_soon(publisher)


async def _produce_at_rate(client: Client, spec: Spec) -> None:
    interval = 1.0 / spec.rate
    start = time.perf_counter()
    sent = 0
    async with trio.open_nursery() as nursery:
        while sent < spec.count:
            due = min(spec.count, int((time.perf_counter() - start) / interval) + 1)
            if due > sent:
                # everything due now goes in one call; acks are awaited off the schedule
                nursery.start_soon(client.publish_many, spec.topic,
                                   [stamped(spec.size) for _ in range(due - sent)])
                sent = due
            await trio.sleep(max(0.0, start + sent * interval - time.perf_counter()))


async def _consume(spec: Spec) -> Result:
    result = Result("consumer")
    latencies: list[float] = []
    measure = spec.mode == "latency"
    async with connect(spec.address) as client, client.subscribe(
            spec.topic, prefetch=spec.prefetch) as sub:
        result.start = ready_then_go()
        n = 0
        target = spec.count
        with trio.move_on_after(spec.idle_timeout) as idle:
            async for msg in sub:
                if measure:
                    latencies.append(latency_of(msg.payload, time.perf_counter_ns()))
                await msg.ack()
                n += 1
                if n == 1:
                    result.first = time.perf_counter()
                if n >= target:
                    break
                if not n & 1023:
                    idle.deadline = trio.current_time() + spec.idle_timeout
        result.last = time.perf_counter()
        result.count = n
        if idle.cancelled_caught:
            result.error = f"received {n} of {target} messages, then nothing for {spec.idle_timeout}s"
    result.latency_us = summarise(latencies)
    if math.isnan(result.first):
        result.first = 0.0
    return result
