"""Checks on pushes and acks per subscription: order and windows (G1), what may be
redelivered and when (G4), generations never mixed (G7)."""

from __future__ import annotations

from dataclasses import dataclass, field

from flux.shard.server import DRAIN_GRACE
from flux.sim import history as h
from flux.sim.checker import Report
from flux.sim.checker.delayed import delayed_topics
from flux.sim.checker.index import Incarnation, Index, Session


@dataclass
class _State:
    """What one session has seen so far (client side)."""

    last_first: int = -1
    unacked: dict[int, None] = field(default_factory=dict)   # delivered, no ack sent yet
    delivered: set[int] = field(default_factory=set)
    attempts: dict[int, int] = field(default_factory=dict)
    pushes: dict[int, list[tuple[float, int]]] = field(default_factory=dict)
    ack_sent: dict[int, float] = field(default_factory=dict)  # offset -> first ack sent
    last_repush: dict[int, int] = field(default_factory=dict)  # attempt -> offset last pushed
    top: int = -1                      # the highest offset delivered
    # offsets a cumulative ack does not cover: a shared subscription's pushes below one
    # delivered before (G10), which the shard acks by offset only
    late: set[int] = field(default_factory=set)
    naked: set[int] = field(default_factory=set)   # nak'd and not delivered again since
    # offsets a nak, term or in_progress was sent for (G11): off G4's schedule; the
    # G11 rules judge them
    settled: set[int] = field(default_factory=set)

    def covered(self, through: int, sent: float) -> set[int]:
        """What ``through`` acks on the shard: offsets delivered before the ACK left
        (``sent``), up to it, but no late one."""
        return {o for o, pushes in self.pushes.items()
                if o <= through and pushes[0][0] <= sent and o not in self.late}


class _Confirmed:
    """Acks and cursors the shard confirmed to any session of one subscription, with
    when (the reply's arrival) and where.

    The shard's cursor never moves back. Replies on one connection arrive in the order
    the shard sent them; across connections a reply may be held up for any time (a
    stall), so only a reply that arrived before a request was sent surely came from
    an earlier state of the shard than that request's answer.
    """

    def __init__(self) -> None:
        self.cursors: list[tuple[float, int, int]] = []      # (t, session, cursor)
        self.offsets: dict[int, list[tuple[float, int]]] = {}  # offset -> [(t, session)]

    def cursor_before(self, session: int, sent: float) -> int:
        """The highest cursor the shard surely had before it answered a request that
        ``session`` sent at ``sent``: one confirmed earlier to that session (its
        connection keeps order) or to any session before ``sent``."""
        return max((cursor for at, where, cursor in self.cursors
                    if where == session or at < sent), default=-1)

    def cursor_sent_before(self, t: float) -> int:
        """The highest cursor confirmed to any session before ``t``: the shard had moved
        it there before it could see a request sent at ``t``, however slow the links."""
        return max((cursor for at, _, cursor in self.cursors if at < t), default=-1)

    def acked(self, offset: int, session: int, since: float) -> bool:
        """Whether the shard surely knew ``offset`` acked before it pushed it to ``session``:
        confirmed to that session (replies on one connection keep their order), or to
        another one before ``since``, when ``session``'s SUBSCRIBE was sent (a push of
        it can only follow that, however slow the links)."""
        if offset < self.cursor_before(session, since):
            return True
        return any(where == session or at < since for at, where in self.offsets.get(offset, ()))


class _AcksSent:
    """The offsets some session of one subscription sent an ack for, and the lowest
    offset at or above its start that no ack covered yet.

    Rule G6/cursor-past-unacked: the cursor a SUBSCRIBED or ACKED reply reports is the
    lowest unacked offset, so every offset from the subscription's start up to it was
    acked before the shard answered, and so by an ack sent before the reply arrived.
    Sound under any delay and fault: an ack counts from when it left the client, an
    ``ack_through(n)`` for every offset up to n this session received (the shard's
    own view of what it covers is no larger: first pushes go in offset order on the
    session's one connection, and a re-push follows a first push), and acks of
    sessions the shard refused (taken over) count too; a subscription deleted and
    made again is another incarnation with its own start."""

    def __init__(self, start: int) -> None:
        self.offsets: set[int] = set()
        self.low = start

    def add(self, covered: set[int]) -> None:
        self.offsets |= covered
        while self.low in self.offsets:
            self.low += 1

    def check(self, e: h.Subscribed | h.AckConfirmed, cursor: int, inc: Incarnation,
              report: Report, dead_letter: bool = False) -> None:
        if dead_letter:  # an exhausted message's dead letter moves the cursor too (G11)
            return
        report.examine("G6", "cursor-past-unacked")
        if cursor > self.low:
            what = "SUBSCRIBED" if isinstance(e, h.Subscribed) else "ACKED"
            report.add("G6", "cursor-past-unacked", e.t,
                       f"{e.subscriber}: {what} reports {inc.topic}/{inc.name} at cursor"
                       f" {cursor}, but no ack for offset {self.low} (at or above its start"
                       f" {inc.start}) was sent before it")


def check(index: Index, report: Report) -> None:
    duplicates = 0
    delayed = delayed_topics(index)  # G12's due order replaces G1's offset order there
    for inc in index.incarnations:
        duplicates += _check_incarnation(index, inc, report, inc.topic in delayed)
    report.count("redeliveries", duplicates)


def _check_incarnation(index: Index, inc: Incarnation, report: Report,
                       delayed: bool = False) -> int:
    states: dict[int, _State] = {}
    confirmed = _Confirmed()
    acks = _AcksSent(inc.start)
    dead_letter = index.params_for(inc.topic).dead_letter  # G11's policy
    redeliveries = 0
    for e in inc.events:
        if isinstance(e, h.Subscribed):
            if e.mode == "push":   # a pull cursor moves by COMMIT (the pull rules')
                acks.check(e, e.cursor, inc, report, dead_letter)
            states[e.session] = _State()
            window = index.sessions[e.session].window(index.params.max_in_flight)
            report.examine("G1", "window")
            if e.max_in_flight > window:
                report.add("G1", "window", e.t,
                           f"{e.subscriber} asked for max_in_flight={e.asked_max_in_flight}"
                           f" (cap {index.params.max_in_flight}); the shard granted"
                           f" {e.max_in_flight}")
            # the shard answered the SUBSCRIBE some time after it was sent: a reply held up
            # on its way (a stall) may report a cursor acks have moved past meanwhile
            before = confirmed.cursor_sent_before(e.requested)
            report.examine("G6", "cursor-moved-back")
            if e.cursor < before:
                report.add("G6", "cursor-moved-back", e.t,
                           f"{e.subscriber} resumed {inc.topic}/{inc.name} at cursor {e.cursor},"
                           f" below the cursor {before} confirmed before it asked")
            confirmed.cursors.append((e.t, e.session, e.cursor))
            continue
        assert isinstance(e, (h.Delivered, h.AckSent, h.AckConfirmed, h.AckRefused,
                              h.TopicWasReset, h.SessionEnded))
        session = index.sessions[e.session]
        st = states[e.session]
        if isinstance(e, h.AckRefused):
            report.examine("G1", "ack-refused")
        if isinstance(e, h.Delivered):
            if e.attempt > 1:
                redeliveries += 1
            _delivered(index, inc, session, st, e, confirmed, report, delayed)
        elif isinstance(e, h.AckSent):
            covered = set(e.offsets) | {o for o in st.delivered if o <= e.through}
            # what the shard surely takes as acked: a shared subscription's late pushes
            # are acked by offset only (G10), so a cumulative ack may leave them
            for o in set(e.offsets) | st.covered(e.through, e.t):
                st.ack_sent.setdefault(o, e.t)
            for o in covered:
                st.unacked.pop(o, None)
            # G11: a term counts as an ack (or a dead letter); a nak frees its window slot
            covered |= set(e.terms)
            for o in (*e.terms, *(n[0] for n in e.naks)):
                st.unacked.pop(o, None)
            st.naked.update(n[0] for n in e.naks)
            st.settled.update(e.terms, e.progress, (n[0] for n in e.naks))
            acks.add(covered)
        elif isinstance(e, h.AckConfirmed):
            acks.check(e, e.cursor, inc, report, dead_letter)
            for o in set(e.offsets) | st.covered(e.through, e.requested):
                confirmed.offsets.setdefault(o, []).append((e.t, e.session))
            # the shard answered the ACK some time after it was sent: a reply held up on
            # its way may arrive after another session's acks moved the cursor on
            before = confirmed.cursor_before(e.session, e.requested)
            report.examine("G6", "cursor-moved-back")
            if e.cursor < before:
                report.add("G6", "cursor-moved-back", e.t,
                           f"{e.subscriber}: ACKED cursor {e.cursor} below the cursor {before}"
                           " confirmed before the ACK was sent")
            confirmed.cursors.append((e.t, e.session, e.cursor))
        elif isinstance(e, h.AckRefused) and e.error == "NotDelivered" and not e.settle \
                and e.offset in st.delivered and (session.end is None or e.t < session.end.t):
                report.add("G1", "ack-refused", e.t,
                           f"{e.subscriber} acked {inc.topic}@{e.offset}, delivered to this"
                           " session, and the shard refused it as not delivered")
    for session in inc.sessions:
        _check_schedule(index, session, states[session.sub.session], report)
        _check_dropped(index, session, report)
    return redeliveries


def _delivered(index: Index, inc: Incarnation, session: Session, st: _State, e: h.Delivered,
               confirmed: _Confirmed, report: Report, delayed: bool = False) -> None:
    p = index.params_for(e.topic)
    where = f"{e.subscriber} session {e.session}: {e.topic}@{e.offset}"
    report.examine("G7", "generations-mixed")
    if e.generation != session.sub.generation:
        report.add("G7", "generations-mixed", e.t,
                   f"{where} of generation {e.generation:#x} on a session of generation"
                   f" {session.sub.generation:#x}")
        return
    if inc.known_start:
        report.examine("G6", "below-start")
    report.examine("G1", "redelivered-acked")
    report.examine("G4", "too-many-pushes")
    if inc.known_start and e.offset < inc.start:
        report.add("G6", "below-start", e.t, f"{where} is below the subscription's start {inc.start}")
    if confirmed.acked(e.offset, e.session, session.sub.requested):
        report.add("G1", "redelivered-acked", e.t,
                   f"{where} attempt {e.attempt} after the shard confirmed its ack")
    # a shared subscription's member gets first pushes in no order among the group's
    # (a key's queued messages, G10), and attempts count the message's pushes to any
    # member: G10's rules judge those (flux.sim.checker.shared)
    shared = session.sub.shared
    if e.attempt == 1:
        if not delayed and not shared:
            report.examine("G1", "order")
        if not p.dead_letter:
            report.examine("G1", "window")
        if e.offset <= st.last_first and not delayed and not shared:
            report.add("G1", "order", e.t,
                       f"{where} first delivered after offset {st.last_first}")
        st.last_first = max(st.last_first, e.offset)
        window = session.window(p.max_in_flight)
        # (with a dead-letter policy an exhausted message leaves the window unseen, G11)
        if e.offset not in st.unacked and len(st.unacked) >= window and not p.dead_letter:
            report.add("G1", "window", e.t,
                       f"{where} pushed while {len(st.unacked)} delivered messages were unacked"
                       f" (max_in_flight={window})")
    elif e.offset not in st.attempts and p.dead_letter:
        pass  # G11: a push count carried from an earlier session (push counts that survive)
    elif not shared:
        previous = st.attempts.get(e.offset, 0)
        report.examine("G4", "attempt-numbering")
        if e.attempt != previous + 1:
            report.add("G4", "attempt-numbering", e.t,
                       f"{where} attempt {e.attempt} follows attempt {previous}")
        # first pushes in due order, or a nak's re-push: a lower offset may come later
        if not delayed and not st.settled and not p.dead_letter:
            _check_repush_order(st, e, where, report)
    if e.attempt > 1 + p.retry_count:
        report.add("G4", "too-many-pushes", e.t,
                   f"{where} pushed {e.attempt} times (retry_count={p.retry_count})")
    st.attempts[e.offset] = e.attempt
    # late (G10): below what was delivered before, and new to the session or back after
    # its nak; a re-push after an ack timeout is not (the member had it)
    if shared and e.offset <= st.top and (e.offset not in st.delivered or e.offset in st.naked):
        st.late.add(e.offset)
    st.naked.discard(e.offset)
    st.top = max(st.top, e.offset)
    st.delivered.add(e.offset)
    if e.offset not in st.ack_sent:
        st.unacked[e.offset] = None
    st.pushes.setdefault(e.offset, []).append((e.t, e.attempt))


def _check_repush_order(st: _State, e: h.Delivered, where: str, report: Report) -> None:
    """G1: the k-th pushes of one session arrive in increasing offset order, for every k.

    Sound under any delay and fault: a session's first pushes go in increasing offset
    order (G1), so a lower offset was first pushed no later than a higher one, and
    its k-th push is due no later (G4: push k at ``t0 + (k-1)(timeout +
    retry_interval)``, the same period for every message). Re-pushes due at the
    same moment go in offset order (G1), and one due earlier is never sent after one
    due later (the shard's timers fire in time order, a pause delays both). A
    session is one connection, which keeps the order of what the shard sent; a
    message acked or exhausted before its k-th push simply has none to compare."""
    report.examine("G1", "repush-order")
    last = st.last_repush.get(e.attempt, -1)
    if e.offset <= last:
        report.add("G1", "repush-order", e.t,
                   f"{where} attempt {e.attempt} pushed after offset {last}'s attempt"
                   f" {e.attempt}: a lower offset's push k is due no later")
    st.last_repush[e.attempt] = max(last, e.offset)


def _check_schedule(index: Index, session: Session, st: _State, report: Report) -> None:
    """G4: push k of an unacked message at t0 + k*(timeout + retry_interval), only it."""
    p = index.params_for(session.sub.topic)
    lat, period = p.latency, p.period
    tol = 2 * lat
    hosts = (session.sub.client, session.host)
    end = session.end.t if session.end is not None else index.end_at
    exhausted = False
    for offset, pushes in st.pushes.items():
        if offset in st.settled:  # a nak, term or in_progress: G11's rules judge it
            exhausted = exhausted or max(a for _, a in pushes) >= 1 + p.retry_count
            continue
        t1 = next((t for t, attempt in pushes if attempt == 1), None)
        if t1 is None:
            continue
        acked_at = st.ack_sent.get(offset)
        where = f"{session.sub.subscriber} session {session.sub.session}: {session.sub.topic}@{offset}"
        for t, attempt in pushes:
            if attempt == 1 or not index.quiet(hosts, t1, t):
                continue
            due = t1 + (attempt - 1) * period
            if acked_at is not None:
                report.examine("G4", "redelivered-after-ack")
            report.examine("G4", "early-redelivery")
            report.examine("G4", "late-redelivery")
            if acked_at is not None and acked_at + lat < t - lat:
                report.add("G4", "redelivered-after-ack", t,
                           f"{where} attempt {attempt} at {t:.3f}, its ack was sent at"
                           f" {acked_at:.3f}")
            elif t < due - tol:
                report.add("G4", "early-redelivery", t,
                           f"{where} attempt {attempt} at {t:.3f}, due at {due:.3f}")
            elif t > due + tol:
                report.add("G4", "late-redelivery", t,
                           f"{where} attempt {attempt} at {t:.3f}, due at {due:.3f}")
        last = max(attempt for _, attempt in pushes)
        if last >= 1 + p.retry_count and p.dead_letter:
            continue  # dead-lettered, the session goes on (G11: the dead-letter rules)
        if last >= 1 + p.retry_count:
            exhausted = True  # pushed 1 + retry_count times: the shard may deactivate
            due = t1 + p.retry_count * period + p.timeout
            what = "deactivated (SubscriptionInactive)"
        else:
            due = t1 + last * period
            what = f"pushed again (attempt {last + 1})"
        if due + tol + lat < end and index.quiet(hosts, t1, due + tol):
            report.examine("G4", "missed-redelivery")
        if (acked_at is None or acked_at > due + lat) and due + tol + lat < end \
                and index.quiet(hosts, t1, due + tol):
            report.add("G4", "missed-redelivery", due,
                       f"{where} unacked since {t1:.3f} was not {what} by {due + tol:.3f}")
    if session.sub.shared:
        return  # another member's message may have used its pushes (G10)
    if session.end is not None and session.end.reason == "inactive":
        report.examine("G4", "spurious-inactive")
    if session.end is not None and session.end.reason == "inactive" and not exhausted:
        report.add("G4", "spurious-inactive", session.end.t,
                   f"{session.sub.subscriber} session {session.sub.session} was made inactive"
                   " though no message used all its pushes")


def _check_dropped(index: Index, session: Session, report: Report) -> None:
    """A healthy session (client pinging, no fault near it) is never cut by the broker."""
    end = session.end
    if end is None or end.reason != "lost" or not index.history.meta.get("close_reasons"):
        return  # (a recorder that does not tell "lost" from "closed" sets no close_reasons)
    p = index.params
    incarnation = session.sub.shard_generation or session.sub.generation
    stopped = index.stopped.get(incarnation)
    if stopped is not None and stopped <= end.t + DRAIN_GRACE + p.latency:
        # its shard died, or drained: a draining shard closes its connections first and
        # stops once they are closed, DRAIN_GRACE at the latest (G7)
        return
    report.examine("G6", "dropped-without-cause")
    since = end.t - 2 * p.heartbeat - 2 * p.latency
    if index.quiet((session.sub.client, session.host), since, end.t):
        report.add("G6", "dropped-without-cause", end.t,
                   f"{session.sub.subscriber} session {session.sub.session}: the broker closed"
                   " its connection though no fault touched it")
