"""After a run: merge the histories, check them with the simulator's checker, and count.

:func:`merge` builds one :class:`~flux.sim.history.History` from the runner's
events and every worker's file, in time order, with the metadata the checker
reads. :func:`check` runs :func:`flux.sim.checker.check` on it (the one checker;
nothing here judges G1-G7). :func:`tally` counts messages, duplicates, recovery
times and throughput for the report, and per storage kind (:func:`by_storage`) what
G9 promises across process kills: no acked message of a disk topic lost in any
generation, and no disk topic changing its generation.
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.faults import FaultRecord
from chaos.runner import RunOutput
from flux import config as config_mod
from flux.hashing import dead_letter_source, shard_for
from flux.sim import checker
from flux.sim import history as h

# Verdicts: these rules fail the run whatever else happens.
FATAL_RULES = ("G2/lost", "G2/unexpected", "G1/order")


def load_events(path: Path, until: float) -> tuple[list[h.Event], int]:
    """Events of one worker file up to ``until``; tolerates a torn last line (a killed
    process). Returns the events and how many lines were unreadable."""
    events: list[h.Event] = []
    bad = 0
    try:
        f = path.open(encoding="utf-8")
    except FileNotFoundError:
        return events, 0
    with f:
        for line in f:
            try:
                data = json.loads(line)
            except ValueError:
                bad += 1
                continue
            if data.get("kind") == "meta":
                continue
            event = h.event_from_dict(data)
            if event.t <= until:
                events.append(event)
    return events, bad


def merge(out: RunOutput) -> h.History:
    """One history of the whole run, in time order, with the checker's metadata."""
    s = out.settings
    end = out.phases.get("end", float("inf"))
    events = list(out.history.events)
    unreadable = 0
    for spec in out.workers:
        found, bad = load_events(Path(spec.out), end)
        events.extend(found)
        unreadable += bad
    events.sort(key=lambda e: e.t)   # stable: each process's own order is kept
    producers = [w for w in out.workers if w.role == "producer"]
    subscribers = [w for w in out.workers if w.role in ("subscriber", "member", "puller")]
    overrides = list(s.settings)
    pool = next((w.topics[0] for w in out.workers if w.pool is not None), None)
    overrides += s.storage_overrides(out.data_dir, pool)
    config = config_mod.load(overrides=overrides, shards=3, port=0)
    meta: dict[str, Any] = {
        "source": "chaos", "seed": s.seed, "config": config.to_dict(), "oracle": False,
        "latency_bound": s.latency_bound, "plan": " ".join(f.describe() for f in out.plan),
        "liveness": [{"subscriber": w.subscriber_id(t), "topic": t,
                      "pull": w.role == "puller", "group": w.pool}
                     for w in subscribers for t in w.topics],
        "canaries": [[t, w.canary_id(t)] for w in producers for t in w.topics],
        "topics": out.topics, "storage": out.storage, "unreadable_lines": unreadable,
    }
    return h.History(meta=meta, events=events)


def check(history: h.History) -> checker.Report:
    return checker.check(history)


def failed(report: checker.Report, crashes: list[str], t: Tally | None = None) -> bool:
    """The run fails on any violation the checker reports, on any process (broker or
    client) that died of its own accord, and on any broken disk promise (G9) the
    storage tally found (:meth:`StorageTally.broken`)."""
    disk = t.storage.get("disk") if t is not None else None
    return not report.ok or bool(crashes) or bool(disk is not None and disk.broken())


_EXITED = re.compile(r"shard (\d+) \(pid (\d+)\) exited with status (-?\d+)")
_ERROR = re.compile(r"^[\s|]*([A-Za-z_.]*(?:Error|Exception|Exit)\b.*)$")


def broker_crashes(log: Path) -> list[str]:
    """Broker processes that died of their own accord, from the broker's log.

    The history cannot show them: a shard that crashes comes back with a new
    generation, which the checker blames on whatever fault touched that shard
    (in a chaos run one nearly always did). A shard killed by the runner or by the
    router exits by SIGKILL (status -9, or -1 once adopted); a status of 1 or more,
    or a traceback, is a crash.
    """
    crashes: list[str] = []
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return crashes
    for i, line in enumerate(lines):
        exited = _EXITED.search(line)
        if exited and int(exited.group(3)) > 0:
            crashes.append(f"shard {exited.group(1)} (pid {exited.group(2)}) exited with"
                           f" status {exited.group(3)}")
        elif "Traceback (most recent call last)" in line and not line.lstrip(" |+").startswith(
                "Exception Group"):
            error = next((m.group(1) for m in map(_ERROR.match, lines[i + 1:i + 80]) if m),
                         "an exception")
            crashes.append(f"traceback in the broker log (line {i + 1}): {error}")
    return crashes


@dataclass
class Tally:
    published: int = 0            # distinct (topic, id) a producer tried to publish
    acked: int = 0                # ... of which acked
    delivered: int = 0            # ... handed to at least one subscriber's code
    deliveries: int = 0           # messages handed to subscribers' code, repeats included
    duplicated: int = 0           # repeats: a subscriber got a message it had already got
    duplicated_messages: int = 0  # distinct (subscriber, message) got more than once
    stored_again: int = 0         # messages stored in two generations (retried across a crash)
    # losses count (live subscriber, acked message) pairs, as the checker does
    lost_explained: int = 0       # missed by a subscriber; its generation ended by a crash (G7)
    lost_by_all: int = 0          # ... of which messages no subscriber got at all
    lost_unexplained: int = 0     # missed by a subscriber, no crash to blame (G2 lost)
    dead_letters: int = 0         # distinct messages read back from dead-letter topics (G11)
    faults: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    recovery: dict[str, dict[str, float]] = field(default_factory=dict)
    recovery_of: list[float | None] = field(default_factory=list)   # per fault, in order
    throughput: dict[str, list[int]] = field(default_factory=dict)
    adoption: dict[str, int] = field(default_factory=dict)
    storage: dict[str, StorageTally] = field(default_factory=dict)   # "memory", "disk"


@dataclass
class StorageTally:
    """The messages of one storage kind's topics, and what process kills did to them.

    Losses are (live subscriber, acked message id) pairs the subscriber never received
    in any generation (pushed, or in a page it fetched). For a memory topic a loss is
    explained when every generation the message was acked in ended by a shard crash
    (G7); for a disk topic nothing explains one (G9: a SIGKILL loses nothing acked).
    """

    topics: list[str] = field(default_factory=list)
    acked: int = 0                 # distinct (topic, id) acked
    delivered: int = 0             # ... received by at least one subscriber
    deliveries: int = 0            # pushed messages handed to subscribers' code, repeats
                                   # included (pages fetched not counted)
    lost_explained: int = 0        # pairs: a crash ended every generation it was acked in
    lost_unexplained: int = 0      # pairs: no crash explains it
    lost_by_all: int = 0           # acked messages no subscriber received at all
    generations: int = 0           # distinct generations seen, summed over the topics
    generation_changes: int = 0    # generations beyond each topic's first
    resets_seen: int = 0           # resets (G7) the history records clients seeing
    shard_generation: int = 0      # disk topics: replies carrying a shard incarnation's
                                   # generation (the topic was not on disk)
    kills: int = 0                 # process kills of a shard holding topics of this kind
    lost_ids: list[str] = field(default_factory=list)        # a few, for the report
    changed: list[str] = field(default_factory=list)         # "topic: gen -> gen", a few

    def broken(self) -> bool:
        """A disk promise broken: an acked message lost, a generation changed, or the
        topic served from memory."""
        return bool(self.lost_unexplained or self.generation_changes or self.shard_generation)


def tally(out: RunOutput, history: h.History, report: checker.Report) -> Tally:
    t = Tally()
    attempted: set[tuple[str, str]] = set()
    acked: set[tuple[str, str]] = set()
    stored: dict[tuple[str, str], set[int]] = {}
    consumed: dict[tuple[str, str, str], int] = {}
    dead: set[tuple[str, str]] = set()
    for e in history:
        if isinstance(e, h.Fetched) and dead_letter_source(e.topic) is not None:
            dead.update((e.topic, i) for i in e.ids)
        elif isinstance(e, h.PublishAttempted):
            attempted.add((e.topic, e.id))
        elif isinstance(e, h.PublishAcked):
            acked.add((e.topic, e.id))
            stored.setdefault((e.topic, e.id), set()).add(e.generation)
        elif isinstance(e, h.Consumed):
            key = (e.subscriber, e.topic, e.id)
            consumed[key] = consumed.get(key, 0) + 1
    t.published, t.acked = len(attempted), len(acked)
    t.dead_letters = len(dead)
    t.delivered = len({(topic, mid) for _, topic, mid in consumed})
    t.deliveries = sum(consumed.values())
    t.duplicated = sum(n - 1 for n in consumed.values())
    t.duplicated_messages = sum(1 for n in consumed.values() if n > 1)
    t.stored_again = sum(1 for gens in stored.values() if len(gens) > 1)
    t.lost_explained = report.counts.get("missed_explained_by_crash", 0)
    t.lost_by_all = report.counts.get("lost_explained_by_crash", 0)
    t.lost_unexplained = report.counts.get("lost", 0)
    for record in out.faults:
        bucket = t.skipped if record.skipped else t.faults
        bucket[record.kind] = bucket.get(record.kind, 0) + 1
    t.recovery_of, t.recovery = recovery_times(out, history)
    t.throughput = throughput(out, history)
    t.adoption = adoption(out)
    t.storage = by_storage(out, history)
    return t


SHOWN = 10   # lost ids and generation changes listed per kind


def by_storage(out: RunOutput, history: h.History) -> dict[str, StorageTally]:
    """Per storage kind (only the kinds the run has): see :class:`StorageTally`."""
    kinds = {topic: out.storage.get(topic, "memory") for topic in out.topics}
    result = {kind: StorageTally(topics=[t for t in out.topics if kinds[t] == kind])
              for kind in ("memory", "disk") if kind in kinds.values()}
    shard_generations: set[int] = set()
    latest: dict[int, int] = {}          # shard index -> its latest incarnation's generation
    shard_of: dict[int, int] = {}        # incarnation generation -> shard index
    acked: dict[tuple[str, str], set[int]] = {}   # (topic, id) -> generations acked in
    received: dict[tuple[str, str], set[str]] = {}   # (subscriber, topic) -> ids
    seen: dict[str, list[int]] = {topic: [] for topic in out.topics}  # generations, in order
    deliveries: dict[str, int] = {}
    for e in history:
        if isinstance(e, h.ShardHello):
            shard_generations.add(e.generation)
            latest[e.shard] = e.generation
            shard_of[e.generation] = e.shard
            continue
        topic = getattr(e, "topic", None)
        if topic not in kinds:
            continue
        generation: int | None = None
        if isinstance(e, h.PublishAcked):
            acked.setdefault((e.topic, e.id), set()).add(e.generation)
            generation = e.generation
        elif isinstance(e, h.Consumed):
            received.setdefault((e.subscriber, e.topic), set()).add(e.id)
            deliveries[e.topic] = deliveries.get(e.topic, 0) + 1
            generation = e.generation
        elif isinstance(e, h.Fetched):
            if e.name is not None:
                received.setdefault((e.subscriber, e.topic), set()).update(e.ids)
            generation = e.generation
        elif isinstance(e, h.Subscribed):
            generation = e.generation
        elif isinstance(e, h.TopicWasReset):
            result[kinds[e.topic]].resets_seen += 1
        if generation is not None and generation not in seen[topic]:
            seen[topic].append(generation)
    live = [(spec["subscriber"], spec["topic"]) for spec in history.meta.get("liveness", [])
            if spec.get("group") is None]
    # a shared subscription's members count as one reader: what any of them got (G10)
    for spec in history.meta.get("liveness", []):
        group = spec.get("group")
        if group is not None:
            pooled = received.setdefault((f"pool:{group}", spec["topic"]), set())
            pooled |= received.get((spec["subscriber"], spec["topic"]), set())
            if (f"pool:{group}", spec["topic"]) not in live:
                live.append((f"pool:{group}", spec["topic"]))
    anyone: set[tuple[str, str]] = {(topic, i) for (_, topic), ids in received.items()
                                    for i in ids}
    for (topic, message_id), generations in acked.items():
        st = result[kinds[topic]]
        st.acked += 1
        got = (topic, message_id) in anyone
        st.delivered += got
        st.lost_by_all += not got
        ended = all(g in shard_of and latest[shard_of[g]] != g for g in generations)
        for subscriber, live_topic in live:
            if live_topic != topic or message_id in received.get((subscriber, topic), ()):
                continue
            if kinds[topic] == "memory" and ended:
                st.lost_explained += 1
            else:
                st.lost_unexplained += 1
                if len(st.lost_ids) < SHOWN:
                    st.lost_ids.append(f"{subscriber} never got {topic} id={message_id}")
    owners = {topic: shard_for(topic, 3) for topic in out.topics}
    for topic, order in seen.items():
        st = result[kinds[topic]]
        st.deliveries += deliveries.get(topic, 0)
        st.generations += len(order)
        st.generation_changes += max(0, len(order) - 1)
        if kinds[topic] == "disk":
            st.shard_generation += sum(1 for g in order if g in shard_generations)
            if len(order) > 1 and len(st.changed) < SHOWN:
                st.changed.append(f"{topic}: " + " -> ".join(f"{g:#x}" for g in order))
    for record in out.faults:
        for index in killed_shards(record):
            for st in result.values():
                st.kills += any(owners[topic] == index for topic in st.topics)
    return result


def killed_shards(record: FaultRecord) -> list[int]:
    """The shard indexes whose process a fault ended by SIGKILL: a shard kill, a pause
    so long that the router killed and replaced the shard, and the shards a restarted
    router replaced instead of adopting."""
    if record.began is None:
        return []
    if record.kind == "shard-kill" or (record.kind == "shard-pause"
                                       and "replaced" in record.detail):
        return [record.planned.target]
    if record.kind == "router-kill":
        return list(record.replaced)
    return []


def adoption(out: RunOutput) -> dict[str, int]:
    """How restarted routers took over the running shards (DESIGN §3). A shard a new
    router replaced instead of adopting is explained if a process fault (kill, pause)
    touched it while the router was down."""
    counts = {"router_restarts": 0, "adopted": 0, "replaced": 0, "replaced_without_cause": 0}
    process_faults = [r for r in out.faults if r.kind in ("shard-kill", "shard-pause")
                      and r.began is not None]
    for record in out.faults:
        if record.kind != "router-kill" or record.began is None or record.ended is None:
            continue
        counts["router_restarts"] += 1
        counts["replaced"] += len(record.replaced)
        counts["adopted"] += record.adopted
        for index in record.replaced:
            began, ended = record.began, record.ended
            if not any(f.planned.target == index and f.began is not None and f.began <= ended
                       and (f.ended is None or f.ended >= began) for f in process_faults):
                counts["replaced_without_cause"] += 1
    return counts


Timed = dict[int, list[tuple[float, int]]]   # shard index -> [(time, generation)], in order


def _acks_by_shard(out: RunOutput, history: h.History) -> tuple[Timed, Timed]:
    """Publish acks and HELLO replies per shard index, with their generations."""
    owner = {topic: shard_for(topic, 3) for topic in out.topics}
    acks: Timed = {}
    hellos: Timed = {}
    for e in history:
        if isinstance(e, h.PublishAcked):
            acks.setdefault(owner.get(e.topic, -1), []).append((e.t, e.generation))
        elif isinstance(e, h.ShardHello):
            hellos.setdefault(e.shard, []).append((e.t, e.generation))
    return acks, hellos


def recovery_time(record: FaultRecord, acks: Timed, hellos: Timed | None = None) -> float | None:
    """Seconds until the broker served again after a fault. Router: from the restart until
    the new router printed its banner. Shard kill: from the kill until the new process
    acked a publish (one a client sent it after hearing its HELLO: a disk topic keeps its
    generation, so the ack's generation alone cannot tell the processes apart). Reset:
    from the reset, and other faults from their end, until the shard acked a publish."""
    if record.began is None or record.ended is None:
        return None
    if record.kind == "router-kill":
        return record.ready_after
    shard_acks = acks.get(record.planned.target, [])
    since = record.began if record.kind in ("shard-kill", "reset") else record.ended
    after = since
    if record.kind == "shard-kill" and hellos is not None:
        up = next((t for t, g in hellos.get(record.planned.target, [])
                   if t >= since and g != record.old_generation), None)
        if up is None:
            return None
        after = up
    i = bisect.bisect_left(shard_acks, (after, -1))
    for t, generation in shard_acks[i:]:
        if record.kind != "shard-kill" or generation != record.old_generation:
            return t - since
    return None


def recovery_times(out: RunOutput, history: h.History
                   ) -> tuple[list[float | None], dict[str, dict[str, float]]]:
    """Each fault's recovery time, and their median, p90 and max by kind."""
    acks, hellos = _acks_by_shard(out, history)
    each = [recovery_time(record, acks, hellos) for record in out.faults]
    by_kind: dict[str, list[float]] = {}
    for record, value in zip(out.faults, each, strict=True):
        if value is not None:
            by_kind.setdefault(record.kind, []).append(value)
    summary = {}
    for kind, values in sorted(by_kind.items()):
        values.sort()
        summary[kind] = {"n": len(values), "median": values[len(values) // 2],
                         "p90": values[min(len(values) - 1, int(len(values) * 0.9))],
                         "max": values[-1]}
    return each, summary


def throughput(out: RunOutput, history: h.History) -> dict[str, list[int]]:
    """Publish acks and deliveries per second since the start phase, in all and (as
    ``acked_per_s_<kind>``) publish acks per storage kind."""
    start = out.phases.get("start", 0.0)
    series: dict[str, list[int]] = {"acked_per_s": [], "delivered_per_s": []}
    for kind in sorted(set(out.storage.values())):
        series[f"acked_per_s_{kind}"] = []
    for e in history:
        if isinstance(e, (h.PublishAcked, h.Consumed)):
            second = int(e.t - start)
            if second < 0:
                continue
            names = ["delivered_per_s"]
            if isinstance(e, h.PublishAcked):
                names = ["acked_per_s", f"acked_per_s_{out.storage.get(e.topic, 'memory')}"]
            for name in names:
                counts = series.setdefault(name, [])
                while len(counts) <= second:
                    counts.append(0)
                counts[second] += 1
    return series
