"""The blocking client for scripts and notebooks: ``connect()``, :class:`Client`,
:class:`Subscription` and :class:`Message`, with the names of the async flavours.

Each client runs the asyncio client (:mod:`flux.client.asyncio`) on a private
event loop in a daemon thread; every call here hands a coroutine to that loop
and blocks until it answers. The caller's thread never runs a loop, so this
works from any thread and inside code that already runs one (Jupyter). No
protocol logic lives here.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import weakref
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar, cast

from flux import errors
from flux.client import asyncio as aio
from flux.client import types
from flux.client.credentials import split_url
from flux.client.tls import TlsOption, client_context
from flux.client.types import FetchResult, PublishAck, PublishAcks, SubscribeInfo
from flux.message_meta import check_delay

__all__ = ["Client", "Message", "Subscription", "connect"]

T = TypeVar("T")
STOP_TIMEOUT = 10.0   # seconds close() waits for the loop thread to finish
_END = object()       # the subscription's iterator finished


class _LoopThread:
    """A private asyncio loop in a daemon thread, and the portal into it."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        finally:
            loop.close()

    def in_loop(self) -> bool:
        return threading.current_thread() is self.thread

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for it; an interrupt (Ctrl-C) cancels it."""
        if self.in_loop():
            coro.close()
            raise RuntimeError("a blocking Flux call was made from its own client's loop thread")
        try:
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        except RuntimeError:  # the loop is closed
            coro.close()
            raise errors.ClientClosed("the client was closed") from None
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def call_soon(self, fn: Any, *args: Any) -> None:
        """Run ``fn(*args)`` on the loop without waiting (dropped once it is closed)."""
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(fn, *args)

    def stop(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self.loop.stop)
        except RuntimeError:
            return  # already closed
        if not self.in_loop():
            self.thread.join(STOP_TIMEOUT)


def _shut_down(portal: _LoopThread, client: aio.Client) -> None:
    """Close ``client`` on its loop, then stop the loop thread (also the finalizer)."""
    try:
        if not portal.in_loop():
            portal.run(client._aclose(raise_crash=False))
    finally:
        portal.stop()


def connect(url: str = "flux://127.0.0.1:7070", *, request_timeout: float = 10.0,
            retry_deadline: float = 60.0, linger: float = 0.0, token: str | None = None,
            user: str | None = None, password: str | None = None, tls: TlsOption = None
            ) -> Client:
    """Connect to the router at ``url`` and return a :class:`Client` (blocking).

    Use it as ``with connect(url) as client:``, or call ``client.close()``.
    Options as in :func:`flux.client.trio.connect`. Raises ConnectionLost (or
    RequestTimeout) if the router cannot be reached, ValueError for bad options.
    """
    return Client(url, request_timeout=request_timeout, retry_deadline=retry_deadline,
                  linger=linger, token=token, user=user, password=password, tls=tls)


class Client:
    """A blocking connection to a Flux cluster; make it with :func:`connect`.

    Thread-safe: calls from several threads share one connection per shard, and
    their publishes are batched together.
    """

    def __init__(self, url: str, *, request_timeout: float = 10.0, retry_deadline: float = 60.0,
                 linger: float = 0.0, token: str | None = None, user: str | None = None,
                 password: str | None = None, tls: TlsOption = None) -> None:
        credentials = split_url(url, token=token, user=user, password=password)[1]
        context = client_context(url, tls)
        self._portal = _LoopThread("flux-client")
        try:
            self._client = self._portal.run(
                self._open(url, request_timeout=request_timeout, retry_deadline=retry_deadline,
                           linger=linger, credentials=credentials, tls=context))
        except BaseException:
            self._portal.stop()
            raise
        # closes the client if it is dropped without close(), and at interpreter exit
        self._closer = weakref.finalize(self, _shut_down, self._portal, self._client)

    @staticmethod
    async def _open(url: str, **options: Any) -> aio.Client:
        client = aio.Client(url, **options)
        try:
            await client._start()
        except BaseException:
            await client._aclose(raise_crash=False)
            raise
        return client

    def __repr__(self) -> str:
        return f"<flux sync Client {self._client._core!r}>"

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Fail what is outstanding with ClientClosed, close the connections and stop
        the background thread. Idempotent. Raises the error of a crashed client."""
        if self._closer.alive:
            self._closer()
            crashed = self._client._shell.crashed
            if crashed is not None:
                raise crashed

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if not self._closer.alive:
            coro.close()
            raise errors.ClientClosed("the client was closed")
        return self._portal.run(coro)

    # -- the API of the async flavours, blocking ---------------------------------------

    def publish(self, topic: str, payload: bytes, id: str | None = None, *,
                key: str | None = None, headers: dict[str, str] | None = None,
                delay: float | None = None, deliver_at: float | None = None) -> PublishAck:
        """Publish one message and wait for its ack (see :meth:`flux.client.trio.Client.publish`).

        Raises InvalidTopic, InvalidMessageId, InvalidKey, InvalidHeaders, InvalidDelay,
        MessageTooLarge, InvalidRequest, TopicFull, RetryDeadlineExceeded, ClientClosed.
        """
        return self._run(self._client.publish(topic, payload, id, key=key, headers=headers,
                                              delay=delay, deliver_at=deliver_at))

    def publish_many(self, topic: str, payloads: Iterable[bytes],
                     ids: Iterable[str] | None = None, *,
                     keys: Iterable[str | None] | None = None,
                     headers: Iterable[dict[str, str] | None] | dict[str, str] | None = None,
                     delay: float | None = None, deliver_at: float | None = None
                     ) -> PublishAcks:
        """Publish several messages to one topic in batched frames; returns their acks.

        Every item is attempted; the first error (in item order) is raised after
        all finished. Raises like :meth:`publish`.
        """
        return self._run(self._client.publish_many(
            topic, list(payloads), list(ids) if ids is not None else None, keys=keys,
            headers=headers, delay=delay, deliver_at=deliver_at))

    def subscribe(self, topic: str, name: str | None = None, read_old: bool = False,
                  from_offset: int | None = None, max_in_flight: int | None = None,
                  prefetch: int | None = None, on_reset: str = "earliest", *,
                  shared: bool = False, key_ordered: bool = False) -> Subscription:
        """A push subscription, used as ``with client.subscribe(...) as sub: for msg in sub``.

        Options as in :meth:`flux.client.trio.Client.subscribe`. Entering raises
        InvalidTopic, InvalidRequest, OffsetOutOfRange, RetryDeadlineExceeded,
        ClientClosed.
        """
        return Subscription(self, cast(aio.Subscription, self._client.subscribe(
            topic, name, read_old=read_old, from_offset=from_offset, max_in_flight=max_in_flight,
            prefetch=prefetch, on_reset=on_reset, shared=shared, key_ordered=key_ordered)))

    def subscribe_pull(self, topic: str, name: str, *, read_old: bool = False,
                       from_offset: int | None = None, generation: int | None = None,
                       on_reset: str = "earliest") -> SubscribeInfo:
        """Create or resume the pull subscription ``name``. Raises InvalidTopic,
        InvalidRequest, TopicReset, OffsetOutOfRange, RetryDeadlineExceeded."""
        return self._run(self._client.subscribe_pull(
            topic, name, read_old=read_old, from_offset=from_offset, generation=generation,
            on_reset=on_reset))

    def fetch(self, topic: str, offset: int, max_messages: int = 1000, *,
              max_bytes: int | None = None, name: str | None = None,
              generation: int | None = None) -> FetchResult:
        """Read held messages from ``offset`` on. Raises InvalidTopic, TopicReset,
        UnknownSubscription, InvalidRequest, RetryDeadlineExceeded."""
        return self._run(self._client.fetch(topic, offset, max_messages, max_bytes=max_bytes,
                                           name=name, generation=generation))

    def commit(self, topic: str, name: str, offset: int, generation: int | None) -> int:
        """Set pull subscription ``name``'s cursor; returns it. Raises TopicReset,
        UnknownSubscription, OffsetOutOfRange, RetryDeadlineExceeded."""
        return self._run(self._client.commit(topic, name, offset, generation))

    def stats(self, *, wait: float | None = None, partial: bool = False
              ) -> dict[int, dict[str, Any]]:
        """Every shard's STATS reply, by index, each asked for at most ``wait`` seconds.
        Raises RetryDeadlineExceeded, unless ``partial``: then a shard that did not
        answer is ``{"unavailable": "<why>"}``."""
        return self._run(self._client.stats(wait=wait, partial=partial))


class Message:
    """A pushed message: ``topic``, ``offset``, ``generation``, ``id``, ``payload``,
    ``timestamp``, ``attempt`` (1 for a first delivery in this session), ``key``,
    ``headers`` and ``due`` (a delayed message's due time, else None).

    ``msg.ack()`` queues the ack without blocking; it never raises: a refused
    ack surfaces from the subscription's iterator. ``nak``, ``term`` and
    ``in_progress`` (G11) likewise.
    """

    __slots__ = ("_client", "_msg", "attempt", "due", "generation", "headers", "id", "key",
                 "offset", "payload", "timestamp", "topic")

    def __init__(self, client: Client, msg: types.Message) -> None:
        self._client = client
        self._msg = msg
        self.topic = msg.topic
        self.offset = msg.offset
        self.generation = msg.generation
        self.id = msg.id
        self.payload = msg.payload
        self.timestamp = msg.timestamp
        self.attempt = msg.attempt
        self.key = msg.key
        self.headers = msg.headers
        self.due = msg.due

    def ack(self) -> None:
        """Queue the ack of this message (sent coalesced with others)."""
        acker = self._msg._acker
        if acker is not None:
            self._client._portal.call_soon(acker, self._msg)

    def nak(self, delay: float = 0) -> None:
        """Give the message back (G11): out of the in-flight window now, pushed again
        ``delay`` seconds later (that push counts; a nak on its last allowed push
        exhausts it). Does not block; a refusal surfaces from the iterator. Raises
        InvalidDelay for a negative or non-numeric ``delay``."""
        self._settle("nak", check_delay(delay, math.inf, "nak delay"))

    def term(self, reason: str = "") -> None:
        """No more pushes of this message (G11): to the dead-letter topic with ``reason``
        (the topic's ``dead_letter`` policy), else counted as acked. Does not block;
        raises InvalidRequest for a reason over 1024 bytes."""
        self._settle("term", types.check_reason(reason))

    def in_progress(self) -> None:
        """Still working on it (G11): the ack deadline becomes now plus the topic's
        ``subscriber.timeout``; no push is used. Does not block."""
        self._settle("progress", None)

    def _settle(self, kind: str, value: Any) -> None:
        settle = types.settler(self._msg)
        if settle is not None:
            self._client._portal.call_soon(settle, self._msg, kind, value)

    def __repr__(self) -> str:
        return repr(self._msg)


class Subscription:
    """A push subscription: ``with`` subscribes and unsubscribes; iterate for messages.

    ``for msg in sub`` blocks for each message; ``sub.next(timeout=...)`` waits
    at most ``timeout`` seconds. Both raise SubscriptionInactive,
    SubscriptionTakenOver, TopicReset or a refused ack's error like the async
    iterators; iteration stops after :meth:`unsubscribe` or when the client
    closes. Iterate from one thread at a time.
    """

    def __init__(self, client: Client, sub: aio.Subscription) -> None:
        self._client = client
        self._sub = sub
        self.topic = sub.topic
        self.name = sub.name

    def __repr__(self) -> str:
        return repr(self._sub)

    @property
    def info(self) -> SubscribeInfo | None:
        """The first SUBSCRIBED reply (None before subscribing)."""
        return self._sub.info

    @property
    def created(self) -> bool | None:
        """Whether the first subscribe created the subscription."""
        return self._sub.created

    @property
    def start_offset(self) -> int | None:
        """Where the subscription started (when it was created)."""
        return self._sub.start_offset

    @property
    def generation(self) -> int | None:
        """The shard generation of the current session (changes after a reset)."""
        return self._sub.generation

    def __enter__(self) -> Subscription:
        """Subscribe. Raises InvalidTopic, InvalidRequest, OffsetOutOfRange,
        RetryDeadlineExceeded, ClientClosed."""
        self._client._run(self._sub.__aenter__())
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.unsubscribe()

    def __iter__(self) -> Subscription:
        return self

    def __next__(self) -> Message:
        if not self._client._closer.alive:
            raise StopIteration  # like the async iterators once their client closed
        msg = self._client._run(self._next(None))
        if msg is _END:
            raise StopIteration
        assert isinstance(msg, Message)
        return msg

    def next(self, timeout: float | None = None) -> Message | None:
        """The next message, or None if none came within ``timeout`` seconds (None:
        wait as long as it takes). Raises ClientClosed once the subscription is
        over, and the iterator's typed errors."""
        msg = self._client._run(self._next(timeout))
        if msg is _END:
            raise errors.ClientClosed("the subscription was closed")
        assert msg is None or isinstance(msg, Message)
        return msg

    async def _next(self, timeout: float | None) -> object:
        try:
            if timeout is None:
                msg = await self._sub.__anext__()
            else:
                msg = await asyncio.wait_for(self._sub.__anext__(), timeout)
        except StopAsyncIteration:
            return _END
        except TimeoutError:
            return None
        return Message(self._client, msg)

    def unsubscribe(self) -> None:
        """Send queued acks, then end this session. Idempotent; never raises for a lost
        connection or a closed client."""
        if self._client._closer.alive:
            with contextlib.suppress(errors.ClientClosed):
                self._client._run(self._sub.unsubscribe())
