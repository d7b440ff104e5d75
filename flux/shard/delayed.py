"""Delayed delivery (G12): due times, the shard's timer index, and due-time push order.

A publish may ask for ``delay`` (seconds) or ``deliver_at`` (wall time): the
message is stored and acked at once, and first pushed to no subscription before
it is due. Each topic indexes its delayed messages in runs of consecutive offsets
(:mod:`flux.shard.due_index`, a few bytes a message); the shard's timer heap
(``ShardState._delays``) holds one entry per run with messages not yet due, keyed
by the earliest, woken through ``next_deadline`` like every other timer; firing
looks at the messages due alone. A subscription's first
pushes go in (due time, offset) order, an undelayed message being due when
stored: the undelayed ones come from its offset cursor (``next_push``), skipping
delayed offsets, and the due delayed ones from its own small heap, merged by wall
due time (the times DELIVER and PUBLISHED report, so a checker sees the order the
shard used). Cleanup holds a delayed message until ``ttl`` after it is due.
"""

from __future__ import annotations

import heapq
import math
from typing import Any

from flux import errors
from flux.message_meta import Meta, check_delay, check_headers, check_key, check_time
from flux.shard.due_index import TopicDelays
from flux.shard.state import ShardState, Topic
from flux.shard.subscription import Subscription


class GroupOptions:
    """The optional fourth field of a PUBLISH group, its columns checked for shape:
    ``keys``, ``headers``, ``delay``, ``deliver_at`` (one per item, or one number for
    all). Each item's values are checked by :meth:`item` (per-item errors)."""

    __slots__ = ("delays", "deliver_at", "headers", "keys")

    def __init__(self, keys: list[Any] | None, headers: list[Any] | None,
                 delays: list[Any] | None, deliver_at: list[Any] | None) -> None:
        self.keys = keys
        self.headers = headers
        self.delays = delays
        self.deliver_at = deliver_at

    def item(self, i: int, max_delay: float, epoch: float, now: float
             ) -> tuple[str | None, dict[str, str] | None, float | None]:
        """Item ``i``'s key, headers and due time (monotonic; None: due when stored).
        Raises InvalidKey, InvalidHeaders or InvalidDelay."""
        key = self.keys[i] if self.keys is not None else None
        if key is not None:
            check_key(key)
        headers = self.headers[i] if self.headers is not None else None
        if headers is not None:
            headers = check_headers(headers) or None
        delay = self.delays[i] if self.delays is not None else None
        at = self.deliver_at[i] if self.deliver_at is not None else None
        if delay is not None and at is not None:
            raise errors.InvalidDelay("give delay or deliver_at, not both")
        if at is not None:
            # a time in the past means now (G12); one too far away is refused
            delay = max(0.0, check_time(at) - (epoch + now))
            check_delay(delay, max_delay, "deliver_at (from now)")
        elif delay is not None:
            delay = check_delay(delay, max_delay)
        due = now + delay if delay else None
        return key, headers, due


def group_options(opts: Any, n: int) -> GroupOptions:
    """A PUBLISH group's options map (``n`` items); InvalidRequest for a bad shape."""
    if not isinstance(opts, dict):
        raise errors.InvalidRequest("a PUBLISH group's options must be a map")

    def column(name: str, scalar: bool) -> list[Any] | None:
        value = opts.get(name)
        if value is None:
            return None
        if type(value) is list:
            if len(value) != n:
                raise errors.InvalidRequest(f"PUBLISH option {name!r} needs one item per message"
                                            f" ({n}), got {len(value)}")
            return value
        if scalar:
            return [value] * n  # one value for every item (its type is checked per item)
        raise errors.InvalidRequest(f"PUBLISH option {name!r} must be an array")

    return GroupOptions(column("keys", False), column("headers", False),
                        column("delay", True), column("deliver_at", True))


def record_meta(meta: Meta | None, dues: list[float | None] | None,
                epoch: float) -> dict[str, Any] | None:
    """A PUBLISH record's optional fifth field (PROTOCOL.md §14.4): the run's keys,
    headers and due times (``dues`` monotonic, recorded as wall times), only the columns
    it has."""
    if meta is None and dues is None:
        return None
    out: dict[str, Any] = {}
    if meta is not None and meta.keys is not None:
        out["keys"] = list(meta.keys)
    if meta is not None and meta.headers is not None:
        out["headers"] = list(meta.headers)
    if dues is not None:
        out["due"] = [None if d is None else epoch + d for d in dues]
    return out


class Delays(ShardState):
    """The delayed messages of every topic: holding, firing, ordering, cleanup limits."""

    def _hold_delayed(self, topic: Topic, first: int, dues: list[float | None]) -> None:
        """Messages from offset ``first`` were stored with these due times (None: due
        when stored): index them (``now`` is the store time, so every given due is in the
        future), and wake their run earlier if one of them is due before its timer."""
        run, soonest = topic.delayed.add(topic.name, first, dues)
        if run is None or soonest >= run.timer:
            return
        heap = self._delays
        if run.timer != math.inf:  # its entry in the heap goes stale (skipped when popped)
            self._stale_delays += 1
            if self._stale_delays > 1024 and 2 * self._stale_delays > len(heap):
                # dues brought forward again and again (published latest first): keep
                # the heap to one entry per run
                live = {id(r): (at, seq, r) for at, seq, r in heap if at == r.timer}
                heap[:] = live.values()
                heapq.heapify(heap)
                self._stale_delays = 0
        run.timer = soonest
        heapq.heappush(heap, (soonest, next(self._timer_seq), run))

    def _due_of(self, topic: Topic, offset: int) -> float | None:
        """The wall due time of a held delayed message at ``offset`` (None otherwise)."""
        due = topic.delayed.due_of(offset)
        return None if due is None else self.epoch + due

    def _fire_delays(self, now: float) -> None:
        """Every delayed message due by ``now`` joins the due heap of each attached
        subscription that has still to push it. Runs before any frame or timer at
        ``now`` is handled, so a push at ``now`` sees everything due by then."""
        heap = self._delays
        topics, epoch, dirty = self.topics, self.epoch, self._dirty
        while heap and heap[0][0] <= now:
            at, _, run = heapq.heappop(heap)
            if at != run.timer:
                continue  # its timer was brought forward since
            topic = topics.get(run.topic)
            if topic is None or topic.delayed.run_of(run.first) is not run:
                continue  # trimmed, or the topic is gone
            fired = run.fire(now)
            due = run.next_due()
            run.timer = math.inf if due is None else due
            if due is not None:
                heapq.heappush(heap, (due, next(self._timer_seq), run))
            subs = [sub for sub in topic.subs.values() if sub.pushing]
            if not subs:
                continue
            first, dues, log = run.first, run.dues, topic.log
            for i in fired:
                offset = first + i
                if not log.holds(offset):
                    continue
                entry = (epoch + dues[i], offset)
                for sub in subs:
                    if _wants(sub, offset):
                        heapq.heappush(sub.due_heap, entry)
                        dirty[id(sub)] = sub

    def _attach_delays(self, topic: Topic, sub: Subscription, now: float) -> None:
        """A session attached: the delayed messages due already that it has still to
        push go to its due heap (those not due join when they are)."""
        sub.delayed = delayed = topic.delayed
        if not delayed:
            return
        epoch, log = self.epoch, topic.log
        heap: list[tuple[float, int]] = []
        for run in delayed.runs(max(sub.cursor, sub.attached_from)):
            first, dues = run.first, run.dues
            for i in run.seal()[:run.due_by(now)]:
                o = first + i
                if _wants(sub, o) and log.holds(o):
                    heap.append((epoch + dues[i], o))
        heapq.heapify(heap)
        sub.due_heap = heap

    def _delay_keep(self, topic: Topic, now: float) -> KeepDelayed:
        """What cleanup of a topic must keep out of line if it trims past it: the
        delayed messages not ``ttl`` past their due time (forgets trimmed ones)."""
        self._forget_gone(topic)
        return KeepDelayed(topic.delayed, now - topic.settings.ttl)

    def _write_kept(self, topic: Topic, offsets: list[int]) -> None:
        """Write the kept messages at ``offsets`` of a disk topic whole in KEEP records
        (those already out of memory are read back first, their old record still in the
        log); each leaves memory once its record is durable. The rows go in (due,
        offset) order, so that messages due together are read back together. Damage read
        back writes nothing (its topic's log is recovered)."""
        journal, log = topic.journal, topic.log
        assert journal is not None
        try:
            log.recall_kept(offsets)
        except errors.StorageUnavailable:
            return
        epoch = self.epoch
        rows: list[list[Any]] = []
        for o in offsets:
            entry, (key, headers, due) = log.kept(o)
            rows.append([o, entry.id, epoch + entry.stored_at, entry.payload, key, headers,
                         None if due is None else epoch + due])
        rows.sort(key=lambda row: (math.inf if row[6] is None else row[6], row[0]))
        for written in journal.keep(rows):
            log.kept_written(*written)
        if log.settle_kept(journal.writer.durable):  # (durable once written: fsync never)
            self._recount(topic)

    def _past_kept(self, topic: Topic, sub: Subscription, limit: float, stop: int) -> int:
        """Where cleanup of a topic may trim up to for ``sub`` (at most ``stop``):
        its cursor moved over the offsets it acked and the delayed messages due after
        ``limit``, which the trim keeps out of line (G12: a pending message does not
        hold back the others). Held offsets only: those below the oldest are gone or
        kept already."""
        o = max(sub.cursor, topic.log.oldest)
        acked, delayed = sub.acked, topic.delayed
        while o < stop:
            if o not in acked:
                due = delayed.due_of(o)
                if due is None or due <= limit:
                    break
            o += 1
        return o

    def _release_kept(self, topic: Topic, now: float) -> None:
        """Delete the kept delayed messages now ``ttl`` past their due time and acked by
        every subscription (below every cursor). Looks at none of them before the
        earliest of their due times is ``ttl`` past (unless one waits for a cursor)."""
        log, delayed = topic.log, topic.delayed
        limit = now - topic.settings.ttl
        if limit < delayed.release_at:
            return
        subs = list(topic.subs.values())
        soonest = math.inf

        def done(o: int) -> bool:
            nonlocal soonest
            due = delayed.due_of(o)
            if due is not None and due > limit:
                soonest = min(soonest, due)
                return False
            for sub in subs:
                if o >= sub.cursor and o not in sub.acked:
                    soonest = -math.inf  # it waits for an ack: look again next pass
                    return False
            return True

        gone = log.release(done)
        delayed.release_at = soonest
        if gone and topic.journal is not None:  # released messages stay gone after a restart
            topic.journal.release(gone)
        for o in gone:
            self.counters["trimmed"] += 1
            self._emit("trimmed", topic.name, o, 1)
        if gone:
            self._forget_gone(topic)
            self._recount(topic)

    def _forget_gone(self, topic: Topic) -> None:
        """Forget the runs of delayed messages no longer held (below the lowest offset)."""
        topic.delayed.forget_below(topic.log.lowest)

    def _pending_of(self, topic: Topic, sub: Subscription, now: float) -> int:
        """Delayed messages not due yet that ``sub`` has not acked (its lag leaves them
        out; STATS shows them apart)."""
        return topic.delayed.pending(sub.cursor, sub.acked, now)

    def _due_order(self, sub: Subscription, topic: Topic, start: int, end: int,
                   room: int) -> tuple[list[int], int]:
        """The next at most ``room`` first pushes of ``sub`` in (due, offset) order, and
        where its offset cursor stands after them. Undelayed messages come from
        ``start`` on (skipping delayed and acked offsets), due delayed ones from its due
        heap; none at or past ``end`` (not exposed yet: a disk topic's, G9) is pushed,
        nor anything due after it."""
        log, delayed, acked, heap = topic.log, topic.delayed, sub.acked, sub.due_heap
        epoch, stored = self.epoch, log.next_offset
        picks: list[int] = []
        o = start
        while len(picks) < room:
            while o < stored:  # the next undelayed offset not acked (runs passed at once)
                o = delayed.undelayed_from(o)
                if o not in acked:
                    break
                o += 1
            while heap and not _wants(sub, heap[0][1]):
                heapq.heappop(heap)  # acked meanwhile (or below the cursor)
            main = (epoch + log.stored_at(o), o) if o < stored else None
            if heap and (main is None or heap[0] < main):
                if heap[0][1] >= end:
                    break
                picks.append(heapq.heappop(heap)[1])
            elif main is not None and o < end:
                picks.append(o)
                o += 1
            else:
                break
        return picks, o


class KeepDelayed:
    """For :meth:`TopicLog.trim`: which offsets of a range it drops stay held out of line
    (delayed messages not ``ttl`` past their due time); ``kept`` collects them."""

    __slots__ = ("delayed", "kept", "limit")

    def __init__(self, delayed: TopicDelays, limit: float) -> None:
        self.delayed = delayed
        self.limit = limit
        self.kept: list[int] = []

    def __call__(self, start: int, stop: int) -> list[int]:
        keep = self.delayed.keep(start, stop, self.limit) if self.delayed else []
        if keep:
            self.kept += keep
            self.delayed.release_at = -math.inf  # one may be due before those kept so far
        return keep


def _wants(sub: Subscription, offset: int) -> bool:
    """Whether ``sub``'s attached session has still to first-push ``offset``."""
    return (offset >= sub.cursor and offset >= sub.attached_from and offset not in sub.acked
            and offset not in sub.due_pushed and offset not in sub.in_flight)
