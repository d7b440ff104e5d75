"""Peer producers and consumers for the bench (asyncio): NATS core and JetStream through
nats-py, Redis Streams through redis-py. Optional: needs the ``bench`` extra.

Each does what the Flux worker does, the way a user of that system would:
NATS core publishes and subscribes (no acks exist); JetStream publishes
asynchronously with a ``Nats-Msg-Id`` (dedup) and acks each pushed message
explicitly; Redis pipelines XADD and reads with XREADGROUP, acking each batch
with one XACK. A consumer with ``options["tally"]`` is one of a pool
(:mod:`flux.bench.pool`): a client of one JetStream pull consumer that all the
pool's clients share (``options["name"]``), or one consumer of a Redis group.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any

from flux.bench.pool import PoolCounter
from flux.bench.worker import (
    Result,
    Spec,
    Tally,
    flat_out,
    paced,
    payload,
    ready_then_go,
    summarise,
)

STREAM = "BENCH"   # the JetStream stream every run uses (subjects js.>)
GROUP = "bench"    # the Redis consumer group


def run(spec: Spec) -> Result:
    if spec.role == "consumer" and "tally" in spec.options:
        pooled = {"jetstream": _js_pool_consume, "redis": _redis_pool_consume}[spec.system]
        pool_result: Result = asyncio.run(pooled(spec))
        return pool_result
    fn = {("nats", "producer"): _nats_produce, ("nats", "consumer"): _nats_consume,
          ("jetstream", "producer"): _js_produce, ("jetstream", "consumer"): _js_consume,
          ("redis", "producer"): _redis_produce, ("redis", "consumer"): _redis_consume,
          }[(spec.system, spec.role)]
    result: Result = asyncio.run(fn(spec))
    return result


def _ids(n: int) -> list[str]:
    digits = os.urandom(16 * n).hex()
    return [digits[i:i + 32] for i in range(0, len(digits), 32)]


class _Counter(Tally):
    """A :class:`Tally` for callback consumers: ``wait`` until ``spec.count`` came."""

    def __init__(self, spec: Spec, result: Result) -> None:
        super().__init__(spec, result)
        self.done = asyncio.Event()

    def seen(self, data: bytes) -> None:
        if self.took(data):
            self.result.last = time.perf_counter()
            self.done.set()

    async def wait(self) -> None:
        last = -1
        while not self.done.is_set():
            if self.n == last:
                self.timed_out()
                self.result.last = time.perf_counter()
                break
            last = self.n
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.done.wait(), self.spec.idle_timeout)
        self.result.count = self.n
        self.result.latency_us = summarise(self.latencies)


# -- NATS core -------------------------------------------------------------------------------


async def _nats_produce(spec: Spec) -> Result:
    import nats

    result = Result("producer")
    nc = await nats.connect(spec.address, pending_size=8 << 20)
    try:
        result.start = ready_then_go()
        if spec.mode == "latency":
            async def send(bodies: list[bytes]) -> None:
                for body in bodies:
                    await nc.publish(spec.topic, body)
            await paced(spec, send)
        else:
            body = payload(spec.size)
            publish = nc.publish
            for i in range(spec.count):
                await publish(spec.topic, body)
                if not i % spec.batch:
                    await asyncio.sleep(0)  # let the flusher write
        await nc.flush()
        result.last = time.perf_counter()
        result.count = spec.count
    finally:
        await nc.close()
    return result


async def _nats_consume(spec: Spec) -> Result:
    import nats

    result = Result("consumer")
    nc = await nats.connect(spec.address)
    counter = _Counter(spec, result)

    async def on_msg(msg: Any) -> None:
        counter.seen(msg.data)

    try:
        await nc.subscribe(spec.topic, cb=on_msg, pending_msgs_limit=-1, pending_bytes_limit=-1)
        await nc.flush()
        result.start = ready_then_go()
        await counter.wait()
    finally:
        await nc.close()
    return result


# -- JetStream -------------------------------------------------------------------------------


async def ensure_stream(address: str, duplicate_window: float, storage: str = "memory",
                        stream: str = STREAM, subjects: str = "js.>") -> None:
    """(Re)create the stream ``stream`` on ``subjects``, in ``memory`` or ``file`` storage."""
    import nats
    from nats.js.api import StorageType, StreamConfig

    nc = await nats.connect(address)
    try:
        js = nc.jetstream()
        with contextlib.suppress(Exception):  # not there yet
            await js.delete_stream(stream)
        await js.add_stream(StreamConfig(name=stream, subjects=[subjects],
                                         storage=StorageType(storage),
                                         duplicate_window=duplicate_window))
    finally:
        await nc.close()


async def _js_produce(spec: Spec) -> Result:
    import nats

    result = Result("producer")
    nc = await nats.connect(spec.address, pending_size=8 << 20)
    js = nc.jetstream(publish_async_max_pending=spec.window * spec.batch)
    try:
        await js.publish(spec.topic, b"warm-up")
        result.start = ready_then_go()
        futures: list[Any] = []

        async def send(bodies: list[bytes]) -> None:
            for body, message_id in zip(bodies, _ids(len(bodies)), strict=True):
                futures.append(await js.publish_async(
                    spec.topic, body, headers={"Nats-Msg-Id": message_id}))

        if spec.mode == "latency":
            await paced(spec, send)
        else:
            body = payload(spec.size)
            left = spec.count
            while left:
                n = min(spec.batch, left)
                await send([body] * n)
                left -= n
        await asyncio.gather(*futures)
        result.last = time.perf_counter()
        result.count = spec.count
    finally:
        await nc.close()
    return result


async def _js_consume(spec: Spec) -> Result:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    result = Result("consumer")
    nc = await nats.connect(spec.address)
    js = nc.jetstream()
    counter = _Counter(spec, result)

    async def on_msg(msg: Any) -> None:
        counter.seen(msg.data)
        await msg.ack()

    try:
        await js.subscribe(spec.topic, cb=on_msg, manual_ack=True,
                           config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT,
                                                 max_ack_pending=spec.prefetch,
                                                 deliver_policy=DeliverPolicy.NEW),
                           pending_msgs_limit=-1, pending_bytes_limit=-1)
        await nc.flush()
        result.start = ready_then_go()
        await counter.wait()
    finally:
        await nc.close()
    return result


# -- Redis Streams ---------------------------------------------------------------------------


async def _redis_produce(spec: Spec) -> Result:
    import redis.asyncio as aioredis

    result = Result("producer")
    client = aioredis.from_url(spec.address)
    try:
        await client.ping()
        result.start = ready_then_go()

        async def send(bodies: list[bytes]) -> None:
            pipe = client.pipeline(transaction=False)
            for body, message_id in zip(bodies, _ids(len(bodies)), strict=True):
                pipe.xadd(spec.topic, {b"i": message_id, b"d": body})
            await pipe.execute()

        if spec.mode == "latency":
            await paced(spec, send)
        else:
            await flat_out(spec, send)
        result.last = time.perf_counter()
        result.count = spec.count
    finally:
        await client.aclose()
    return result


async def _redis_consume(spec: Spec) -> Result:
    import redis.asyncio as aioredis

    result = Result("consumer")
    client = aioredis.from_url(spec.address)
    counter = _Counter(spec, result)
    try:
        await client.xgroup_create(spec.topic, GROUP, id="$", mkstream=True)
        result.start = ready_then_go()

        async def reader() -> None:
            while not counter.done.is_set():
                reply: Any = await client.xreadgroup(GROUP, "c1", {spec.topic: ">"},
                                                     count=spec.batch, block=1000)
                for _, entries in reply or ():
                    ids = []
                    for entry_id, fields in entries:
                        counter.seen(fields[b"d"])
                        ids.append(entry_id)
                    if ids:
                        await client.xack(spec.topic, GROUP, *ids)

        task = asyncio.create_task(reader())
        await counter.wait()
        task.cancel()
    finally:
        await client.aclose()
    return result


# -- pools: several clients of one JetStream pull consumer, or of one Redis group ------------


async def _js_pool_consume(spec: Spec) -> Result:
    """A client of the pull consumer ``options["name"]`` (made by the pool's first
    client, ``max_ack_pending`` the pool's ``prefetch`` each): fetches of ``batch``,
    each message acked."""
    import nats
    from nats.errors import TimeoutError as FetchTimeout
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    pool = PoolCounter(spec)
    nc = await nats.connect(spec.address)
    try:
        js = nc.jetstream()
        psub = await js.pull_subscribe(
            spec.topic, durable=spec.options["name"], stream=STREAM,
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.NEW,
                                  max_ack_pending=spec.prefetch * pool.members))
        pool.go()

        async def work() -> None:
            while True:
                try:
                    msgs = await psub.fetch(spec.batch, timeout=1.0)
                except FetchTimeout:
                    continue
                for msg in msgs:
                    pool.took()
                    await msg.ack()

        return await pool.until_done(work())
    finally:
        await nc.close()
        pool.close()


async def _redis_pool_consume(spec: Spec) -> Result:
    """Consumer ``c<slot>`` of the group (made by the pool's first consumer):
    ``XREADGROUP COUNT batch``, one XACK per batch read."""
    import redis.asyncio as aioredis
    from redis.exceptions import ResponseError

    pool = PoolCounter(spec)
    client = aioredis.from_url(spec.address)
    name = f"c{spec.options.get('slot', 0)}"
    try:
        with contextlib.suppress(ResponseError):  # BUSYGROUP: another member made it
            await client.xgroup_create(spec.topic, GROUP, id="$", mkstream=True)
        pool.go()

        async def work() -> None:
            while not pool.finished:
                reply: Any = await client.xreadgroup(GROUP, name, {spec.topic: ">"},
                                                     count=spec.batch, block=200)
                for _, entries in reply or ():
                    if entries:
                        pool.took(len(entries))
                        await client.xack(spec.topic, GROUP, *(e[0] for e in entries))

        # a cancelled XREADGROUP can leave redis-py waiting: let the loop see the end
        return await pool.until_done(work(), grace=2.0)
    finally:
        await client.aclose()
        pool.close()
