"""Pushing: first deliveries under credit and window, selective redelivery (G1, G4).

Each push has an ack deadline; a timed-out message alone is re-pushed after
``retry_interval``; one that used all its pushes makes the subscription inactive.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from flux import errors
from flux.message_meta import columns_size
from flux.shard.journal import Held
from flux.shard.naks import Settling
from flux.shard.state import (
    P,
    Session,
)
from flux.shard.subscription import PushTimers, Subscription
from flux.shard.topic import TopicLog


class Delivery(Settling):
    """Pushes, ack deadlines and redeliveries."""

    def _push_new(self, sub: Subscription, now: float) -> None:
        topic = self.topics[sub.topic]
        log = topic.log
        end = log.next_offset if topic.journal is None else topic.journal.exposed
        room = min(sub.max_in_flight - len(sub.in_flight), sub.credit)
        # the cursor can jump past next_push over offsets acked before this attachment
        # (they are no longer in ``acked``): never push those
        start = max(sub.next_push, sub.cursor, log.oldest)
        if room <= 0 or (start >= end and not sub.due_heap):
            return
        assert sub.session is not None
        session = self.sessions.get(sub.session[0])
        if session is None:
            return
        delayed = topic.delayed
        if delayed and (sub.due_heap or delayed.last >= start):
            self._push_in_due_order(sub, session, topic, start, end, room, now)
            return
        stop = min(end, start + room)
        acked = sub.acked
        offsets: range | list[int] = range(start, stop)
        if acked and acked.max() >= start:
            skipping = acked.missing(start, stop)
            if len(skipping) < stop - start:  # skipped some: fill the room further on
                for o in range(stop, end):
                    if len(skipping) >= room:
                        break
                    if o not in acked:
                        skipping.append(o)
                stop = skipping[-1] + 1 if skipping else stop
                offsets = skipping
        if not offsets:
            sub.next_push = stop
            return
        if self._carried(sub, offsets):  # counts kept from earlier attachments (G11)
            if self._push_carried(session, sub, topic, offsets, now):
                sub.next_push = stop
                self._schedule(sub)
            return
        n = len(offsets)
        payloads: Sequence[bytes]
        try:  # a disk topic's evicted payloads are read back here
            if type(offsets) is range:  # the usual case: a contiguous run of offsets
                ids, payloads, times = log.span(start, stop, self.epoch)
            else:
                ids, payloads, times = self._columns(log, offsets)
        except errors.StorageUnavailable:
            return  # damage read back (logged; its topic is recovered): nothing pushed
        sub.next_push = stop
        sub.in_flight.push_first(offsets)
        self._count_pushes(topic, sub, offsets, 1)
        self._await_ack(session, sub, now + topic.settings.timeout, offsets, 1)
        sub.credit -= n
        self.counters["delivered"] += n
        meta = log.meta_columns(offsets, self.epoch) if log.metas else None
        self._deliver(session, sub.session[1], topic.generation, 1, offsets, ids, payloads, times,
                      meta)
        self._schedule(sub)

    def _push_in_due_order(self, sub: Subscription, session: Session, topic: Any, start: int,
                           end: int, room: int, now: float) -> None:
        """First pushes of a topic that carries delayed messages, in (due, offset) order
        (G12): one DELIVER whose offsets may be out of order or have holes."""
        assert sub.session is not None
        log = topic.log
        picks, next_push = self._due_order(sub, topic, start, end, room)
        if picks and self._carried(sub, picks):  # counts kept from earlier attachments (G11)
            if self._push_carried(session, sub, topic, picks, now):
                sub.next_push = next_push
            self._schedule(sub)
            return
        if picks:
            try:  # a disk topic's evicted payloads are read back here
                ids, payloads, times = self._columns(log, picks)
            except errors.StorageUnavailable:
                return  # damage read back (logged; its topic is recovered): nothing pushed
            delayed, pushed = topic.delayed, sub.due_pushed
            if len(pushed) > 4096 and len(pushed) > 2 * len(sub.in_flight):
                in_flight = sub.in_flight  # the acked ones go: a session's pushes add up
                sub.due_pushed = pushed = {o for o in pushed if o in in_flight}
            pushed.update(o for o in picks if o in delayed)
            sub.in_flight.push_first(picks)
            self._count_pushes(topic, sub, sorted(picks), 1)
            self._await_ack(session, sub, now + topic.settings.timeout, sorted(picks), 1)
            sub.credit -= len(picks)
            self.counters["delivered"] += len(picks)
            self._deliver(session, sub.session[1], topic.generation, 1, picks, ids, payloads,
                          times, log.meta_columns(picks, self.epoch))
        sub.next_push = next_push
        self._schedule(sub)

    def _columns(self, log: TopicLog, offsets: Sequence[int]
                 ) -> tuple[list[str], list[bytes], list[float | int]]:
        """Ids, payloads and store-time runs of held ``offsets`` (not a contiguous run)."""
        return log.columns(offsets, self.epoch)

    def _deliver(self, session: Session, sid: int, generation: int, attempt: int,
                 offsets: Sequence[int],
                 ids: list[str], payloads: Sequence[bytes], times: list[float | int],
                 meta: dict[str, Any] | None = None) -> None:
        """Queue DELIVER frames for these columns (``offsets`` a range when contiguous,
        ``times`` as runs, ``meta`` the keys, headers and due times if any has one), split
        so no frame nears max_frame_bytes."""
        budget = self.config.max_frame_bytes // 2
        n = len(offsets)
        size = (payloads.size if type(payloads) is P.PackedPayloads
                else sum(map(len, payloads)))
        if meta is not None:
            size += columns_size(meta)
        # joining the ids (at most 128 bytes each) counts them faster than len() per id
        if n * 40 + len("".join(ids)) + size <= budget:
            frame: list[Any] = [P.DELIVER, sid, generation, attempt, P.offsets_field(offsets),
                                ids, payloads, times]
            if meta is not None:
                frame.append(meta)
            session.out.append(frame)
            return
        payloads = list(payloads)  # rare: split item by item
        cuts, size = [0], 0
        for i in range(n):
            item_size = len(payloads[i]) + len(ids[i]) + 40
            if size + item_size > budget and i > cuts[-1]:
                cuts.append(i)
                size = 0
            size += item_size
        cuts.append(n)
        each = list(P.times_of(times))
        for a, b in pairwise(cuts):
            frame = [P.DELIVER, sid, generation, attempt, P.offsets_field(offsets[a:b]),
                     ids[a:b], payloads[a:b], P.time_runs(each[a:b])]  # (typed above)
            if meta is not None:
                frame.append({name: column[a:b] for name, column in meta.items()})
            session.out.append(frame)

    def _schedule(self, sub: PushTimers) -> None:
        """Make sure the timer heap wakes ``sub`` at its earliest timer."""
        at = sub.next_timer()
        if at is not None and (sub.wake_at is None or at < sub.wake_at):
            sub.wake_at = at
            heapq.heappush(self._timers, (at, next(self._timer_seq), sub))

    def _run_timers(self, sub: Subscription, now: float) -> None:
        if sub.session is None or sub.deleted:
            return
        settings = self.topics[sub.topic].settings  # a topic with subscriptions is held
        if sub.naks:  # nak'd messages due again (G11)
            due = self._due_naks(sub, now)
            if due:
                self._redeliver(sub, due)
        max_pushes = 1 + settings.retry_count
        retry_interval = settings.retry_interval
        repush: list[tuple[float, int, int]] = []
        while True:
            d = sub.deadlines[0] if sub.deadlines else None
            r = sub.repushes[0] if sub.repushes else None
            if d is not None and d[0] <= now and (r is None or d[0] <= r[0]):
                sub.deadlines.popleft()
                at, offsets, pushes, epoch = d
                for offset in offsets:  # only the unacked ones of the batch time out
                    if not sub.is_current(offset, pushes, epoch):
                        if sub.extended and offset not in sub.in_flight:
                            sub.extended.pop(offset, None)  # settled: its in_progress too
                        continue
                    if sub.extended and self._deferred(sub, offset, at):
                        continue
                    if pushes >= max_pushes:
                        if self._exhausted(sub, offset, max_pushes, now):
                            return
                        continue
                    if retry_interval <= 0:
                        repush.append((at, offset, pushes))
                    else:
                        sub.add_repush(at + retry_interval, offset, pushes)
            elif r is not None and r[0] <= now:
                sub.repushes.popleft()
                at, offset, pushes, epoch = r
                if sub.is_current(offset, pushes, epoch) and not (
                        sub.extended and self._overtaken(sub, offset, at, retry_interval)):
                    repush.append((at, offset, pushes))
            else:
                break
        if repush:
            self._redeliver(sub, repush)
        self._schedule(sub)

    def _await_ack(self, session: Session | None, sub: PushTimers, at: float,
                   offsets: Sequence[int], pushes: Any) -> None:
        """Push ``pushes`` of ``offsets`` waits for its ack until ``at``; or, if the push
        waits behind a held reply (a disk topic's record not yet durable, G9), until the
        timeout after it goes out (:meth:`_pushes_sent`): G4 counts from the push the
        client can see."""
        if session is not None and session.holds:
            session.holds[-1].pushes.append((sub, offsets, pushes, sub.epoch))
        else:
            sub.add_deadlines(at, offsets, pushes)

    def _pushes_sent(self, gone: list[Held], now: float) -> None:
        """Held replies went with the pushes queued behind them: start their timeouts."""
        topics = self.topics
        for held in gone:
            for sub, offsets, pushes, epoch in held.pushes:
                topic = topics.get(sub.topic)
                if topic is None or sub.deleted or epoch != sub.epoch:
                    continue
                sub.add_deadlines(now + topic.settings.timeout, offsets, pushes)
                self._schedule(sub)

    def _redeliver(self, sub: Subscription, due: list[tuple[float, int, int]]) -> None:
        """Re-push ``due`` (at, offset, pushes so far): one DELIVER per attempt number,
        each in offset order, the frames in order of their lowest offset."""
        assert sub.session is not None
        session = self.sessions.get(sub.session[0])
        topic = self.topics[sub.topic]
        log, timeout = topic.log, topic.settings.timeout
        by_attempt: dict[int, list[int]] = {}
        # deadlines are added in time order: the queue must stay ordered
        for at, offset, pushes in sorted(due, key=lambda e: (e[0], e[1])):
            # an in_progress whose deadline equals one in force (at the push's own instant,
            # or twice at one instant) doubles the timer entries of one push: the first
            # re-push makes the other stale (else one DELIVER carries the offset twice)
            if not log.holds(offset) or sub.in_flight.get(offset) != pushes:
                continue
            if sub.extended:  # an in_progress of the push before is done with
                sub.extended.pop(offset, None)
            sub.in_flight[offset] = pushes + 1
            self._await_ack(session, sub, at + timeout, [offset], pushes + 1)
            by_attempt.setdefault(pushes + 1, []).append(offset)
        for attempt, offsets in by_attempt.items():
            self._count_pushes(topic, sub, offsets, attempt)
        if by_attempt and session is not None:
            # frames in order of their lowest offset
            runs = sorted((sorted(offsets), attempt) for attempt, offsets in by_attempt.items())
            for offsets, attempt in runs:
                try:  # a disk topic's evicted payloads are read back here
                    columns = self._columns(log, offsets)
                except errors.StorageUnavailable:
                    # damage read back (logged; its topic is recovered): the push is
                    # counted but not sent, and times out like a lost one
                    continue
                self.counters["redelivered"] += len(offsets)
                sub.redelivered += len(offsets)
                self._deliver(session, sub.session[1], topic.generation, attempt, offsets,
                              *columns, log.meta_columns(offsets, self.epoch))

    def _exhausted(self, sub: Subscription, offset: int, pushes: int, now: float) -> bool:
        """A message used all its pushes: with a dead-letter policy it goes to the
        dead-letter topic and pushes go on (G11); else the subscription becomes inactive
        (G4). True if the attachment ended."""
        topic = self.topics[sub.topic]
        if topic.settings.dead_letter:
            self._dead_letter(topic, sub, offset, pushes, "exhausted", now)
            return False
        assert sub.session is not None
        conn, sid = sub.session
        session = self.sessions.get(conn)
        if session is not None:
            session.out.append([P.SUB_ENDED, sid, errors.SubscriptionInactive.code,
                                f"offset {offset} was pushed {pushes}"
                                " times without an ack; subscribe again to resume"])
        self._emit("exhausted", sub.topic, sub.name, offset)
        self._end_attachment(sub, now)
        return True
