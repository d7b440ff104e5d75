"""G12 checks (delayed delivery) and the message keys and headers: nothing is pushed
before it is due, a session's first pushes of a topic that carries delayed messages
come in (due time, offset) order, and every message arrives with the key and headers
it was published with.
"""

from __future__ import annotations

from flux.sim import history as h
from flux.sim.checker import Report
from flux.sim.checker.index import Index

# rounding between a due time kept on a shard's clock and one written as wall time
# in a disk topic's log and read back by another incarnation
EPSILON = 1e-6


def delayed_topics(index: Index) -> set[str]:
    """The topics some publish asked to delay (G12 replaces G1's offset order there)."""
    return {e.topic for e in index.history
            if isinstance(e, h.PublishAttempted) and e.delay > 0}


def check(index: Index, report: Report) -> None:
    _check_not_early(index, report)
    _check_due_order(index, report, delayed_topics(index))
    _check_meta(index, report)


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
