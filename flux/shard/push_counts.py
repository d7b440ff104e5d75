"""Push counts that survive (G11): pushes a message used, kept across attachments.

With a dead-letter policy, a plain subscription remembers how many pushes each
unacked message used (``Subscription.push_counts``), so a message that keeps
killing its consumers runs out of pushes even though each new session would
start its counts again (G6). A disk topic journals each count (a PUSHES record)
when the push is made, without holding anything for it: after a restart a count
is at least what its last durable record said. First pushes of an attachment
that carry a count go out as re-pushes (attempt = count + 1, no credit used);
one already out of pushes goes to the dead-letter topic instead.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import takewhile
from typing import TYPE_CHECKING, Any

from flux import errors
from flux.shard.delayed import Delays
from flux.shard.journal import PUSHES
from flux.shard.state import Session, Topic
from flux.shard.subscription import Subscription
from flux.shard.topic import TopicLog


class PushCounts(Delays):
    """Counting, journaling and carrying the pushes each message used."""

    def _count_pushes(self, topic: Topic, sub: Subscription, offsets: Sequence[int],
                      pushes: int) -> None:
        """``offsets`` were pushed for the ``pushes``-th time: keep that (a topic with a
        dead-letter policy), and journal it for a named subscription of a disk topic.
        A shared subscription's counts survive too (G10), kept by its members and group
        (:meth:`Subscription.surviving_counts`): only journaled here."""
        shared = sub.group is not None
        if not (topic.settings.dead_letter or shared) or not offsets:
            return
        if not shared:
            sub.push_counts.update(dict.fromkeys(offsets, pushes))
        journal = topic.journal
        if journal is not None and not sub.ephemeral and journal.failed is None:
            journal.append(PUSHES, [sub.name, pushes, _runs(offsets)])

    def _forget_counts(self, sub: Subscription) -> None:
        """Drop the counts of offsets acked since (those below the cursor at once; a
        full sweep only when the map holds many more entries than what is unacked)."""
        counts = sub.push_counts
        cursor = sub.cursor
        # the oldest entries first (counts are made in push order, mostly rising): those
        # below the cursor go, at C speed
        below = list(takewhile(cursor.__gt__, counts))
        if below:
            deque(map(counts.__delitem__, below), 0)
        live = len(sub.in_flight) + len(sub.nak_waiting) + len(sub.dead_pending)
        group = sub.group
        if group is not None:  # a shared one's messages are out with its members
            live += len(group.holder) + len(group.nak_at) + len(group.waiting)
        if len(counts) > 2 * live + 64:
            acked = sub.acked
            sub.push_counts = {o: n for o, n in counts.items() if o >= cursor and o not in acked}

    def _carried(self, sub: Subscription, offsets: Sequence[int]) -> bool:
        """Whether a batch of first pushes holds an offset with a count kept from an
        earlier attachment, or one parked for its dead letter (cheap in the usual case:
        no count kept from before this attachment is of an offset in the batch)."""
        counts, parked = sub.push_counts, sub.dead_pending
        if not counts and not parked:
            return False
        lo = min(offsets) if type(offsets) is not range else offsets.start
        if lo > sub.carry_max and (not parked or max(parked) < lo):
            return False
        return any(o in counts or o in parked for o in offsets)

    def _push_carried(self, session: Session, sub: Subscription, topic: Topic,
                      offsets: Sequence[int], now: float) -> bool:
        """Make a batch of first pushes that holds carried counts or parked offsets:
        parked ones are skipped; one already out of pushes goes to the dead-letter topic;
        the others go with attempt = their count + 1 (an attempt-1 push uses credit).
        False if nothing could be read (a disk topic's damage: nothing done)."""
        assert sub.session is not None
        counts, parked = sub.push_counts, sub.dead_pending
        max_pushes = 1 + topic.settings.retry_count
        plan: list[tuple[int, int]] = []
        for o in offsets:  # in push order: offset order, or due order (G12)
            if o in parked:
                continue
            used = counts.get(o, 0)
            if used >= max_pushes:
                self._dead_letter(topic, sub, o, used, "exhausted", now)
                continue
            plan.append((o, used + 1))
        if not plan:
            self._dirty[id(sub)] = sub  # (as below: nothing took the room)
            return True
        log = topic.log
        by_attempt: dict[int, list[int]] = {}
        for o, pushes in plan:
            by_attempt.setdefault(pushes, []).append(o)
        columns: dict[int, tuple[list[str], list[bytes], list[float | int]]] = {}
        try:  # a disk topic's evicted payloads are read back here
            for pushes, group in by_attempt.items():
                columns[pushes] = self._columns(log, group)
        except errors.StorageUnavailable:
            return False
        in_flight = sub.in_flight
        delayed = topic.delayed
        for o, pushes in plan:  # (a batch of first pushes: above every offset in flight)
            in_flight[o] = pushes
            if o in delayed:
                sub.due_pushed.add(o)
        at = now + topic.settings.timeout
        for pushes, group in sorted(by_attempt.items(), key=lambda e: min(e[1])):
            self._await_ack(session, sub, at, sorted(group), pushes)
            self._count_pushes(topic, sub, group, pushes)
            if pushes == 1:
                sub.credit -= len(group)
                self.counters["delivered"] += len(group)
            else:
                self.counters["redelivered"] += len(group)
                sub.redelivered += len(group)
            self._deliver(session, sub.session[1], topic.generation, pushes, group,
                          *columns[pushes], log.meta_columns(group, self.epoch))
        if len(by_attempt.get(1, ())) < len(offsets):
            # the batch was sized by credit, and a re-push or a dead letter used none: the
            # next messages may fit now (the pump runs again, G2)
            self._dirty[id(sub)] = sub
        return True

    if TYPE_CHECKING:  # what Delivery and DeadLetters provide (ShardCore combines them)
        def _dead_letter(self, topic: Topic, sub: Subscription, offset: int, pushes: int,
                         reason: str, now: float) -> bool: ...

        def _columns(self, log: TopicLog, offsets: Sequence[int]
                     ) -> tuple[list[str], list[bytes], list[float | int]]: ...

        def _await_ack(self, session: Session | None, sub: Subscription, at: float,
                       offsets: Sequence[int], pushes: int) -> None: ...

        def _deliver(self, session: Session, sid: int, generation: int, attempt: int,
                     offsets: Sequence[int], ids: list[str], payloads: Sequence[bytes],
                     times: list[float | int], meta: dict[str, Any] | None = None) -> None: ...


def _runs(offsets: Sequence[int]) -> list[int]:
    """``offsets`` as ``[first, count, ...]`` runs of increasing offsets."""
    if type(offsets) is range:
        return [offsets.start, len(offsets)]
    runs: list[int] = []
    for o in sorted(offsets):
        if runs and runs[-2] + runs[-1] == o:
            runs[-1] += 1
        else:
            runs += (o, 1)
    return runs
