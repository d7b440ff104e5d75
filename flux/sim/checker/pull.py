"""Checks on the pull path (FETCH / FETCHED, COMMIT / COMMITTED): what a page holds
(G1, G2, G7), that nothing a pull subscription still holds is skipped (G5), that its
cursor never moves back (G6), and that a live pull reader reads to the end (liveness).

A request is handled by the shard some time between when it was sent and when its
reply arrived, whatever the links did meanwhile: every rule here reasons only with
that, so delays, stalls and partitions cannot make one fire falsely. Whether a
subscription was deleted in between is the oracle's word (``SubscriptionGone``,
``ShardStopped``): the rules that need it are skipped in histories without an oracle.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from itertools import pairwise

from flux.hashing import dead_letter_source
from flux.sim import history as h
from flux.sim.checker import Report
from flux.sim.checker.delayed import delayed_topics
from flux.sim.checker.index import Index

Key = tuple[str, int, str]   # (topic, generation, subscription name)

# liveness: acks later than this before the end need not be read by then
SETTLE = 5.0


@dataclass(frozen=True)
class _Cursor:
    """A cursor the shard reported (a pull SUBSCRIBED or a COMMITTED reply)."""

    requested: float
    t: float
    cursor: int
    what: str
    created: bool = False
    shard: int | None = None   # a resume's: its cursor may hold commits not yet durable


def check(index: Index, report: Report) -> None:
    history = index.history
    ids: dict[tuple[str, int, int], str] = {}
    attempted: set[tuple[str, str]] = set()
    acked: dict[tuple[str, int], list[tuple[float, int]]] = {}   # (topic, gen) -> (t, offset)
    cursors: dict[Key, list[_Cursor]] = {}
    subscribed: dict[Key, list[h.Subscribed]] = {}
    commits = index.commits
    gone = _Deletions()
    # (topic, generation) -> offset -> when the oracle first deleted it
    trimmed: dict[tuple[str, int], dict[int, float]] = {}
    fetches = gaps = 0
    delayed = delayed_topics(index)
    for e in history:
        if isinstance(e, h.PublishAttempted):
            attempted.add((e.topic, e.id))
        elif isinstance(e, h.PublishAcked):
            ids.setdefault((e.topic, e.generation, e.offset), e.id)
            acked.setdefault((e.topic, e.generation), []).append((e.t, e.offset))
        elif isinstance(e, h.Delivered):
            ids.setdefault((e.topic, e.generation, e.offset), e.id)
        elif isinstance(e, h.Subscribed) and e.mode == "pull" and e.name is not None:
            key = (e.topic, e.generation, e.name)
            subscribed.setdefault(key, []).append(e)
            cursors.setdefault(key, []).append(
                _Cursor(e.requested, e.t, e.cursor, "resumed at", e.created, e.shard))
        elif isinstance(e, h.Committed):
            report.examine("G6", "commit-not-applied")
            if e.cursor < e.offset:
                report.add("G6", "commit-not-applied", e.t,
                           f"{e.subscriber}: COMMIT {e.topic}@{e.offset} answered with cursor"
                           f" {e.cursor}; a commit moves the cursor forward to its offset")
            if e.generation is not None:
                cursors.setdefault((e.topic, e.generation, e.name), []).append(
                    _Cursor(e.requested, e.t, e.cursor, "committed to"))
        elif isinstance(e, h.Fetched):
            fetches += 1
            gaps += e.first > e.offset and e.name is not None
            _check_page(e, ids, attempted, acked, report)
        elif isinstance(e, h.SubscriptionGone):
            gone.add((e.topic, e.generation, e.name), e.t)
        elif isinstance(e, h.Trimmed):
            deleted = trimmed.setdefault((e.topic, e.generation), {})
            for o in range(e.first, e.first + e.count):
                deleted.setdefault(o, e.t)
        elif isinstance(e, h.ShardStopped):
            gone.stop(e.generation, e.t)
    report.count("fetched_pages", fetches)
    report.count("fetch_gaps", gaps)   # pages that found offsets they asked for cleaned up
    if history.meta.get("oracle", False):
        for key, seen in cursors.items():
            _check_cursors(index, key, seen, gone, report)
            _check_cursor_bound(key, seen, commits, gone, report)
        judged = sum(_check_skipped(e, subscribed, commits, gone, report,
                                    trimmed.get((e.topic, e.generation), {})
                                    if e.topic in delayed else None)
                     for e in history.of(h.Fetched))
        report.count("fetch_gaps_judged", judged)
    _check_liveness(index, cursors, acked, report)


class _Deletions:
    """When the oracle saw each pull subscription deleted, or its shard stop."""

    def __init__(self) -> None:
        self.times: dict[Key, list[float]] = {}
        self.stopped: dict[int, float] = {}

    def add(self, key: Key, t: float) -> None:
        self.times.setdefault(key, []).append(t)

    def stop(self, generation: int, t: float) -> None:
        self.stopped.setdefault(generation, t)

    def between(self, key: Key, t1: float, t2: float) -> bool:
        """Whether the subscription may have been deleted between ``t1`` and ``t2``
        (both included: at one instant, either order is possible)."""
        if self.stopped.get(key[1], math.inf) <= t2:
            return True
        times = self.times.get(key, [])
        i = bisect.bisect_left(times, t1)
        return i < len(times) and times[i] <= t2


def _check_page(e: h.Fetched, ids: dict[tuple[str, int, int], str],
                attempted: set[tuple[str, str]],
                acked: dict[tuple[str, int], list[tuple[float, int]]], report: Report) -> None:
    """G1/G2/G7 on one FETCHED page, from what it says and what clients saw before."""
    where = f"{e.subscriber}: FETCH {e.topic}@{e.offset}"
    if e.asked_generation is not None:
        report.examine("G7", "fetch-generation")
    if e.asked_generation is not None and e.generation != e.asked_generation:
        report.add("G7", "fetch-generation", e.t,
                   f"{where} of generation {e.asked_generation:#x} answered from generation"
                   f" {e.generation:#x} (TopicReset expected)")
        return
    report.examine("G1", "fetch-range")
    report.examine("G1", "fetch-next")
    if e.first < e.next and e.max_messages > 0 and not e.holes:
        report.examine("G2", "fetch-empty")
    report.examine("G1", "fetch-id", len(e.ids))
    report.examine("G2", "fetch-unexpected", len(e.ids))
    page = e.page()
    if e.holes:  # offsets one by one (G12: held out of line): increasing, in the range
        bad_range = e.oldest > e.next or any(
            o < max(e.offset, e.oldest) or o >= e.next for o in page) \
            or any(a >= b for a, b in pairwise(page))
    else:
        bad_range = e.oldest > e.next or e.first != max(e.offset, e.oldest) \
            or bool(e.ids and e.first + len(e.ids) > e.next)
    if bad_range:
        report.add("G1", "fetch-range", e.t,
                   f"{where} got first={e.first}, {len(e.ids)} message(s), oldest={e.oldest},"
                   f" next={e.next}: a page starts at max(offset, oldest) and ends by next")
    elif not e.ids and e.first < e.next and e.max_messages > 0 and not e.holes:
        report.add("G2", "fetch-empty", e.t,
                   f"{where} got no message though [{e.first}, {e.next}) is held")
    late = [o for t, o in acked.get((e.topic, e.generation), ()) if t < e.requested and o >= e.next]
    if late:
        report.add("G1", "fetch-next", e.t,
                   f"{where} says next={e.next}, but offset {min(late)} was acked before the"
                   " FETCH was sent")
    # a dead-letter topic holds messages published to its source topic (G11)
    published_to = dead_letter_source(e.topic) or e.topic
    for offset, message_id in zip(page, e.ids, strict=False):
        known = ids.setdefault((e.topic, e.generation, offset), message_id)
        if known != message_id:
            report.add("G1", "fetch-id", e.t,
                       f"{where} read {e.topic}@{offset} as {message_id!r}; it holds"
                       f" {known!r} (generation {e.generation:#x})")
        if (published_to, message_id) not in attempted:
            report.add("G2", "fetch-unexpected", e.t,
                       f"{where} read {e.topic}@{offset} id={message_id!r}, never published")


def _check_cursors(index: Index, key: Key, seen: list[_Cursor], gone: _Deletions,
                   report: Report) -> None:
    """G6: a pull subscription's cursor never moves back. A reply that arrived before
    another request was sent was answered first; unless the subscription may have been
    deleted in between, the later answer's cursor is at least the earlier one's. A
    resume's cursor is no floor across a stop of its shard: it may hold commits whose
    records were not durable yet (G9 holds back COMMITTED, not a resuming SUBSCRIBED),
    and a disk topic's recovery, in the same generation, goes back to the last durable."""
    ordered = sorted(seen, key=lambda c: c.t)
    arrivals = [c.t for c in ordered]
    for b in ordered:
        before = ordered[:bisect.bisect_left(arrivals, b.requested)]
        floor = max((a for a in before if not gone.between(key, a.requested, b.t) and not (
                        a.shard is not None and not a.created
                        and index.stopped_between(a.shard, a.requested, b.t))),
                    key=lambda a: a.cursor, default=None)
        if floor is not None:
            report.examine("G6", "commit-moved-back" if b.what == "committed to"
                           else "resume-below-commit")
        if floor is None or b.cursor >= floor.cursor:
            continue
        rule = "commit-moved-back" if b.what == "committed to" else "resume-below-commit"
        report.add("G6", rule, b.t,
                   f"{key[0]}/{key[2]} {b.what} cursor {b.cursor} (asked at {b.requested:.3f}),"
                   f" below the cursor {floor.cursor} it was {floor.what} at {floor.t:.3f}")


def _check_cursor_bound(key: Key, seen: list[_Cursor],
                        commits: dict[tuple[str, str], list[tuple[float, int | None, int]]],
                        gone: _Deletions, report: Report) -> None:
    """G6: a pull subscription's cursor moves only by COMMIT, so a cursor the shard
    reports (a resume, a COMMITTED) is at most the larger of its start and the highest
    COMMIT its name was sent before the reply arrived. Sound under any delay: the
    start is a created SUBSCRIBED reply that arrived first, with no deletion of the
    subscription possible between that SUBSCRIBE's sending and this reply (else the
    subscription may be another, with another start); a COMMIT counts from when it
    left the client, whatever incarnation or generation it named (more only widens
    the bound)."""
    names = commits.get((key[0], key[2]), ())
    for b in seen:
        starts = [a.cursor for a in seen
                  if a.created and a.t <= b.t and not gone.between(key, a.requested, b.t)]
        if not starts:
            continue
        report.examine("G6", "cursor-past-commit")
        bound = max([max(starts)] + [offset for t, _g, offset in names if t <= b.t])
        if b.cursor > bound:
            report.add("G6", "cursor-past-commit", b.t,
                       f"{key[0]}/{key[2]} {b.what} cursor {b.cursor}, past its start and"
                       f" every COMMIT sent before the reply (at most {bound})")


def _check_skipped(e: h.Fetched, subscribed: dict[Key, list[h.Subscribed]],
                   commits: dict[tuple[str, str], list[tuple[float, int | None, int]]],
                   gone: _Deletions, report: Report,
                   deleted: dict[int, float] | None = None) -> bool:
    """G5: a FETCH that names its pull subscription never finds cleaned up a message
    that subscription still held. A SUBSCRIBED reply that arrived before the FETCHED
    says the subscription held every offset from its start (created) or cursor
    (resumed) on, and kept holding each until a COMMIT past it: if no COMMIT past an
    offset was sent before the reply arrived, and the subscription may not have been
    deleted meanwhile, the page must not start above it. True if the page skipped
    offsets (cleaned up) and the rule could judge it.

    ``deleted`` (a topic that carries delayed messages: when the oracle first deleted
    each offset) narrows that for a start at the oldest message held or at a
    from_offset, and for a cursor: it may be a kept delayed message below offsets gone
    before the subscription was made (G12; a cursor stays below them), so such a
    SUBSCRIBED proves held only the offsets the oracle deleted after it arrived. One
    that made the subscription at the next offset still proves every offset above it."""
    if e.name is None or e.first <= e.offset:
        return False
    key = (e.topic, e.generation, e.name)
    proofs = [s for s in subscribed.get(key, ())
              if s.t < e.t and not gone.between(key, s.requested, e.t)]
    if not proofs:
        return False
    report.examine("G5", "fetch-skipped")
    committed = max((offset for t, generation, offset in commits.get((e.topic, e.name), ())
                     if t < e.t and generation in (None, e.generation)), default=0)
    low = max(e.offset, committed)

    def held_by(s: h.Subscribed, offset: int) -> bool:
        if offset < (s.start if s.created else s.cursor):
            return False
        if deleted is None or (s.created and not (s.reset or s.read_old
                                                  or s.from_offset is not None)):
            return True
        return deleted.get(offset, -math.inf) > s.t

    held = min(s.start if s.created else s.cursor for s in proofs)
    skipped = next((o for o in range(max(low, held), e.first)
                    if any(held_by(s, o) for s in proofs)), None)
    if skipped is not None:
        report.add("G5", "fetch-skipped", e.t,
                   f"{e.subscriber}: FETCH {e.topic}@{e.offset} started at {e.first} (oldest"
                   f" {e.oldest}); offset {skipped} was held for subscription {e.name}"
                   f" (from {held}, committed to {committed}) and not committed past")
    return True


def _check_liveness(index: Index, cursors: dict[Key, list[_Cursor]],
                    acked: dict[tuple[str, int], list[tuple[float, int]]],
                    report: Report) -> None:
    """A live pull reader, once faults heal, commits up to the end of what was acked in
    its subscription's generation (all but the last ``SETTLE`` seconds of acks)."""
    history = index.history
    last: dict[str, h.Subscribed] = {}
    for e in history.of(h.Subscribed):
        if e.mode == "pull" and e.name is not None:
            last[e.subscriber] = e
    final = {e.topic: e.generation for e in history.of(h.PublishAcked)}
    for spec in history.meta.get("liveness", []):
        sub = last.get(spec["subscriber"])
        if not spec.get("pull") or sub is None or sub.topic != spec["topic"] \
                or final.get(sub.topic) != sub.generation:
            continue  # (never-subscribed, stale-generation: the liveness module's)
        assert sub.name is not None
        key = (sub.topic, sub.generation, sub.name)
        due = [o for t, o in acked.get((sub.topic, sub.generation), ())
               if t <= index.end_at - SETTLE]
        if not due or index.heal_at + SETTLE > index.end_at:
            continue
        cursor = max((c.cursor for c in cursors.get(key, ())), default=0)
        report.examine("liveness", "pull-behind")
        if cursor <= max(due):
            report.add("liveness", "pull-behind", index.end_at,
                       f"{sub.subscriber} committed {sub.topic} generation {sub.generation:#x}"
                       f" only to {cursor}; offset {max(due)} was acked before"
                       f" {index.end_at - SETTLE:.3f}")
