"""Client-side state of one push subscription: buffer, credit, acks, resume (sans-IO).

:class:`AckSession` tracks one attachment (one SUBSCRIBED reply): what it
delivered and what the user acked, and turns queued acks into ACK contents
without ever acking cumulatively past an offset the user has not acked.
:class:`SubState` owns the buffer, credit and errors across attachments. Neither
builds frames nor knows connections; :mod:`flux.client.core` does.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

from flux import errors
from flux.client.types import Message, SubscribeInfo, Waiter, Wakeable

Status = Literal["waiting", "subscribing", "active", "ended", "closed"]

# Acks wait (to share an ACK frame) only while the consumer still has buffered
# messages to go through, for at most ACK_DELAY seconds and ACK_BATCH acks, so a
# slow consumer never holds acks long enough to cause redeliveries.
ACK_DELAY = 0.005
ACK_BATCH = 256


class AckSession:
    """Deliveries and user acks of one attachment of a subscription."""

    __slots__ = ("acked", "confirmed", "delivered", "generation", "next_offset", "order", "queued",
                 "sid")

    def __init__(self, sid: int, generation: int, cursor: int) -> None:
        self.sid = sid
        self.generation = generation
        self.order: deque[int] = deque()   # first deliveries, increasing (G1)
        self.delivered: set[int] = set()   # offsets in ``order``
        self.acked: set[int] = set()       # user-acked offsets >= ``confirmed``
        self.queued: list[int] = []        # user acks not sent yet
        self.confirmed = cursor            # the shard's cursor: everything below is acked
        self.next_offset = cursor          # one past the highest offset delivered

    def __repr__(self) -> str:
        return (f"<AckSession sid={self.sid} gen={self.generation:#x} confirmed={self.confirmed}"
                f" next={self.next_offset} unacked={len(self.order)} queued={len(self.queued)}>")

    def deliver(self, offset: int) -> None:
        if offset not in self.delivered and not self.is_acked(offset):
            self.order.append(offset)
            self.delivered.add(offset)
        if offset >= self.next_offset:
            self.next_offset = offset + 1

    def seen(self, offset: int) -> bool:
        return offset in self.delivered or self.is_acked(offset)

    def is_acked(self, offset: int) -> bool:
        return offset < self.confirmed or offset in self.acked

    def ack(self, offset: int) -> bool:
        """Record a user ack; False if it was already acked."""
        if self.is_acked(offset):
            return False
        self.acked.add(offset)
        self.queued.append(offset)
        return True

    def low(self) -> int:
        """The lowest offset delivered here that the user has not acked (else next_offset)."""
        order, acked, delivered = self.order, self.acked, self.delivered
        while order and (order[0] < self.confirmed or order[0] in acked):
            delivered.discard(order.popleft())
        return order[0] if order else self.next_offset

    def take_ack(self) -> tuple[list[int], int] | None:
        """Explicit offsets and a cumulative ``through`` (-1: none) for one ACK frame.

        ``through`` is only used below :meth:`low`, so it never covers an offset
        delivered to this session that the user has not acked (DESIGN §1, Acks).
        """
        if not self.queued:
            return None
        queued = self.queued
        self.queued = []
        low = self.low()
        below = [o for o in queued if o < low]
        if len(below) >= 2:
            through = max(below)
            return sorted(o for o in queued if o > through), through
        return sorted(queued), -1

    def confirm(self, cursor: int) -> None:
        """The shard's cursor after an ACKED: forget acks below it."""
        if cursor > self.confirmed:
            self.confirmed = cursor
            if self.acked:
                self.acked = {o for o in self.acked if o >= cursor}


class SubState(Wakeable):
    """A push subscription as the client keeps it, across reconnects."""

    def __init__(self, topic: str, name: str | None, *, read_old: bool, from_offset: int | None,
                 max_in_flight: int | None, prefetch: int, on_reset: str, deadline: float) -> None:
        super().__init__()
        self.topic = topic
        self.name = name
        self.read_old = read_old
        self.from_offset = from_offset
        self.max_in_flight = max_in_flight
        self.prefetch = prefetch
        self.on_reset = on_reset
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
        self.buffered: set[int] = set()       # offsets in ``buffer``
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
        return {
            "topic": self.topic, "name": self.name, "mode": "push",
            "read_old": self.read_old and not resuming,
            "from_offset": self.resume_offset if resuming else self.from_offset,
            "max_in_flight": self.max_in_flight, "credit": self.prefetch,
            "generation": self.generation, "on_reset": self.on_reset,
        }

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
            self.ack_on_arrival |= session.acked
        # unconsumed messages come again from the shard's cursor; their credit resets
        self.buffer.clear()
        self.buffered.clear()
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

    def deliver(self, sid: int, generation: int, items: list[list[Any]]) -> tuple[bool, int]:
        """A DELIVER frame; returns (buffer was empty and now is not, credit to give back)."""
        session = self.session
        if session is None or session.sid != sid:
            return False, 0
        was_empty = not self.buffer
        credit_back = 0
        if not self.ack_on_arrival:
            # the usual case, first deliveries only: session.deliver inlined (hot path)
            topic, acker = self.topic, self.acker
            buffer_append, buffered_add = self.buffer.append, self.buffered.add
            delivered, acked, confirmed = session.delivered, session.acked, session.confirmed
            order_append, delivered_add = session.order.append, delivered.add
            rest: list[list[Any]] = []
            top = -1
            for item in items:
                offset, message_id, payload, timestamp, attempt = item
                if attempt != 1:
                    rest.append(item)
                    continue
                if offset not in delivered and offset >= confirmed and offset not in acked:
                    order_append(offset)
                    delivered_add(offset)
                if offset > top:
                    top = offset
                buffer_append(Message(topic, offset, generation, message_id, payload, timestamp,
                                      1, session, acker))
                buffered_add(offset)
            if top >= session.next_offset:
                session.next_offset = top + 1
            if not rest:
                return was_empty and bool(self.buffer), 0
            items = rest
        for offset, message_id, payload, timestamp, attempt in items:
            if attempt == 1 and offset in self.ack_on_arrival:
                # the user acked it in an earlier session; ack it here instead of again
                self.ack_on_arrival.discard(offset)
                session.deliver(offset)
                session.ack(offset)
                credit_back += 1
                continue
            if attempt > 1 and (offset in self.buffered or session.is_acked(offset)):
                continue  # still waiting unconsumed here, or already acked: drop it
            session.deliver(offset)
            self.buffer.append(Message(self.topic, offset, generation, message_id, payload,
                                       timestamp, attempt, session, self.acker))
            self.buffered.add(offset)
        return was_empty and bool(self.buffer), credit_back

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
            self.buffered.discard(msg.offset)
            if msg.attempt == 1:
                self.credit_owed += 1
            if session is not None and session.is_acked(msg.offset):
                continue  # acked through an older Message object meanwhile
            return msg
        return None

    @property
    def ack_batch(self) -> int:
        """Acks that go out at once, even while buffered messages remain."""
        return min(ACK_BATCH, max(1, self.prefetch // 4))

    def ack_due_at(self) -> float:
        """When queued acks must go out: ``-inf`` means now, ``inf`` that none are queued."""
        session = self.session
        if session is None or not session.queued:
            return math.inf
        if self.ack_first_at is None or not self.buffer or len(session.queued) >= self.ack_batch:
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

    def credit_due(self) -> int:
        """Credit to send now: coalesced, but never held while the buffer is empty."""
        owed = self.credit_owed
        if owed and (not self.buffer or owed * 4 >= self.prefetch):
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
