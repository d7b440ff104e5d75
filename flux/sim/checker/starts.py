"""Checks on where a new subscription starts, from what clients saw alone (G6, G7, G2):
the default start is the next offset, ``read_old`` the oldest message still held
(and a message is held for ``message.ttl``), ``from_offset`` that offset unless
it was cleaned up, and a reset (on_reset="earliest") offset 0 of the new generation."""

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
    for sub in index.history.of(h.Subscribed):
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
