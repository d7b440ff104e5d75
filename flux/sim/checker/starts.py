"""Checks on where a new subscription starts, from what clients saw (G6, G7, G2): the
default start is the next offset, ``read_old`` the oldest message still held (and a
message is held for ``message.ttl``), ``from_offset`` that offset unless it was cleaned
up, and a reset (on_reset="earliest") offset 0 of the new generation, or the oldest
message it holds. A reset, ``read_old`` and ``from_offset`` start below no message the
oracle deletes in that generation later (a kept delayed message below the oldest in
line included, G12)."""

from __future__ import annotations

from flux.sim import history as h
from flux.sim.checker import Report
from flux.sim.checker.index import Index


def check(index: Index, report: Report) -> None:
    p = index.params
    lat = p.latency
    acked: dict[tuple[str, int], list[tuple[float, int]]] = {}   # (topic, gen) -> (t, offset)
    first_try: dict[tuple[str, str], float] = {}
    stored: dict[tuple[str, int], list[tuple[float, float, int]]] = {}  # first try, ack, offset
    for e in index.history:
        if isinstance(e, h.PublishAttempted):
            first_try.setdefault((e.topic, e.id), e.t)
        elif isinstance(e, h.PublishAcked) and not e.duplicate:
            acked.setdefault((e.topic, e.generation), []).append((e.t, e.offset))
            stored.setdefault((e.topic, e.generation), []).append(
                (first_try.get((e.topic, e.id), e.t), e.t, e.offset))
    # (topic, generation) -> offset -> when the oracle deleted it (a trim, or a kept
    # delayed message released, G12): it was held until then
    deleted: dict[tuple[str, int], dict[int, float]] = {}
    for e in index.history.of(h.Trimmed):
        gone = deleted.setdefault((e.topic, e.generation), {})
        for o in range(e.first, e.first + e.count):
            gone.setdefault(o, e.t)
    seen: set[tuple[str, int, str]] = set()  # named subscriptions heard of per generation
    for sub in index.history.of(h.Subscribed):
        first = sub.name is None or (sub.topic, sub.generation, sub.name) not in seen
        if sub.name is not None:
            seen.add((sub.topic, sub.generation, sub.name))
        if sub.reset and sub.on_reset == "earliest" and first:
            _check_reset_below_held(sub, deleted.get((sub.topic, sub.generation), {}), report)
        if not sub.created:
            continue
        p = index.params_for(sub.topic)
        key = (sub.topic, sub.generation)
        name = sub.name if sub.name is not None else "(ephemeral)"
        where = f"{sub.subscriber} created {sub.topic}/{name} at offset {sub.start}"
        if sub.reset:
            report.examine("G7", "reset-start")
            # earliest restarts at 0, or at the oldest held when the new generation's
            # first messages outlived their ttl before anyone subscribed (clamped)
            young = [o for tried, _t, o in stored.get(key, ())
                     if o < sub.start and tried > sub.t - p.ttl + lat]
            if sub.on_reset == "earliest" and young:
                report.add("G7", "reset-start", sub.t,
                           f"{where} after a reset, past offset {min(young)} stored less than"
                           f" ttl={p.ttl:g}s before; on_reset=earliest starts at 0")
            continue
        before = [o for t, o in acked.get(key, []) if t < sub.requested]
        if before and not sub.read_old and sub.from_offset is None:
            report.examine("G6", "start-not-next")
        if sub.read_old or sub.from_offset is not None:
            _check_start_above_held(sub, deleted.get(key, {}), report)
            report.examine("G5", "start-past-held")
            floor = sub.from_offset if sub.from_offset is not None else 0
            # messages stored surely less than ttl before the subscribe was processed
            young = [o for tried, t, o in stored.get(key, ())
                     if t < sub.requested and tried > sub.t - p.ttl + lat and o >= floor]
            if young and sub.start > min(young):
                report.add("G5", "start-past-held", sub.t,
                           f"{where}, past offset {min(young)} which was stored less than"
                           f" ttl={p.ttl:g}s before")
            if sub.from_offset is not None:
                report.examine("G6", "start-before-asked")
            if sub.from_offset is not None and sub.start < sub.from_offset:
                report.add("G6", "start-before-asked", sub.t,
                           f"{where}, below the from_offset {sub.from_offset} it asked for")
        elif before and sub.start <= max(before):
            report.add("G6", "start-not-next", sub.t,
                       f"{where}, but offset {max(before)} was acked before it subscribed")
        later = [o for tried, _t, o in stored.get(key, ()) if tried > sub.t]
        if later and not sub.read_old and sub.from_offset is None:
            report.examine("G6", "start-past-new")
        if later and min(later) < sub.start and not sub.read_old and sub.from_offset is None:
            report.add("G6", "start-past-new", sub.t,
                       f"{where}, past offset {min(later)} first published after it subscribed")


def _check_reset_below_held(sub: h.Subscribed, deleted: dict[int, float],
                            report: Report) -> None:
    """G7 (with G9 and G12): a reset with on_reset=earliest starts the subscription at the
    oldest message the new generation holds (a kept delayed message below the oldest in
    line included), whether the SUBSCRIBE makes it or finds it carried into a disk
    topic's new generation by a recovery (which starts every subscription over there):
    no message below its start is held when the shard answers. Judged at the first
    SUBSCRIBED of the subscription in that generation (a later one may find it made
    there by a SUBSCRIBE without a reset). A message the oracle deletes after the
    SUBSCRIBED arrived was held when the shard answered (a deletion is final within a
    generation, and an offset below the start was stored before it); a subscription's
    start never changes once made. Unsound only where the first SUBSCRIBE of a name in a
    generation, without a reset, lost its reply and a reset one found it."""
    report.examine("G7", "reset-start")
    below = [o for o, t in deleted.items() if o < sub.start and t > sub.t]
    if below:
        name = sub.name if sub.name is not None else "(ephemeral)"
        report.add("G7", "reset-start", sub.t,
                   f"{sub.subscriber} {'created' if sub.created else 'resumed'}"
                   f" {sub.topic}/{name} after a reset at offset {sub.start}, past offset"
                   f" {min(below)}, which generation {sub.generation:#x} held until"
                   f" {deleted[min(below)]:.3f}; on_reset=earliest starts at the oldest held")


def _check_start_above_held(sub: h.Subscribed, deleted: dict[int, float],
                            report: Report) -> None:
    """G6 (with G12): a subscription made with ``read_old`` starts at the oldest message
    held, one made with ``from_offset`` at that offset or, if it is older, at the oldest
    held: either way at or below every message at or above the offset asked for (0 for
    ``read_old``) that its topic held when the shard answered, a kept delayed message
    below the oldest in line included (a trim passed it while it was pending; it is
    held, and its subscriptions get it when it is due). A message the oracle deletes
    after the SUBSCRIBED arrived was held when the shard made the subscription (a
    deletion is final within a generation; an offset below the start was stored
    before), and the start options apply only where the reply says it was made."""
    report.examine("G6", "start-above-held")
    floor = sub.from_offset if sub.from_offset is not None else 0
    below = [o for o, t in deleted.items() if floor <= o < sub.start and t > sub.t]
    if below:
        name = sub.name if sub.name is not None else "(ephemeral)"
        asked = "read_old" if sub.from_offset is None else f"from_offset={sub.from_offset}"
        report.add("G6", "start-above-held", sub.t,
                   f"{sub.subscriber} created {sub.topic}/{name} ({asked}) at offset"
                   f" {sub.start}, past offset {min(below)}, which generation"
                   f" {sub.generation:#x} held until {deleted[min(below)]:.3f}")
