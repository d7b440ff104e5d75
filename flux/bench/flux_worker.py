"""Flux producers and consumers for the bench, through the public client API only.

Producers keep ``window`` ``publish_many`` calls of ``batch`` messages in flight
(client-generated dedup ids); consumers use a push subscription and
``await msg.ack()`` every message. ``spec.options["client"]`` picks the client
flavour: ``"asyncio"`` (:mod:`flux.client.asyncio`, the runtime of the peers'
clients too) or ``"trio"`` (:mod:`flux.client.trio`); the workloads are the same.
A producer with ``options["keys"]`` gives its messages that many keys in turn
(:func:`message_key`). A consumer with ``options["tally"]`` is one member of a pool
(:mod:`flux.bench.pool`; asyncio only): it joins a shared subscription when
``options["shared"]`` says so, and never acks the messages of ``options["poison"]``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import trio

from flux.bench.pool import PoolCounter
from flux.bench.worker import (
    Result,
    Spec,
    Tally,
    batch_sizes,
    flat_out,
    paced,
    payload,
    ready_then_go,
    stamped,
    summarise,
)
from flux.client import asyncio as flux_asyncio
from flux.client.trio import Client, connect

FLAVOURS = ("asyncio", "trio")


def message_key(i: int) -> str:
    """The key of a keyed producer's ``i``-th message (modulo its number of keys)."""
    return f"k{i}"


def run(spec: Spec) -> Result:
    flavour = spec.options.get("client", "trio")
    if spec.role == "consumer" and "tally" in spec.options:
        return asyncio.run(_aio_pool_consume(spec))
    if flavour == "asyncio":
        return asyncio.run(_aio_consume(spec) if spec.role == "consumer" else _aio_produce(spec))
    if flavour != "trio":
        raise ValueError(f"unknown Flux client flavour {flavour!r}; one of {FLAVOURS}")
    return trio.run(_consume if spec.role == "consumer" else _produce, spec)


async def _produce(spec: Spec) -> Result:
    result = Result("producer")
    async with connect(spec.address, retry_deadline=float(spec.options.get("retry_deadline", 60))
                       ) as client:
        # one publish first, so the connection to the shard is made before timing starts
        await client.publish(spec.topic, b"warm-up")
        result.start = ready_then_go()
        if spec.mode == "latency":
            acks: list[float] = []
            await _produce_at_rate(client, spec, acks)
            result.ack_latency_us = summarise(acks)
        else:
            await _produce_flat_out(client, spec)
        result.last = time.perf_counter()
        result.count = spec.count
    return result


async def _produce_flat_out(client: Client, spec: Spec) -> None:
    body = payload(spec.size)
    sizes = batch_sizes(spec)

    async def publisher() -> None:
        for n in sizes:
            await client.publish_many(spec.topic, [body] * n)

    async with trio.open_nursery() as nursery:
        for _ in range(spec.window):
            nursery.start_soon(publisher)


async def _produce_at_rate(client: Client, spec: Spec, acks: list[float]) -> None:
    """Publish at ``spec.rate``; each message's publish-to-ack time (us) goes to ``acks``."""
    interval = 1.0 / spec.rate
    start = time.perf_counter()
    sent = 0

    async def publish(payloads: list[bytes]) -> None:
        began = time.perf_counter()
        await client.publish_many(spec.topic, payloads)
        acks.extend([(time.perf_counter() - began) * 1e6] * len(payloads))

    async with trio.open_nursery() as nursery:
        while sent < spec.count:
            due = min(spec.count, int((time.perf_counter() - start) / interval) + 1)
            if due > sent:
                # everything due now goes in one call; acks are awaited off the schedule
                nursery.start_soon(publish, [stamped(spec.size) for _ in range(due - sent)])
                sent = due
            await trio.sleep(max(0.0, start + sent * interval - time.perf_counter()))


async def _consume(spec: Spec) -> Result:
    result = Result("consumer")
    tally = Tally(spec, result)
    async with connect(spec.address) as client, client.subscribe(
            spec.topic, prefetch=spec.prefetch) as sub:
        result.start = ready_then_go()
        with trio.move_on_after(spec.idle_timeout) as idle:
            async for msg in sub:
                done = tally.took(msg.payload)
                await msg.ack()
                if done:
                    break
                if not tally.n & 1023:
                    idle.deadline = trio.current_time() + spec.idle_timeout
        if idle.cancelled_caught:
            tally.timed_out()
        return tally.finish()


# -- the asyncio flavour: the same workloads ------------------------------------------------


async def _aio_produce(spec: Spec) -> Result:
    result = Result("producer")
    async with flux_asyncio.connect(
            spec.address, retry_deadline=float(spec.options.get("retry_deadline", 60))) as client:
        await client.publish(spec.topic, b"warm-up")
        result.start = ready_then_go()
        if spec.mode == "latency":
            acks: list[float] = []
            await _aio_produce_at_rate(client, spec, acks)
            result.ack_latency_us = summarise(acks)
        else:
            await flat_out(spec, _aio_sender(client, spec))
        result.last = time.perf_counter()
        result.count = spec.count
    return result


def _aio_sender(client: flux_asyncio.Client, spec: Spec) -> Callable[[list[bytes]], Any]:
    """``publish_many`` of a batch; with ``options["keys"]``, keyed in turn."""
    count = int(spec.options.get("keys", 0))
    if not count:
        return lambda payloads: client.publish_many(spec.topic, payloads)
    names = [message_key(i) for i in range(count)]
    sent = [0]

    def send(payloads: list[bytes]) -> Any:
        first = sent[0]
        sent[0] += len(payloads)
        return client.publish_many(spec.topic, payloads, keys=[
            names[(first + j) % count] for j in range(len(payloads))])

    return send


async def _aio_produce_at_rate(client: flux_asyncio.Client, spec: Spec, acks: list[float]) -> None:
    pending: set[asyncio.Task[object]] = set()

    async def publish(payloads: list[bytes]) -> None:
        began = time.perf_counter()
        await client.publish_many(spec.topic, payloads)
        acks.extend([(time.perf_counter() - began) * 1e6] * len(payloads))

    async def send(payloads: list[bytes]) -> None:
        # acks are awaited off the schedule
        task = asyncio.ensure_future(publish(payloads))
        pending.add(task)  # kept until done
        task.add_done_callback(pending.discard)

    await paced(spec, send)
    if pending:
        await asyncio.gather(*pending)


async def _aio_consume(spec: Spec) -> Result:
    result = Result("consumer")
    tally = Tally(spec, result)
    async with flux_asyncio.connect(spec.address) as client, client.subscribe(
            spec.topic, prefetch=spec.prefetch) as sub:
        result.start = ready_then_go()
        try:
            async with asyncio.timeout(spec.idle_timeout) as idle:
                async for msg in sub:
                    done = tally.took(msg.payload)
                    await msg.ack()
                    if done:
                        break
                    if not tally.n & 1023:
                        idle.reschedule(asyncio.get_running_loop().time() + spec.idle_timeout)
        except TimeoutError:
            tally.timed_out()
        return tally.finish()


async def _aio_pool_consume(spec: Spec) -> Result:
    """One member of a pool: counts each offset once (a re-push goes back to the member
    that held it) and acks every message but the poison key's."""
    options = spec.options
    poison = options.get("poison")
    pool = PoolCounter(spec)
    try:
        async with flux_asyncio.connect(spec.address) as client, client.subscribe(
                spec.topic, options.get("name"), prefetch=spec.prefetch,
                shared=bool(options.get("shared")),
                key_ordered=bool(options.get("key_ordered"))) as sub:
            pool.go()

            async def work() -> None:
                taken: set[int] = set()
                async for msg in sub:
                    if poison is not None and msg.key == poison:
                        continue
                    if msg.offset not in taken:
                        taken.add(msg.offset)
                        pool.took()
                    await msg.ack()

            return await pool.until_done(work())
    finally:
        pool.close()
