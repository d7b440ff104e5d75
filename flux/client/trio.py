"""The trio client: ``connect()``, :class:`Client` and :class:`Subscription`.

This is the user API. Every protocol decision (routing, batching, retries,
credit, acks, resume) is made by the sans-IO :class:`flux.client.core.ClientCore`;
:mod:`flux.client.trio_shell` does the sockets, tasks and timers, reaching the
outside world through a :class:`flux.host.Host` only, so the simulator runs
this client unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

import trio

from flux import errors
from flux.client.core import ClientCore
from flux.client.subscription import SubState
from flux.client.trio_shell import TrioShell
from flux.client.types import FetchResult, Message, PublishAck, SubscribeInfo, Waiter
from flux.host import Host, RealHost

__all__ = ["Client", "Subscription", "connect"]

STREAK = 64  # most buffered messages the iterator returns before it yields to the scheduler


@asynccontextmanager
async def connect(url: str = "flux://127.0.0.1:7070", *, request_timeout: float = 10.0,
                  retry_deadline: float = 60.0, linger: float = 0.0,
                  host: Host | None = None) -> AsyncIterator[Client]:
    """Connect to the router at ``url`` (``flux://host:port``) and yield a :class:`Client`.

    ``request_timeout`` bounds each request and connection attempt;
    ``retry_deadline`` bounds how long a publish (or fetch, commit, stats) is
    retried; keep it below the broker's ``message.dedup_window``. ``linger``
    (seconds, default 0: send as soon as the connection is free) lets a partial
    batch of publishes wait that long for more, trading latency for throughput.
    Raises ConnectionLost (or RequestTimeout) if the router cannot be reached,
    ValueError for bad options.
    """
    body_error: BaseException | None = None
    async with trio.open_nursery() as nursery:
        client: Client | None = None
        try:
            client = Client(url, request_timeout=request_timeout, retry_deadline=retry_deadline,
                            linger=linger, host=host or RealHost("flux-client"), nursery=nursery)
            await client._start()
            yield client
        except BaseException as exc:  # re-raised below, outside the nursery (no group)
            body_error = exc
        finally:
            if client is not None:
                client._shutdown()
    if body_error is not None:
        raise body_error


class Client:
    """A connection to a Flux cluster; make it with :func:`connect`."""

    def __init__(self, url: str, *, request_timeout: float, retry_deadline: float,
                 linger: float = 0.0, host: Host, nursery: trio.Nursery) -> None:
        self._host = host
        self._core = ClientCore(url, rng=host.random, now=host.now(),
                                request_timeout=request_timeout, retry_deadline=retry_deadline,
                                linger=linger)
        self._shell = TrioShell(self._core, host, nursery)
        self._pump = self._shell.pump
        self._wait_all = self._shell.wait_all

    def __repr__(self) -> str:
        return f"<flux Client {self._core!r}>"

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
        item = self._core.publish(topic, payload, id, self._host.now())
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
        items = self._core.publish_many(topic, bodies, id_list, self._host.now())
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
                                         now=self._host.now())
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
                                name=name, generation=generation, now=self._host.now())
        result: FetchResult = await self._call(call)
        return result

    async def commit(self, topic: str, name: str, offset: int, generation: int | None) -> int:
        """Set pull subscription ``name``'s cursor to ``offset``; returns the cursor.

        Raises TopicReset, UnknownSubscription, OffsetOutOfRange,
        RetryDeadlineExceeded.
        """
        call = self._core.commit(topic, name, offset, generation, now=self._host.now())
        cursor: int = await self._call(call)
        return cursor

    async def stats(self) -> dict[int, dict[str, Any]]:
        """What every shard holds (its STATS reply), by shard index.

        Raises RetryDeadlineExceeded if a shard stays unreachable.
        """
        calls = self._core.stats(self._host.now())
        self._pump()
        await self._wait_all(calls)
        return {i: call.result() for i, call in enumerate(calls)}

    # -- the shell ---------------------------------------------------------------------

    async def _call(self, waiter: Waiter) -> Any:
        self._pump()
        await self._wait_all([waiter])
        return waiter.result()

    def _ack(self, state: SubState, msg: Message) -> None:
        # the core reads the clock only for the first held ack (reading it costs more
        # than the rest of an ack)
        held = state.ack_first_at
        if self._core.ack(state, msg, self._host.now() if held is None else held):
            self._pump()

    async def _start(self) -> None:
        self._shell.start()
        await self._wait_all([self._core.ready])
        self._core.ready.result()

    def _shutdown(self) -> None:
        self._shell.close()


class Subscription:
    """A push subscription: ``async with`` subscribes and unsubscribes; iterate for messages.

    ``async for msg in sub`` yields :class:`~flux.client.types.Message`; it
    raises SubscriptionInactive or SubscriptionTakenOver when the shard ended
    the subscription, TopicReset (``on_reset="raise"``) after a shard restart,
    NotDelivered (or another typed error) when the shard refused an ack, and
    stops after :meth:`unsubscribe` or when the client closes. Iterate it from
    one task at a time. While the connection is being re-established the
    iterator simply waits; unconsumed messages come again from the cursor.
    Messages already buffered are returned without yielding to other tasks,
    up to ``STREAK`` in a row (it stays cancellable).
    """

    def __init__(self, client: Client, topic: str, name: str | None, **options: Any) -> None:
        self._client = client
        self.topic = topic
        self.name = name
        self._options = options
        self._state: SubState | None = None
        self._streak = 0   # messages returned since the last pump and scheduler yield

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
        state = client._core.subscribe(self.topic, self.name, now=client._host.now(),
                                       **self._options)
        state.acker = functools.partial(client._ack, state)
        self._state = state
        try:
            await client._call(state.ready)
        except BaseException:
            client._core.unsubscribe(state, client._host.now())
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
        if self._streak < STREAK and state.buffer and state.status == "active" \
                and not state.errors:
            # buffered messages go out without a trip through the scheduler; credit and
            # acks they owe are handed to the shell at least every STREAK messages
            await trio.lowlevel.checkpoint_if_cancelled()
            msg = state.next_message()
            if msg is not None:
                self._streak += 1
                return msg
        self._streak = 0
        while True:
            await trio.lowlevel.checkpoint_if_cancelled()
            if state.status == "closed":
                raise StopAsyncIteration
            try:
                msg = client._core.next_message(state)
            finally:
                client._pump()
            if msg is not None:
                await trio.lowlevel.cancel_shielded_checkpoint()
                return msg
            event = trio.Event()
            state.waker = event
            await event.wait()

    async def unsubscribe(self) -> None:
        """Send queued acks, then end this session (a named subscription keeps its
        cursor on the shard). Idempotent; never raises for a lost connection."""
        state = self._state
        if state is None or state.status == "closed":
            return
        client = self._client
        done = client._core.unsubscribe(state, client._host.now())
        client._pump()
        await client._wait_all([done])
