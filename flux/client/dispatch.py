"""Frames in and out of the client core, and what failures do (sans-IO).

Replies are matched to what is pending on their connection; PUBLISHED results
(per group: offsets, duplicates, refusals) finish batches in bulk and split off
only the refused items to retry them; a lost connection requeues or retries what
was on it. PUBLISH frames are built here, at send time, so publishes queued
while the connection is busy coalesce (at most ~256 items, under
``max_frame_bytes``; consecutive ones of a topic share a group); with ``linger``
a partial batch may also wait that long for more.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from flux import errors, protocol
from flux.client.connection import Conn, PendingKind, ShardMap, ShardSlot, backoff
from flux.client.pushes import REFRESH_MAP, Pushes
from flux.client.requests import (
    GROUP_OVERHEAD,
    MAX_BATCH,
    PUBLISH_WINDOW,
    Call,
    PublishBatch,
    PublishPart,
    deadline_exceeded,
    retryable,
)
from flux.client.subscription import SubState

P = protocol
CONNECTION_LEVEL = (errors.ConnectionLost, errors.RequestTimeout)


class Dispatch(Pushes):
    """What arrives, what leaves and what fails, for the client core."""

    def connected(self, conn_id: int, now: float) -> None:
        """The connection is open: say HELLO."""
        conn = self.conns.get(conn_id)
        if conn is None or conn.state != "connecting":
            return
        credentials = self.credentials
        if conn.role == "shard" and credentials is not None and credentials.password \
                and self.session is None:  # a shard takes no password: log in first
            self._close(conn, errors.SessionExpired("no session token yet: logging in at"
                                                    " the router first"), now)
            return
        conn.state = "hello"
        body: dict[str, Any] = {"version": P.VERSION, "role": "client"}
        if self.credentials is not None:
            body.update(self.credentials.hello(conn.role, self.session))
        self._request(conn, [P.HELLO, next(self._rids), body], "hello", None, now)

    def connect_failed(self, conn_id: int, now: float, exc: errors.FluxError | None = None) -> None:
        """Opening the connection failed (refused, unreachable)."""
        conn = self.conns.get(conn_id)
        if conn is not None:
            host, port = conn.address
            self._close(conn, exc or errors.ConnectionLost(f"cannot connect to {host}:{port}"),
                        now, tell_shell=False)

    def connection_lost(self, conn_id: int, now: float, exc: errors.FluxError | None = None) -> None:
        """The connection closed or broke (EOF, reset, corrupt frames)."""
        conn = self.conns.get(conn_id)
        if conn is None:
            return
        reason = conn.close_reason  # an ERROR the peer sent before closing: say why
        if exc is None or reason is not None:
            host, port = conn.address
            exc = errors.ConnectionLost(f"connection to {host}:{port} closed"
                                        + (f" by the peer: {reason}" if reason else ""))
        self._close(conn, exc, now, tell_shell=False)

    def receive(self, conn_id: int, frame: list[Any], now: float) -> None:
        """Handle one decoded frame that arrived on connection ``conn_id``."""
        conn = self.conns.get(conn_id)
        if conn is None:
            return
        try:
            kind = frame[0]
            if kind == P.DELIVER:
                self._on_deliver(conn, frame)
            elif kind == P.SUB_ENDED:
                self._on_sub_ended(conn, frame, now)
            else:
                rid = frame[1]
                entry = conn.pending.pop(rid, None) if type(rid) is int else None
                if entry is None:  # a late reply, or an ERROR about the connection itself
                    if kind == P.ERROR:
                        conn.close_reason = P.error_from_frame(frame)
                    return
                self._on_reply(conn, entry[0], entry[1], frame, now)
        except (IndexError, KeyError, TypeError, ValueError) as exc:
            self._close(conn, errors.ProtocolError(
                f"malformed {P.KIND_NAMES.get(frame[0] if frame else 0, '?')} frame from"
                f" {conn.address[0]}:{conn.address[1]}: {exc.__class__.__name__}: {exc}"), now)

    def take_output(self, conn_id: int, now: float) -> list[list[Any]] | None:
        """Frames to send on ``conn_id`` now (maybe none); None once it is closed."""
        conn = self.conns.get(conn_id)
        if conn is None:
            return None
        frames, conn.out = conn.out, []
        if conn.dirty:
            dirty, conn.dirty = conn.dirty, {}
            for sid, sub in dirty.items():
                frames.extend(self._sub_frames(conn, sub, sid, now))
        if conn.state == "ready" and conn.role == "shard":
            self._publish_frames(conn, frames, now)
        if frames:
            conn.last_send = now
        return frames

    def _on_reply(self, conn: Conn, kind: PendingKind, obj: Any, frame: list[Any],
                  now: float) -> None:
        error = P.error_from_frame(frame) if frame[0] == P.ERROR else None
        if kind == "hello":
            self._on_hello(conn, frame, error, now)
        elif kind == "publish":
            conn.publish_frames -= 1
            self._on_published(conn, obj, frame, error, now)
        elif kind == "call":
            call: Call = obj
            call.in_flight = False
            if error is not None:
                self._call_failed(call, error, now)
            else:
                try:
                    self._finish(call, call.parse(frame))
                except errors.ProtocolError as exc:
                    self._fail(call, exc)
        elif kind == "subscribe":
            self._on_subscribed(conn, obj[0], obj[1], frame, error, now)
        elif kind == "ack":
            sub, session, terms = obj
            if terms:  # G11: confirmed terms count as acked, refused ones end their wait
                refused = {item[0] for item in frame[4]} if error is None else set(terms)
                session.termed(terms, refused)
            if sub.session is not session or sub.status != "active":
                return
            if error is not None:
                # a retryable refusal of the whole frame (StorageUnavailable: the shard's
                # log failed, and it restarts) is not the user's to handle: the session
                # ends with the shard, and what was not acked is delivered again
                if not error.retryable:
                    sub.errors.append(error)
            else:
                session.confirm(int(frame[3]))
                if frame[4]:
                    sub.refused(frame[4])
            if sub.errors:
                self._wake(sub)
        elif kind == "unsubscribe":
            sid, done = obj
            conn.subs.pop(sid, None)
            if done is not None:
                self._finish(done, None)

    def _on_hello(self, conn: Conn, frame: list[Any], error: errors.FluxError | None,
                  now: float) -> None:
        if error is not None:
            if conn.role == "router" and isinstance(error, (errors.SessionExpired,
                                                            errors.AuthenticationFailed)):
                self.session = None  # the next login at the router uses the password
            slot = self._slot_of(conn) if conn.role == "shard" else None
            self._close(conn, error, now)
            if slot is not None and isinstance(error, errors.AuthenticationFailed):
                self._refuse_slot(slot, error)  # the same credentials will fail again
            return
        body = frame[2]
        if conn.role == "router":
            session = body.get("session")
            if isinstance(session, bytes):
                self.session = session  # for the shards' HELLOs (a password login)
            self._install_map(ShardMap.from_hello(body), now)
            self._close(conn, None, now)  # the router is only asked for the map
            self._finish(self.ready, self.map)
            return
        conn.state = "ready"
        conn.heartbeat = float(body.get("heartbeat") or 0) or None
        conn.max_frame_bytes = int(body.get("max_frame_bytes") or P.DEFAULT_MAX_FRAME_BYTES)
        conn.generation = body.get("generation")
        slot = self._slot_of(conn)
        if slot is None:
            self._close(conn, None, now)
            return
        slot.failures = 0
        self._flush_slot(slot, now)

    def _refuse_slot(self, slot: ShardSlot, error: errors.FluxError) -> None:
        """Fail everything waiting for ``slot``'s shard: it refused our credentials."""
        while slot.publishes:
            self._fail(slot.publishes.popleft(), error)
        while slot.calls:
            self._fail(slot.calls.popleft(), error)
        for sub in list(slot.subs.values()):
            if sub.info is None:
                self._fail(sub.ready, error)
                sub.status = "closed"
            else:
                sub.end(error)
                self._wake(sub)
            self._forget_sub(sub)

    def _install_map(self, new: ShardMap, now: float) -> None:
        old = self.map
        self.map = new
        homeless: list[PublishPart | Call | SubState] = list(self._unrouted)
        self._unrouted.clear()
        if old is None or old.shard_count != new.shard_count:
            old_slots = self.slots
            self.slots = [old_slots[i] if i < len(old_slots) else ShardSlot(i)
                          for i in range(new.shard_count)]
            for slot in old_slots:  # topics moved: route queued work again
                homeless.extend(slot.publishes)
                homeless.extend(slot.calls)
                slot.publishes.clear()
                slot.calls.clear()
                for key, sub in list(slot.subs.items()):
                    if sub.status == "waiting":
                        homeless.append(sub)
                        del slot.subs[key]
            for slot in old_slots[new.shard_count:]:
                if slot.conn is not None:
                    self._close(slot.conn, errors.ConnectionLost("the shard left the map"), now)
        for obj in homeless:
            if isinstance(obj, SubState) or not obj.done:
                self._route(obj, now)
        for slot in self.slots:
            self._ensure_conn(slot, now)

    def _publish_frames(self, conn: Conn, frames: list[list[Any]], now: float) -> None:
        """Coalesce the slot's queued parts into PUBLISH frames (at most ~256 items, under
        the shard's max_frame_bytes), while the in-flight window has room. Consecutive
        parts of one topic share a group; a part that does not fit is split."""
        slot = self._slot_of(conn)
        if slot is None:
            return
        queue = slot.publishes
        limit = max(4096, conn.max_frame_bytes - 1024)
        while queue and conn.publish_frames < PUBLISH_WINDOW:
            if self.linger and self._lingers(queue, limit, now):
                slot.linger_at = min(slot.linger_at, queue[0].queued_at + self.linger)
                break
            wire: list[list[Any]] = []
            layout: list[list[PublishPart]] = []   # the parts of each group, in order
            owned = False   # whether the last group's arrays are this frame's to extend
            size = 64
            count = 0
            while queue and count < MAX_BATCH:
                part = queue[0]
                batch = part.batch
                if batch.done:
                    queue.popleft()
                    continue
                if now > batch.deadline:
                    queue.popleft()
                    self._fail(part, deadline_exceeded(part.describe(), part.last_error))
                    continue
                topic = batch.topic
                # groups with keys, headers or delays (options) are never merged
                merge = bool(wire) and wire[-1][0] == topic and batch.options is None \
                    and len(wire[-1]) == 3
                budget = limit - size - (0 if merge else len(topic) + GROUP_OVERHEAD)
                lo, hi = part.lo, part.hi
                part_size = batch.size(lo, hi)
                if hi - lo <= MAX_BATCH - count and part_size <= budget:
                    queue.popleft()
                else:
                    take = _fitting(batch, lo, min(hi - lo, MAX_BATCH - count), budget)
                    if not take:
                        if wire:
                            break
                        # not even one message fits in this shard's frames
                        head = part.split(1) if hi - lo > 1 else queue.popleft()
                        self._fail(head, errors.MessageTooLarge(
                            f"a {len(batch.payloads[lo])}-byte payload is over the shard's"
                            f" max_frame_bytes={conn.max_frame_bytes}"))
                        continue
                    part = part.split(take)
                    hi = part.hi
                    part_size = batch.size(lo, hi)
                part.in_flight = True
                part.attempts += 1
                ids, payloads = batch.ids, batch.payloads
                sliced = lo != 0 or hi != len(ids)
                if sliced:
                    ids, payloads = ids[lo:hi], payloads[lo:hi]
                if merge:
                    group = wire[-1]
                    if not owned:  # never extend a batch's own arrays
                        group[1], group[2], owned = list(group[1]), list(group[2]), True
                    group[1] += ids
                    group[2] += payloads
                    layout[-1].append(part)
                else:
                    wire.append([topic, ids, payloads] if batch.options is None
                                else [topic, ids, payloads, batch.options_of(lo, hi)])
                    layout.append([part])
                    owned = sliced
                    size += len(topic) + GROUP_OVERHEAD
                size += part_size
                count += hi - lo
            if not wire:
                continue
            rid = next(self._rids)
            frames.append([P.PUBLISH, rid, wire])
            conn.pending[rid] = ("publish", layout)
            conn.timeouts.append((now + self.request_timeout, rid))
            conn.publish_frames += 1

    def _lingers(self, queue: deque[PublishPart], limit: int, now: float) -> bool:
        """Whether a partial batch should wait for more items (``linger``): only until
        its oldest item has waited ``linger``, and never once it would fill a frame."""
        if now >= queue[0].queued_at + self.linger:
            return False
        if sum(part.hi - part.lo for part in queue) >= MAX_BATCH:
            return False
        return sum(part.size + GROUP_OVERHEAD + len(part.topic) for part in queue) + 64 <= limit

    def _on_published(self, conn: Conn, layout: list[list[PublishPart]], frame: list[Any],
                      error: errors.FluxError | None, now: float) -> None:
        retry_now: list[PublishPart] = []
        results: list[Any] = []
        generation = 0
        if error is None:
            try:
                generation, results = int(frame[2]), frame[3]
                _check_published(layout, results)
            except (IndexError, KeyError, TypeError, ValueError) as exc:
                error = errors.ProtocolError(f"malformed PUBLISHED: {exc}")
        if error is not None:
            retry_now = [part for parts in layout for part in parts
                         if self._publish_failed(part, error, now)]
        else:
            woken = self._woken
            for parts, result in zip(layout, results, strict=True):
                offsets, duplicates, refused = result[0], result[1], result[2]
                # a disk topic's own generation follows when it is not the shard's (G9)
                group_generation = result[3] if len(result) > 3 and result[3] is not None \
                    else generation
                dues = result[4] if len(result) > 4 else None  # delayed items' due times
                if type(offsets) is int:  # every item stored, from this offset on
                    offsets = range(offsets, offsets + sum(p.hi - p.lo for p in parts))
                base = 0
                for part in parts:
                    part.in_flight = False
                    lo, hi = part.lo, part.hi
                    n = hi - lo
                    batch = part.batch
                    if batch.done:
                        base += n
                        continue
                    if base == 0 and n == len(offsets):  # the usual case: a part is a group
                        mine = refused
                        batch.offsets[lo:hi] = offsets
                        for i in duplicates:
                            batch.duplicates[lo + i] = True
                    else:
                        end = base + n
                        mine = [[i - base, c, m] for i, c, m in refused if base <= i < end]
                        batch.offsets[lo:hi] = offsets[base:end]
                        for i in duplicates:
                            if base <= i < end:
                                batch.duplicates[lo + i - base] = True
                    batch.generations[lo:hi] = [group_generation] * n
                    if dues is not None:
                        batch.set_dues(lo, dues[base:base + n])
                    if batch.finish(n - len(mine)) and batch.waker is not None:
                        woken.append(batch)
                    if mine:
                        retry_now.extend(self._refused(part, mine, now))
                    base += n
        for part in retry_now:
            self._route(part, now)
        slot = self._slot_of(conn)
        if slot is not None and slot.publishes:
            self._arm_linger(slot)
            self._writable[conn.id] = None

    def _refused(self, part: PublishPart, refused: list[list[Any]],
                 now: float) -> list[PublishPart]:
        """Items of ``part`` the shard refused (``[index, code, message]``, increasing index):
        each run of one retryable code is retried together, anything else fails alone.
        Returns the parts to send again at once."""
        again: list[PublishPart] = []
        batch = part.batch
        start = 0
        while start < len(refused):
            index, code, message = refused[start]
            exc = errors.from_code(int(code), str(message))
            end = start + 1
            if retryable(exc):
                while (end < len(refused) and refused[end][1] == code
                       and refused[end][0] == index + end - start):
                    end += 1
            piece = PublishPart(batch, part.lo + index, part.lo + index + end - start,
                                part.attempts)
            if self._publish_failed(piece, exc, now):
                again.append(piece)
            start = end
        return again

    def _publish_failed(self, part: PublishPart, exc: errors.FluxError, now: float) -> bool:
        """Decide a part's fate after ``exc``; True means "send it again at once"."""
        part.in_flight = False
        if part.done:
            return False
        part.last_error = exc
        if not retryable(exc):
            self._fail(part, exc)
        elif now >= part.deadline:
            self._fail(part, deadline_exceeded(part.describe(), exc))
        elif isinstance(exc, CONNECTION_LEVEL):
            return True  # the reconnect has its own backoff; keep the same ids (G3)
        else:
            if isinstance(exc, REFRESH_MAP):
                self._refresh_map(now)
            self._delay(part, part.attempts, now)
        return False

    def _call_failed(self, call: Call, exc: errors.FluxError, now: float) -> None:
        call.in_flight = False
        if call.done:
            return
        call.last_error = exc
        if not retryable(exc):
            self._fail(call, exc)
        elif now >= call.deadline:
            self._fail(call, deadline_exceeded(call.describe(), exc))
        elif isinstance(exc, CONNECTION_LEVEL):
            self._route(call, now)
        else:
            if isinstance(exc, REFRESH_MAP):
                self._refresh_map(now)
            self._delay(call, call.attempts, now)

    def _close(self, conn: Conn, exc: errors.FluxError | None, now: float,
               tell_shell: bool = True) -> None:
        """Forget ``conn``; ``exc`` None is a deliberate close. Work on it is retried."""
        if conn.state == "closed":
            return
        was_ready = conn.state == "ready"
        conn.state = "closed"
        self.conns.pop(conn.id, None)
        self._writable.pop(conn.id, None)
        if tell_shell:
            self._to_close.append(conn.id)
        pending, conn.pending = conn.pending, {}
        if conn.role == "router":
            self._router_done(conn, exc, now)
            return
        error = exc or errors.ConnectionLost(f"connection to shard {conn.index} closed")
        slot = self._slot_of(conn)
        if slot is not None:
            slot.conn = None
            slot.last_error = error
            slot.failures = 0 if was_ready else slot.failures + 1
            slot.retry_at = now + backoff(self.rng, slot.failures)
        if exc is not None:
            self._refresh_map(now)
        requeue: list[PublishPart] = []
        for kind, obj in pending.values():
            if kind == "publish":
                requeue.extend(part for parts in obj for part in parts
                               if self._publish_failed(part, error, now))
            elif kind == "call":
                self._call_failed(obj, error, now)
            elif kind == "unsubscribe" and obj[1] is not None:
                self._finish(obj[1], None)
        for sid, sub in conn.subs.items():
            if sub.sid == sid and sub.status in ("subscribing", "active"):
                sub.detached()
                sub.retry_at = now
                if slot is None:
                    self._route(sub, now)
        conn.subs.clear()
        for item in reversed(requeue):  # first in line again, in their original order
            self._route(item, now, front=True)
        if slot is not None:
            self._ensure_conn(slot, now)

    def _router_done(self, conn: Conn, exc: errors.FluxError | None, now: float) -> None:
        if self._router_conn is conn:
            self._router_conn = None
        if exc is None:
            self._router_failures = 0
        else:
            self._router_failures += 1
            self._router_retry_at = now + backoff(self.rng, self._router_failures)
            if not self.ready.done:
                host, port = self.router
                self._fail(self.ready, errors.ConnectionLost(
                    f"cannot reach the router at {host}:{port}: {exc}") if isinstance(
                        exc, CONNECTION_LEVEL) else exc)
        if self._refresh_again and now >= self._router_retry_at:
            self._refresh_map(now)

    def _fail_pending(self, kind: PendingKind, obj: Any, exc: errors.FluxError) -> None:
        if kind == "publish":
            for parts in obj:
                for part in parts:
                    self._fail(part, exc)
        elif kind == "call":
            self._fail(obj, exc)
        elif kind == "subscribe":
            self._fail(obj[0].ready, exc)
        elif kind == "unsubscribe" and obj[1] is not None:
            self._finish(obj[1], None)


def _fitting(batch: PublishBatch, lo: int, most: int, budget: int) -> int:
    """How many messages of ``batch`` from ``lo`` on (at most ``most``) fit in ``budget``."""
    sizes = batch.item_sizes()
    if sum(sizes[lo:lo + most]) <= budget:
        return most
    total = 0
    for k in range(most):
        total += sizes[lo + k]
        if total > budget:
            return k
    return most


def _check_published(layout: list[list[PublishPart]], results: Any) -> None:
    """Raise ValueError (or TypeError) unless ``results`` answers the groups of ``layout``:
    one ``[offsets, duplicates, refused]`` (and perhaps the group's generation) per
    group, indexes in range and increasing."""
    if type(results) is not list or len(results) != len(layout):
        raise ValueError(f"{len(results)} results for {len(layout)} groups")
    for parts, result in zip(layout, results, strict=True):
        if type(result) is not list or not 3 <= len(result) <= 5:
            raise ValueError(f"a group result is [offsets, duplicates, refused(, generation"
                             f"(, due))], not {result!r}")
        offsets, duplicates, refused = result[0], result[1], result[2]
        if len(result) >= 4 and type(result[3]) is not int \
                and not (len(result) == 5 and result[3] is None):
            raise TypeError("a group's generation must be an integer")
        n = sum(part.hi - part.lo for part in parts)
        if len(result) == 5 and (type(result[4]) is not list or len(result[4]) != n):
            raise ValueError("a group's due times are an array of one per item")
        if type(duplicates) is not list or type(refused) is not list:
            raise TypeError("duplicates and refused must be arrays")
        if type(offsets) is int:  # a first offset: every item stored new
            if offsets < 0 or duplicates or refused:
                raise ValueError("a first offset stands for items all stored new")
            continue
        if type(offsets) is not list or len(offsets) != n:
            raise ValueError(f"a group of {n} items got {len(offsets)} offsets")
        if n and not set(map(type, offsets)) <= {int}:  # no per-item Python loop
            raise TypeError("offsets must be integers")
        if duplicates and (not set(map(type, duplicates)) <= {int} or min(duplicates) < 0
                           or max(duplicates) >= n):
            raise ValueError("duplicate index out of range")
        last = -1
        for entry in refused:
            index, code, _message = entry
            if type(index) is not int or type(code) is not int or not last < index < n:
                raise ValueError(f"bad refused entry {entry!r}")
            last = index
