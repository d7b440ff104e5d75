"""Liveness once faults heal (as in TigerBeetle's VOPR), and the loss accounting.

Every subscription the workload keeps alive must, by the end, have been given
(pushed, or read by FETCH for a pull subscription) every message acked in its
topic's final generation from its start on; publishes
made after the heal must be acked. A subscriber asking for a ``from_offset`` past
the end of its topic's final generation is refused (OffsetOutOfRange) every time,
rightly, so it need not be subscribed at the end. Acked messages of a generation
that ended are counted as lost-and-explained (G7), never as violations.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any

from flux.sim import history as h
from flux.sim.checker import Report
from flux.sim.checker.index import Incarnation, Index, Session

SETTLE = 5.0   # seconds before the end after which a publish need not be acked yet


def check(index: Index, report: Report) -> None:
    history = index.history
    acked: dict[tuple[str, int], dict[int, str]] = {}
    acked_at: dict[tuple[str, str], float] = {}
    consumed: dict[tuple[str, str, int], set[int]] = {}
    delivered: dict[tuple[str, str, int], set[int]] = {}
    anyone: set[tuple[str, int, int]] = set()
    latest_generation: dict[int, int] = {}
    latest_topic_generation: dict[str, int] = {}
    shard_of: dict[int, int] = {}
    final: dict[str, int] = {}  # topic -> the generation of its latest acked publish
    for e in history:
        if isinstance(e, h.PublishAcked):
            acked.setdefault((e.topic, e.generation), {}).setdefault(e.offset, e.id)
            acked_at.setdefault((e.topic, e.id), e.t)
            final[e.topic] = e.generation
        elif isinstance(e, h.Consumed):
            consumed.setdefault((e.subscriber, e.topic, e.generation), set()).add(e.offset)
            anyone.add((e.topic, e.generation, e.offset))
        elif isinstance(e, h.Delivered):
            delivered.setdefault((e.subscriber, e.topic, e.generation), set()).add(e.offset)
            anyone.add((e.topic, e.generation, e.offset))
        elif isinstance(e, h.Fetched) and e.name is not None:
            page = e.page()
            for seen in (consumed, delivered):  # a pull reader's pages are what it read
                seen.setdefault((e.subscriber, e.topic, e.generation), set()).update(page)
            anyone.update((e.topic, e.generation, o) for o in page)
        elif isinstance(e, h.ShardHello):
            latest_generation[e.shard] = e.generation
            shard_of[e.generation] = e.shard
        if isinstance(e, (h.PublishAcked, h.Subscribed)) \
                and e.generation not in index.shard_generations:
            latest_topic_generation[e.topic] = e.generation  # a disk topic's own (G9)
    received = consumed if consumed else delivered
    oracle = bool(history.meta.get("oracle", False))
    trimmed: dict[tuple[str, int], dict[int, float]] = {}  # first deletion of each offset
    for e in history.of(h.Trimmed):
        first = trimmed.setdefault((e.topic, e.generation), {})
        for o in range(e.first, e.first + e.count):
            first.setdefault(o, e.t)

    def gone_first(inc: Incarnation) -> set[int]:
        """What a subscription made by a reset, ``read_old`` or a ``from_offset`` never
        held, on a topic that carries delayed messages: it starts at the oldest message
        held (or its from_offset), which may be a kept delayed message below offsets
        cleaned up already (G12). Those the oracle deleted before its SUBSCRIBED arrived
        (without the oracle: every offset acked before it)."""
        if not inc.below_gaps:
            return set()
        if oracle:
            return {o for o, t in trimmed.get((inc.topic, inc.generation), {}).items()
                    if t < inc.created_at}
        return {o for o, message_id in acked.get((inc.topic, inc.generation), {}).items()
                if acked_at.get((inc.topic, message_id), inc.created_at) < inc.created_at}

    def newest(session: Session) -> int:
        """The generation a live session should have reached: its shard's latest, or
        for a disk topic's own generation, the topic's latest."""
        generation = session.sub.generation
        if generation in index.shard_generations:
            return latest_generation.get(session.sub.shard, generation)
        return latest_topic_generation.get(session.sub.topic, generation)

    last_session: dict[str, Session] = {}
    for session in index.sessions.values():
        last_session[session.sub.subscriber] = session
    # the members of each shared subscription (G10): together they get every message
    groups: dict[tuple[str, str], list[str]] = {}
    for spec in history.meta.get("liveness", []):
        if spec.get("group") is not None:
            groups.setdefault((spec["topic"], spec["group"]), []).append(spec["subscriber"])
    for spec in history.meta.get("liveness", []):
        subscriber, topic = spec["subscriber"], spec["topic"]
        found = last_session.get(subscriber)
        if (found is None or found.sub.topic != topic
                or newest(found) != found.sub.generation) \
                and _past_the_end(spec, acked, final):
            continue  # refused with OffsetOutOfRange in the final generation, rightly
        report.examine("liveness", "never-subscribed")
        if found is None or found.sub.topic != topic:
            report.add("liveness", "never-subscribed", index.end_at,
                       f"{subscriber} has no subscription to {topic} at the end")
            continue
        session = found
        generation = session.sub.generation
        latest = newest(session)
        report.examine("liveness", "stale-generation")
        if latest != generation:
            report.add("liveness", "stale-generation", index.end_at,
                       f"{subscriber} still on generation {generation:#x} of shard"
                       f" {session.sub.shard}; the shard is at {latest:#x}")
            continue
        inc = session.incarnation
        got = received.get((subscriber, topic, generation), set())
        if spec.get("group") is not None:
            # what reached any member (a member may ack a message it holds before its
            # code took it: the client then never hands it on, rightly)
            got = got.union(*(seen.get((member, topic, generation), set())
                              for member in groups[(topic, spec["group"])]
                              for seen in (received, delivered)))
        # a dead letter (G11) settles a message whose pushes all went to sessions that
        # lost them: the subscription need never get it (a term was of one it got)
        settled = index.settled(inc)
        never_held = gone_first(inc)
        report.examine("G2", "lost", sum(1 for o in acked.get((topic, generation), {})
                                         if o >= inc.start))
        missing = sorted(o for o in acked.get((topic, generation), {}) if o >= inc.start
                         and o not in got and o not in settled and o not in never_held)
        if missing:
            shown = ", ".join(str(o) for o in missing[:8]) + (" ..." if len(missing) > 8 else "")
            report.add("G2", "lost", index.end_at,
                       f"{subscriber} never got {len(missing)} acked message(s) of {topic}"
                       f" generation {generation:#x} after faults healed: offsets {shown}")
            report.count("lost", len(missing))
            continue
        if session.sub.mode == "push":
            _check_left_unacked(index, session, acked.get((topic, generation), {}),
                                acked_at, report, never_held)

    for topic, message_id in history.meta.get("canaries", []):
        report.examine("liveness", "publish-stuck")
        if (topic, message_id) not in acked_at:
            report.add("liveness", "publish-stuck", index.end_at,
                       f"publish of {topic} id={message_id!r} after the heal was never acked")

    explained = undelivered = 0
    for (topic, generation), offsets in acked.items():
        never = sum(1 for o in offsets if (topic, generation, o) not in anyone)
        shard = shard_of.get(generation)
        if shard is not None and latest_generation[shard] != generation:
            explained += never
        else:
            undelivered += never
    report.count("lost_explained_by_crash", explained)
    report.count("undelivered_in_final_generation", undelivered)
    report.count("missed_explained_by_crash",
                 _missed_by_crash(index, acked, received, latest_generation, shard_of))


def _missed_by_crash(index: Index, acked: dict[tuple[str, int], dict[int, str]],
                     received: dict[tuple[str, str, int], set[int]],
                     latest_generation: dict[int, int], shard_of: dict[int, int]) -> int:
    """Acked messages a live subscriber never got, of generations that ended (G7):
    from its subscription's start in that generation, or all if it had none there."""
    starts: dict[tuple[str, str, int], int] = {}
    for session in index.sessions.values():
        key = (session.sub.subscriber, session.sub.topic, session.sub.generation)
        starts[key] = min(starts.get(key, session.incarnation.start), session.incarnation.start)
    missed = 0
    for spec in index.history.meta.get("liveness", []):
        subscriber, topic = spec["subscriber"], spec["topic"]
        for (acked_topic, generation), offsets in acked.items():
            shard = shard_of.get(generation)
            if acked_topic != topic or shard is None or latest_generation[shard] == generation:
                continue
            key = (subscriber, topic, generation)
            got = received.get(key, set())
            start = starts.get(key, 0)
            missed += sum(1 for o in offsets if o >= start and o not in got)
    return missed


def _check_left_unacked(index: Index, session: Session, acked: dict[int, str],
                        acked_at: dict[tuple[str, str], float], report: Report,
                        never_held: Container[int] = ()) -> None:
    """G4/left-unacked: at-least-once means a message a subscription has not acked is
    pushed again (a later session resumes from the cursor), and a live subscriber
    acks all it is given once faults heal; so by the end each message of its final
    generation from its start on, published ``SETTLE`` seconds before the end, has
    an ack sent by some session of the subscription. A delivery to an earlier session
    that was lost before its ack does not count (``G2/lost`` counts it as received).
    ``never_held``: offsets gone before a start at a kept delayed message (G12), never
    given to it."""
    from flux.sim.checker.retention import _ack_times

    inc = session.incarnation
    if index.heal_at + SETTLE > index.end_at:
        return
    sent = _ack_times(inc, index.commits, index.settled(inc))
    due = [o for o, message_id in acked.items() if o >= inc.start and o not in never_held
           and acked_at.get((inc.topic, message_id), index.end_at) <= index.end_at - SETTLE]
    report.examine("G4", "left-unacked", len(due))
    missing = sorted(o for o in due if o not in sent)
    if missing:
        shown = ", ".join(str(o) for o in missing[:8]) + (" ..." if len(missing) > 8 else "")
        report.add("G4", "left-unacked", index.end_at,
                   f"{session.sub.subscriber} never acked {len(missing)} message(s) of"
                   f" {inc.topic} generation {inc.generation:#x} it was given, though it acks"
                   f" all once faults heal: offsets {shown} were not pushed again")


def _past_the_end(spec: dict[str, Any], acked: dict[tuple[str, int], dict[int, str]],
                  final: dict[str, int]) -> bool:
    """Whether ``spec``'s from_offset lies past what its topic's final generation is
    known to hold (every acked offset of it, plus one)."""
    from_offset, topic = spec.get("from_offset"), spec["topic"]
    if from_offset is None or topic not in final:
        return False
    return bool(from_offset > max(acked[(topic, final[topic])]) + 1)
