"""After a run: merge the histories, check them with the simulator's checker, and count.

:func:`merge` builds one :class:`~flux.sim.history.History` from the runner's
events and every worker's file, in time order, with the metadata the checker
reads. :func:`check` runs :func:`flux.sim.checker.check` on it (the one checker;
nothing here judges G1-G7). :func:`tally` counts messages, duplicates, recovery
times and throughput for the report.
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
from flux.hashing import shard_for
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
    config = config_mod.load(overrides=s.settings, shards=3, port=0)
    events = list(out.history.events)
    unreadable = 0
    for spec in out.workers:
        found, bad = load_events(Path(spec.out), end)
        events.extend(found)
        unreadable += bad
    events.sort(key=lambda e: e.t)   # stable: each process's own order is kept
    producers = [w for w in out.workers if w.role == "producer"]
    subscribers = [w for w in out.workers if w.role in ("subscriber", "puller")]
    meta: dict[str, Any] = {
        "source": "chaos", "seed": s.seed, "config": config.to_dict(), "oracle": False,
        "latency_bound": s.latency_bound, "plan": " ".join(f.describe() for f in out.plan),
        "liveness": [{"subscriber": w.subscriber_id(t), "topic": t,
                      "pull": w.role == "puller"} for w in subscribers for t in w.topics],
        "canaries": [[t, w.canary_id(t)] for w in producers for t in w.topics],
        "topics": out.topics, "unreadable_lines": unreadable,
    }
    return h.History(meta=meta, events=events)


def check(history: h.History) -> checker.Report:
    return checker.check(history)


def failed(report: checker.Report, crashes: list[str]) -> bool:
    """The run fails on any violation the checker reports, and on any process (broker or
    client) that died of its own accord."""
    return not report.ok or bool(crashes)


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
    faults: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    recovery: dict[str, dict[str, float]] = field(default_factory=dict)
    recovery_of: list[float | None] = field(default_factory=list)   # per fault, in order
    throughput: dict[str, list[int]] = field(default_factory=dict)
    adoption: dict[str, int] = field(default_factory=dict)


def tally(out: RunOutput, history: h.History, report: checker.Report) -> Tally:
    t = Tally()
    attempted: set[tuple[str, str]] = set()
    acked: set[tuple[str, str]] = set()
    stored: dict[tuple[str, str], set[int]] = {}
    consumed: dict[tuple[str, str, str], int] = {}
    for e in history:
        if isinstance(e, h.PublishAttempted):
            attempted.add((e.topic, e.id))
        elif isinstance(e, h.PublishAcked):
            acked.add((e.topic, e.id))
            stored.setdefault((e.topic, e.id), set()).add(e.generation)
        elif isinstance(e, h.Consumed):
            key = (e.subscriber, e.topic, e.id)
            consumed[key] = consumed.get(key, 0) + 1
    t.published, t.acked = len(attempted), len(acked)
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
    return t


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


def _acks_by_shard(out: RunOutput, history: h.History) -> dict[int, list[tuple[float, int]]]:
    owner = {topic: shard_for(topic, 3) for topic in out.topics}
    acks: dict[int, list[tuple[float, int]]] = {}
    for e in history.of(h.PublishAcked):
        acks.setdefault(owner.get(e.topic, -1), []).append((e.t, e.generation))
    return acks


def recovery_time(record: FaultRecord, acks: dict[int, list[tuple[float, int]]]) -> float | None:
    """Seconds until the broker served again after a fault. Router: from the restart until
    the new router printed its banner. Shard kill: from the kill until the new generation
    acked a publish. Reset: from the reset, and other faults from their end, until the
    shard acked a publish."""
    if record.began is None or record.ended is None:
        return None
    if record.kind == "router-kill":
        return record.ready_after
    shard_acks = acks.get(record.planned.target, [])
    since = record.began if record.kind in ("shard-kill", "reset") else record.ended
    i = bisect.bisect_left(shard_acks, (since, -1))
    for t, generation in shard_acks[i:]:
        if record.kind != "shard-kill" or generation != record.old_generation:
            return t - since
    return None


def recovery_times(out: RunOutput, history: h.History
                   ) -> tuple[list[float | None], dict[str, dict[str, float]]]:
    """Each fault's recovery time, and their median, p90 and max by kind."""
    acks = _acks_by_shard(out, history)
    each = [recovery_time(record, acks) for record in out.faults]
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
    """Publish acks and deliveries per second since the start phase."""
    start = out.phases.get("start", 0.0)
    acked: list[int] = []
    delivered: list[int] = []
    for e in history:
        if isinstance(e, (h.PublishAcked, h.Consumed)):
            series = acked if isinstance(e, h.PublishAcked) else delivered
            second = int(e.t - start)
            if second < 0:
                continue
            while len(series) <= second:
                series.append(0)
            series[second] += 1
    return {"acked_per_s": acked, "delivered_per_s": delivered}
