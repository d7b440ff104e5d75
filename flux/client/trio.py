"""The trio client: ``connect()``, :class:`Client` and :class:`Subscription`.

This is the user API. Every protocol decision (routing, batching, retries,
credit, acks, resume) is made by the sans-IO :class:`flux.client.core.ClientCore`;
:mod:`flux.client.trio_shell` does the sockets, tasks and timers, reaching the
outside world through a :class:`flux.host.Host` only, so the simulator runs
this client unchanged.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from flux.client.api import ClientBase, SubscriptionBase
from flux.client.core import ClientCore
from flux.client.credentials import Credentials, split_url
from flux.client.tls import TlsOption, client_context
from flux.client.trio_shell import TrioShell
from flux.client.types import Message
from flux.host import Host, RealHost

__all__ = ["Client", "Subscription", "connect"]

STREAK = 64  # most buffered messages the iterator returns before it yields to the scheduler
# ... and how often it looks for a cancellation meanwhile (a look costs about a third of
# what the rest of taking a message does)
CANCEL_EVERY = 8


@asynccontextmanager
async def connect(url: str = "flux://127.0.0.1:7070", *, request_timeout: float = 10.0,
                  retry_deadline: float = 60.0, linger: float = 0.0,
                  host: Host | None = None, token: str | None = None,
                  user: str | None = None, password: str | None = None,
                  tls: TlsOption = None) -> AsyncIterator[Client]:
    """Connect to the router at ``url`` (``flux://host:port``) and yield a :class:`Client`.

    ``request_timeout`` bounds each request and connection attempt;
    ``retry_deadline`` bounds how long a publish (or fetch, commit, stats) is
    retried; keep it below the broker's ``message.dedup_window``. ``linger``
    (seconds, default 0: send as soon as the connection is free) lets a partial
    batch of publishes wait that long for more, trading latency for throughput.
    ``token``, or ``user`` and ``password``, prove who the client is when the broker
    has ``auth`` on (they may also come in the URL: ``flux://USER:PASSWORD@host:port``
    or ``flux://host:port?token=T``); a wrong one raises AuthenticationFailed.
    ``tls``: True (or a ``flux+tls://`` URL) speaks TLS, verifying the broker with the
    system's CAs; a path trusts that CA file instead; an ``ssl.SSLContext`` is used as
    it is (client certificates). The URL may also carry ``?ca=...&cert=...&key=...``.
    Raises ConnectionLost (or RequestTimeout) if the router cannot be reached,
    ValueError for bad options.
    """
    credentials = split_url(url, token=token, user=user, password=password)[1]
    context = client_context(url, tls)
    body_error: BaseException | None = None
    async with trio.open_nursery() as nursery:
        client: Client | None = None
        try:
            client = Client(url, request_timeout=request_timeout, retry_deadline=retry_deadline,
                            linger=linger, host=host or RealHost("flux-client"), nursery=nursery,
                            credentials=credentials, tls=context)
            await client._start()
            yield client
        except BaseException as exc:  # re-raised below, outside the nursery (no group)
            body_error = exc
        finally:
            if client is not None:
                client._shutdown()
    if body_error is not None:
        raise body_error


class Client(ClientBase):
    """A connection to a Flux cluster; make it with :func:`connect`."""

    def __init__(self, url: str, *, request_timeout: float, retry_deadline: float,
                 linger: float = 0.0, host: Host, nursery: trio.Nursery,
                 credentials: Credentials | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self._host = host
        self._core = ClientCore(url, rng=host.random, now=host.now(),
                                request_timeout=request_timeout, retry_deadline=retry_deadline,
                                linger=linger, credentials=credentials)
        self._shell = TrioShell(self._core, host, nursery, tls)
        self._use_shell(self._shell)

    def __repr__(self) -> str:
        return f"<flux Client {self._core!r}>"

    def _now(self) -> float:
        return self._host.now()

    def _shell_start(self) -> None:
        self._shell.start()

    def _shutdown(self) -> None:
        self._shell.close()


class Subscription(SubscriptionBase):
    """A push subscription: ``async with`` subscribes and unsubscribes; iterate for messages.

    ``async for msg in sub`` yields :class:`~flux.client.types.Message`; it
    raises SubscriptionInactive or SubscriptionTakenOver when the shard ended
    the subscription, TopicReset (``on_reset="raise"``) after a shard restart,
    NotDelivered (or another typed error) when the shard refused an ack, and
    stops after :meth:`unsubscribe` or when the client closes. Iterate it from
    one task at a time. While the connection is being re-established the
    iterator simply waits; unconsumed messages come again from the cursor.
    Messages already buffered are returned without yielding to other tasks,
    up to ``STREAK`` in a row; a cancellation is noticed within ``CANCEL_EVERY``
    messages (an unacked message is delivered again, so none is lost).
    """

    def __init__(self, client: ClientBase, topic: str, name: str | None,
                 **options: Any) -> None:
        super().__init__(client, topic, name, **options)
        self._streak = 0   # messages returned since the last pump and scheduler yield

    async def __anext__(self) -> Message:
        state = self._state
        if state is None:
            raise RuntimeError("use 'async with client.subscribe(...) as sub' before iterating")
        client = self._client
        streak = self._streak
        if streak < STREAK and state.buffer and state.status == "active" and not state.errors:
            # buffered messages go out without a trip through the scheduler; credit and
            # acks they owe are handed to the shell at least every STREAK messages
            if not streak % CANCEL_EVERY:
                await trio.lowlevel.checkpoint_if_cancelled()
            msg = state.next_message()
            if msg is not None:
                self._streak = streak + 1
                return msg
        self._streak = 0
        waited = False
        while True:
            await trio.lowlevel.checkpoint_if_cancelled()
            if state.status == "closed":
                raise StopAsyncIteration
            try:
                msg = client._core.next_message(state)
            finally:
                client._pump()
            if msg is not None:
                if not waited:  # a wait already let the other tasks run
                    await trio.lowlevel.cancel_shielded_checkpoint()
                return msg
            event = trio.Event()
            state.waker = event
            await event.wait()
            waited = True


Client._subscription_class = Subscription
