"""nak, term and in_progress of pushed messages (G11), per offset of an ACK frame.

An ACK may carry a seventh field, ``{"nak": [[offset, delay], ...], "term":
[[offset, reason], ...], "progress": [offset, ...]}`` (PROTOCOL.md §6.7), applied
before the frame's acks, each item confirmed or refused on its own in ACKED:

- **nak**: the message leaves the in-flight window now and is pushed again at
  ``now + delay`` (that push counts); a nak on its last allowed push exhausts it.
- **term**: no more pushes; it goes to the dead-letter topic (a dead-letter
  policy) or counts as an ack.
- **in_progress**: its ack deadline becomes ``now + timeout``; no push is used.

Only offsets this attachment holds may be settled (others: NotDelivered). Each
function works on one (subscription, offset), so shared groups can call them too.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from flux import errors
from flux.hashing import dead_letter_topic
from flux.message_meta import check_delay
from flux.shard.dead_letters import DeadLetters, dead_letter_reason
from flux.shard.inflight import InFlight
from flux.shard.journal import TopicJournal
from flux.shard.state import Topic
from flux.shard.subscription import Subscription

MAX_REASON_BYTES = 1024   # a term's reason (it becomes the dead letter's flux-reason)


class Settling(DeadLetters):
    """The nak, term and in_progress items of ACK frames, and nak'd messages' timers."""

    def _settle(self, sub: Subscription, topic: Topic, body: Any, refused: list[list[Any]],
                now: float, exhausted: list[tuple[int, int]]) -> list[TopicJournal]:
        """Apply an ACK's settle map; refusals go to ``refused``, and (offset, pushes) of
        messages a nak exhausted without a dead-letter policy to ``exhausted`` (the
        caller ends the attachment once the frame's acks are applied). Returns the
        journals of dead-letter topics written to (a confirmed term is durable, as an
        ack is)."""
        journals: list[TopicJournal] = []
        for name, offset, value in settle_items(body):
            try:
                check_item(name, offset)
                if name == "nak":
                    self._nak(sub, topic, offset, value, now, exhausted)
                elif name == "term":
                    journal = self._term(sub, topic, offset, value, now)
                    if journal is not None and journal not in journals:
                        journals.append(journal)
                else:
                    self._in_progress(sub, topic, offset, now)
            except errors.FluxError as exc:
                refused.append([offset if type(offset) is int else -1, exc.code, str(exc)])
        return journals

    def _held(self, sub: Subscription, offset: int, what: str) -> int:
        """The pushes ``offset`` used if this attachment holds it (pushed, not acked,
        termed or exhausted); else NotDelivered."""
        pushes = sub.in_flight.get(offset)
        if pushes is None and what == "term":
            pushes = sub.nak_waiting.get(offset)
        if pushes is None:
            raise errors.NotDelivered(
                f"offset {offset} is not held by this session (not delivered to it, or"
                f" acked, nak'd, termed or exhausted already): nothing to {what}")
        return pushes

    def _nak(self, sub: Subscription, topic: Topic, offset: int, delay: Any, now: float,
             exhausted: list[tuple[int, int]] | None = None) -> None:
        """nak ``offset``: out of the window now, pushed again at ``now + delay``; on its
        last allowed push, exhausted at once (G11): dead-lettered, or (no dead-letter
        policy) listed in ``exhausted`` for the caller to end the attachment."""
        delay = check_delay(delay, topic.settings.max_delay, "nak delay")
        pushes = self._held(sub, offset, "nak")
        if pushes >= 1 + topic.settings.retry_count:
            if topic.settings.dead_letter or exhausted is None:
                self._exhausted(sub, offset, pushes, now)
                return
            sub.in_flight.pop(offset)  # never acked by the frame's through
            sub.extended.pop(offset, None)
            exhausted.append((offset, pushes))
            return
        sub.in_flight.pop(offset)
        sub.extended.pop(offset, None)
        sub.nak_waiting[offset] = pushes
        heapq.heappush(sub.naks, (now + delay, offset, pushes, sub.epoch))
        self._schedule(sub)
        self._dirty[id(sub)] = sub  # a slot of the window is free

    def _term(self, sub: Subscription, topic: Topic, offset: int, reason: Any,
              now: float) -> TopicJournal | None:
        """term ``offset``: to the dead-letter topic, or (no policy) counted as an ack.
        Returns the dead-letter topic's journal when it wrote a record there."""
        if not isinstance(reason, str) or len(reason.encode("utf-8", "replace")) \
                > MAX_REASON_BYTES:
            raise errors.InvalidRequest(f"a term reason is a string of at most"
                                        f" {MAX_REASON_BYTES} bytes")
        pushes = self._held(sub, offset, "term")
        if topic.settings.dead_letter:
            if self._dead_letter(topic, sub, offset, pushes,
                                 dead_letter_reason("term", reason), now):
                dlq = self.topics.get(dead_letter_topic(topic.name, sub.name))
                return dlq.journal if dlq is not None else None
            return None
        self._count_dead(topic, sub, offset)
        return None

    def _in_progress(self, sub: Subscription, topic: Topic, offset: int, now: float) -> None:
        """in_progress ``offset``: its ack deadline becomes ``now + timeout``."""
        pushes = self._held(sub, offset, "in_progress")
        at = now + topic.settings.timeout
        sub.extended[offset] = at
        sub.add_deadlines(at, [offset], pushes)
        self._schedule(sub)

    def _deferred(self, sub: Any, offset: int, at: float) -> bool:
        """Whether an ack deadline at ``at`` of ``offset`` (of a subscription or a
        member) was put off by in_progress (the later deadline has an entry of its
        own). The later one is kept until the message is pushed again or settled."""
        later = sub.extended.get(offset)
        return later is not None and at < later

    def _overtaken(self, sub: Any, offset: int, at: float, retry_interval: float) -> bool:
        """Whether a re-push at ``at`` of ``offset`` follows an ack deadline that an
        in_progress made after it (in the retry interval) put off: G11's deadline
        becomes now + timeout even once the old one has passed, so it is stale."""
        later = sub.extended.get(offset)
        return later is not None and at < later + retry_interval

    def _due_naks(self, sub: Subscription, now: float) -> list[tuple[float, int, int]]:
        """The nak'd messages due for their re-push by ``now``, as ``_redeliver`` takes
        them, back in the in-flight window (in offset order) with the pushes they used."""
        heap, waiting = sub.naks, sub.nak_waiting
        due: list[tuple[float, int, int]] = []
        while heap and heap[0][0] <= now:
            at, offset, pushes, epoch = heapq.heappop(heap)
            if epoch != sub.epoch or waiting.get(offset) != pushes:
                continue  # acked, termed or detached meanwhile
            del waiting[offset]
            _back_in_flight(sub, offset, pushes)
            due.append((at, offset, pushes))
        return due

    def _ack_waiting(self, sub: Subscription, offset: int) -> bool:
        """An ack of a nak'd message waiting for its re-push: it is acked (no re-push)."""
        if offset not in sub.nak_waiting:
            return False
        sub.nak_waiting.pop(offset)
        return sub.count_acked(offset)

    if TYPE_CHECKING:  # provided by Delivery (ShardCore combines them)
        def _exhausted(self, sub: Subscription, offset: int, pushes: int,
                       now: float) -> bool: ...

        def _schedule(self, sub: Subscription) -> None: ...


def settle_items(body: Any) -> Iterator[tuple[str, Any, Any]]:
    """``(kind, offset, value)`` for each item of an ACK's settle map (``value`` is a nak's
    delay or a term's reason; None for progress). InvalidRequest for a map of the wrong
    shape; an item of the wrong shape comes with ``offset`` None (refuse it alone)."""
    if not isinstance(body, dict):
        raise errors.InvalidRequest("ACK's seventh field must be a map of nak, term and"
                                    " progress items")
    for name in ("nak", "term", "progress"):
        items = body.get(name)
        if items is None:
            continue
        if not isinstance(items, list):
            raise errors.InvalidRequest(f"ACK {name} items must be an array")
        for item in items:
            if name == "progress":
                yield name, item, None
            elif isinstance(item, list) and len(item) == 2:
                yield name, item[0], item[1]
            else:
                yield name, None, item


def check_item(name: str, offset: Any) -> int:
    """``offset`` if a settle item of kind ``name`` named one; else InvalidRequest."""
    if type(offset) is not int:
        raise errors.InvalidRequest(f"a {name} item is " + (
            "an offset" if name == "progress" else "[offset, value]"))
    return int(offset)


def _back_in_flight(sub: Subscription, offset: int, pushes: int) -> None:
    """Put ``offset`` back in the in-flight window, keeping it in offset order."""
    in_flight = sub.in_flight
    if not in_flight or offset > in_flight.last():
        in_flight[offset] = pushes
        return
    items = dict(in_flight.items())
    items[offset] = pushes
    sub.in_flight = InFlight(items)  # sorts them
