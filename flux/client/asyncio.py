"""The asyncio client: ``connect()``, :class:`Client` and :class:`Subscription`.

The same API and behaviour as :mod:`flux.client.trio`, on the running asyncio
loop (the default loop or uvloop). Every protocol decision (routing, batching,
retries, credit, acks, resume) is made by the sans-IO
:class:`flux.client.core.ClientCore`; :mod:`flux.client.asyncio_shell` does the
transports and the timer. Nothing here imports trio.
"""

from __future__ import annotations

import asyncio
import os
import random
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from flux.client.api import ClientBase, SubscriptionBase
from flux.client.asyncio_shell import AsyncioShell
from flux.client.core import ClientCore
from flux.client.credentials import Credentials, split_url
from flux.client.tls import TlsOption, client_context
from flux.client.types import Message

__all__ = ["Client", "Subscription", "connect"]

STREAK = 64  # most buffered messages the iterator returns before it yields to the loop


@asynccontextmanager
async def connect(url: str = "flux://127.0.0.1:7070", *, request_timeout: float = 10.0,
                  retry_deadline: float = 60.0, linger: float = 0.0, token: str | None = None,
                  user: str | None = None, password: str | None = None,
                  tls: TlsOption = None) -> AsyncIterator[Client]:
    """Connect to the router at ``url`` (``flux://host:port``) and yield a :class:`Client`.

    ``request_timeout`` bounds each request and connection attempt;
    ``retry_deadline`` bounds how long a publish (or fetch, commit, stats) is
    retried; keep it below the broker's ``message.dedup_window``. ``linger``
    (seconds, default 0: send as soon as the connection is free) lets a partial
    batch of publishes wait that long for more, trading latency for throughput.
    Raises ConnectionLost (or RequestTimeout) if the router cannot be reached,
    ``token``, or ``user`` and ``password``, prove who the client is when the broker
    has ``auth`` on (they may also come in the URL: ``flux://USER:PASSWORD@host:port``
    or ``flux://host:port?token=T``); a wrong one raises AuthenticationFailed.
    ``tls``: True (or a ``flux+tls://`` URL) speaks TLS, verifying the broker with the
    system's CAs; a path trusts that CA file instead; an ``ssl.SSLContext`` is used as
    it is (client certificates). The URL may also carry ``?ca=...&cert=...&key=...``.
    ValueError for bad options.
    """
    client = Client(url, request_timeout=request_timeout, retry_deadline=retry_deadline,
                    linger=linger, credentials=split_url(url, token=token, user=user,
                                                         password=password)[1],
                    tls=client_context(url, tls))
    try:
        await client._start()
        yield client
    except BaseException:
        await client._aclose(raise_crash=False)
        raise
    await client._aclose()


class Client(ClientBase):
    """A connection to a Flux cluster; make it with :func:`connect` (inside a running loop)."""

    def __init__(self, url: str, *, request_timeout: float, retry_deadline: float,
                 linger: float = 0.0, credentials: Credentials | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._core = ClientCore(url, rng=random.Random(os.urandom(16)), now=self._loop.time(),
                                request_timeout=request_timeout, retry_deadline=retry_deadline,
                                linger=linger, credentials=credentials)
        self._shell = AsyncioShell(self._core, self._loop, tls)
        self._use_shell(self._shell)

    def __repr__(self) -> str:
        return f"<flux asyncio Client {self._core!r}>"

    def _now(self) -> float:
        return self._loop.time()

    def _shell_start(self) -> None:
        self._shell.start()

    async def _aclose(self, raise_crash: bool = True) -> None:
        await self._shell.aclose()
        if raise_crash and self._shell.crashed is not None:
            raise self._shell.crashed


class Subscription(SubscriptionBase):
    """A push subscription: ``async with`` subscribes and unsubscribes; iterate for messages.

    ``async for msg in sub`` yields :class:`~flux.client.types.Message`; it
    raises SubscriptionInactive or SubscriptionTakenOver when the shard ended
    the subscription, TopicReset (``on_reset="raise"``) after a shard restart,
    NotDelivered (or another typed error) when the shard refused an ack, and
    stops after :meth:`unsubscribe` or when the client closes. Iterate it from
    one task at a time. While the connection is being re-established the
    iterator simply waits; unconsumed messages come again from the cursor.
    Cancelling a waiting ``__anext__`` (e.g. ``asyncio.wait_for``) loses no message.
    Messages already buffered are returned without yielding to other tasks, up to
    ``STREAK`` in a row.
    """

    def __init__(self, client: ClientBase, topic: str, name: str | None,
                 **options: Any) -> None:
        super().__init__(client, topic, name, **options)
        self._streak = 0   # messages returned since the last pump and loop yield

    async def __anext__(self) -> Message:
        state = self._state
        if state is None:
            raise RuntimeError("use 'async with client.subscribe(...) as sub' before iterating")
        client = self._client
        streak = self._streak
        if streak < STREAK and state.buffer and state.status == "active" and not state.errors:
            # buffered messages go out without a trip through the loop; credit and acks
            # they owe are handed to the shell at least every STREAK messages. No
            # cancellation can be missed: another task runs only while this one waits
            msg = state.next_message()
            if msg is not None:
                self._streak = streak + 1
                return msg
        self._streak = 0
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


Client._subscription_class = Subscription
