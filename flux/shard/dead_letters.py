"""Dead-letter topics (G11): where exhausted and termed messages go, in one step.

With policy ``dead_letter: true``, a message that used all its pushes, or was
termed, is stored in its subscription's dead-letter topic (``TOPIC~SUBSCRIPTION``,
on the same shard, with the source's storage) with its payload, id, key and
headers plus reserved ``flux-`` headers saying where it came from and why, and
counts as acked for that subscription. For a disk topic the dead letter is one
PUBLISH record in the dead-letter topic's log; recovery reads the source ack back
from it (:meth:`DeadLetters._reconcile_dead_letters`), so the two never part. A
dead-letter topic that refuses it (full, its log unavailable) leaves the message
unacked and parked (never pushed), counted in STATS; the cleanup pass retries.
:meth:`DeadLetters._dead_letter` is the one entry point; it needs nothing of the
subscription's sessions.
"""

from __future__ import annotations

from typing import Any

from flux import errors
from flux.hashing import dead_letter_parts, dead_letter_topic
from flux.message_meta import make_meta, meta_size
from flux.shard.delayed import record_meta
from flux.shard.journal import PUBLISH
from flux.shard.push_counts import PushCounts
from flux.shard.state import MESSAGE_COST, Topic
from flux.shard.subscription import Subscription

# the reserved headers of a dead letter (names beginning ``flux-`` are the broker's)
H_TOPIC = "flux-topic"
H_OFFSET = "flux-offset"
H_GENERATION = "flux-generation"
H_SUBSCRIPTION = "flux-subscription"
H_PUSHES = "flux-pushes"
H_REASON = "flux-reason"
H_TIME = "flux-time"


def dead_letter_reason(reason: str, detail: str = "") -> str:
    """The ``flux-reason`` header: ``exhausted``, ``term`` or ``term: DETAIL``."""
    return f"{reason}: {detail}" if detail else reason


class DeadLetters(PushCounts):
    """Writing dead letters, parking refused ones, and reading acks back at recovery."""

    def _dead_letter(self, topic: Topic, sub: Subscription, offset: int, pushes: int,
                     reason: str, now: float) -> bool:
        """Write the message at ``offset`` of ``topic`` to ``sub``'s dead-letter topic and
        count it acked for ``sub``: True. False if the dead-letter topic refused it (it
        is then parked: unacked, not pushed, counted; the cleanup pass retries)."""
        log = topic.log
        name = dead_letter_topic(topic.name, sub.name)
        try:
            entry = log.get(offset)
            if entry is None:  # not held (never expected of an unacked message): done
                self._count_dead(topic, sub, offset)
                return True
            key, headers, _ = log.meta_of(offset)
            letter = dict(headers or {})
            letter.update({H_TOPIC: topic.name, H_OFFSET: str(offset),
                           H_GENERATION: str(topic.generation), H_SUBSCRIPTION: sub.name,
                           H_PUSHES: str(pushes), H_REASON: reason,
                           H_TIME: f"{self.epoch + now:.6f}"})
            size = len(entry.id) + len(entry.payload) + meta_size(key, letter)
            dlq = self.topics.get(name)
            if dlq is None:
                dlq = self._new_topic(name)  # StorageUnavailable: no data directory
                self.topics[name] = dlq
                self.retired.pop(name, None)
            self._check_room(dlq, size, now)
        except errors.FluxError as exc:
            self._park(topic, sub, offset, pushes, reason, exc)
            return False
        dlq_log = dlq.log
        meta = make_meta([key], [letter], 1)
        first = dlq_log.extend((entry.id,), [entry.payload], now, meta=meta)
        journal = dlq.journal
        if journal is not None:
            _, ids, packed = dlq_log.last_chunk()
            wall = self.epoch + now
            end = journal.append(PUBLISH, journal.publish_body(
                first, wall, ids, packed, record_meta(meta, None, self.epoch)))
            if journal.last_position >= 0:
                dlq_log.place(journal.last_position, end)
            journal.expose_at(end, dlq_log.next_offset)
            journal.published_at(end, dlq_log.next_offset, wall)
        self._recount(dlq)
        for reader in dlq.subs.values():
            if reader.pushing:
                self._dirty[id(reader)] = reader
        self._count_dead(topic, sub, offset)
        sub.dead_lettered += 1
        self.counters["dead_lettered"] += 1
        self._emit("dead_lettered", topic.name, sub.name, offset, name, first)
        return True

    def _check_room(self, dlq: Topic, size: int, now: float) -> None:
        """Raise why ``dlq`` takes no dead letter of ``size`` bytes now, if it does not."""
        journal = dlq.journal
        if journal is not None:
            if journal.failed is not None:
                raise errors.StorageUnavailable(
                    f"the log of topic {dlq.name!r} is unavailable ({journal.failed})")
            if self.disk_full is not None:
                raise errors.StorageUnavailable(self.disk_full)
            cap = dlq.settings.storage_max_bytes
            if cap and journal.writer.size >= cap:
                raise errors.TopicFull(f"dead-letter topic {dlq.name!r} has"
                                       f" {journal.writer.size} bytes on disk;"
                                       f" storage.max_bytes={cap}")
        if dlq.held_bytes(now) + size > dlq.settings.max_bytes:
            raise errors.TopicFull(f"dead-letter topic {dlq.name!r} holds"
                                   f" {dlq.held_bytes(now)} bytes;"
                                   f" topic.max_bytes={dlq.settings.max_bytes}")
        if self.memory + size + MESSAGE_COST > self.max_memory:
            raise errors.TopicFull(f"shard {self.index} holds about {self.memory} bytes;"
                                   f" shard.max_memory={self.max_memory}")

    def _count_dead(self, topic: Topic, sub: Subscription, offset: int) -> None:
        """A dead letter (or a term without a dead-letter policy) counts as an ack of
        ``offset`` for ``sub``; a disk topic journals the cursor (not waited for here)."""
        if sub.count_acked(offset):
            self.counters["acked"] += 1
            self._dirty[id(sub)] = sub
            sub.drop_acked_deadlines()
            self._journal_cursor(topic, sub)

    def _park(self, topic: Topic, sub: Subscription, offset: int, pushes: int, reason: str,
              exc: errors.FluxError) -> None:
        """The dead-letter topic refused ``offset``: keep it unacked and out of pushes."""
        sub.in_flight.pop(offset, None)
        sub.nak_waiting.pop(offset, None)
        sub.extended.pop(offset, None)
        if offset not in sub.dead_pending:
            sub.dead_letter_refused += 1
            self.counters["dead_letter_refused"] += 1
            self._emit("dead_letter_refused", topic.name, sub.name, offset, str(exc))
        sub.dead_pending[offset] = (pushes, reason)
        self._dead_pending[id(sub)] = sub

    def _retry_dead_letters(self, now: float) -> None:
        """Try the parked dead letters again (each cleanup pass), oldest first per
        subscription, until one is refused again."""
        for key, sub in list(self._dead_pending.items()):
            topic = self.topics.get(sub.topic)
            if sub.deleted or topic is None or topic.subs.get(sub.name) is not sub:
                del self._dead_pending[key]
                continue
            for offset, (pushes, reason) in sorted(sub.dead_pending.items()):
                if offset < sub.cursor or offset in sub.acked or not topic.log.holds(offset):
                    sub.dead_pending.pop(offset, None)
                    continue
                if not self._dead_letter(topic, sub, offset, pushes, reason, now):
                    break
            if not sub.dead_pending:
                del self._dead_pending[key]

    def _reconcile_dead_letters(self, topic: Topic) -> None:
        """After recovery: every dead letter held by a dead-letter topic counts as acked
        for its subscription (the dead letter's one record is the ack's too, G11), for
        ``topic`` as a dead-letter topic or as a source whose dead-letter topics are
        held already."""
        parts = dead_letter_parts(topic.name)
        if parts is not None:
            source = self.topics.get(parts[0])
            if source is not None:
                self._acks_from(topic, source)
            return
        prefix = dead_letter_topic(topic.name, "")
        for name, dlq in list(self.topics.items()):
            if name.startswith(prefix):
                self._acks_from(dlq, topic)

    def _acks_from(self, dlq: Topic, source: Topic) -> None:
        log = dlq.log
        if not log.metas:
            return
        for offset in range(log.oldest, log.next_offset):
            _, headers, _ = log.meta_of(offset)
            if not headers or headers.get(H_TOPIC) != source.name \
                    or headers.get(H_GENERATION) != str(source.generation):
                continue
            sub = source.subs.get(headers.get(H_SUBSCRIPTION, ""))
            try:
                at = float(headers.get(H_TIME, "0"))
                original = int(headers.get(H_OFFSET, "-1"))
            except ValueError:
                continue
            if sub is not None and at >= self.epoch + sub.created_at - 1e-6:
                sub.count_acked(original)

    def _dead_letter_stats(self, topic: Topic) -> dict[str, Any]:
        """What STATS says of ``topic``'s dead letters: each dead-letter topic's size."""
        prefix = dead_letter_topic(topic.name, "")
        held = {name[len(prefix):]: len(dlq.log) for name, dlq in self.topics.items()
                if name.startswith(prefix)}
        return {"dead_letter_held": sum(held.values()), "dead_letter_topics": held}
