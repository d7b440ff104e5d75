"""The periodic passes: session heartbeats, message cleanup (G5), subscriber cleanup (G6).
"""

from __future__ import annotations

from collections.abc import Sequence

from flux import errors
from flux.shard.dead_letters import DeadLetters
from flux.shard.delayed import KeepDelayed
from flux.shard.state import Topic

# Messages trimmed plus ids forgotten per slice of a cleanup pass. Forgetting an id of
# a big dedup window costs up to ~0.6 us (cache misses in the dict and the allocator),
# so a slice keeps the shard from its sockets for under a millisecond. (Unsliced, one
# pass after a 400k-message burst took 48 ms; slices of 16384 still put 5-10 ms
# stalls, and a p99 of 5 ms, into a latency run 10 s after a burst.)
CLEANUP_SLICE = 1024
# what visiting one topic costs a slice (about as much as trimming a few messages):
# a pass over many idle topics is sliced too
VISIT_COST = 4


class Cleanup(DeadLetters):
    """Heartbeat checks and the two cleanup passes."""

    def _check_sessions(self, now: float) -> None:
        """Close sessions silent for two heartbeats (a paused one is not silent), and
        those without a HELLO after ``limits.hello_timeout``."""
        limit = 2 * self.config.subscriber.heartbeat
        hello_timeout = self.config.limits.hello_timeout
        soonest = now + limit
        for session in list(self.sessions.values()):
            if not session.hello and not session.close:
                hello_by = session.opened_at + hello_timeout
                if hello_by <= now:
                    self._close_session(session, errors.HelloTimeout(
                        f"no HELLO within {hello_timeout:g}s (limits.hello_timeout); closing"),
                        now)
                    continue
                soonest = min(soonest, hello_by)
            if session.paused:
                continue  # its frames wait unread behind its own unread output
            expires = session.last_seen + limit
            if expires <= now:
                self._close_session(session, errors.ProtocolError(
                    f"no frame for {limit:g}s (two heartbeat periods); closing"), now)
            else:
                soonest = min(soonest, expires)
        self._next_session_check = soonest

    def _cleanup_messages(self, now: float) -> bool:
        """G5: delete messages whose ttl expired and that every subscription acked,
        forget expired dedup ids, and retire topics left with nothing. A pass visits
        the topics there were when it began, a slice of work per call (CLEANUP_SLICE,
        a topic visit counting VISIT_COST), so neither a burst of expiries nor many
        topics stall the shard; False means "call again at once" (the next call goes
        on where this one stopped)."""
        pending = self._cleanup_pending
        if pending is None:
            if self._dead_pending:  # dead letters refused earlier: room now? (G11)
                self._retry_dead_letters(now)
            pending = self._cleanup_pending = list(self.topics)
            pending.reverse()  # popped from the end: creation order
        budget = CLEANUP_SLICE
        topics = self.topics
        while pending:
            topic = topics.get(pending[-1])
            if topic is None:
                pending.pop()
                continue
            if budget <= VISIT_COST:
                return False  # no room left for this topic's work: the next slice starts here
            budget -= VISIT_COST
            dedup = topic.dedup
            if dedup.due_at() <= now:
                budget -= dedup.expire(now, budget)
                self._recount(topic)
                if budget <= 0:
                    return False  # this topic may have more: the next slice visits it again
            log = topic.log
            ttl = topic.settings.ttl
            if log.oldest_at() <= now - ttl:
                # a disk topic's messages not yet durable were never exposed: they are
                # held (G5) only once they are (a full disk may keep them waiting long)
                below = log.next_offset if topic.journal is None else topic.journal.exposed
                keep: KeepDelayed | None = None
                if topic.delayed:
                    # held until ttl after it is due, out of line (G12): a pending one at a
                    # subscription's cursor holds back none of the others it acked (G5)
                    keep = self._delay_keep(topic, now)
                    stop = min(below, log.oldest + budget)
                    for sub in topic.subs.values():
                        if sub.cursor < below:
                            below = min(below, self._past_kept(topic, sub, keep.limit, stop))
                else:
                    oldest = log.oldest
                    for sub in topic.subs.values():
                        if sub.cursor < below:
                            # a cursor below the oldest in line (a start at a kept delayed
                            # message since released, G12) sits on offsets gone already:
                            # what it holds starts at its first unacked offset in line
                            below = sub.cursor if sub.cursor >= oldest \
                                else min(below, sub.acked.first_missing(oldest))
                first = log.oldest
                dropped = log.trim(below, now - ttl, budget, keep)
                if dropped:
                    journal = topic.journal
                    if journal is not None:  # trimmed messages stay gone after a restart,
                        # kept ones stay held (their KEEP records first: G12)
                        kept = log.kept_from(first)
                        if kept:
                            self._write_kept(topic, kept)
                        journal.trim(log.oldest)
                    self._recount(topic)
                    for start, count in _runs(first, dropped, keep.kept if keep else ()):
                        self.counters["trimmed"] += count
                        self._emit("trimmed", topic.name, start, count)
                    budget -= dropped
                    if budget <= 0:
                        return False
            if log.lowest < log.oldest:  # kept delayed messages whose time has come
                self._release_kept(topic, now)
            if topic.journal is not None:  # whole log segments with nothing live may go
                moved = topic.journal.retain(log.oldest, self.epoch + now - dedup.window)
                if moved:  # kept messages whose KEEP record would go with them
                    self._write_kept(topic, moved)
            if not topic.subs and not len(log) and not len(dedup) and topic.journal is None:
                self._retire(topic)
            pending.pop()
            if budget <= 0:
                return False
        self._cleanup_pending = None
        return True

    def _retire(self, topic: Topic) -> None:
        """Forget a topic that holds no message, remembers no id and has no
        subscription, keeping only its next offset (a topic used again continues
        from it, G1); one that never stored a message leaves nothing behind."""
        del self.topics[topic.name]
        self.memory -= topic.counted
        next_offset = topic.log.next_offset
        if next_offset:
            self.retired[topic.name] = next_offset
        self._emit("retired", topic.name, next_offset)

    def _cleanup_subscribers(self, now: float) -> None:
        """G6: delete subscriptions inactive for their topic's ``inactive_time``."""
        idle = 2 * self.config.subscriber.heartbeat
        for topic in list(self._subscribed.values()):  # not the topics nobody reads
            inactive_time = topic.settings.inactive_time
            for sub in list(topic.subs.values()):
                if sub.mode == "pull" and sub.active and now - sub.last_activity >= idle:
                    sub.active = False
                    sub.inactive_since = sub.last_activity + idle
                if not sub.active and now - sub.inactive_since >= inactive_time:
                    self._delete_subscription(sub)


def _runs(first: int, count: int, keep: Sequence[int]) -> list[tuple[int, int]]:
    """The runs of offsets ``first`` .. ``first + count - 1`` not in ``keep``."""
    if not keep:
        return [(first, count)]
    runs: list[tuple[int, int]] = []
    start = first
    for o in sorted(o for o in keep if first <= o < first + count):
        if o > start:
            runs.append((start, o - start))
        start = o + 1
    if start < first + count:
        runs.append((start, first + count - start))
    return runs
