"""A chaos client process: a producer, a subscriber or a pull reader on the real Flux client.

Run by the runner as ``python -m chaos.worker --spec JSON`` (a :class:`WorkerSpec`),
in the trio or the asyncio flavour. It records what its client saw to a history
file (:mod:`chaos.recording`), switches to liveness mode on SIGUSR1 (producers
stop, then publish a canary per topic; subscribers ack at once; pull readers, which
FETCH pages and COMMIT after each, go on) and flushes and exits on SIGTERM. Which
faults happen is not its business.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import signal
import sys
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio

from chaos.recording import EventLog, TappedRealHost, make_recorder, monotonic
from flux import errors
from flux.sim import history as h
from flux.sim.tap import Recorder

# A publish is retried (same ids) after these; anything else is a bug in the workload.
RETRYABLE = (errors.TopicFull, errors.Busy, errors.RetryDeadlineExceeded, errors.ConnectionLost,
             errors.RequestTimeout, errors.ShuttingDown, errors.WrongShard,
             errors.StorageUnavailable)
# After these a subscriber subscribes again.
ENDED = (errors.SubscriptionInactive, errors.SubscriptionTakenOver, errors.TopicReset,
         errors.NotDelivered, errors.UnknownSubscription, errors.OffsetOutOfRange,
         errors.RetryDeadlineExceeded, errors.ConnectionLost, errors.RequestTimeout,
         errors.ShuttingDown)
# After these a pull reader subscribes again (its subscription or generation is gone).
PULL_ENDED = (errors.TopicReset, errors.UnknownSubscription, errors.OffsetOutOfRange,
              errors.RetryDeadlineExceeded, errors.RequestTimeout, errors.ShuttingDown)
FLUSH_EVERY = 0.5
PAYLOAD_PAD = b"." * 64


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    index: int
    role: str                       # "producer", "subscriber", "member" or "puller"
    name: str                       # its host name in the history
    flavour: str                    # "trio" or "asyncio"
    url: str
    topics: tuple[str, ...]
    seed: int
    out: str
    request_timeout: float = 1.0
    retry_deadline: float = 8.0
    rate: float = 10.0              # producer: messages per second per topic
    batch: int = 4                  # producer: most messages per publish_many
    give_up_after: float = 30.0     # producer: own retries of one batch (< dedup_window)
    max_in_flight: int | None = None
    prefetch: int | None = None
    slow_ack: float = 0.0           # subscriber: share of messages acked late while faulting
    slow_ack_max: float = 2.0       # subscriber: the latest a late ack comes, in seconds
    withhold: float = 0.0           # subscriber: share of messages never acked in their first
                                    # session, so they use all their pushes (G4: inactive)
    page: int = 50                  # puller: most messages per FETCH
    pool: str | None = None         # member: the shared, key-ordered subscription (G10)
    read_dead: tuple[str, ...] = () # dead-letter topics it reads back (G11)

    def subscription(self, topic: str) -> str:
        return self.pool if self.pool is not None else f"{self.name}-{topic}"

    def subscriber_id(self, topic: str) -> str:
        """The id the history uses for this process's subscription to ``topic`` (tap format)."""
        return f"{self.name}/{self.subscription(topic)}"

    def canary_id(self, topic: str) -> str:
        return f"canary.{self.name}.{topic}"

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerSpec:
        data = json.loads(text)
        data["topics"] = tuple(data["topics"])
        return cls(**data)


def asyncio_available() -> bool:
    try:
        import flux.client.asyncio  # noqa: F401
    except ImportError:
        return False
    return True


class Worker:
    def __init__(self, spec: WorkerSpec, log: EventLog, recorder: Recorder) -> None:
        self.spec = spec
        self.log = log
        self.recorder = recorder
        self.rng = random.Random(f"{spec.seed}:{spec.name}")
        self.healed = anyio.Event()
        self.published = 0
        self.consumed = 0
        self.next_id: dict[str, int] = dict.fromkeys(spec.topics, 0)  # kept across reconnects
        self.canaries: set[str] = set()   # topics whose canary was acked

    @asynccontextmanager
    async def client(self) -> AsyncIterator[Any]:
        spec = self.spec
        if spec.flavour == "asyncio":
            from chaos.flavours import asyncio_client
            async with asyncio_client(spec, self.recorder) as client:
                yield client
        else:
            from flux.client.tls import client_context
            from flux.client.trio import connect

            # TLS goes below the tap (the host's), so the tap still reads plain frames
            tls = client_context(spec.url)
            url = "flux://" + spec.url.split("://", 1)[1].split("?", 1)[0] if tls else spec.url
            host = TappedRealHost(spec.name, self.recorder, tls)
            async with connect(url, request_timeout=spec.request_timeout,
                               retry_deadline=spec.retry_deadline, host=host) as client:
                yield client

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._signals, tg.cancel_scope)
            tg.start_soon(self._flusher)
            while True:
                try:
                    async with self.client() as client:
                        _say({"ready": self.spec.name})
                        await self._work(client)
                    return
                except (errors.FluxError, OSError) as exc:
                    _say({"client_error": f"{type(exc).__name__}: {exc}"})
                await anyio.sleep(self.rng.uniform(0.2, 1.0))

    async def _work(self, client: Any) -> None:
        async with anyio.create_task_group() as tg:
            if self.spec.read_dead:
                tg.start_soon(self._read_dead_letters, client)
            for topic in self.spec.topics:
                if self.spec.role == "producer":
                    tg.start_soon(self._produce, client, topic)
                elif self.spec.role == "puller":
                    tg.start_soon(self._pull, client, topic)
                else:
                    tg.start_soon(self._subscribe, client, topic, tg)
        # producers are done (canaries acked): idle until stopped
        await anyio.sleep_forever()

    async def _signals(self, scope: anyio.CancelScope) -> None:
        with anyio.open_signal_receiver(signal.SIGUSR1, signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                if signum == signal.SIGUSR1:
                    self.healed.set()
                else:
                    scope.cancel()
                    return

    async def _flusher(self) -> None:
        while True:
            await anyio.sleep(FLUSH_EVERY)
            self.log.flush()

    # -- producing ---------------------------------------------------------------------

    async def _produce(self, client: Any, topic: str) -> None:
        spec, rng = self.spec, self.rng
        mean_batch = (1 + spec.batch) / 2
        while not self.healed.is_set():
            with anyio.move_on_after(rng.expovariate(spec.rate / mean_batch)):
                await self.healed.wait()
            if self.healed.is_set():
                break
            n = self.next_id[topic]
            size = rng.randint(1, spec.batch)
            ids = [f"{spec.name}.{topic}.{n + i}" for i in range(size)]
            self.next_id[topic] = n + size   # even if it fails: a new id is a new message
            await self._publish(client, topic, ids)
        if topic not in self.canaries:
            await self._publish(client, topic, [spec.canary_id(topic)], forever=True)
            self.canaries.add(topic)

    async def _publish(self, client: Any, topic: str, ids: list[str], forever: bool = False) -> None:
        """Publish until acked, retrying with the same ids; give up before dedup_window."""
        give_up = monotonic() + self.spec.give_up_after
        payloads = [i.encode() + PAYLOAD_PAD for i in ids]
        while True:
            try:
                # keyed, so a key-ordered pool has keys to keep in order (G10)
                keys = [f"k{zlib.crc32(i.encode()) % 16}" for i in ids]
                if len(ids) == 1:
                    await client.publish(topic, payloads[0], id=ids[0], key=keys[0])
                else:
                    await client.publish_many(topic, payloads, ids=ids, keys=keys)
                self.published += len(ids)
                return
            except RETRYABLE:
                if not forever and monotonic() + self.spec.retry_deadline > give_up:
                    return
                await anyio.sleep(self.rng.uniform(0.05, 0.3))

    # -- subscribing -------------------------------------------------------------------

    async def _subscribe(self, client: Any, topic: str, acks: anyio.abc.TaskGroup) -> None:
        spec, rng = self.spec, self.rng
        withheld: set[str] = set()   # ids not acked in this session; acked in the next
        done: set[str] = set()
        while True:
            try:
                async with client.subscribe(topic, name=spec.subscription(topic), read_old=True,
                                            max_in_flight=spec.max_in_flight,
                                            prefetch=spec.prefetch,
                                            shared=spec.pool is not None,
                                            key_ordered=spec.pool is not None) as sub:
                    async for msg in sub:
                        self.log.add(h.Consumed(monotonic(), spec.subscriber_id(topic), msg.topic,
                                                msg.generation, msg.offset, msg.id, msg.attempt))
                        self.consumed += 1
                        faulting = not self.healed.is_set()
                        if faulting and spec.pool is not None and rng.random() < 0.01:
                            await msg.term("chaos: a job that cannot be done")  # (G11)
                        elif faulting and (msg.id in withheld or (
                                msg.id not in done and rng.random() < spec.withhold)):
                            withheld.add(msg.id)
                        elif faulting and rng.random() < spec.slow_ack:
                            acks.start_soon(_ack_later, msg, rng.uniform(0.0, spec.slow_ack_max))
                        else:
                            await msg.ack()
                return
            except ENDED:
                done |= withheld
                withheld.clear()
                await anyio.sleep(rng.uniform(0.05, 0.5))

    async def _read_dead_letters(self, client: Any) -> None:
        """Read the dead-letter topics of the pool's topic back whole every few seconds
        (the tap records the pages: the checker finds each dead letter there, the report
        counts them)."""
        while True:
            await anyio.sleep(3.0)
            for name in self.spec.read_dead:
                with contextlib.suppress(*RETRYABLE, errors.TopicReset, errors.OffsetOutOfRange):
                    await client.fetch(name, 0, 10_000)

    # -- pull reading ------------------------------------------------------------------

    async def _pull(self, client: Any, topic: str) -> None:
        """Read ``topic`` through the pull path as the Spark source does: a named pull
        subscription, FETCH pages from its cursor, COMMIT after each. The tap records
        the pages (the checker's pull rules and liveness read them)."""
        spec, rng = self.spec, self.rng
        name = spec.subscription(topic)
        generation: int | None = None
        while True:
            try:
                info = await client.subscribe_pull(topic, name, read_old=True,
                                                   generation=generation)
                generation, position = info.generation, info.cursor
                while True:
                    page = await client.fetch(topic, position, spec.page, name=name,
                                              generation=generation)
                    if page.messages:
                        position = page.messages[-1].offset + 1
                        await client.commit(topic, name, position, generation)
                    else:
                        position = max(position, page.oldest)
                        await anyio.sleep(rng.uniform(0.05, 0.2))
            except PULL_ENDED:
                await anyio.sleep(rng.uniform(0.05, 0.5))


async def _ack_later(msg: Any, delay: float) -> None:
    await anyio.sleep(delay)
    await msg.ack()


def _say(data: dict[str, Any]) -> None:
    print(json.dumps(data), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.worker")
    parser.add_argument("--spec", required=True, help="WorkerSpec fields as a JSON object")
    spec = WorkerSpec.from_json(parser.parse_args(argv).spec)
    log = EventLog(spec.out, {"worker": spec.name, "role": spec.role, "flavour": spec.flavour,
                              "pid": os.getpid()})
    worker = Worker(spec, log, make_recorder(log, spec.index))
    try:
        if spec.flavour == "asyncio":
            from chaos.flavours import TappingLoop
            anyio.run(worker.run, backend="asyncio", backend_options={"loop_factory": TappingLoop})
        else:
            anyio.run(worker.run, backend="trio")
    except KeyboardInterrupt:
        pass
    finally:
        worker.recorder.stopped = True
        log.close()
    print(json.dumps({"stopped": spec.name, "published": worker.published,
                      "consumed": worker.consumed}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
