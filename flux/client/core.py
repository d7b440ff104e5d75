"""ClientCore: the whole client protocol as a sans-IO state machine, shared by every shell.

It routes topics to shards (``flux.hashing.shard_for``), keeps the shard map,
request ids and pending requests, coalesces publishes into PUBLISH frames,
decides retries, and keeps subscription state (via
:mod:`flux.client.subscription`). It has no sockets and no clock: every call gets
``now``. A shell opens the connections listed by :meth:`take_connects`, reports
``connected``/``connect_failed``/``connection_lost``, feeds frames to
:meth:`receive`, sends :meth:`take_output` when :meth:`take_writable` lists a
connection, sets wakers of :meth:`take_woken`, and calls :meth:`tick` at
:meth:`next_deadline`. This module is the public face; the machinery is split
by concern: :mod:`~flux.client.routing` (state, routing), :mod:`~flux.client.pushes`
(subscription frames), :mod:`~flux.client.dispatch` (frames in and out, failures)
and :mod:`~flux.client.timers` (deadlines).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flux import errors, protocol
from flux.client.connection import Conn
from flux.client.requests import GROUP_OVERHEAD, ITEM_OVERHEAD, Call, PublishBatch, PublishPart
from flux.client.subscription import SubState
from flux.client.timers import Timers
from flux.client.types import Message, Waiter, Wakeable
from flux.message_meta import group_options

P = protocol
DEFAULT_PREFETCH = 1000  # the shard's default subscriber.max_in_flight


class ClientCore(Timers):
    """All client state; see the module docstring for how a shell drives it.

    ``router`` is the router's address (``flux://host:port`` or a tuple); ``rng``
    draws message ids and backoff jitter; ``request_timeout`` bounds every
    request and connection attempt; ``retry_deadline`` bounds retries;
    ``linger`` (seconds, default 0) lets a partial PUBLISH batch wait that long
    for more messages (full batches always go at once).
    """

    def __repr__(self) -> str:
        host, port = self.router
        shards = self.map.shard_count if self.map is not None else "?"
        return (f"<ClientCore router={host}:{port} shards={shards} conns={len(self.conns)}"
                f" subscriptions={len(self._subs)}{' closed' if self.closed else ''}>")

    def take_connects(self) -> list[Conn]:
        """Connections to open now (``conn.address``); report back with ``conn.id``."""
        out, self._new_conns = self._new_conns, []
        return out

    def take_closes(self) -> list[int]:
        """Connection ids the shell must close (the core already forgot them)."""
        out, self._to_close = self._to_close, []
        return out

    def take_writable(self) -> list[int]:
        """Connection ids that have output; the shell calls :meth:`take_output` for each."""
        out = list(self._writable)
        self._writable.clear()
        return out

    def take_woken(self) -> list[Wakeable]:
        """Waiters and subscriptions whose waiting tasks must wake up."""
        out, self._woken = self._woken, []
        return out

    def new_id(self) -> str:
        """A generated message id: 128 random bits as 32 hex digits."""
        return f"{self.rng.getrandbits(128):032x}"

    def new_ids(self, count: int) -> list[str]:
        """``count`` generated ids (as :meth:`new_id`), drawn in one call."""
        # hex digits in groups of 32, cut by C code rather than a Python loop
        ids: list[str] = self.rng.randbytes(16 * count).hex(" ", 16).split()
        return ids

    def publish(self, topic: str, payload: bytes, message_id: str | None,
                now: float, **options: Any) -> PublishBatch:
        """Queue one message (``options``: ``key``, ``headers``, ``delay``, ``deliver_at``).
        Raises InvalidTopic, InvalidMessageId, InvalidKey, InvalidHeaders, InvalidDelay,
        InvalidRequest, MessageTooLarge or ClientClosed at once; the result is a list of
        one ack."""
        key = options.pop("key", None)
        headers = options.pop("headers", None)
        return self.publish_many(topic, [payload], None if message_id is None else [message_id],
                                 now, keys=None if key is None else [key],
                                 headers=None if headers is None else [headers], **options)

    def publish_many(self, topic: str, payloads: list[bytes], ids: list[str] | None,
                     now: float, *, keys: list[str | None] | None = None,
                     headers: list[dict[str, str] | None] | dict[str, str] | None = None,
                     delay: float | None = None, deliver_at: float | None = None
                     ) -> PublishBatch:
        """Queue several messages of one topic, in order; the batch's result is their acks.
        ``keys`` and ``headers``: one per message (headers: or one map for all);
        ``delay`` (seconds) or ``deliver_at`` (wall time): when they become due (G12).

        Raises InvalidTopic, InvalidMessageId, InvalidKey, InvalidHeaders, InvalidDelay,
        InvalidRequest, MessageTooLarge or ClientClosed at once, before anything is queued."""
        self._check_open()
        P.check_topic(topic)
        count = len(payloads)
        options, options_size = group_options(count, keys, headers, delay, deliver_at)
        if ids is None:
            ids = self.new_ids(count)
            id_bytes = 32 * count
        else:
            if len(ids) != count:
                raise errors.InvalidRequest(f"{len(ids)} ids for {count} payloads")
            for message_id in ids:
                P.check_message_id(message_id)
            id_bytes = len("".join(ids).encode())
        if count and set(map(type, payloads)) != {bytes}:  # set/map: no per-message Python loop
            payloads = list(payloads)
            for i, payload in enumerate(payloads):
                if not isinstance(payload, (bytes, bytearray, memoryview)):
                    raise errors.InvalidRequest(
                        f"payload must be bytes, not {type(payload).__name__}")
                payloads[i] = bytes(payload)
        limit = P.DEFAULT_MAX_FRAME_BYTES - 1024 - len(topic) - GROUP_OVERHEAD
        if count and max(map(len, payloads)) + 4 * P.MAX_ID_BYTES + ITEM_OVERHEAD > limit:
            for payload, message_id in zip(payloads, ids, strict=True):
                if len(payload) + len(message_id.encode()) + ITEM_OVERHEAD > limit:
                    raise errors.MessageTooLarge(
                        f"a {len(payload)}-byte payload cannot fit in a frame")
        batch = PublishBatch(topic, ids, payloads, now + self.retry_deadline, now, id_bytes,
                             options, options_size)
        if count:
            self._route_publishes(topic, PublishPart(batch, 0, count), now)
        else:
            batch.finish(0)
        return batch

    def subscribe(self, topic: str, name: str | None, *, read_old: bool = False,
                  from_offset: int | None = None, max_in_flight: int | None = None,
                  prefetch: int | None = None, on_reset: str = "earliest",
                  shared: bool = False, key_ordered: bool = False, now: float) -> SubState:
        """Start a push subscription; ``sub.ready`` finishes at the first SUBSCRIBED."""
        self._check_open()
        P.check_readable_topic(topic)
        if name is not None and (not isinstance(name, str) or not name or name[0] == "~"
                                 or len(name.encode()) > 255):
            raise errors.InvalidRequest("subscription name must be 1-255 bytes, not starting '~'")
        if on_reset not in ("earliest", "raise"):
            raise errors.InvalidRequest(f"on_reset must be 'earliest' or 'raise', not {on_reset!r}")
        for key, value in (("max_in_flight", max_in_flight), ("prefetch", prefetch)):
            if value is not None and (type(value) is not int or value < 1):
                raise errors.InvalidRequest(f"{key} must be a positive integer")
        if from_offset is not None and (type(from_offset) is not int or from_offset < 0):
            raise errors.InvalidRequest("from_offset must be an integer >= 0")
        if type(shared) is not bool or type(key_ordered) is not bool:
            raise errors.InvalidRequest("shared and key_ordered must be True or False")
        if shared and name is None:
            raise errors.InvalidRequest("a shared subscription needs a name")
        if key_ordered and not shared:
            raise errors.InvalidRequest("key_ordered applies to a shared subscription only")
        sub = SubState(topic, name, read_old=bool(read_old), from_offset=from_offset,
                       max_in_flight=max_in_flight,
                       prefetch=prefetch or max_in_flight or DEFAULT_PREFETCH,
                       on_reset=on_reset, deadline=now + self.retry_deadline,
                       shared=shared, key_ordered=key_ordered)
        sub.key = next(self._keys)
        self._subs[sub.key] = sub
        self._route(sub, now)
        return sub

    def next_message(self, sub: SubState) -> Message | None:
        """The subscription's next message, None if none is buffered; raises its errors."""
        try:
            return sub.next_message()
        finally:
            if sub.credit_owed * 4 >= sub.prefetch:
                self._dirty(sub)

    def ack(self, sub: SubState, msg: Message, now: float) -> bool:
        """Queue the ack of ``msg`` (never raises; refusals surface from the iterator).

        Returns whether the shell must act now (an ACK frame is due, or the first
        queued ack needs its hold timer); otherwise acks wait for the next action.
        """
        session = sub.session
        if msg._session is session and session is not None and sub.status == "active":
            # the usual case, SubState.ack and AckSession.ack inlined (once per message)
            offset = msg.offset
            if offset < session.confirmed or not session.acked.add(offset):
                return False
            queued = session.queued
            queued.append(offset)
            if sub.ack_first_at is None:
                sub.ack_first_at = now
        elif sub.ack(msg, now) and sub.session is not None:
            queued = sub.session.queued
        else:
            return False
        # ask for the shell once per reason: a full batch (send it), or the first held
        # ack (the shell's timer sends it within ACK_DELAY)
        count = len(queued)
        if count == sub.ack_batch:
            self._dirty(sub)
            return True
        if count == 1:
            self._held_acks[sub.key] = sub
            return True
        return False

    def acker(self, sub: SubState, clock: Callable[[], float],
              act: Callable[[], None]) -> Callable[[Message], None]:
        """The function ``msg.ack()`` calls: :meth:`ack`, then ``act()`` (the shell's pump)
        if the shell must act now; ``clock`` is read only for the first held ack."""
        dirty, held_acks = self._dirty, self._held_acks

        def ack(msg: Message) -> None:
            session = sub.session
            if msg[7] is session and session is not None and sub.status == "active":
                # the usual case, :meth:`ack` inlined (msg[1] is msg.offset): once per message
                offset = msg[1]
                if offset < session.confirmed or not session.acked.add(offset):
                    return
                queued = session.queued
                queued.append(offset)
                if sub.ack_first_at is None:
                    sub.ack_first_at = clock()
                count = len(queued)
                if count == sub.ack_batch:
                    dirty(sub)
                    act()
                elif count == 1:  # the shell's timer must know when held acks are due
                    held_acks[sub.key] = sub
                    act()
                return
            held = sub.ack_first_at
            if self.ack(sub, msg, clock() if held is None else held):
                act()

        def settle(msg: Message, kind: str, value: Any) -> None:
            if sub.settle(msg, kind, value):
                dirty(sub)
                act()

        ack.settle = settle  # type: ignore[attr-defined]  # Message.nak, term, in_progress
        return ack

    def unsubscribe(self, sub: SubState, now: float) -> Waiter:
        """End the subscription: queued acks go first, then UNSUBSCRIBE."""
        done = Waiter()
        conn = self.conns.get(sub.conn) if sub.conn is not None else None
        if sub.status == "active" and conn is not None and conn.state == "ready":
            assert sub.sid is not None
            conn.out.extend(self._sub_frames(conn, sub, sub.sid, now, force=True))
            self._request(conn, [P.UNSUBSCRIBE, next(self._rids), sub.sid], "unsubscribe",
                          (sub.sid, done), now)
        else:
            done.set_value(None)
        sub.status = "closed"
        self._forget_sub(sub)
        self._wake(sub)
        return done

    def subscribe_pull(self, topic: str, name: str, *, read_old: bool = False,
                       from_offset: int | None = None, generation: int | None = None,
                       on_reset: str = "earliest", now: float) -> Call:
        """Create or resume a pull subscription (SUBSCRIBE mode "pull")."""
        P.check_readable_topic(topic)
        if not isinstance(name, str) or not name:
            raise errors.InvalidRequest("a pull subscription needs a name")
        return self._call("subscribe_pull", topic, {
            "topic": topic, "name": name, "mode": "pull", "read_old": bool(read_old),
            "from_offset": from_offset, "generation": generation, "on_reset": on_reset}, now)

    def fetch(self, topic: str, offset: int, *, max_messages: int = 1000,
              max_bytes: int | None = None, name: str | None = None,
              generation: int | None = None, now: float) -> Call:
        """Read held messages from ``offset`` on (FETCH)."""
        P.check_readable_topic(topic)
        return self._call("fetch", topic, {
            "topic": topic, "name": name, "generation": generation, "offset": offset,
            "max_messages": max_messages, "max_bytes": max_bytes}, now)

    def commit(self, topic: str, name: str, offset: int, generation: int | None,
               now: float) -> Call:
        """Move a pull subscription's cursor to ``offset`` (COMMIT)."""
        P.check_readable_topic(topic)
        return self._call("commit", topic, {"topic": topic, "name": name,
                                            "generation": generation, "offset": offset}, now)

    def stats(self, now: float, wait: float | None = None) -> list[Call]:
        """One STATS call per shard in the map, each retried for ``wait`` seconds (default:
        ``retry_deadline``)."""
        self._check_open()
        count = self.map.shard_count if self.map is not None else 0
        deadline = now + (self.retry_deadline if wait is None else wait)
        calls = [Call("stats", topic=None, shard=i, body={}, deadline=deadline)
                 for i in range(count)]
        for call in calls:
            self._route(call, now)
        return calls

    def abandon(self, waiter: Waiter) -> None:
        """The caller stopped waiting (cancelled): skip it if it was not sent yet."""
        waiter.set_error(errors.ClientClosed("the caller stopped waiting"))

    def close(self) -> None:
        """Fail everything outstanding with ClientClosed and close every connection."""
        if self.closed:
            return
        self.closed = True
        exc = errors.ClientClosed("the client was closed")
        for conn in list(self.conns.values()):
            for kind, obj in conn.pending.values():
                self._fail_pending(kind, obj, exc)
            conn.pending.clear()
            conn.state = "closed"
            self._to_close.append(conn.id)
        self.conns.clear()
        for slot in self.slots:
            for part in slot.publishes:
                self._fail(part, exc)
            for call in slot.calls:
                self._fail(call, exc)
        for _, _, waiter in self._delayed:
            self._fail(waiter, exc)
        for obj in self._unrouted:
            if not isinstance(obj, SubState):
                self._fail(obj, exc)
        for sub in list(self._subs.values()):
            self._fail(sub.ready, exc)
            sub.status = "closed"
            self._wake(sub)
        self._subs.clear()
        self._fail(self.ready, exc)

    def _call(self, kind: Any, topic: str, body: dict[str, Any], now: float) -> Call:
        self._check_open()
        call = Call(kind, topic=topic, shard=None, body=body, deadline=now + self.retry_deadline)
        self._route(call, now)
        return call
