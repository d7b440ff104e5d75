"""Checks on what the broker deletes: messages only after ttl and acked-by-all (G5),
subscriptions only after ``inactive_time`` and soon after it, ephemeral ones only when
their session ends (G6).

Trims and subscription deletions are *oracle* facts the simulator reads from the
shard; without them (chaos) only what clients see of G6 is checked. An ephemeral
subscription holds messages until its session ends, on the client's side or (by the
oracle) on the shard's: the client may hear of that late, or never (a partition).
"""

from __future__ import annotations

import math

from flux.sim import history as h
from flux.sim.checker import Report
from flux.sim.checker.delayed import delayed_topics
from flux.sim.checker.index import Incarnation, Index, Session


def check(index: Index, report: Report) -> None:
    _check_trims(index, report)
    _check_gone(index, report)
    _check_subscription_lifetimes(index, report)
    _check_ephemeral_deletions(index, report)


def _ack_times(inc: Incarnation,
               commits: dict[tuple[str, str], list[tuple[float, int | None, int]]],
               settled: dict[int, float] | None = None) -> dict[int, float]:
    """When an ack covering each offset was first sent by any session of ``inc``, or a
    COMMIT past it (pull) named it: any COMMIT of its name and generation (or of no
    stated generation), even one sent to an earlier incarnation, which may arrive late.
    ``settled``: offsets the shard counts acked without an ack (G11: a term sent, a
    dead letter written), from when."""
    delivered: dict[int, set[int]] = {}
    acked: dict[int, float] = dict(settled or {})
    if inc.name is not None:
        through = 0   # every offset below it is committed from the time of the commit
        for t, generation, offset in commits.get((inc.topic, inc.name), ()):
            if generation in (None, inc.generation) and offset > through:
                for o in range(max(through, inc.start), offset):
                    acked.setdefault(o, t)
                through = offset
    for e in inc.events:
        if isinstance(e, h.Delivered):
            delivered.setdefault(e.session, set()).add(e.offset)
        elif isinstance(e, h.AckSent):
            mine = delivered.get(e.session, set())
            for o in set(e.offsets) | {o for o in mine if o <= e.through}:
                if o not in acked or e.t < acked[o]:
                    acked[o] = e.t
    return acked


def _check_trims(index: Index, report: Report) -> None:
    epoch = float(index.history.meta.get("epoch", 0.0))
    stored_at: dict[tuple[str, int, int], float] = {}
    first_attempt: dict[tuple[str, str], float] = {}
    ids: dict[tuple[str, int, int], str] = {}
    for e in index.history:
        if isinstance(e, h.PublishAttempted):
            first_attempt.setdefault((e.topic, e.id), e.t)
        elif isinstance(e, h.PublishAcked):
            ids.setdefault((e.topic, e.generation, e.offset), e.id)
        elif isinstance(e, h.Delivered):
            stored_at.setdefault((e.topic, e.generation, e.offset), e.timestamp - epoch)
            ids.setdefault((e.topic, e.generation, e.offset), e.id)
    by_topic: dict[tuple[str, int], list[Incarnation]] = {}
    for inc in index.incarnations:
        by_topic.setdefault((inc.topic, inc.generation), []).append(inc)
    ack_times: dict[int, dict[int, float]] = {}
    trimmed = 0
    for position, trim in enumerate(index.history.events):
        if not isinstance(trim, h.Trimmed):
            continue
        for offset in range(trim.first, trim.first + trim.count):
            trimmed += 1
            key = (trim.topic, trim.generation, offset)
            message_id = ids.get(key)
            stored = stored_at.get(key)
            if stored is None and message_id is not None:
                stored = first_attempt.get((trim.topic, message_id))
            if stored is not None:
                report.examine("G5", "deleted-before-ttl")
            ttl = index.params_for(trim.topic).ttl
            if stored is not None and trim.t < stored + ttl - 1e-5:  # timestamps: float error
                report.add("G5", "deleted-before-ttl", trim.t,
                           f"{trim.topic}@{offset} deleted {trim.t - stored:.3f}s after it was"
                           f" stored (ttl={ttl:g}s)")
            for inc in _unacked_holders(index, by_topic.get((trim.topic, trim.generation), []),
                                        offset, trim.t, position, ack_times, report,
                                        "deleted-unacked"):
                who = inc.name if inc.name is not None else "an ephemeral subscription"
                report.add("G5", "deleted-unacked", trim.t,
                           f"{trim.topic}@{offset} deleted while subscription {who}"
                           f" (start {inc.start}) had not acked it")
    report.count("trimmed", trimmed)


def _gone_below(e: h.Event, delayed: set[str]) -> tuple[str, int, int] | None:
    """What a reply shows deleted: ``(topic, generation, oldest)``, every offset below
    ``oldest`` gone when the shard answered. A FETCHED reply says what it held; a
    SUBSCRIBED that created a subscription at the oldest held message (``read_old``,
    a ``from_offset`` raised to it, a reset clamped to it) says so by its start, but
    not on a topic that carries delayed messages: delayed ones below that start may
    still be held, out of line (G12)."""
    if isinstance(e, h.Fetched):
        return (e.topic, e.generation, e.oldest)
    if isinstance(e, h.Subscribed) and e.created and e.topic not in delayed and (
            e.read_old or e.reset
            or (e.from_offset is not None and e.start > e.from_offset)):
        return (e.topic, e.generation, e.start)
    return None


def _check_gone(index: Index, report: Report) -> None:
    """G5 from what clients see, whatever path deleted a message (the oracle's trims
    show only the paths that report them): every offset below the oldest a FETCHED or
    SUBSCRIBED reply shows was deleted before that reply arrived, so

    - G5/gone-before-ttl: it was stored at least ``ttl`` earlier, and it was stored
      after its id's first publish attempt was sent;
    - G5/gone-unacked: every subscription that held it then had acked it: one that
      starts at or below it and that surely existed until the reply (the oracle saw
      no deletion before it; an ephemeral one's session was surely attached) held it
      from its creation (its start shows it was not gone then) to the deletion, so an
      ack (or COMMIT) covering it must have been sent before the reply arrived.

    Sound under any delay: only the reply's arrival and the sending of attempts and
    acks are used. Each offset is judged at the first reply that shows it gone (the
    earliest arrival is the strictest test of both rules)."""
    history = index.history
    oracle = bool(history.meta.get("oracle", False))
    first_attempt: dict[tuple[str, str], float] = {}
    ids: dict[tuple[str, int, int], str] = {}
    judged: dict[tuple[str, int], int] = {}
    by_topic: dict[tuple[str, int], list[Incarnation]] = {}
    for inc in index.incarnations:
        by_topic.setdefault((inc.topic, inc.generation), []).append(inc)
    ack_times: dict[int, dict[int, float]] = {}
    delayed = delayed_topics(index)
    for position, e in enumerate(history.events):
        if isinstance(e, h.PublishAttempted):
            first_attempt.setdefault((e.topic, e.id), e.t)
        elif isinstance(e, (h.PublishAcked, h.Delivered)):
            ids.setdefault((e.topic, e.generation, e.offset), e.id)
        elif isinstance(e, h.Fetched):
            for offset, published_id in zip(e.page(), e.ids, strict=False):
                ids.setdefault((e.topic, e.generation, offset), published_id)
        gone = _gone_below(e, delayed)
        if gone is None:
            continue
        topic, generation, oldest = gone
        low = judged.get((topic, generation), 0)
        if oldest <= low:
            continue
        judged[(topic, generation)] = oldest
        ttl = index.params_for(topic).ttl
        # (a start at the oldest held, or at a from_offset, may be a kept delayed
        # message above offsets gone before it was made)
        holders = [inc for inc in by_topic.get((topic, generation), ())
                   if inc.known_start and inc.created_at <= e.t
                   and not inc.below_gaps] if oracle else []
        for offset in range(low, oldest):
            report.examine("G5", "gone-before-ttl")
            known = ids.get((topic, generation, offset))
            tried = first_attempt.get((topic, known)) if known is not None else None
            if tried is not None and e.t < tried + ttl - 1e-5:
                report.add("G5", "gone-before-ttl", e.t,
                           f"{topic}@{offset} (generation {generation:#x}) was gone at {e.t:.3f},"
                           f" less than ttl={ttl:g}s after its first publish at {tried:.3f}")
            for inc in _unacked_holders(index, holders, offset, e.t, position, ack_times,
                                        report, "gone-unacked"):
                who = inc.name if inc.name is not None else "an ephemeral subscription"
                report.add("G5", "gone-unacked", e.t,
                           f"{topic}@{offset} was gone at {e.t:.3f} though subscription"
                           f" {who} (start {inc.start}) had sent no ack for it")


def _unacked_holders(index: Index, incarnations: list[Incarnation], offset: int, t: float,
                     position: int, ack_times: dict[int, dict[int, float]], report: Report,
                     rule: str) -> list[Incarnation]:
    """The incarnations that surely held ``offset`` at ``t`` (history event ``position``)
    with no ack for it sent by then, nor a dead letter (G11) written by then as far as
    the reads of its dead-letter topic show: a deletion of it by ``t`` broke G5 for each.
    ``ack_times`` caches each incarnation's ack times (by ``id``)."""
    unacked = []
    for inc in incarnations:
        if not _held_for(index, inc, offset, t, position):
            continue
        report.examine("G5", rule)
        if id(inc) not in ack_times:
            ack_times[id(inc)] = _ack_times(inc, index.commits, index.settled(inc))
        sent = min(ack_times[id(inc)].get(offset, math.inf),
                   index.unseen_letter_from(inc, offset))
        if sent > t:
            unacked.append(inc)
    return unacked


def _held_for(index: Index, inc: Incarnation, offset: int, t: float, position: int) -> bool:
    """Whether ``inc`` certainly existed at ``t`` (event ``position`` of the history) and
    had to ack ``offset`` first."""
    if offset < inc.start:
        return False
    # not once its shard deleted it (the oracle's word; for an ephemeral one the client
    # may not have heard of it yet, its session having ended on the shard's side): by
    # history order, so a trim at the same instant but before the deletion is checked
    if inc.deleted_event is not None and inc.deleted_event < position:
        return False
    # first seen after its shard stopped, and that after ``t``: what the shard did before
    # the stop and had not made durable (a deletion of this subscription, the trim) may
    # have been lost with it, the subscription and the messages coming back at recovery
    # (G9). Otherwise it held the offset at ``t``: it starts at or above what was held
    # when it was made, and a trimmed offset never comes back without a stop. Not a
    # start at the oldest held or at a from_offset on a topic that carries delayed
    # messages (perhaps a kept delayed message below offsets gone before it was made,
    # G12): that says so only if it was made before ``t``
    if inc.created_at > t and (inc.below_gaps or index.stopped_between(
            inc.sessions[0].sub.shard, t, inc.created_at)):
        return False
    if inc.name is not None:
        return True
    # ephemeral: only while its one session is surely attached
    session = inc.sessions[0]
    lat = index.params.latency
    if session.sub.t > t - lat:
        return False
    end = session.end
    return end is None or (end.reason != "lost" and end.t > t + lat)


def _check_ephemeral_deletions(index: Index, report: Report) -> None:
    """G6: a shard deletes an ephemeral subscription only when its session ends there
    (UNSUBSCRIBE, the connection closing, two silent heartbeat periods, a message out
    of pushes). With no fault near, the client hears of each of these within the latency
    bound, or it ended the session itself: a deletion it never hears of is not one."""
    lat = index.params.latency
    for inc in index.incarnations:
        if inc.name is not None or inc.deleted_event is None:
            continue
        gone = index.history.events[inc.deleted_event].t
        session = inc.sessions[0]
        heard_by = gone + 2 * lat
        if heard_by < index.end_at:
            report.examine("G6", "deleted-without-cause")
        if heard_by >= index.end_at or (session.end is not None and session.end.t <= heard_by):
            continue
        since = gone - 2 * index.params.heartbeat - 2 * lat
        if index.quiet((session.sub.client, session.host), since, heard_by):
            report.add("G6", "deleted-without-cause", gone,
                       f"{session.sub.subscriber} session {session.sub.session}: its shard"
                       f" deleted the ephemeral subscription at {gone:.3f}, though no fault"
                       f" touched it and the session had not ended by {heard_by:.3f}")


def _pull_activity(index: Index) -> dict[tuple[str, int, str | None], list[tuple[float, float]]]:
    """Every FETCH or COMMIT a pull subscription answered (it existed, and was active,
    when the shard handled it, which was after it was sent): (sent, answered) by key."""
    seen: dict[tuple[str, int, str | None], list[tuple[float, float]]] = {}
    for e in index.history:
        if isinstance(e, (h.Fetched, h.Committed)) and e.name is not None \
                and e.generation is not None:
            seen.setdefault((e.topic, e.generation, e.name), []).append((e.requested, e.t))
    return seen


def _check_subscription_lifetimes(index: Index, report: Report) -> None:
    oracle = bool(index.history.meta.get("oracle", False))
    by_key: dict[tuple[str, int, str | None], list[Incarnation]] = {}
    for inc in index.incarnations:
        if inc.name is not None:
            by_key.setdefault(inc.key, []).append(inc)
    pulled = _pull_activity(index) if oracle else {}
    for incs in by_key.values():
        for i, inc in enumerate(incs):
            successor = incs[i + 1] if i + 1 < len(incs) else None
            p = index.params_for(inc.topic)
            evidence = max(index.last_attached(s) for s in inc.sessions)
            if inc.deleted_at is not None:
                # a FETCH or COMMIT naming it, answered before the oracle saw it deleted,
                # was handled (after it was sent) by it or by one deleted before it was
                # created: either way it cannot go inactive_time after that sending
                evidence = max([evidence] + [sent for sent, t in pulled.get(inc.key, ())
                                             if t < inc.deleted_at])
            earliest = evidence + p.inactive_time
            gone = inc.deleted_at
            if gone is None and successor is not None:
                gone = successor.created_at  # deleted at the latest when re-created
            if gone is not None and not inc.died_with_shard:
                report.examine("G6", "deleted-too-early")
            if gone is not None and gone < earliest - 1e-9 and not inc.died_with_shard:
                report.add("G6", "deleted-too-early", gone,
                           f"subscription {inc.topic}/{inc.name} deleted at {gone:.3f}, but it was"
                           f" attached at {evidence:.3f} (inactive_time={p.inactive_time:g}s)")
            _check_kept_too_long(index, inc, successor, oracle, report)


def _member_overlaps(session: Session, sessions: list[Session], t1: float, t2: float) -> bool:
    """Whether another session of a shared subscription may have been attached at some
    time in [t1, t2] (asked to attach by t2, not ended before t1)."""
    return any(other is not session and other.sub.requested <= t2
               and (other.end is None or other.end.t >= t1) for other in sessions)


def _check_kept_too_long(index: Index, inc: Incarnation, successor: Incarnation | None,
                         oracle: bool, report: Report) -> None:
    """After an unsubscribe or SubscriptionInactive the shard holds the subscription
    inactive (every earlier session was superseded by that one's attach)."""
    p = index.params_for(inc.topic)
    slack = p.inactive_time + p.subscriber_cleanup + 2 * p.latency
    sessions = inc.sessions
    for i, session in enumerate(sessions):
        end = session.end
        if end is None or end.reason not in ("unsubscribed", "inactive"):
            continue
        limit = end.t + slack
        if session.sub.generation not in index.shard_generations:  # a disk topic (G9)
            limit = index.recovered_deadline(session.sub.shard, end.t, slack)
        if session.sub.shared and _member_overlaps(session, sessions, end.t - p.latency, limit):
            continue  # another member was (or may have been) attached: still active (G10)
        host = session.host
        following = sessions[i + 1] if i + 1 < len(sessions) else None
        if following is not None:
            if following.sub.requested <= end.t:
                continue
            report.examine("G6", "kept-too-long")
            if following.sub.requested > limit and index.quiet((host,), end.t, limit):
                report.add("G6", "kept-too-long", following.sub.t,
                           f"subscription {inc.topic}/{inc.name} inactive since {end.t:.3f} still"
                           f" existed at {following.sub.requested:.3f}")
            continue
        if not oracle or not index.quiet((host,), end.t, limit):
            continue
        report.examine("G6", "kept-too-long")
        gone = inc.deleted_at
        if gone is None and successor is not None:
            gone = successor.created_at
        if (gone is None and index.end_at > limit) or (gone is not None and gone > limit):
            report.add("G6", "kept-too-long", limit,
                       f"subscription {inc.topic}/{inc.name} inactive since {end.t:.3f} was not"
                       f" deleted by {limit:.3f} (inactive_time + cleanup_time)")
