"""Pushing: first deliveries under credit and window, selective redelivery (G1, G4).

Each push has an ack deadline; a timed-out message alone is re-pushed after
``retry_interval``; one that used all its pushes makes the subscription inactive.
"""

from __future__ import annotations

import heapq
from typing import Any

from flux import errors
from flux.shard.state import (
    P,
    Session,
    ShardState,
)
from flux.shard.subscription import Subscription


class Delivery(ShardState):
    """Pushes, ack deadlines and redeliveries."""

    def _pump(self, now: float) -> None:
        """Send first deliveries to every subscription that may have room for them."""
        if not self._dirty:
            return
        dirty = self._dirty
        self._dirty = {}
        for sub in dirty.values():
            if sub.session is not None:
                self._push_new(sub, now)

    def _push_new(self, sub: Subscription, now: float) -> None:
        topic = self.topics[sub.topic]
        log = topic.log
        end = log.next_offset
        room = min(sub.max_in_flight - len(sub.in_flight), sub.credit)
        # the cursor can jump past next_push over offsets acked before this attachment
        # (they are no longer in ``acked``): never push those
        start = max(sub.next_push, sub.cursor, log.oldest)
        if room <= 0 or start >= end:
            return
        assert sub.session is not None
        session = self.sessions.get(sub.session[0])
        if session is None:
            return
        stop = min(end, start + room)
        acked = sub.acked
        if acked and max(acked) >= start:
            offsets = [o for o in range(start, stop) if o not in acked]
            if len(offsets) < stop - start:  # skipped some: fill the room further on
                for o in range(stop, end):
                    if len(offsets) >= room:
                        break
                    if o not in acked:
                        offsets.append(o)
                stop = offsets[-1] + 1 if offsets else stop
        else:
            offsets = list(range(start, stop))
        sub.next_push = stop
        if not offsets:
            return
        epoch = self.epoch
        if len(offsets) == stop - start:  # the usual case: a contiguous run of offsets
            ids, payloads, times = log.span(start, stop)
            items = [[o, i, p, epoch + t, 1]
                     for o, i, p, t in zip(offsets, ids, payloads, times, strict=True)]
            size: int | None = sum(map(len, ids)) + sum(map(len, payloads))
        else:
            items = []
            for o in offsets:
                entry = log.get(o)
                assert entry is not None  # held: at or above the cursor
                items.append([o, entry.id, entry.payload, epoch + entry.stored_at, 1])
            size = None
        sub.in_flight.update(dict.fromkeys(offsets, 1))
        sub.add_deadlines(now + self.config.subscriber.timeout, offsets, 1)
        sub.credit -= len(items)
        self.counters["delivered"] += len(items)
        self._deliver(session, sub.session[1], items, size)
        self._schedule(sub)

    def _deliver(self, session: Session, sid: int, items: list[list[Any]],
                 size: int | None = None) -> None:
        """Queue DELIVER frames for ``items`` (``size``: their ids and payloads, if known),
        split so no frame nears max_frame_bytes."""
        budget = self.config.max_frame_bytes // 2
        if size is None:
            size = sum(len(item[2]) + len(item[1]) for item in items)
        if len(items) * 40 + size <= budget:
            session.out.append([P.DELIVER, sid, self.generation, items])
            return
        start = size = 0
        for i, item in enumerate(items):
            item_size = len(item[2]) + len(item[1]) + 40
            if size + item_size > budget and i > start:
                session.out.append([P.DELIVER, sid, self.generation, items[start:i]])
                start, size = i, 0
            size += item_size
        session.out.append([P.DELIVER, sid, self.generation,
                            items[start:] if start else items])

    def _schedule(self, sub: Subscription) -> None:
        """Make sure the timer heap wakes ``sub`` at its earliest timer."""
        at = sub.next_timer()
        if at is not None and (sub.wake_at is None or at < sub.wake_at):
            sub.wake_at = at
            heapq.heappush(self._timers, (at, next(self._timer_seq), sub))

    def _run_timers(self, sub: Subscription, now: float) -> None:
        if sub.session is None or sub.deleted:
            return
        cfg = self.config.subscriber
        max_pushes = 1 + cfg.retry_count
        repush: list[tuple[float, int, int]] = []
        while True:
            d = sub.deadlines[0] if sub.deadlines else None
            r = sub.repushes[0] if sub.repushes else None
            if d is not None and d[0] <= now and (r is None or d[0] <= r[0]):
                sub.deadlines.popleft()
                at, offsets, pushes, epoch = d
                for offset in offsets:  # only the unacked ones of the batch time out
                    if not sub.is_current(offset, pushes, epoch):
                        continue
                    if pushes >= max_pushes:
                        self._exhausted(sub, offset, now)
                        return
                    if cfg.retry_interval <= 0:
                        repush.append((at, offset, pushes))
                    else:
                        sub.add_repush(at + cfg.retry_interval, offset, pushes)
            elif r is not None and r[0] <= now:
                sub.repushes.popleft()
                at, offset, pushes, epoch = r
                if sub.is_current(offset, pushes, epoch):
                    repush.append((at, offset, pushes))
            else:
                break
        if repush:
            self._redeliver(sub, repush)
        self._schedule(sub)

    def _redeliver(self, sub: Subscription, due: list[tuple[float, int, int]]) -> None:
        assert sub.session is not None
        session = self.sessions.get(sub.session[0])
        topic = self.topics[sub.topic]
        timeout = self.config.subscriber.timeout
        items: list[list[Any]] = []
        for at, offset, pushes in sorted(due, key=lambda e: (e[0], e[1])):
            entry = topic.log.get(offset)
            if entry is None:
                continue
            sub.in_flight[offset] = pushes + 1
            sub.add_deadlines(at + timeout, [offset], pushes + 1)
            items.append([offset, entry.id, entry.payload, self.epoch + entry.stored_at,
                          pushes + 1])
        if items and session is not None:
            self.counters["redelivered"] += len(items)
            self._deliver(session, sub.session[1], items)

    def _exhausted(self, sub: Subscription, offset: int, now: float) -> None:
        """A message used all its pushes: the subscription becomes inactive (G4)."""
        assert sub.session is not None
        conn, sid = sub.session
        session = self.sessions.get(conn)
        if session is not None:
            session.out.append([P.SUB_ENDED, sid, errors.SubscriptionInactive.code,
                                f"offset {offset} was pushed {1 + self.config.subscriber.retry_count}"
                                " times without an ack; subscribe again to resume"])
        self._emit("exhausted", sub.topic, sub.name, offset)
        self._end_attachment(sub, now)
