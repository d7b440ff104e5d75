"""G10 checks (shared subscriptions): one member holds a message (and, key-ordered, a
key) at a time, only the holder's ack counts, a key's first pushes go in offset
order, and a message's push count grows across members.

A member *holds* an offset from the DELIVER that reached it until it sent an ack
covering it, or its session ended (for an unsubscribe, when the UNSUBSCRIBE left).
That end is the earliest the shard can have let the message go, so holdings built
this way are never shorter than the shard's: a second member given the message
(or the key) while the first still holds it is a violation. Judged only where no
fault touched either member's links or the shard (a broker that lost a member's
heartbeat rightly hands its messages on) and no message of the subscription was
exhausted around it (that ends every member at once).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from flux.sim import history as h
from flux.sim.checker import Report
from flux.sim.checker.delayed import delayed_topics
from flux.sim.checker.index import Incarnation, Index, Session


@dataclass
class _Holding:
    session: Session
    offset: int
    key: str | None
    attempt: int
    at: float
    until: float = float("inf")


@dataclass
class _Member:
    """One session of a shared subscription, as its client saw it."""

    session: Session
    holdings: list[_Holding] = field(default_factory=list)
    open: dict[int, _Holding] = field(default_factory=dict)
    delivered: set[int] = field(default_factory=set)
    acked: set[int] = field(default_factory=set)   # offsets it sent an ack for
    end: float = float("inf")


def key_of(meta: str | None) -> str | None:
    """The key of a delivery's ``meta`` (:func:`flux.sim.history.meta_key`)."""
    if meta is None:
        return None
    key = json.loads(meta)[0]
    return key if isinstance(key, str) else None


def check(index: Index, report: Report) -> None:
    delayed = delayed_topics(index)
    for inc in index.incarnations:
        if inc.sessions and any(s.sub.shared for s in inc.sessions):
            _check_group(index, inc, report, inc.topic in delayed)


def _check_group(index: Index, inc: Incarnation, report: Report, delayed: bool) -> None:
    members: dict[int, _Member] = {s.sub.session: _Member(s) for s in inc.sessions}
    acked_by: dict[int, list[tuple[float, int]]] = {}  # offset -> (ack sent, session)
    inactive: list[float] = []            # when a member heard its group was exhausted
    key_ordered = any(s.sub.key_ordered for s in inc.sessions)
    for e in inc.events:
        member = members.get(getattr(e, "session", -1))
        if member is None:
            continue
        if isinstance(e, h.Delivered):
            holding = _Holding(member.session, e.offset, key_of(e.meta), e.attempt, e.t)
            if e.offset in member.acked:
                holding.until = e.t  # a re-push that crossed its ack: released already
            if e.offset in member.open:  # a re-push to the holder: one holding after another
                member.open.pop(e.offset).until = e.t
            if holding.until > holding.at:
                member.open[e.offset] = holding
            member.holdings.append(holding)
            member.delivered.add(e.offset)
        elif isinstance(e, h.AckSent):
            # an ack, a nak or a term lets a message go (in_progress keeps it, G11)
            covered = set(e.offsets) | {o for o in member.open if o <= e.through} \
                | {o for o, _ in e.naks} | set(e.terms)
            member.acked |= covered
            for offset in covered:
                acked_by.setdefault(offset, []).append((e.t, e.session))
                if offset in member.open:
                    member.open.pop(offset).until = e.t
        elif isinstance(e, h.AckConfirmed):
            _check_ack_held(inc, member, e, acked_by, report)
        elif isinstance(e, h.SessionEnded):
            end = e.requested if e.requested is not None else e.t
            member.end = min(member.end, end)
            for holding in member.open.values():
                holding.until = min(holding.until, end)
            member.open.clear()
            if e.reason == "inactive":
                inactive.append(e.t)
    holdings = sorted((x for m in members.values() for x in m.holdings), key=lambda x: x.at)
    _check_held_twice(index, inc, holdings, inactive, report,
                      by_key=key_ordered)
    if key_ordered and not delayed:
        _check_key_order(index, inc, holdings, inactive, report)
    _check_push_counts(index, inc, members, holdings, report)


def _disturbed(index: Index, sessions: tuple[Session, ...], t1: float, t2: float,
               inactive: list[float]) -> bool:
    lat = index.params.latency
    hosts = tuple({host for s in sessions for host in (s.sub.client, s.host)})
    if not index.quiet(hosts, t1 - lat, t2 + lat):
        return True
    return any(t1 - lat <= t <= t2 + 2 * lat for t in inactive)


def _check_held_twice(index: Index, inc: Incarnation, holdings: list[_Holding],
                      inactive: list[float], report: Report, *, by_key: bool) -> None:
    """G10/held-twice: a message (key-ordered: a key) is never held by two members at
    once. Member A got it at t1 and still held it (no ack or end sent) when member B got
    it (or a message of the key) at t2 >= t1: the shard pushed A's at s1 <= t1 and B's at
    s2 <= t2; if s2 < s1, B held its one until it acked after t2, so at s1 both did; if
    s2 >= s1, A held its one until at least its ack or end, after t2 >= s2, so at s2 both
    did. Either way two members held it at once."""
    open_by_unit: dict[tuple[str, object], list[_Holding]] = {}
    for held in holdings:
        units: list[tuple[str, object]] = [("offset", held.offset)]
        if by_key and held.key is not None:
            units.append(("key", held.key))
        for unit in units:
            earlier = open_by_unit.setdefault(unit, [])
            earlier[:] = [x for x in earlier if x.until > held.at]
            report.examine("G10", "held-twice")
            for other in earlier:
                if other.session is held.session or held.until <= held.at:
                    continue
                if _disturbed(index, (other.session, held.session), other.at, held.at, inactive):
                    continue
                what = (f"offset {held.offset}" if unit[0] == "offset"
                        else f"key {held.key!r} (offset {held.offset}, while it held"
                             f" offset {other.offset})")
                report.add("G10", "held-twice", held.at,
                           f"{inc.topic}/{inc.name}: {held.session.sub.subscriber} session"
                           f" {held.session.sub.session} was given {what} while"
                           f" {other.session.sub.subscriber} session {other.session.sub.session}"
                           f" held it since {other.at:.3f}")
                break
            earlier.append(held)


def _check_key_order(index: Index, inc: Incarnation, holdings: list[_Holding],
                     inactive: list[float], report: Report) -> None:
    """G10/key-order: a key's first pushes go out in offset order. Within a session (one
    connection keeps order) they arrive in increasing offset order; across two sessions
    whose links no fault touched, one that arrived more than two latency bounds after a
    higher one of its key was sent after it (in one shard incarnation, no message of the
    subscription exhausted between: that starts a round whose first pushes begin again
    at the cursor)."""
    lat = index.params.latency
    last: dict[tuple[int, str], int] = {}
    firsts: dict[str, list[_Holding]] = {}
    for held in holdings:
        if held.attempt != 1 or held.key is None:
            continue
        report.examine("G10", "key-order")
        where = (f"{inc.topic}/{inc.name}: {held.session.sub.subscriber} session"
                 f" {held.session.sub.session} got key {held.key!r} offset {held.offset}")
        previous = last.get((held.session.sub.session, held.key))
        if previous is not None and held.offset < previous:
            report.add("G10", "key-order", held.at, f"{where} after offset {previous}")
        last[(held.session.sub.session, held.key)] = max(previous or -1, held.offset)
        for other in firsts.setdefault(held.key, []):
            if other.offset > held.offset and other.session is not held.session \
                    and held.at - lat > other.at + lat \
                    and other.session.sub.shard_generation == held.session.sub.shard_generation \
                    and not _disturbed(index, (other.session, held.session), other.at, held.at,
                                       inactive):
                report.add("G10", "key-order", held.at,
                           f"{where} (first push) after {other.session.sub.subscriber} got"
                           f" offset {other.offset} of that key at {other.at:.3f}")
                break
        firsts[held.key].append(held)


def _check_push_counts(index: Index, inc: Incarnation, members: dict[int, _Member],
                       holdings: list[_Holding], report: Report) -> None:
    """G10/push-count: a message's push count survives hand-offs and re-attaching: no two
    pushes of it carry one attempt number. Only an exhausted message's count starts
    afresh, and exhaustion ends every member at once (a member may not hear of it: its
    connection may be gone), so two pushes are judged only when a witness shows the group
    was never emptied between them: a member attached before the first was sent (its
    SUBSCRIBED arrived a latency bound before that push arrived, over a quiet link) and
    still a member when the shard sent it something after the second arrived (a
    delivery or ACKED to it, over a quiet link, a bound after it): a session the shard
    ended never gets another DELIVER or ACKED."""
    lat = index.params.latency
    lives: list[tuple[Session, float, list[float]]] = []
    for m in members.values():
        active = [x.at for x in m.holdings] + [
            e.t for e in m.session.events if isinstance(e, h.AckConfirmed)]
        if active:
            lives.append((m.session, m.session.sub.t, active))

    def hosts(s: Session) -> tuple[str, str]:
        return (s.sub.client, s.host)

    def witnessed(first: _Holding, t2: float) -> bool:
        t1 = first.at
        if not index.quiet(hosts(first.session), t1 - lat, t1):
            return False
        for witness, joined, active in lives:
            if joined <= t1 - lat and any(
                    t >= t2 + lat and index.quiet(hosts(witness), t - lat, t) for t in active):
                return True
        return False

    seen: dict[tuple[int, int], _Holding] = {}
    for held in holdings:
        report.examine("G10", "push-count")
        other = seen.get((held.offset, held.attempt))
        if other is not None and other.session is not held.session \
                and witnessed(other, held.at):
            report.add("G10", "push-count", held.at,
                       f"{inc.topic}/{inc.name}: offset {held.offset} pushed to"
                       f" {held.session.sub.subscriber} session {held.session.sub.session}"
                       f" with attempt {held.attempt}, as to {other.session.sub.subscriber}"
                       f" session {other.session.sub.session} at {other.at:.3f}")
        seen[(held.offset, held.attempt)] = held


def _check_ack_held(inc: Incarnation, member: _Member, e: h.AckConfirmed,
                    acked_by: dict[int, list[tuple[float, int]]], report: Report) -> None:
    """G10/ack-not-held: an ack counts only from the member holding the message. An
    offset the shard accepted from a member it was never delivered to (a DELIVER to it
    would have come before the ACKED, on its one connection), while no other session
    had sent an ack of it before the reply came (acking what the subscription acked
    already changes nothing and is not refused), was held by no one or by another."""
    me = member.session.sub.session
    for offset in e.offsets:
        report.examine("G10", "ack-not-held")
        if offset in member.delivered or offset < inc.start:
            continue
        if any(sid != me and t < e.t for t, sid in acked_by.get(offset, ())):
            continue
        report.add("G10", "ack-not-held", e.t,
                   f"{inc.topic}/{inc.name}: {member.session.sub.subscriber} session {me}"
                   f" acked offset {offset}, never delivered to it, and the shard accepted it")
