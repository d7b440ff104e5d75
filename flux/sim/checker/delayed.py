"""G12 checks (delayed delivery) and the message keys and headers: nothing is pushed
before it is due, a session's first pushes of a topic that carries delayed messages
come in (due time, offset) order, and every message arrives with the key and headers
it was published with.
"""

from __future__ import annotations

import math

from flux.sim import history as h
from flux.sim.checker import Report
from flux.sim.checker.index import Incarnation, Index

# rounding between a due time kept on a shard's clock and one written as wall time
# in a disk topic's log and read back by another incarnation
EPSILON = 1e-6


def delayed_topics(index: Index) -> set[str]:
    """The topics some publish asked to delay (G12 replaces G1's offset order there)."""
    return index.delayed


def check(index: Index, report: Report) -> None:
    topics = delayed_topics(index)
    _check_not_early(index, report)
    _check_due_order(index, report, topics)
    _check_meta(index, report)
    if index.history.meta.get("oracle", False):
        _check_held_back(index, report, topics)


def _check_not_early(index: Index, report: Report) -> None:
    """G12: a message published with ``delay`` d is pushed no earlier than d after the
    first attempt to publish it. Sound under any delay and fault: the shard stores it
    after that attempt left the client, makes it due d later on its own clock (one
    clock in the simulator; a disk topic's log keeps the due time across restarts),
    and a push reaches the client after the shard sent it."""
    first: dict[tuple[str, str], tuple[float, float]] = {}  # (topic, id) -> (sent, delay)
    for e in index.history:
        if isinstance(e, h.PublishAttempted):
            first.setdefault((e.topic, e.id), (e.t, e.delay))
        elif isinstance(e, h.Delivered):
            sent = first.get((e.topic, e.id))
            if sent is None or sent[1] <= 0:
                continue
            report.examine("G12", "pushed-early")
            due = sent[0] + sent[1]
            if e.t < due - EPSILON:
                report.add("G12", "pushed-early", e.t,
                           f"{e.subscriber} got {e.topic}@{e.offset} id={e.id!r} (attempt"
                           f" {e.attempt}) at {e.t:.3f}, published with delay={sent[1]:g} at"
                           f" {sent[0]:.3f}: not due before {due:.3f}")


def _check_due_order(index: Index, report: Report, topics: set[str]) -> None:
    """G12: in one session, first pushes (attempt 1) of a topic that carries delayed
    messages come in increasing (due time, offset) order, an undelayed message being
    due when stored. Sound under any delay and fault: a session is one connection to
    one shard incarnation, which keeps the order the shard sent in; the due time of a
    delayed message is the one DELIVER reports and of another its store time, both on
    that incarnation's wall clock, as the shard orders them; a message due later was
    not due yet when the shard pushed the earlier ones. Equal reported due times are
    not judged by offset: the shard orders by its monotonic clock, and two due times
    that differ there may print as one wall time."""
    last: dict[int, tuple[float, int]] = {}   # session -> (due, offset) of its last first push
    # (a key-ordered shared subscription's member may get a key's queued message late, G10)
    keyed = {s for s, session in index.sessions.items() if session.sub.key_ordered}
    for e in index.history:
        if not isinstance(e, h.Delivered) or e.attempt != 1 or e.topic not in topics \
                or e.session in keyed:
            continue
        due = e.due if e.due is not None else e.timestamp
        report.examine("G12", "due-order")
        previous = last.get(e.session)
        if previous is not None and due < previous[0] - EPSILON:
            report.add("G12", "due-order", e.t,
                       f"{e.subscriber} session {e.session}: {e.topic}@{e.offset} (due"
                       f" {due:.6f}) first pushed after offset {previous[1]} (due"
                       f" {previous[0]:.6f})")
        if previous is None or due > previous[0]:
            last[e.session] = (due, e.offset)


def _check_meta(index: Index, report: Report) -> None:
    """Every message delivered or fetched carries the key and headers its id was published
    with (a producer reuses an id only to retry the same message). Sound under any delay
    and fault: nothing the broker does may change them (a recovery rebuilds them from the
    PUBLISH record)."""
    published: dict[tuple[str, str], str | None] = {}
    for e in index.history:
        if isinstance(e, h.PublishAttempted):
            published.setdefault((e.topic, e.id), e.meta)
        elif isinstance(e, h.Delivered):
            key = (e.topic, e.id)
            if key not in published:
                continue
            report.examine("G2", "meta-changed")
            if e.meta != published[key]:
                report.add("G2", "meta-changed", e.t,
                           f"{e.subscriber} got {e.topic}@{e.offset} id={e.id!r} with key and"
                           f" headers {e.meta}; it was published with {published[key]}")
        elif isinstance(e, h.Fetched) and e.metas:
            for i, (message_id, meta) in enumerate(zip(e.ids, e.metas, strict=False)):
                key = (e.topic, message_id)
                if key not in published:
                    continue
                report.examine("G2", "meta-changed")
                if meta != published[key]:
                    report.add("G2", "meta-changed", e.t,
                               f"{e.subscriber} fetched {e.topic} item {i} id={message_id!r}"
                               f" with key and headers {meta}; it was published with"
                               f" {published[key]}")


def _check_held_back(index: Index, report: Report, topics: set[str]) -> None:
    """G12 (with G5 per message): a pending delayed message does not hold back the
    cleanup of the others. On a topic that carries delayed messages, a message is
    *free* once ``ttl`` passed after its publish was acked and after it was due, and
    every holder confirmed its ack (or was deleted); cleanup trims a prefix, so it must
    be deleted (the oracle's word) within two cleanup periods of the time it is free
    and nothing below it blocks it any more. Below it, an undelayed message blocks
    until it is free, and a delayed one only from ``ttl`` after it is due (before
    that, cleanup keeps it out of line) until it is free; either stops blocking once
    deleted.

    Sound under any delay and fault: every time used is an upper bound of the shard's
    (a publish is stored before its ack arrives, an ack counted before its ACKED
    arrives); the holders are every incarnation of its generation starting at or below
    it; a message any holder settled otherwise (a term, a dead letter), never
    confirmed, or with an offset below it no publish ack shows, is not judged; and one
    shard incarnation serving the generation must be up, with no fault on its host,
    from the moment it is free until the deadline. A disk topic's generation outlives
    its shard's incarnations (G9): it is judged within each incarnation a subscription
    of that generation was made or resumed in, up to the first bit that rots in its
    shard's log meanwhile (the shard may read it back and recover the topic alone, in a
    new generation, at any moment after), and a subscription's deletion lets go of
    nothing if its shard stopped after it (the deletion may not have been durable). A
    subscription of another generation of the topic that never shows up in this one may
    have been carried into it by a recovery (G9: a new generation keeps the named
    subscriptions, from the oldest message): it holds everything until the oracle sees
    it deleted in this generation."""
    epoch = float(index.history.meta.get("epoch", 0.0))
    stored: dict[tuple[str, int], dict[int, tuple[float, float | None]]] = {}
    trimmed: dict[tuple[str, int], dict[int, float]] = {}
    committed: dict[tuple[str, str], list[h.Committed]] = {}
    shard_of: dict[int, int] = {}
    began: dict[int, float] = {}  # shard generation -> when a client first heard it
    # (topic, generation) -> the shard generations that served it (a memory topic's: itself)
    served: dict[tuple[str, int], set[int]] = {}
    # a disk topic's named subscriptions per generation, and when the oracle saw one go: a
    # recovery that starts a new generation carries every subscription of the old one
    # into it, from the oldest message, whether or not a client ever resumes it there
    named: dict[str, dict[str, tuple[float, int]]] = {}  # first seen: when, generation
    gen_seen: dict[tuple[str, int], float] = {}  # when a client first heard of a generation
    deleted_at: dict[tuple[str, int, str], float] = {}
    resumed_at: dict[tuple[str, int, str], float] = {}
    for e in index.history:
        if isinstance(e, (h.PublishAcked, h.Subscribed)):
            gen_seen.setdefault((e.topic, e.generation), e.t)
        if isinstance(e, h.PublishAcked) and e.topic in topics and "~" not in e.topic:
            due = None if e.due is None else e.due - epoch
            stored.setdefault((e.topic, e.generation), {}).setdefault(e.offset, (e.t, due))
        elif isinstance(e, h.Trimmed):
            gone = trimmed.setdefault((e.topic, e.generation), {})
            for o in range(e.first, e.first + e.count):
                gone.setdefault(o, e.t)
        elif isinstance(e, h.Committed):
            committed.setdefault((e.topic, e.name), []).append(e)
        elif isinstance(e, (h.ShardHello, h.ShardStopped)):
            shard_of.setdefault(e.generation, e.shard)
            if isinstance(e, h.ShardHello):
                began.setdefault(e.generation, e.t)
        elif isinstance(e, h.Subscribed) and e.shard_generation is not None \
                and e.generation not in index.shard_generations:
            served.setdefault((e.topic, e.generation), set()).add(e.shard_generation)
            if e.name is not None:
                named.setdefault(e.topic, {}).setdefault(e.name, (e.t, e.generation))
                resumed_at.setdefault((e.topic, e.generation, e.name), e.t)
        elif isinstance(e, h.SubscriptionGone):
            deleted_at.setdefault((e.topic, e.generation, e.name), e.t)
    holders: dict[tuple[str, int], list[tuple[int, _LetGo]]] = {}
    for inc in index.incarnations:
        if (inc.topic, inc.generation) in stored:
            holders.setdefault((inc.topic, inc.generation), []).append(
                (inc.start, _let_go(index, inc, committed)))
    inf = math.inf
    # a bit that rots in a disk topic's log while its shard runs ends that topic's
    # generation whenever the shard reads it back (it recovers the topic alone): no
    # incarnation is known to serve a disk generation past the first rot on its host
    rots: dict[str, list[float]] = {}
    for d in index.disturbances:
        if d.fault == "rot":
            for host in d.hosts:
                rots.setdefault(host, []).append(d.begin)

    def until_rot(begin: float, end: float, shard: int) -> float:
        """``end``, or the first rot on ``shard``'s host within ``begin`` .. ``end``."""
        return min([end] + [t for t in rots.get(f"shard-{shard}", ()) if t >= begin])
    for (topic, generation), messages in stored.items():
        p = index.params_for(topic)
        slack = 2 * p.message_cleanup + 2 * p.latency
        gone = trimmed.get((topic, generation), {})
        disk = generation not in index.shard_generations
        # the spans of the shard incarnations that served this generation
        spans = [(began.get(g, inf) if disk else -inf,
                  min(index.stopped.get(g, index.end_at), index.end_at), shard_of.get(g, -1))
                 for g in (served.get((topic, generation), ()) if disk else (generation,))]
        if disk:
            spans = [(b, until_rot(b, e, n), n) for b, e, n in spans]
        mine = holders.get((topic, generation), [])
        # until when a subscription carried in (first seen in another generation, before
        # this one) may hold all of it unseen: until the oracle saw it deleted in this
        # generation, or a client attached to it here (from then on it is one of ``mine``)
        carried_hold = -inf
        if disk:
            began_at = gen_seen.get((topic, generation), inf)
            for name, (seen, g) in named.get(topic, {}).items():
                if g != generation and seen < began_at:
                    key = (topic, generation, name)
                    carried_hold = max(carried_hold,
                                       min(deleted_at.get(key, inf), resumed_at.get(key, inf)))
        undelayed_block = -inf                 # the latest an undelayed one below blocks
        delayed_blocks: list[tuple[float, float]] = []  # (from, until) of delayed ones
        for offset in range(max(messages, default=-1) + 1):
            known = messages.get(offset)
            free = inf
            if known is not None:
                acked, due = known
                free = max(max(acked, acked if due is None else due) + p.ttl, carried_hold)
                for start, let_go in mine:
                    if start <= offset:
                        t = let_go.get(offset, disk)
                        free = max(free, inf if t is None else t)
            release = min(free, gone.get(offset, inf))
            t = max(free, undelayed_block)
            moved = True
            while moved and t < inf:
                moved = False
                for since, until in delayed_blocks:
                    if since <= t + slack and until > t:
                        t, moved = until, True
            deadline = t + slack
            span = next((s for s in spans if s[0] <= free and deadline < s[1]), None)
            if t < inf and span is not None and index.quiet((f"shard-{span[2]}",), free, deadline):
                report.examine("G12", "cleanup-held-back")
                deleted = gone.get(offset)
                if deleted is None or deleted > deadline:
                    report.add("G12", "cleanup-held-back", deadline,
                               f"{topic}@{offset} (generation {generation:#x}) was acked by"
                               f" every subscription and {p.ttl:g}s old by {free:.3f}, with"
                               f" nothing below it in the way by {t:.3f}, but not deleted by"
                               f" {deadline:.3f}"
                               + ("" if deleted is None else f" (deleted at {deleted:.3f})"))
            if known is not None and known[1] is not None:
                delayed_blocks.append((known[1] + p.ttl, release))
            else:
                undelayed_block = max(undelayed_block, release)


class _LetGo:
    """When the shard surely stopped holding each offset for one incarnation; with a
    deletion, every offset by ``until`` at the latest (``durable_until``: the deletion of
    a disk topic's subscription whose shard did not stop after it)."""

    __slots__ = ("durable_until", "known", "until")

    def __init__(self, known: dict[int, float], until: float | None,
                 durable_until: float | None) -> None:
        self.known = known
        self.until = until
        self.durable_until = durable_until

    def get(self, offset: int, disk: bool = False) -> float | None:
        t = self.known.get(offset)
        until = self.durable_until if disk else self.until
        if until is None:
            return t
        return until if t is None else min(t, until)


def _let_go(index: Index, inc: Incarnation,
            committed: dict[tuple[str, str], list[h.Committed]]) -> _LetGo:
    """For ``inc``: an ACKED naming an offset (or covering it by ``through`` in the
    session it was pushed in), a COMMITTED past it, or the oracle's deletion of ``inc``;
    offsets a term or dead letter may have settled are left out (not judged)."""
    out: dict[int, float] = {}
    pushed: dict[int, set[int]] = {}
    for e in inc.events:
        if isinstance(e, h.Delivered):
            pushed.setdefault(e.session, set()).add(e.offset)
        elif isinstance(e, h.AckConfirmed):
            mine = pushed.get(e.session, set())
            for o in (*e.offsets, *(o for o in mine if o <= e.through)):
                out.setdefault(o, e.t)
    if inc.name is not None:
        for c in committed.get((inc.topic, inc.name), ()):
            if c.generation in (None, inc.generation):
                for o in range(inc.start, c.cursor):
                    out.setdefault(o, c.t)
    for o in index.settled(inc):
        out.pop(o, None)
    until = inc.deleted_at
    durable = until
    if until is not None and (inc.died_with_shard or not inc.sessions or index.stopped_between(
            inc.sessions[0].sub.shard, until, math.inf)):
        durable = None
    return _LetGo(out, until, durable)
