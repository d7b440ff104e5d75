"""What the trio and asyncio clients share: the user API over :class:`ClientCore`.

:class:`ClientBase` and :class:`SubscriptionBase` hold every public method
whose body is the same in both flavours; a flavour adds its clock (``_now``),
its shell (``_pump``, ``_wait_all``), start and close, and the iterator's
``__anext__``, which differs in how it yields to the event loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, ClassVar, Protocol, Self

from flux import errors
from flux.client.core import ClientCore
from flux.client.subscription import SubState
from flux.client.types import FetchResult, Message, PublishAck, PublishAcks, SubscribeInfo, Waiter


class Shell(Protocol):
    """What a flavour's I/O shell offers the shared API."""

    def start(self) -> None: ...

    def pump(self) -> None: ...

    async def wait_all(self, waiters: list[Any]) -> None: ...


class ClientBase:
    """The public client API; see :func:`flux.client.trio.connect`."""

    _core: ClientCore
    _pump: Callable[[], None]
    _wait_all: Callable[[list[Any]], Awaitable[None]]
    _subscription_class: ClassVar[type[SubscriptionBase]]

    def _use_shell(self, shell: Shell) -> None:
        self._pump = shell.pump
        self._wait_all = shell.wait_all

    async def _start(self) -> None:
        """Start the shell and wait for the router's shard map."""
        self._shell_start()
        await self._wait_all([self._core.ready])
        self._core.ready.result()

    def _shell_start(self) -> None:
        raise NotImplementedError

    def _now(self) -> float:
        raise NotImplementedError

    # -- publishing --------------------------------------------------------------------

    async def publish(self, topic: str, payload: bytes, id: str | None = None, *,
                      key: str | None = None, headers: dict[str, str] | None = None,
                      delay: float | None = None, deliver_at: float | None = None
                      ) -> PublishAck:
        """Publish one message; returns its ack once the shard stored it.

        ``id`` (1-128 bytes) deduplicates retries; without one a random id is
        generated. Retries after timeouts, lost connections, Busy and
        ShuttingDown reuse the id. ``key`` (1-255 bytes) and ``headers`` (str to
        str; names beginning ``flux-`` are the broker's) travel with the message.
        ``delay`` (seconds) or ``deliver_at`` (wall time; the past means now):
        stored and acked at once, pushed to no subscription before it is due (the
        ack's ``due``; at most the topic's ``message.max_delay`` away).
        Raises InvalidTopic, InvalidMessageId, InvalidKey, InvalidHeaders,
        InvalidDelay, MessageTooLarge, InvalidRequest (before sending), TopicFull
        (back-pressure: retry later), RetryDeadlineExceeded, ClientClosed.
        Like a deadline, cancelling the call leaves it unknown whether the
        message was stored; publish again with the same id to find out.
        """
        batch = self._core.publish(topic, payload, id, self._now(), key=key, headers=headers,
                                   delay=delay, deliver_at=deliver_at)
        self._pump()
        await self._wait_all([batch])
        return batch.result()[0]

    async def publish_many(self, topic: str, payloads: Iterable[bytes],
                           ids: Iterable[str] | None = None, *,
                           keys: Iterable[str | None] | None = None,
                           headers: Iterable[dict[str, str] | None] | dict[str, str] | None
                           = None, delay: float | None = None, deliver_at: float | None = None
                           ) -> PublishAcks:
        """Publish several messages to one topic, in order; returns their acks.

        Every item is attempted; if any failed, the first error (in item order)
        is raised after all finished. Pass ``ids`` to make a retry of the whole
        call deduplicated; ``keys`` and ``headers`` one per message (headers: or
        one map for all); ``delay``/``deliver_at`` apply to every message. Raises
        like :meth:`publish`.
        """
        bodies = list(payloads)
        id_list = list(ids) if ids is not None else None
        if id_list is not None and len(id_list) != len(bodies):
            raise errors.InvalidRequest(f"{len(id_list)} ids for {len(bodies)} payloads")
        batch = self._core.publish_many(
            topic, bodies, id_list, self._now(), keys=list(keys) if keys is not None else None,
            headers=headers if headers is None or isinstance(headers, dict) else list(headers),
            delay=delay, deliver_at=deliver_at)
        self._pump()
        await self._wait_all([batch])
        return batch.result()

    # -- subscribing -------------------------------------------------------------------

    def subscribe(self, topic: str, name: str | None = None, read_old: bool = False,
                  from_offset: int | None = None, max_in_flight: int | None = None,
                  prefetch: int | None = None, on_reset: str = "earliest", *,
                  shared: bool = False, key_ordered: bool = False) -> SubscriptionBase:
        """A push subscription, used as ``async with client.subscribe(...) as sub``.

        ``name`` makes a durable subscription (resumed from its cursor after a
        reconnect); without it the subscription is ephemeral and, after a
        reconnect, resumes as a new ephemeral one from the lowest offset not
        yet acked. ``read_old``/``from_offset`` apply when the subscription is
        created. ``prefetch`` is the credit: how many first deliveries may wait
        in the client (default ``max_in_flight`` or 1000). ``on_reset``
        ("earliest" or "raise") decides what a shard restart does (G7).

        ``shared=True`` joins the named subscription as one member of a worker
        pool (G10): each message goes to one member at a time, a member that
        leaves hands its unacked messages to the others, and ``max_in_flight``
        and ``prefetch`` are this member's. ``key_ordered=True`` (with
        ``shared``) keeps each message key on one member while it has unacked
        messages, so a key's messages are worked in order.
        Entering raises InvalidTopic or InvalidRequest (bad options, before
        sending), SubscriptionKindMismatch (the name is a subscription of
        another kind), OffsetOutOfRange, RetryDeadlineExceeded or ClientClosed.
        """
        return self._subscription_class(self, topic, name, read_old=read_old, from_offset=from_offset,
                            max_in_flight=max_in_flight, prefetch=prefetch, on_reset=on_reset,
                            shared=shared, key_ordered=key_ordered)

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

    async def stats(self, *, wait: float | None = None, partial: bool = False
                    ) -> dict[int, dict[str, Any]]:
        """What every shard holds (its STATS reply), by shard index; each shard is asked
        for at most ``wait`` seconds (default: ``retry_deadline``).

        Raises RetryDeadlineExceeded if a shard stays unreachable (a recovering shard
        answers Busy until it is done), unless ``partial``: then such a shard's entry is
        ``{"unavailable": "<why>"}`` and the others are returned.
        """
        calls = self._core.stats(self._now(), wait)
        self._pump()
        await self._wait_all(calls)
        out: dict[int, dict[str, Any]] = {}
        for i, call in enumerate(calls):
            try:
                out[i] = call.result()
            except errors.RetryDeadlineExceeded as exc:
                if not partial:
                    raise
                why = exc.__cause__ if isinstance(exc.__cause__, errors.FluxError) else exc
                out[i] = {"unavailable": f"{type(why).__name__}: {why}"}
        return out

    # -- the shell ---------------------------------------------------------------------

    async def _call(self, waiter: Waiter) -> Any:
        self._pump()
        await self._wait_all([waiter])
        return waiter.result()


class SubscriptionBase:
    """A push subscription: ``async with`` subscribes and unsubscribes; iterate for messages.

    ``async for msg in sub`` yields :class:`~flux.client.types.Message`; it
    raises SubscriptionInactive or SubscriptionTakenOver when the shard ended
    the subscription, TopicReset (``on_reset="raise"``) after a shard restart,
    NotDelivered (or another typed error) when the shard refused an ack, and
    stops after :meth:`unsubscribe` or when the client closes. Iterate it from
    one task at a time. While the connection is being re-established the
    iterator simply waits; unconsumed messages come again from the cursor.
    """

    def __init__(self, client: ClientBase, topic: str, name: str | None, **options: Any) -> None:
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

    async def __aenter__(self) -> Self:
        """Subscribe. Raises InvalidTopic, InvalidRequest, OffsetOutOfRange,
        RetryDeadlineExceeded, ClientClosed."""
        client = self._client
        state = client._core.subscribe(self.topic, self.name, now=client._now(),
                                       **self._options)
        state.acker = client._core.acker(state, client._now, client._pump)
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

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Message:
        raise NotImplementedError

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
