"""The asyncio client: ``connect()``, :class:`Client` and :class:`Subscription`.

The same API and behaviour as :mod:`flux.client.trio`, on the running asyncio
loop (the default loop or uvloop). Every protocol decision (routing, batching,
retries, credit, acks, resume) is made by the sans-IO
:class:`flux.client.core.ClientCore`; :mod:`flux.client.asyncio_shell` does the
transports and the timer. Nothing here imports trio.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

from flux import errors
from flux.client.asyncio_shell import AsyncioShell
from flux.client.core import ClientCore
from flux.client.subscription import SubState
from flux.client.types import FetchResult, Message, PublishAck, SubscribeInfo, Waiter

__all__ = ["Client", "Subscription", "connect"]


@asynccontextmanager
async def connect(url: str = "flux://127.0.0.1:7070", *, request_timeout: float = 10.0,
                  retry_deadline: float = 60.0, linger: float = 0.0) -> AsyncIterator[Client]:
    """Connect to the router at ``url`` (``flux://host:port``) and yield a :class:`Client`.

    ``request_timeout`` bounds each request and connection attempt;
    ``retry_deadline`` bounds how long a publish (or fetch, commit, stats) is
    retried; keep it below the broker's ``message.dedup_window``. ``linger``
    (seconds, default 0: send as soon as the connection is free) lets a partial
    batch of publishes wait that long for more, trading latency for throughput.
    Raises ConnectionLost (or RequestTimeout) if the router cannot be reached,
    ValueError for bad options.
    """
    client = Client(url, request_timeout=request_timeout, retry_deadline=retry_deadline,
                    linger=linger)
    try:
        await client._start()
        yield client
    except BaseException:
        await client._aclose(raise_crash=False)
        raise
    await client._aclose()


class Client:
    """A connection to a Flux cluster; make it with :func:`connect` (inside a running loop)."""

    def __init__(self, url: str, *, request_timeout: float, retry_deadline: float,
                 linger: float = 0.0) -> None:
        self._loop = asyncio.get_running_loop()
        self._core = ClientCore(url, rng=random.Random(os.urandom(16)), now=self._loop.time(),
                                request_timeout=request_timeout, retry_deadline=retry_deadline,
                                linger=linger)
        self._shell = AsyncioShell(self._core, self._loop)
        self._pump = self._shell.pump
        self._wait_all = self._shell.wait_all

    def __repr__(self) -> str:
        return f"<flux asyncio Client {self._core!r}>"

    # -- publishing --------------------------------------------------------------------

    async def publish(self, topic: str, payload: bytes, id: str | None = None) -> PublishAck:
        """Publish one message; returns its ack once the shard stored it.

        ``id`` (1-128 bytes) deduplicates retries; without one a random id is
        generated. Retries after timeouts, lost connections, Busy and
        ShuttingDown reuse the id. Raises InvalidTopic, InvalidMessageId,
        MessageTooLarge, InvalidRequest (before sending), TopicFull
        (back-pressure: retry later), RetryDeadlineExceeded, ClientClosed.
        Like a deadline, cancelling the call leaves it unknown whether the
        message was stored; publish again with the same id to find out.
        """
        item = self._core.publish(topic, payload, id, self._now())
        self._pump()
        await self._wait_all([item])
        value: PublishAck = item.result()
        return value

    async def publish_many(self, topic: str, payloads: Iterable[bytes],
                           ids: Iterable[str] | None = None) -> list[PublishAck]:
        """Publish several messages to one topic, in order; returns their acks.

        Every item is attempted; if any failed, the first error (in item order)
        is raised after all finished. Pass ``ids`` to make a retry of the whole
        call deduplicated. Raises like :meth:`publish`.
        """
        bodies = list(payloads)
        id_list = list(ids) if ids is not None else None
        if id_list is not None and len(id_list) != len(bodies):
            raise errors.InvalidRequest(f"{len(id_list)} ids for {len(bodies)} payloads")
        now = self._now()
        items = []
        try:
            for i, body in enumerate(bodies):
                items.append(self._core.publish(topic, body, id_list[i] if id_list else None, now))
        except errors.FluxError:
            for item in items:
                self._core.abandon(item)
            raise
        self._pump()
        await self._wait_all(items)
        failed = next((item.error for item in items if item.error is not None), None)
        if failed is not None:
            raise failed
        return [item.result() for item in items]

    # -- subscribing -------------------------------------------------------------------

    def subscribe(self, topic: str, name: str | None = None, read_old: bool = False,
                  from_offset: int | None = None, max_in_flight: int | None = None,
                  prefetch: int | None = None, on_reset: str = "earliest") -> Subscription:
        """A push subscription, used as ``async with client.subscribe(...) as sub``.

        ``name`` makes a durable subscription (resumed from its cursor after a
        reconnect); without it the subscription is ephemeral and, after a
        reconnect, resumes as a new ephemeral one from the lowest offset not
        yet acked. ``read_old``/``from_offset`` apply when the subscription is
        created. ``prefetch`` is the credit: how many first deliveries may wait
        in the client (default ``max_in_flight`` or 1000). ``on_reset``
        ("earliest" or "raise") decides what a shard restart does (G7).
        Entering raises InvalidTopic or InvalidRequest (bad options, before
        sending), OffsetOutOfRange, RetryDeadlineExceeded or ClientClosed.
        """
        return Subscription(self, topic, name, read_old=read_old, from_offset=from_offset,
                            max_in_flight=max_in_flight, prefetch=prefetch, on_reset=on_reset)

    async def subscribe_pull(self, topic: str, name: str, *, read_old: bool = False,
                             from_offset: int | None = None, generation: int | None = None,
                             on_reset: str = "earliest") -> SubscribeInfo:
        """Create or resume the pull subscription ``name`` (no pushes; FETCH and COMMIT).

        Raises InvalidTopic, InvalidRequest, TopicReset (``on_reset="raise"``
        and ``generation`` is stale), OffsetOutOfRange, RetryDeadlineExceeded.
        """
        call = self._core.subscribe_pull(topic, name, read_old=read_old, from_offset=from_offset,
                                         generation=generation, on_reset=on_reset,
                                         now=self._now())
        info: SubscribeInfo = await self._call(call)
        return info

    async def fetch(self, topic: str, offset: int, max_messages: int = 1000, *,
                    max_bytes: int | None = None, name: str | None = None,
                    generation: int | None = None) -> FetchResult:
        """Read held messages of ``topic`` from ``offset`` on (the pull path).

        With ``name`` the fetch also keeps that pull subscription active.
        Raises InvalidTopic, TopicReset (``generation`` is not the shard's),
        UnknownSubscription, InvalidRequest, RetryDeadlineExceeded.
        """
        call = self._core.fetch(topic, offset, max_messages=max_messages, max_bytes=max_bytes,
                                name=name, generation=generation, now=self._now())
        result: FetchResult = await self._call(call)
        return result

    async def commit(self, topic: str, name: str, offset: int, generation: int | None) -> int:
        """Set pull subscription ``name``'s cursor to ``offset``; returns the cursor.

        Raises TopicReset, UnknownSubscription, OffsetOutOfRange,
        RetryDeadlineExceeded.
        """
        call = self._core.commit(topic, name, offset, generation, now=self._now())
        cursor: int = await self._call(call)
        return cursor

    async def stats(self) -> dict[int, dict[str, Any]]:
        """What every shard holds (its STATS reply), by shard index.

        Raises RetryDeadlineExceeded if a shard stays unreachable.
        """
        calls = self._core.stats(self._now())
        self._pump()
        await self._wait_all(calls)
        return {i: call.result() for i, call in enumerate(calls)}

    # -- the shell ---------------------------------------------------------------------

    def _now(self) -> float:
        return self._loop.time()

    async def _call(self, waiter: Waiter) -> Any:
        self._pump()
        await self._wait_all([waiter])
        return waiter.result()

    def _ack(self, state: SubState, msg: Message) -> None:
        # the core needs the time only for the first held ack
        held = state.ack_first_at
        if self._core.ack(state, msg, self._now() if held is None else held):
            self._pump()

    async def _start(self) -> None:
        self._shell.start()
        await self._wait_all([self._core.ready])
        self._core.ready.result()

    async def _aclose(self, raise_crash: bool = True) -> None:
        await self._shell.aclose()
        if raise_crash and self._shell.crashed is not None:
            raise self._shell.crashed


class Subscription:
    """A push subscription: ``async with`` subscribes and unsubscribes; iterate for messages.

    ``async for msg in sub`` yields :class:`~flux.client.types.Message`; it
    raises SubscriptionInactive or SubscriptionTakenOver when the shard ended
    the subscription, TopicReset (``on_reset="raise"``) after a shard restart,
    NotDelivered (or another typed error) when the shard refused an ack, and
    stops after :meth:`unsubscribe` or when the client closes. Iterate it from
    one task at a time. While the connection is being re-established the
    iterator simply waits; unconsumed messages come again from the cursor.
    Cancelling a waiting ``__anext__`` (e.g. ``asyncio.wait_for``) loses no message.
    """

    def __init__(self, client: Client, topic: str, name: str | None, **options: Any) -> None:
        self._client = client
        self.topic = topic
        self.name = name
        self._options = options
        self._state: SubState | None = None

    def __repr__(self) -> str:
        return repr(self._state) if self._state is not None else (
            f"<Subscription {self.topic} name={self.name!r} not subscribed>")

    @property
    def info(self) -> SubscribeInfo | None:
        """The first SUBSCRIBED reply (None before subscribing)."""
        return self._state.info if self._state is not None else None

    @property
    def created(self) -> bool | None:
        """Whether the first subscribe created the subscription."""
        return self.info.created if self.info is not None else None

    @property
    def start_offset(self) -> int | None:
        """Where the subscription started (when it was created)."""
        return self.info.start_offset if self.info is not None else None

    @property
    def generation(self) -> int | None:
        """The shard generation of the current session (changes after a reset)."""
        return self._state.generation if self._state is not None else None

    async def __aenter__(self) -> Subscription:
        """Subscribe. Raises InvalidTopic, InvalidRequest, OffsetOutOfRange,
        RetryDeadlineExceeded, ClientClosed."""
        client = self._client
        state = client._core.subscribe(self.topic, self.name, now=client._now(), **self._options)
        state.acker = functools.partial(client._ack, state)
        self._state = state
        try:
            await client._call(state.ready)
        except BaseException:
            client._core.unsubscribe(state, client._now())
            client._pump()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.unsubscribe()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Message:
        state = self._state
        if state is None:
            raise RuntimeError("use 'async with client.subscribe(...) as sub' before iterating")
        client = self._client
        # let other tasks run (and a cancellation land) before a message is taken:
        # once taken, it is returned without awaiting anything, so none is lost
        await asyncio.sleep(0)
        while True:
            if state.status == "closed":
                raise StopAsyncIteration
            try:
                msg = client._core.next_message(state)
            finally:
                client._pump()
            if msg is not None:
                return msg
            event = asyncio.Event()
            state.waker = event
            await event.wait()

    async def unsubscribe(self) -> None:
        """Send queued acks, then end this session (a named subscription keeps its
        cursor on the shard). Idempotent; never raises for a lost connection."""
        state = self._state
        if state is None or state.status == "closed":
            return
        client = self._client
        done = client._core.unsubscribe(state, client._now())
        client._pump()
        await client._wait_all([done])
