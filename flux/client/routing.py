"""The client core's state and the primitives that place work on shards (sans-IO).

:class:`Routing` holds everything :class:`flux.client.core.ClientCore` knows
(shard map, slots, connections, queues) and the small steps shared by the rest
of the core: route a publish, call or subscription to its shard (via
``flux.hashing.shard_for``), open connections, ask the router for the map,
queue requests, and finish or wake waiters. No sockets, no clock.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from typing import Any

from flux import errors, protocol
from flux.client.connection import Conn, PendingKind, ShardMap, ShardSlot, backoff
from flux.client.credentials import Credentials, split_url
from flux.client.requests import Call, PublishPart, deadline_exceeded
from flux.client.subscription import SubState
from flux.client.types import Waiter, Wakeable
from flux.hashing import shard_for

P = protocol


class Routing:
    """State of a client core, and routing to shards; see :class:`ClientCore`."""

    def __init__(self, router: str | tuple[str, int], *, rng: random.Random, now: float,
                 request_timeout: float = 10.0, retry_deadline: float = 60.0,
                 linger: float = 0.0, credentials: Credentials | None = None) -> None:
        if request_timeout <= 0 or retry_deadline <= 0:
            raise ValueError("request_timeout and retry_deadline must be positive")
        if not 0 <= linger < retry_deadline:
            raise ValueError("linger must be >= 0 and below retry_deadline")
        if isinstance(router, str):
            address, in_url = split_url(router)
            router = P.parse_address(address)
            credentials = credentials or in_url
        self.router = router
        self.credentials = credentials   # None: HELLO proves nothing (auth off)
        self.session: bytes | None = None  # the router's session token (password logins)
        self.rng = rng
        self.request_timeout = request_timeout
        self.retry_deadline = retry_deadline
        self.linger = linger             # seconds a partial PUBLISH batch may wait to fill
        self.map: ShardMap | None = None
        self.slots: list[ShardSlot] = []
        self.conns: dict[int, Conn] = {}
        self.ready = Waiter()            # the first shard map (or why there is none)
        self.closed = False
        self._conn_ids = itertools.count(1)
        self._rids = itertools.count(1)
        self._sids = itertools.count(1)
        self._keys = itertools.count(1)
        self._seq = itertools.count()
        self._router_conn: Conn | None = None
        self._router_failures = 0
        self._router_retry_at = now
        self._refresh_again = False
        self._unrouted: deque[PublishPart | Call | SubState] = deque()
        self._shards_of: tuple[int, dict[str, int]] = (0, {})   # shard count, topic -> index
        self._delayed: list[tuple[float, int, PublishPart | Call]] = []   # backoff heap
        self._subs: dict[int, SubState] = {}
        self._held_acks: dict[int, SubState] = {}   # key -> subscription holding acks
        self._new_conns: list[Conn] = []
        self._to_close: list[int] = []
        self._writable: dict[int, None] = {}
        self._woken: list[Wakeable] = []
        self._refresh_map(now)

    def _check_open(self) -> None:
        if self.closed:
            raise errors.ClientClosed("the client was closed")

    def _route(self, obj: PublishPart | Call | SubState, now: float, front: bool = False) -> None:
        if self.map is None:
            self._unrouted.append(obj)
            return
        count = self.map.shard_count
        if isinstance(obj, Call) and obj.shard is not None:
            index = obj.shard
            if index >= count:
                self._fail(obj, errors.InvalidRequest(f"there is no shard {index} any more"))
                return
        else:
            assert obj.topic is not None
            index = self._shard_of(obj.topic, count)
        slot = self.slots[index]
        if isinstance(obj, PublishPart):
            if front:
                slot.publishes.appendleft(obj)
            else:
                slot.publishes.append(obj)
                self._arm_linger(slot)
        elif isinstance(obj, Call):
            slot.calls.append(obj)
        else:
            slot.subs[obj.key] = obj
        conn = slot.conn
        if conn is None:
            self._ensure_conn(slot, now)
        elif conn.state == "ready":
            if isinstance(obj, PublishPart):
                self._writable[conn.id] = None  # PUBLISH frames are built at send time
            else:
                self._flush_slot(slot, now)

    def _shard_of(self, topic: str, count: int) -> int:
        """``shard_for(topic, count)``, cached (it is pure, and costs a microsecond)."""
        cache = self._shards_of
        if cache[0] != count:
            cache = self._shards_of = (count, {})
        index = cache[1].get(topic)
        if index is None:
            if len(cache[1]) > 10_000:
                cache[1].clear()
            index = cache[1][topic] = shard_for(topic, count)
        return index

    def _route_publishes(self, topic: str, part: PublishPart, now: float) -> None:
        """:meth:`_route` for a new batch of publishes of one topic."""
        if self.map is None:
            self._unrouted.append(part)
            return
        slot = self.slots[self._shard_of(topic, self.map.shard_count)]
        slot.publishes.append(part)
        self._arm_linger(slot)
        conn = slot.conn
        if conn is None:
            self._ensure_conn(slot, now)
        elif conn.state == "ready":
            self._writable[conn.id] = None

    def _ensure_conn(self, slot: ShardSlot, now: float) -> None:
        if slot.conn is not None or self.closed or not slot.has_work() or now < slot.retry_at:
            return
        address = self.map.addresses.get(slot.index) if self.map is not None else None
        if address is None:  # the router has no address for it (yet): ask again later
            slot.failures += 1
            slot.retry_at = now + backoff(self.rng, slot.failures)
            slot.last_error = errors.ConnectionLost(f"the shard map has no address for shard {slot.index}")
            self._refresh_map(now)
            return
        slot.conn = self._open("shard", slot.index, address, now)

    def _open(self, role: Any, index: int | None, address: tuple[str, int], now: float) -> Conn:
        conn = Conn(next(self._conn_ids), role, index, address, now)
        self.conns[conn.id] = conn
        self._new_conns.append(conn)
        return conn

    def _refresh_map(self, now: float) -> None:
        """Ask the router for the shard map (one attempt per trigger, coalesced)."""
        if self.closed:
            return
        if self._router_conn is not None or now < self._router_retry_at:
            self._refresh_again = True
            return
        self._refresh_again = False
        self._router_conn = self._open("router", None, self.router, now)

    def _flush_slot(self, slot: ShardSlot, now: float) -> None:
        """The slot's connection is ready: send waiting calls and subscribes."""
        conn = slot.conn
        assert conn is not None
        while slot.calls:
            call = slot.calls.popleft()
            if call.done:
                continue
            if now > call.deadline:
                self._fail(call, deadline_exceeded(call.describe(), call.last_error))
                continue
            call.in_flight = True
            call.attempts += 1
            self._request(conn, call.frame(next(self._rids), next(self._sids)), "call", call, now)
        for sub in slot.subs.values():
            if sub.status == "waiting" and now >= sub.retry_at:
                sid = next(self._sids)
                sub.sid, sub.conn, sub.status = sid, conn.id, "subscribing"
                sub.attempts += 1
                conn.subs[sid] = sub
                self._request(conn, [P.SUBSCRIBE, next(self._rids), sid, sub.options()],
                              "subscribe", (sub, sid), now)
        if slot.publishes:
            self._writable[conn.id] = None

    def _arm_linger(self, slot: ShardSlot) -> None:
        """With ``linger``, make sure a timer will send the slot's queued publishes.

        Never called from :meth:`Timers._slot_due`, which clears the timer: a
        due timer re-armed there would fire again at once, over and over."""
        if self.linger and slot.publishes and slot.linger_at == math.inf:
            slot.linger_at = slot.publishes[0].queued_at + self.linger

    def _request(self, conn: Conn, frame: list[Any], kind: PendingKind, obj: Any,
                 now: float) -> None:
        rid = frame[1]
        conn.out.append(frame)
        conn.pending[rid] = (kind, obj)
        conn.timeouts.append((now + self.request_timeout, rid))
        self._writable[conn.id] = None

    def _dirty(self, sub: SubState) -> None:
        conn = self.conns.get(sub.conn) if sub.conn is not None else None
        if conn is not None and sub.sid is not None:
            conn.dirty[sub.sid] = sub
            self._writable[conn.id] = None

    def _forget_sub(self, sub: SubState) -> None:
        self._subs.pop(sub.key, None)
        for slot in self.slots:
            slot.subs.pop(sub.key, None)

    def _slot_of(self, conn: Conn) -> ShardSlot | None:
        index = conn.index
        if index is not None and index < len(self.slots) and self.slots[index].conn is conn:
            return self.slots[index]
        return None

    def _wake(self, obj: Wakeable) -> None:
        if obj.waker is not None:
            self._woken.append(obj)

    def _finish(self, waiter: Waiter, value: Any) -> None:
        if not waiter.done:
            waiter.set_value(value)
            self._wake(waiter)

    def _fail(self, waiter: Waiter | PublishPart, exc: errors.FluxError) -> None:
        """Fail a waiter, or every message of a publish part."""
        if isinstance(waiter, PublishPart):
            if waiter.fail(exc):
                self._wake(waiter.batch)
        elif not waiter.done:
            waiter.set_error(exc)
            self._wake(waiter)

    def _delay(self, waiter: PublishPart | Call, attempt: int, now: float) -> None:
        at = min(now + backoff(self.rng, attempt), waiter.deadline)
        heapq.heappush(self._delayed, (at, next(self._seq), waiter))
