"""Push subscriptions in the client core: SUBSCRIBED, DELIVER, SUB_ENDED in; ACK, CREDIT out.

The per-subscription rules (buffer, credit, ack coalescing, resume) live in
:mod:`flux.client.subscription`; this mixin ties them to connections and
request ids. Sans-IO.
"""

from __future__ import annotations

from typing import Any

from flux import errors, protocol
from flux.client.connection import Conn, backoff
from flux.client.requests import deadline_exceeded, retryable
from flux.client.routing import Routing
from flux.client.subscription import SubState
from flux.message_meta import read_columns

P = protocol
REFRESH_MAP = (errors.WrongShard, errors.ShuttingDown)


class Pushes(Routing):
    """Subscription frames of the client core."""

    def _on_subscribed(self, conn: Conn, sub: SubState, sid: int, frame: list[Any],
                       error: errors.FluxError | None, now: float) -> None:
        if sub.sid != sid or sub.status != "subscribing":
            conn.subs.pop(sid, None)
            if error is None:  # unsubscribed meanwhile: detach the session it made
                self._request(conn, [P.UNSUBSCRIBE, next(self._rids), sid], "unsubscribe",
                              (sid, None), now)
            return
        if error is None:
            info = sub.attached(sid, frame[3])
            self._finish(sub.ready, info)
            self._dirty(sub)
            return
        conn.subs.pop(sid, None)
        sub.sid, sub.conn, sub.status, sub.last_error = None, None, "waiting", error
        if retryable(error) and (sub.info is not None or now < sub.deadline):
            if isinstance(error, REFRESH_MAP):
                self._refresh_map(now)
            sub.retry_at = now + backoff(self.rng, sub.attempts)
        elif sub.info is None:
            self._fail(sub.ready, error if not retryable(error)
                       else deadline_exceeded("subscribe", error))
            sub.status = "closed"
            self._forget_sub(sub)
        else:  # e.g. TopicReset with on_reset="raise"
            sub.end(error)
            self._forget_sub(sub)
            self._wake(sub)

    def _on_deliver(self, conn: Conn, frame: list[Any]) -> None:
        count = P.check_deliver(frame)
        # keys, headers and due times, when a message has any (offsets may be out of
        # order and have holes: a delayed message's push order, G12)
        meta = None
        if len(frame) > 8:
            meta = read_columns(frame[8], count)
            frame = frame[:8]
        _, sid, generation, attempt, offsets, ids, payloads, times = frame
        sub = conn.subs.get(sid)
        if sub is None or sub.status != "active":
            return
        woke, credit_back = sub.deliver(sid, generation, attempt,
                                        P.offsets_of(offsets, count), ids, payloads,
                                        P.times_of(times), meta)
        sub.credit_owed += credit_back
        if woke:
            self._wake(sub)
        if sub.credit_owed or (sub.session is not None and sub.session.queued):
            self._dirty(sub)

    def _on_sub_ended(self, conn: Conn, frame: list[Any], now: float) -> None:
        """The shard detached a session (PROTOCOL.md §6.8). After a retryable end
        (StorageUnavailable: its topic's log is being recovered) the subscription
        resumes as after a lost connection: SUBSCRIBE again after a backoff, with
        the generation it knows, retried while the shard answers Busy; the user's
        unacked messages come again (G4; G7 on a new generation). Any other end
        is the user's: the iterator raises it."""
        sid = frame[1]
        sub = conn.subs.pop(sid, None)
        if sub is None or sub.sid != sid or sub.status not in ("active", "subscribing"):
            return
        error = errors.from_code(int(frame[2]), str(frame[3]))
        if retryable(error):
            sub.detached()
            sub.last_error = error
            sub.retry_at = now + backoff(self.rng, sub.attempts)
            return
        sub.end(error)
        self._forget_sub(sub)
        self._wake(sub)

    def _sub_frames(self, conn: Conn, sub: SubState, sid: int, now: float,
                    force: bool = False) -> list[list[Any]]:
        """ACK and CREDIT frames a subscription has due on ``conn`` (acks may be held
        briefly to share a frame; :meth:`Timers.tick` flushes them)."""
        session = sub.session
        if sub.sid != sid or sub.conn != conn.id or sub.status != "active" or session is None:
            return []
        out: list[list[Any]] = []
        ack = sub.take_ack(now, force)
        settle = session.take_settle()
        if ack is not None or settle is not None:
            rid = next(self._rids)
            explicit, through = ack if ack is not None else ([], -1)
            frame: list[Any] = [P.ACK, rid, sid, session.generation, explicit, through]
            if settle is not None:  # nak, term, in_progress (G11; PROTOCOL.md §6.7)
                frame.append(settle)
            out.append(frame)
            terms = [item[0] for item in settle.get("term", ())] if settle is not None else []
            conn.pending[rid] = ("ack", (sub, session, terms))
            conn.timeouts.append((now + self.request_timeout, rid))
        if session.queued:
            self._held_acks[sub.key] = sub
        credit = sub.credit_due()
        if credit:
            out.append([P.CREDIT, sid, credit])
        return out
