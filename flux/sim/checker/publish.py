"""Checks on what was stored: offsets never reused (G1), dedup (G3), no unexpected
message (G2), and one live incarnation per shard index (G7)."""

from __future__ import annotations

import math

from flux.sim import history as h
from flux.sim.checker import Report
from flux.sim.checker.index import Index


def check(index: Index, report: Report) -> None:
    first_attempt: dict[tuple[str, str], float] = {}
    at_offset: dict[tuple[str, int, int], str] = {}
    offsets_of: dict[tuple[str, int, str], dict[int, float]] = {}
    fresh_acks: dict[tuple[str, int, str], list[tuple[float, int]]] = {}
    acked: set[tuple[str, str]] = set()
    delivered: set[tuple[str, int, int]] = set()

    def stored(t: float, topic: str, generation: int, offset: int, message_id: str) -> None:
        key = (topic, generation, offset)
        report.examine("G1", "offset-reused")
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
            report.examine("G2", "unexpected")
            if (e.topic, e.id) not in first_attempt:
                report.add("G2", "unexpected", e.t,
                           f"{e.subscriber} got {e.topic}@{e.offset} id={e.id!r}, never published")
            stored(e.t, e.topic, e.generation, e.offset, e.id)
            delivered.add((e.topic, e.generation, e.offset))

    report.examine("G3", "stored-twice", len(offsets_of))
    for (topic, generation, message_id), offsets in offsets_of.items():
        if len(offsets) < 2:
            continue
        since = first_attempt.get((topic, message_id), min(offsets.values()))
        ordered = sorted(offsets.items())
        window = index.params_for(topic).dedup_window
        for _offset, seen in ordered[1:]:
            if seen - since < window:
                report.add("G3", "stored-twice", seen,
                           f"{topic} id={message_id!r} stored at offsets"
                           f" {[o for o, _ in ordered]} in generation {generation:#x} within"
                           f" dedup_window={window:g}s of its first publish")
    report.examine("G3", "duplicate-flag", len(fresh_acks))
    for (topic, generation, message_id), acks in fresh_acks.items():
        fresh = [o for _, o in acks]
        if len(fresh) != len(set(fresh)):
            report.add("G3", "duplicate-flag", acks[-1][0],
                       f"{topic} id={message_id!r} acked twice at the same offset in generation"
                       f" {generation:#x} without duplicate=True")

    _check_full_after_dedup(index, report)
    _check_generations(index, report)
    report.count("published", len(first_attempt))
    report.count("acked", len(acked))
    report.count("delivered_offsets", len(delivered))


def _check_full_after_dedup(index: Index, report: Report) -> None:
    """G3/full-before-dedup: the dedup check comes before the TopicFull check, so a
    publish whose id was stored in the window is answered as a duplicate, never as
    TopicFull. Sound under any delay: the refusal names its generation; the id's
    ack in that generation arrived before the refused attempt was sent, so the
    shard had stored it before it judged the attempt; the window counts from the
    store, which came after the id's first attempt, and the refusal arrived less
    than ``dedup_window`` after that attempt, so the id was still remembered."""
    first_attempt: dict[tuple[str, str], float] = {}
    sent: dict[tuple[str, int, str, str], float] = {}   # (producer, op, topic, id) -> t
    stored: dict[tuple[str, int, str], float] = {}      # (topic, generation, id) -> ack
    for e in index.history:
        if isinstance(e, h.PublishAttempted):
            first_attempt.setdefault((e.topic, e.id), e.t)
            sent[(e.producer, e.op, e.topic, e.id)] = e.t
        elif isinstance(e, h.PublishAcked):
            stored.setdefault((e.topic, e.generation, e.id), e.t)
        elif isinstance(e, h.PublishFailed) and e.error == "TopicFull" \
                and e.generation is not None:
            report.examine("G3", "full-before-dedup")
            acked = stored.get((e.topic, e.generation, e.id))
            attempt = sent.get((e.producer, e.op, e.topic, e.id))
            first = first_attempt.get((e.topic, e.id))
            if acked is None or attempt is None or first is None:
                continue
            window = index.params_for(e.topic).dedup_window
            if acked < attempt and e.t < first + window - index.params.latency:
                report.add("G3", "full-before-dedup", e.t,
                           f"{e.producer}: {e.topic} id={e.id!r} refused TopicFull in"
                           f" generation {e.generation:#x}, though it was stored there (acked"
                           f" at {acked:.3f}) within dedup_window={window:g}s")


def _check_generations(index: Index, report: Report) -> None:
    """G7: a shard index has one incarnation at a time, so two generations of one shard
    were never both up at once, and a shard changes generation only when a fault
    (on it, or on the router that restarts it) explains it."""
    _check_overlap(index, report)
    current: dict[int, tuple[int, float]] = {}
    retired: dict[int, set[int]] = {}
    for e in index.history.of(h.ShardHello):
        now = current.get(e.shard)
        if now is None or now[0] == e.generation or e.generation in retired.get(e.shard, set()):
            if now is None:
                current[e.shard] = (e.generation, e.t)
            continue
        retired.setdefault(e.shard, set()).add(now[0])
        report.examine("G7", "restart-without-cause")
        hosts = (f"shard-{e.shard}", "router")
        if index.quiet(hosts, now[1], e.t):
            report.add("G7", "restart-without-cause", e.t,
                       f"shard {e.shard} changed generation {now[0]:#x} -> {e.generation:#x}"
                       " with no fault on it or the router")
        current[e.shard] = (e.generation, e.t)


def _check_overlap(index: Index, report: Report) -> None:
    """Each reply of a shard incarnation that names its generation (HELLO_OK, SUBSCRIBED,
    PUBLISHED; the first two also name the shard) shows it up when it sent that reply:
    after the request was sent (the shard handled it first), before the reply arrived,
    and over a link no fault touched, within the latency bound before the arrival. So generation g was
    up at some instant no later than ``early[g]`` (its first reply's arrival) and at some
    instant no earlier than ``late[g]`` (the latest such lower bound): it was up throughout
    between them. Two incarnations that were never up at once can be put one after the
    other only if ``late`` of the first is before ``early`` of the second; when neither
    order fits, both were up at once, however long any frame was held on the way."""
    lat = index.params.latency
    early: dict[tuple[int, int], float] = {}
    late: dict[tuple[int, int], float] = {}
    generations: dict[int, list[int]] = {}
    flagged: set[tuple[int, int, int]] = set()
    shard_of: dict[int, int | None] = {}   # generation -> shard (None: named by two)
    attempted: dict[tuple[str, int, str, str], float] = {}
    for e in index.history:
        client: str
        if isinstance(e, h.PublishAttempted):
            attempted.setdefault((e.producer, e.op, e.topic, e.id), e.t)
            continue
        if isinstance(e, (h.ShardHello, h.Subscribed)):
            shard, sent, client = e.shard, e.requested, e.client
            if shard < 0 or e.generation not in index.shard_generations:
                continue  # a disk topic's generation is not an incarnation's
            shard_of[e.generation] = shard if shard_of.get(e.generation, shard) == shard \
                else None
        elif isinstance(e, h.PublishAcked):
            # the PUBLISHED reply to the request whose items the tap recorded as attempts
            # (the earliest attempt with its request id is no later than that request)
            found = shard_of.get(e.generation)
            if found is None:
                continue
            shard, client = found, e.producer
            sent = attempted.get((e.producer, e.op, e.topic, e.id))
        else:
            continue
        key = (shard, e.generation)
        report.examine("G7", "two-incarnations")
        after = -math.inf if sent is None else sent
        if e.t - lat > after and index.quiet((client, f"shard-{shard}"), e.t - lat, e.t):
            after = e.t - lat
        if key not in early:
            early[key], late[key] = e.t, after
            generations.setdefault(shard, []).append(e.generation)
        else:
            early[key], late[key] = min(early[key], e.t), max(late[key], after)
        for other in generations[shard]:
            o = (shard, other)
            pair = (shard, min(other, e.generation), max(other, e.generation))
            if other == e.generation or pair in flagged \
                    or not (late[key] > early[o] and late[o] > early[key]):
                continue
            flagged.add(pair)
            report.add("G7", "two-incarnations", e.t,
                       f"{client} reached shard {shard} generation {e.generation:#x}, up at"
                       f" or after {late[key]:.6f}, while generation {other:#x} was up at or"
                       f" before {early[o]:.6f} and at or after {late[o]:.6f}; it was up"
                       f" at or before {early[key]:.6f}: both were up at once")
