"""Time in the client core: request and connect timeouts, heartbeats, retries, reconnects.

The core has no clock: :meth:`Timers.next_deadline` says when :meth:`Timers.tick`
must run next and the shell calls it with ``now``. Sans-IO.
"""

from __future__ import annotations

import heapq
import math

from flux import errors, protocol
from flux.client.connection import Conn, ShardSlot
from flux.client.dispatch import Dispatch
from flux.client.requests import deadline_exceeded

P = protocol


class Timers(Dispatch):
    """Deadlines of the client core."""

    def next_deadline(self) -> float:
        """When :meth:`tick` must run next (``math.inf``: only on events)."""
        at = math.inf
        if self.closed:
            return at
        if self._delayed:
            at = self._delayed[0][0]
        for conn in self.conns.values():
            at = min(at, self._conn_deadline(conn))
        for slot in self.slots:
            at = min(at, self._slot_deadline(slot))
        if self._refresh_again and self._router_conn is None:
            at = min(at, self._router_retry_at)
        for sub in self._held_acks.values():
            at = min(at, sub.ack_deadline())
        return at

    def tick(self, now: float) -> None:
        """Run what is due: retries, request and connect timeouts, heartbeats, reconnects."""
        if self.closed:
            return
        while self._delayed and self._delayed[0][0] <= now:
            _, _, waiter = heapq.heappop(self._delayed)
            if not waiter.done:
                self._route(waiter, now)
        for conn in list(self.conns.values()):
            if self._conn_deadline(conn) <= now:
                self._conn_due(conn, now)
        for slot in self.slots:
            if self._slot_deadline(slot) <= now:
                self._slot_due(slot, now)
        if self._refresh_again and self._router_conn is None and now >= self._router_retry_at:
            self._refresh_map(now)
        for key, sub in list(self._held_acks.items()):
            due = sub.ack_due_at()
            if due <= now or due == math.inf:
                del self._held_acks[key]
                self._dirty(sub)

    def _conn_deadline(self, conn: Conn) -> float:
        if conn.state == "connecting":
            return conn.opened_at + self.request_timeout
        timeouts = conn.timeouts
        while timeouts and timeouts[0][1] not in conn.pending:
            timeouts.popleft()
        at = timeouts[0][0] if timeouts else math.inf
        if conn.state == "ready" and conn.heartbeat:
            at = min(at, conn.last_send + conn.heartbeat / 2)
        return at

    def _conn_due(self, conn: Conn, now: float) -> None:
        host, port = conn.address
        if conn.state == "connecting":
            self._close(conn, errors.RequestTimeout(
                f"connecting to {host}:{port} took over {self.request_timeout:g}s"), now)
        elif conn.timeouts and conn.timeouts[0][0] <= now:
            self._close(conn, errors.RequestTimeout(
                f"no reply from {host}:{port} within request_timeout={self.request_timeout:g}s"),
                now)
        else:  # idle for half a heartbeat period: the shard drops sessions silent for two
            self._request(conn, [P.PING, next(self._rids)], "ping", None, now)
            conn.last_send = now

    def _slot_deadline(self, slot: ShardSlot) -> float:
        at = slot.linger_at
        conn = slot.conn
        if conn is None or conn.state != "ready":
            if conn is None and slot.has_work():
                at = slot.retry_at
            for queue in (slot.publishes, slot.calls):
                if queue:
                    at = min(at, queue[0].deadline)
        for sub in slot.subs.values():
            if sub.status == "waiting":
                at = min(at, sub.deadline if not sub.ready.done else math.inf,
                         sub.retry_at if conn is not None and conn.state == "ready" else math.inf)
        return at

    def _slot_due(self, slot: ShardSlot, now: float) -> None:
        if slot.linger_at <= now:  # the lingering batch is due: _flush_slot wakes the writer
            slot.linger_at = math.inf
        for queue in (slot.publishes, slot.calls):
            if queue and queue[0].deadline <= now:
                keep = [w for w in queue if not w.done and w.deadline > now]
                for waiter in queue:
                    if not waiter.done and waiter.deadline <= now:
                        self._fail(waiter, deadline_exceeded(
                            waiter.describe(), waiter.last_error or slot.last_error))
                queue.clear()
                queue.extend(keep)  # type: ignore[arg-type]
        for sub in list(slot.subs.values()):
            if sub.status == "waiting" and not sub.ready.done and now >= sub.deadline:
                self._fail(sub.ready, deadline_exceeded("subscribe", sub.last_error))
                sub.status = "closed"
                self._forget_sub(sub)
        if slot.conn is None:
            self._ensure_conn(slot, now)
        elif slot.conn.state == "ready":
            self._flush_slot(slot, now)
