"""Client-side state of one push subscription: buffer, credit, acks, resume (sans-IO).

:class:`AckSession` tracks one attachment (one SUBSCRIBED reply): what it
delivered and what the user acked, and turns queued acks into ACK contents
without ever acking cumulatively past an offset the user has not acked.
:class:`SubState` owns the buffer, credit and errors across attachments. Neither
builds frames nor knows connections; :mod:`flux.client.core` does.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from itertools import islice, repeat
from operator import lt
from typing import Any, Literal

from flux import errors
from flux.acks import Acks
from flux.client.types import Message, SubscribeInfo, Waiter, Wakeable

Status = Literal["waiting", "subscribing", "active", "ended", "closed"]

# Acks wait to share an ACK frame, for at most ACK_DELAY seconds and ``ack_batch``
# (at most ACK_BATCH) acks, so a slow consumer never holds acks long enough to
# cause redeliveries, and a fast one sends an ACK per batch, not per DELIVER.
ACK_DELAY = 0.005
ACK_BATCH = 256


class AckSession:
    """Deliveries and user acks of one attachment of a subscription.

    Both are held as runs of offsets (:class:`~flux.acks.Acks`): a message held
    unacked (a long job, a nak with a delay, a poison message) keeps every later
    delivery and ack until the shard's cursor passes it, and as runs they cost
    what their gaps cost, not ~100 bytes a message. :meth:`low` drops the
    deliveries below the lowest one not acked.
    """

    __slots__ = ("acked", "confirmed", "delayed", "deliveries", "generation", "next_offset",
                 "queued", "sent_top", "settles", "sid", "terming")

    def __init__(self, sid: int, generation: int, cursor: int) -> None:
        self.sid = sid
        self.generation = generation
        self.deliveries = Acks()           # offsets delivered here, from low() on
        self.acked = Acks()                # user-acked offsets >= ``confirmed``
        self.queued: list[int] = []        # user acks not sent yet
        self.sent_top = -1                 # the highest ack taken for an ACK frame
        self.confirmed = cursor            # the shard's cursor: everything below is acked
        self.next_offset = cursor          # one past the highest offset delivered
        # offsets a cumulative ack never covers, acked by offset: delivered delayed
        # messages (DELIVER gave them a due time, G12) and offsets delivered below one
        # delivered before (re-pushes, a shared subscription's hand-offs, G10)
        self.delayed: set[int] = set()
        # nak, term and in_progress items not sent yet (G11): ACK's seventh field; and the
        # offsets termed, not confirmed yet (no cumulative ack covers them meanwhile)
        self.settles: dict[str, list[Any]] = {}
        self.terming: set[int] = set()

    def __repr__(self) -> str:
        return (f"<AckSession sid={self.sid} gen={self.generation:#x} confirmed={self.confirmed}"
                f" next={self.next_offset} unacked={len(self.deliveries)}"
                f" queued={len(self.queued)}>")

    def deliver(self, offset: int) -> None:
        if offset < self.next_offset:
            # below an offset delivered before (a re-push, or a shared subscription's
            # hand-off): the shard never applies a cumulative ack to it, so it is acked
            # by offset (PROTOCOL.md §6.7)
            self.delayed.add(offset)
        if not self.is_acked(offset):
            self.deliveries.add(offset)
        if offset >= self.next_offset:
            self.next_offset = offset + 1

    def deliver_first(self, offsets: Sequence[int]) -> None:
        """First deliveries of one frame: :meth:`deliver` of each, in bulk when they
        continue where the last ones stopped (the usual case)."""
        if not offsets:
            return
        first = offsets[0]
        if first >= self.next_offset and first >= self.confirmed and (
                type(offsets) is range or all(map(lt, offsets, islice(offsets, 1, None)))):
            # nothing at or above next_offset was delivered or acked here yet: a run, or
            # a few (a key-ordered member's keys), added a run at a time
            if offsets[-1] - first == len(offsets) - 1:
                self.deliveries.add_range(first, offsets[-1] + 1)
            else:
                self.deliveries.add_sorted(offsets)
            self.next_offset = offsets[-1] + 1
        else:
            for offset in offsets:
                self.deliver(offset)

    def delivered(self, offset: int) -> bool:
        """Whether ``offset`` was delivered here (an acked one may still count until
        :meth:`low` moves past it; :meth:`is_acked` tells)."""
        return offset in self.deliveries

    def seen(self, offset: int) -> bool:
        return self.delivered(offset) or self.is_acked(offset)

    def is_acked(self, offset: int) -> bool:
        return offset < self.confirmed or offset in self.acked

    def ack(self, offset: int) -> bool:
        """Record a user ack; False if it was already acked."""
        if offset < self.confirmed or not self.acked.add(offset):
            return False
        self.queued.append(offset)
        return True

    def low(self) -> int:
        """The lowest offset delivered here that the user has not acked (else next_offset)."""
        deliveries, acked = self.deliveries, self.acked
        if not deliveries:
            return self.next_offset
        offset: int | None = max(deliveries.min(), self.confirmed)
        while offset is not None:
            offset = acked.first_missing(offset)    # past a run of acks
            if offset in deliveries:
                deliveries.drop_below(offset)       # what lies below is acked: done
                return offset
            offset = deliveries.first_held(offset)  # past a gap in the deliveries
        deliveries.drop_below(self.next_offset)
        return self.next_offset

    def take_ack(self) -> tuple[list[int], int] | None:
        """Explicit offsets and a cumulative ``through`` (-1: none) for one ACK frame.

        ``through`` is only used below :meth:`low`, so it never covers an offset
        delivered to this session that the user has not acked (DESIGN §1, Acks).
        """
        if not self.queued:
            return None
        queued = self.queued
        self.queued = []
        queued.sort()   # each offset once: ack() queues an offset only the first time
        if queued[-1] > self.sent_top:
            self.sent_top = queued[-1]
        explicit: list[int] = []
        if self.delayed:  # the shard applies ``through`` to none of these: by offset
            explicit = [o for o in queued if o in self.delayed]
            if explicit:
                by_offset = set(explicit)
                self.delayed -= by_offset
                queued = [o for o in queued if o not in by_offset]
                if not queued:
                    return explicit, -1
        below = bisect_left(queued, self.low())
        if below >= 2:
            return sorted(queued[below:] + explicit), queued[below - 1]
        return sorted(queued + explicit) if explicit else queued, -1

    def settle(self, offset: int, kind: str, value: Any) -> bool:
        """Queue a nak (``value``: its delay), term (its reason) or in_progress of a message
        delivered here; False if it is acked or termed already. Neither a nak'd nor a
        termed message counts as acked here, so no cumulative ack covers it; a termed
        one does once the shard confirmed the term (:meth:`termed`)."""
        if self.is_acked(offset) or offset in self.terming:
            return False
        if kind == "progress":
            self.settles.setdefault(kind, []).append(offset)
            return True
        self.settles.setdefault(kind, []).append([offset, value])
        if kind == "term":
            self.terming.add(offset)
        return True

    def termed(self, offsets: list[int], refused: set[int]) -> None:
        """An ACKED answered terms of ``offsets``: those not ``refused`` count as acked
        from now on (the shard settled them)."""
        for offset in offsets:
            self.terming.discard(offset)
            if offset not in refused and offset >= self.confirmed:
                self.acked.add(offset)
                self.sent_top = max(self.sent_top, offset)

    def take_settle(self) -> dict[str, list[Any]] | None:
        """The settle map of the next ACK frame, if any item is queued."""
        if not self.settles:
            return None
        settles, self.settles = self.settles, {}
        return settles

    def confirm(self, cursor: int) -> None:
        """The shard's cursor after an ACKED: forget acks below it."""
        if cursor > self.confirmed:
            self.confirmed = cursor
            self.acked.drop_below(cursor)


class SubState(Wakeable):
    """A push subscription as the client keeps it, across reconnects."""

    def __init__(self, topic: str, name: str | None, *, read_old: bool, from_offset: int | None,
                 max_in_flight: int | None, prefetch: int, on_reset: str, deadline: float,
                 shared: bool = False, key_ordered: bool = False) -> None:
        super().__init__()
        self.topic = topic
        self.name = name
        self.read_old = read_old
        self.from_offset = from_offset
        self.max_in_flight = max_in_flight
        self.prefetch = prefetch
        self.on_reset = on_reset
        self.shared = shared                  # a member of a shared subscription (G10)
        self.key_ordered = key_ordered
        self.deadline = deadline              # for the first SUBSCRIBE only
        self.status: Status = "waiting"
        self.conn: int | None = None          # connection id while subscribing/active
        self.sid: int | None = None
        self.session: AckSession | None = None
        self.generation: int | None = None
        self.info: SubscribeInfo | None = None   # the first SUBSCRIBED reply
        self.ready = Waiter()                 # done at the first SUBSCRIBED (or failure)
        self.closing: Waiter | None = None    # unsubscribe in progress
        self.buffer: deque[Message] = deque()
        # acks that go out at once, even while buffered messages remain
        self.ack_batch = min(ACK_BATCH, max(1, prefetch // 4))
        self.ack_on_arrival: set[int] = set()  # user-acked in an earlier session, unconfirmed
        self.resume_offset: int | None = None
        self.credit_owed = 0
        self.ack_first_at: float | None = None  # when the oldest held ack was queued
        self.errors: deque[errors.FluxError] = deque()
        self.fatal: errors.FluxError | None = None
        self.attempts = 0
        self.retry_at = 0.0
        self.last_error: errors.FluxError | None = None
        self.key = 0                          # the core's handle for it
        self.acker: Callable[[Message], None] | None = None

    def __repr__(self) -> str:
        name = f" name={self.name!r}" if self.name is not None else " ephemeral"
        gen = f" gen={self.generation:#x}" if self.generation is not None else ""
        return (f"<Subscription {self.topic}{name} {self.status}{gen} buffered={len(self.buffer)}"
                f" sid={self.sid}>")

    # -- subscribing -------------------------------------------------------------------

    def options(self) -> dict[str, Any]:
        """The SUBSCRIBE body: first time the user's start options, later a resume."""
        resuming = self.info is not None
        body = {
            "topic": self.topic, "name": self.name, "mode": "push",
            "read_old": self.read_old and not resuming,
            "from_offset": self.resume_offset if resuming else self.from_offset,
            "max_in_flight": self.max_in_flight, "credit": self.prefetch,
            "generation": self.generation, "on_reset": self.on_reset,
        }
        if self.shared:
            body["shared"] = True
            body["key_ordered"] = self.key_ordered
        return body

    def attached(self, sid: int, body: dict[str, Any]) -> SubscribeInfo:
        """A SUBSCRIBED reply for ``sid``: a new session starts at the shard's cursor."""
        info = SubscribeInfo.from_reply(body)
        if self.generation is not None and info.generation != self.generation:
            self.ack_on_arrival.clear()  # offsets of two generations never mix (G7)
        self.generation = info.generation
        self.status = "active"
        self.session = AckSession(sid, info.generation, info.cursor)
        self.attempts = 0
        if self.info is None:
            self.info = info
        if self.ack_on_arrival:
            self.ack_on_arrival = {o for o in self.ack_on_arrival if o >= info.cursor}
        return info

    def detached(self) -> None:
        """The session ended without an error (connection lost): resume later."""
        session = self.session
        if session is not None:
            self.resume_offset = session.low()
            self.ack_on_arrival.update(session.acked)
        # unconsumed messages come again from the shard's cursor; their credit resets
        self.buffer.clear()
        self.credit_owed = 0
        self.ack_first_at = None
        self.session = None
        self.sid = None
        self.conn = None
        if self.status in ("subscribing", "active"):
            self.status = "waiting"

    def end(self, exc: errors.FluxError) -> None:
        """The subscription is over with ``exc`` (raised by every later ``next_message``)."""
        self.detached()
        if self.status != "closed":
            self.status = "ended"
            self.fatal = exc
            self.errors.clear()

    # -- messages in -------------------------------------------------------------------

    def deliver(self, sid: int, generation: int, attempt: int, offsets: Sequence[int],
                ids: list[str], payloads: list[bytes], timestamps: Iterable[float],
                meta: tuple[list[Any], list[Any], list[Any]] | None = None) -> tuple[bool, int]:
        """A DELIVER frame (parallel columns, one attempt; ``timestamps`` may be an
        iterator; ``meta`` the keys, headers and due times, if any message has one);
        returns (buffer was empty and now is not, credit to give back)."""
        session = self.session
        if session is None or session.sid != sid:
            return False, 0
        buffer = self.buffer
        was_empty = not buffer
        count = len(offsets)
        if meta is not None and any(d is not None for d in meta[2]):
            session.delayed.update(o for o, d in zip(offsets, meta[2], strict=True)
                                   if d is not None)
        if attempt == 1 and not self.ack_on_arrival:
            # the usual case, first deliveries only: one bulk step per array (hot path)
            session.deliver_first(offsets)
            # Message(...) of each, built by C code (tuple.__new__ is Message.__new__'s body);
            # with no key, header or due time in the frame, the shorter tuple
            columns = [repeat(self.topic, count), offsets, repeat(generation, count), ids,
                       payloads, timestamps, repeat(1, count), repeat(session, count),
                       repeat(self.acker, count)]
            if meta is not None:
                columns += meta
            buffer.extend(map(tuple.__new__, repeat(Message, count), zip(*columns, strict=True)))
            return was_empty and bool(buffer), 0
        keys, headers, dues = meta if meta is not None else (
            repeat(None, count), repeat(None, count), repeat(None, count))
        credit_back = 0
        # offsets waiting unconsumed: a re-push of one of them is dropped
        buffered = {msg.offset for msg in buffer} if attempt > 1 else set()
        for offset, message_id, payload, timestamp, key, header, due in zip(
                offsets, ids, payloads, timestamps, keys, headers, dues, strict=True):
            if attempt == 1 and offset in self.ack_on_arrival:
                # the user acked it in an earlier session; ack it here instead of again
                self.ack_on_arrival.discard(offset)
                session.deliver(offset)
                session.ack(offset)
                credit_back += 1
                continue
            if attempt > 1 and (offset in buffered or session.is_acked(offset)
                                or offset in session.terming):
                if offset in buffered:
                    session.delayed.add(offset)  # a re-push: acked by offset (see deliver)
                continue  # still waiting unconsumed here, or already acked (termed): drop it
            session.deliver(offset)
            buffer.append(Message(self.topic, offset, generation, message_id, payload,
                                  timestamp, attempt, session, self.acker, key, header, due))
            buffered.add(offset)
        return was_empty and bool(buffer), credit_back

    def next_message(self) -> Message | None:
        """The next message for the user, or None when none is buffered.

        Raises a pending refused-ack error first, and the fatal error (sticky)
        once the subscription ended.
        """
        if self.errors:
            raise self.errors.popleft()
        if self.fatal is not None:
            raise self.fatal
        buffer, session = self.buffer, self.session
        while buffer:
            msg = buffer.popleft()
            if msg[6] == 1:  # msg.attempt, read as fast as it gets (once per message)
                self.credit_owed += 1
            if session is not None and (msg[1] < session.confirmed or msg[1] in session.acked):
                continue  # acked through an older Message object meanwhile
            return msg
        return None

    def ack_due_at(self) -> float:
        """When queued acks must go out: ``-inf`` means now, ``inf`` that none are queued."""
        session = self.session
        if session is not None and session.settles:
            return -math.inf  # a nak, term or in_progress goes at once
        if session is None or not session.queued:
            return math.inf
        if self.ack_first_at is None or len(session.queued) >= self.ack_batch:
            return -math.inf
        return self.ack_first_at + ACK_DELAY

    def ack_deadline(self) -> float:
        """The latest time held acks may wait until (``inf``: none are held)."""
        session = self.session
        if session is None or not session.queued or self.ack_first_at is None:
            return math.inf
        return self.ack_first_at + ACK_DELAY

    def take_ack(self, now: float, force: bool = False) -> tuple[list[int], int] | None:
        """The contents of an ACK frame if one is due now (or ``force``)."""
        session = self.session
        if session is None or (not force and self.ack_due_at() > now):
            return None
        self.ack_first_at = None
        return session.take_ack()

    def settle(self, msg: Message, kind: str, value: Any) -> bool:
        """Queue a nak, term or in_progress of ``msg`` (G11); True if it was queued (it
        goes out at once). A message of an earlier session or generation is not held
        by this one: nothing is sent."""
        session = self.session
        if self.status != "active" or session is None or msg.generation != self.generation \
                or not (msg._session is session or session.delivered(msg.offset)):
            return False
        return session.settle(msg.offset, kind, value)

    def credit_due(self) -> int:
        """Credit to send now: coalesced into quarters of ``prefetch``. Holding less than
        a quarter never stalls pushes: the shard still has three quarters to use."""
        owed = self.credit_owed
        if owed * 4 >= self.prefetch:
            self.credit_owed = 0
            return owed
        return 0

    # -- acks --------------------------------------------------------------------------

    def ack(self, msg: Message, now: float) -> bool:
        """Queue the user's ack of ``msg``; True if it was queued for this session."""
        if self.status in ("ended", "closed") or msg.generation != self.generation:
            return False  # nothing left to ack: the session or the generation is gone
        session = self.session
        if session is not None and (msg._session is session or session.seen(msg.offset)):
            if not session.ack(msg.offset):
                return False
            if self.ack_first_at is None:
                self.ack_first_at = now
            return True
        # delivered in an earlier session: ack it when this one delivers it again
        self.ack_on_arrival.add(msg.offset)
        return False

    def refused(self, items: list[list[Any]]) -> None:
        """ACKED listed refused acks: surface them as one typed error."""
        offsets = [item[0] for item in items]
        code, message = items[0][1], items[0][2]
        more = f" (and {len(items) - 1} more)" if len(items) > 1 else ""
        exc = errors.from_code(code, f"ack of offset {offsets[0]} refused: {message}{more}",
                               {"offsets": offsets} if len(offsets) > 1 else {"offset": offsets[0]})
        self.errors.append(exc)
