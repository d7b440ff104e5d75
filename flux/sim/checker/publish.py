"""Checks on what was stored: offsets never reused (G1), dedup (G3), no unexpected
message (G2), and one live incarnation per shard index (G7)."""

from __future__ import annotations

from flux.sim import history as h
from flux.sim.checker import Report
from flux.sim.checker.index import Index


def check(index: Index, report: Report) -> None:
    p = index.params
    first_attempt: dict[tuple[str, str], float] = {}
    at_offset: dict[tuple[str, int, int], str] = {}
    offsets_of: dict[tuple[str, int, str], dict[int, float]] = {}
    fresh_acks: dict[tuple[str, int, str], list[tuple[float, int]]] = {}
    acked: set[tuple[str, str]] = set()
    delivered: set[tuple[str, int, int]] = set()

    def stored(t: float, topic: str, generation: int, offset: int, message_id: str) -> None:
        key = (topic, generation, offset)
        known = at_offset.setdefault(key, message_id)
        if known != message_id:
            report.add("G1", "offset-reused", t,
                       f"{topic}@{offset} (generation {generation:#x}) holds {known!r} and"
                       f" {message_id!r}")
        offsets_of.setdefault((topic, generation, message_id), {}).setdefault(offset, t)

    for e in index.history:
        if isinstance(e, h.PublishAttempted):
            first_attempt.setdefault((e.topic, e.id), e.t)
        elif isinstance(e, h.PublishAcked):
            acked.add((e.topic, e.id))
            stored(e.t, e.topic, e.generation, e.offset, e.id)
            if not e.duplicate:
                fresh_acks.setdefault((e.topic, e.generation, e.id), []).append((e.t, e.offset))
        elif isinstance(e, (h.Delivered, h.Consumed)):
            if (e.topic, e.id) not in first_attempt:
                report.add("G2", "unexpected", e.t,
                           f"{e.subscriber} got {e.topic}@{e.offset} id={e.id!r}, never published")
            stored(e.t, e.topic, e.generation, e.offset, e.id)
            delivered.add((e.topic, e.generation, e.offset))

    for (topic, generation, message_id), offsets in offsets_of.items():
        if len(offsets) < 2:
            continue
        since = first_attempt.get((topic, message_id), min(offsets.values()))
        ordered = sorted(offsets.items())
        for _offset, seen in ordered[1:]:
            if seen - since < p.dedup_window:
                report.add("G3", "stored-twice", seen,
                           f"{topic} id={message_id!r} stored at offsets"
                           f" {[o for o, _ in ordered]} in generation {generation:#x} within"
                           f" dedup_window={p.dedup_window:g}s of its first publish")
    for (topic, generation, message_id), acks in fresh_acks.items():
        fresh = [o for _, o in acks]
        if len(fresh) != len(set(fresh)):
            report.add("G3", "duplicate-flag", acks[-1][0],
                       f"{topic} id={message_id!r} acked twice at the same offset in generation"
                       f" {generation:#x} without duplicate=True")

    _check_generations(index, report)
    report.count("published", len(first_attempt))
    report.count("acked", len(acked))
    report.count("delivered_offsets", len(delivered))


def _check_generations(index: Index, report: Report) -> None:
    """A shard index has one incarnation at a time: an old generation never answers again."""
    current: dict[int, tuple[int, float]] = {}
    retired: dict[int, set[int]] = {}
    lat = index.params.latency
    for e in index.history.of(h.ShardHello):
        now = current.get(e.shard)
        if now is not None and now[0] == e.generation:
            continue
        if e.generation in retired.get(e.shard, set()):
            if now is not None and e.t <= now[1] + lat:
                continue  # an answer the old incarnation sent just before it died
            report.add("G7", "two-incarnations", e.t,
                       f"{e.client} reached shard {e.shard} generation {e.generation:#x} after a"
                       f" newer generation {now[0] if now else 0:#x} had served it")
            continue
        if now is not None:
            retired.setdefault(e.shard, set()).add(now[0])
            hosts = (f"shard-{e.shard}", "router")
            if index.quiet(hosts, now[1], e.t):
                report.add("G7", "restart-without-cause", e.t,
                           f"shard {e.shard} changed generation {now[0]:#x} -> {e.generation:#x}"
                           " with no fault on it or the router")
        current[e.shard] = (e.generation, e.t)
