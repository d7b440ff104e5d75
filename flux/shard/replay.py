"""Rebuilding a disk topic from its log's records at shard start (G9 recovery).

:class:`TopicReplay` takes the records recovery reads, in order, and builds
the topic as of its last durable state: messages at their offsets with their
store times, the dedup window (an id stored within ``dedup_window`` of now is
still a duplicate), the head as trims left it, and every named subscription
with its cursor and acks, inactive until a client resumes it (its
``inactive_time`` counts from the recovery). Payloads are not kept: each run of
messages remembers where its PUBLISH record is, and the shard reads payloads back
when they are first wanted (:mod:`flux.shard.cache`), so recovering a log bigger
than memory holds only ids in memory; a kept delayed message (G12) stays in its latest
KEEP record the same way (:mod:`flux.shard.kept`).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator, Sequence
from typing import Any

import msgpack

from flux.acks import Acks
from flux.message_meta import make_meta
from flux.policies import TopicSettings
from flux.shard import journal as J
from flux.shard.dedup import DedupWindow
from flux.shard.due_index import TopicDelays
from flux.shard.kept import Placed
from flux.shard.packed_ids import PackedIds
from flux.shard.publish_record import read_publish
from flux.shard.sharing import Group
from flux.shard.state import Topic
from flux.shard.subscription import Subscription
from flux.shard.topic import TopicLog
from flux.storage import Record

WINDOW_STEP = 32768  # ids remembered between two pauses of a window's rebuild (~10 ms)


class ReplayError(Exception):
    """A record that passed its checksum but does not make sense (a bug, not damage)."""


class TopicReplay:
    """Feeds on one topic's records (:meth:`feed`), then builds it (:meth:`build`).

    ``epoch`` is wall time minus the new incarnation's monotonic time: a record's
    wall time ``w`` becomes the monotonic store time ``w - epoch``.
    """

    def __init__(self, name: str, settings: TopicSettings, epoch: float,
                 now: float = -math.inf) -> None:
        self.name = name
        self.settings = settings
        self.epoch = epoch
        # ids stored at or before this (monotonic) time have left the dedup window by the
        # recovery's ``now``: they are not remembered at all (most of a long log's ids)
        self.forgotten_by = now - settings.dedup_window
        self.log: TopicLog | None = None
        self.dedup = DedupWindow(settings.dedup_window)
        # the runs of ids still in the window, in log order, remembered at build (their
        # number known: the window's index is made at its size once, never grown)
        self._window: list[tuple[Sequence[str], int, float, int | None]] = []
        self.next_offset = 0        # at least this (a snapshot's, when no message is left)
        self.oldest = 0             # trims moved the head here
        # name -> [mode, start offset, created (wall), cursor, acks (above the cursor, once
        # the records before it are applied: those the cursor passed go at build)]
        self.subs: dict[str, list[Any]] = {}
        self.records = 0
        self.messages = 0
        self.gaps = 0
        self.published: list[tuple[int, int, float]] = []  # (end, next offset, wall) each
        self.delayed = TopicDelays()  # the runs of delayed messages
        self.pushes: dict[str, dict[int, int]] = {}  # name -> offset -> pushes used (G11)
        # kept messages (G12: delayed ones a trim passed), by offset: where their latest
        # KEEP record is, their size and key (their payloads stay in the log), whether
        # they have a key or headers, and their wall due time
        self.kept: dict[int, tuple[Placed, bool, float | None]] = {}

    def feed(self, rec: Record) -> None:
        """Apply one record (in log order)."""
        self.records += 1
        rtype = rec.type
        if rtype == J.PUBLISH:  # ids and payload lengths only: the payloads stay in the log
            first, wall, ids, size, lens, fields = read_publish(rec.body)
            self._publish(first, wall, ids, size, lens, rec.position, rec.end, fields)
            self.published.append((rec.end, first + len(ids), wall))
            return
        body = msgpack.unpackb(rec.body, raw=False, use_list=True)
        if rtype == J.IDS:
            first, wall, ids = body
            self._ids(first, wall, ids)
            self.published.append((rec.end, first + len(ids), wall))
        elif rtype in (J.CURSOR, J.CURSOR_V1):  # acks added since the last record (as runs;
            # format 1: as offsets): their union counts
            name, cursor, acked = body
            row = self.subs.get(name)
            if row is not None:
                row[3] = cursor
                if rtype == J.CURSOR:
                    row[4].add_runs(acked)
                else:
                    add = row[4].add
                    for o in acked:
                        add(o)
        elif rtype == J.SUBSCRIPTION:
            name, mode, start, created = body
            self.subs[name] = [mode, start, created, start, Acks()]
            self.pushes.pop(name, None)
        elif rtype == J.UNSUBSCRIBED:
            self.subs.pop(body[0], None)
            self.pushes.pop(body[0], None)
        elif rtype == J.TRIM:
            self.oldest = max(self.oldest, body[0])
        elif rtype == J.KEEP:
            position = rec.position
            for offset, message_id, _, payload, key, headers, due in body:
                self.kept[offset] = (Placed(position, len(message_id) + len(payload), key),
                                     key is not None or headers is not None, due)
        elif rtype == J.RELEASE:
            for o in body:
                self.kept.pop(o, None)
        elif rtype == J.PUSHES:  # push counts that survive (G11): the highest count wins
            name, pushes, runs = body
            counts = self.pushes.setdefault(name, {})
            for first, count in zip(runs[0::2], runs[1::2], strict=True):
                for o in range(first, first + count):
                    if counts.get(o, 0) < pushes:
                        counts[o] = pushes
        elif rtype in (J.SNAPSHOT, J.SNAPSHOT_V1):
            next_offset, oldest, rows = body[:3]
            # the messages kept then (a fourth field; none without it): a KEEP record
            # before it of any other was released, its RELEASE perhaps compacted away
            still = set(body[3]) if len(body) > 3 else set()
            self.kept = {o: kept for o, kept in self.kept.items() if o in still}
            self.next_offset = max(self.next_offset, next_offset)
            self.oldest = max(self.oldest, oldest)
            acks = Acks.from_runs if rtype == J.SNAPSHOT else Acks  # (format 1: offsets)
            self.subs = {row[0]: [row[1], row[2], row[3], row[4], acks(row[5])] for row in rows}
            self.pushes = {row[0]: dict(zip(row[6][0::2], row[6][1::2], strict=True))
                           for row in rows if len(row) > 6}
        else:
            raise ReplayError(f"topic {self.name!r}: unknown record type {rtype} at"
                              f" position {rec.position}")

    def _publish(self, first: int, wall: float, ids: Sequence[str], size: int,
                 lens: bytes | array[int], position: int, end: int,
                 fields: dict[str, Any] | None = None) -> None:
        log = self.log
        if log is None or first > log.next_offset:
            if log is not None:  # offsets skipped (never expected in one log): start anew
                self.gaps += 1
            log = self.log = TopicLog(first, placed=True)
        elif first < log.next_offset:
            return  # already applied (never expected either)
        stored_at = wall - self.epoch
        chunk = ids
        meta = None
        if fields:   # a fifth field: keys, headers and due times (absent from older records)
            epoch, n = self.epoch, len(chunk)
            dues = fields.get("due")
            if dues is not None:  # wall due times, back on this incarnation's clock
                self.delayed.add(self.name, first,
                                 [None if d is None else d - epoch for d in dues])
            meta = make_meta(fields.get("keys"), fields.get("headers"), n)
        log.extend_placed(chunk, lens, stored_at, position, end, size, meta)
        if self.dedup.window > 0 and stored_at > self.forgotten_by:
            self._window.append((chunk, first, stored_at, size))
        self.messages += len(chunk)

    def _ids(self, first: int, wall: float, ids: list[str]) -> None:
        """Messages gone before a compaction whose ids may still be in the window."""
        stored_at = wall - self.epoch
        if self.dedup.window > 0 and stored_at > self.forgotten_by:
            self._window.append((tuple(ids), first, stored_at, None))
        self.next_offset = max(self.next_offset, first + len(ids))

    def remember_window(self, step: int = WINDOW_STEP) -> Iterator[None]:
        """Remember the runs of ids still in the window, in log order (as a shard that
        took them one after another would have: one that came again takes its place),
        pausing (a ``yield``) after every ``step`` ids: the caller lets its other tasks
        run there. :meth:`build` does what is left."""
        runs, self._window = self._window, []
        if not runs:
            return
        self.dedup.expect(sum(len(ids) for ids, _, _, _ in runs))
        remember = self.dedup.remember_all
        done = 0
        for ids, first, stored_at, size in runs:
            # (the log keeps a record's ids packed: a str each only for the window's pass)
            remember(ids.unpacked() if type(ids) is PackedIds else ids, first, stored_at, size)
            done += len(ids)
            if done >= step:
                done = 0
                yield

    def _hold_kept(self, log: TopicLog) -> TopicDelays:
        """Hold the kept messages below the log's oldest out of line (those at or above it
        are in line: a TRIM after their KEEP record was lost); the topic's index of
        delayed messages, theirs included."""
        kept = sorted((o, v) for o, v in self.kept.items() if o < log.oldest)
        self.kept = {o: v for o, v in self.kept.items() if o < log.oldest}
        if not kept:
            self.delayed.forget_below(log.oldest)
            return self.delayed
        epoch = self.epoch
        dues: dict[int, float | None] = {}
        for o, (placed, meta, due) in kept:  # (recovery counts its KEEP records durable)
            log.hold_placed(o, placed, meta)
            dues[o] = None if due is None else due - epoch
        # the index takes offsets in increasing order: the kept ones, then those in line
        dues.update((o, due) for o, due in self.delayed.items() if o >= log.oldest)
        delayed = TopicDelays()
        for o in sorted(dues):
            delayed.add(self.name, o, [dues[o]])
        return delayed

    def kept_positions(self) -> dict[int, int]:
        """Each kept message's offset -> the position of its latest KEEP record, in the
        order of those positions (for the topic's journal; after :meth:`build`)."""
        return dict(sorted(((o, placed.position) for o, (placed, _, _) in self.kept.items()),
                           key=lambda item: item[1]))

    def build(self, generation: int, now: float, *, reset: bool = False) -> Topic:
        """The recovered topic at ``now`` (monotonic), of ``generation``. ``reset``: a new
        generation (G9: after a power loss or damage) in which the old one's acks mean
        nothing to clients, so each subscription starts over at the oldest message held
        (``log.lowest``: a kept delayed message below the oldest in line counts)."""
        log = self.log
        if log is None or log.next_offset < self.next_offset:
            log = TopicLog(max(self.next_offset, log.next_offset if log else 0), placed=True)
        if self.oldest > log.oldest:
            log.trim(self.oldest, math.inf)
        for _ in self.remember_window(1 << 62):
            pass
        self.dedup.expire(now)
        delayed = self._hold_kept(log)
        topic = Topic(self.name, log, self.dedup, self.settings, generation=generation,
                      delayed=delayed)
        for name, (mode, start, created, cursor, acked) in self.subs.items():
            if reset:  # from the oldest message held, a kept one below the oldest in line
                # included (G12: carried into the new generation, it is delivered there)
                cursor, start, acked = log.lowest, log.lowest, Acks()
            else:
                acked = acked.copy()  # (build may run again: the replay keeps its own)
                acked.drop_below(cursor + 1)
            shared = mode in ("shared", "shared-keyed")  # (journal_mode)
            sub = Subscription(topic=self.name, name=name, ephemeral=False,
                               mode="push" if shared else mode,
                               cursor=cursor, start_offset=start,
                               created_at=created - self.epoch,
                               acked=acked,
                               group=Group(mode == "shared-keyed") if shared else None)
            sub.inactive_since = now
            sub.last_activity = now
            if not reset:  # pushes of a new generation's messages start again
                sub.push_counts = {o: n for o, n in sorted(self.pushes.get(name, {}).items())
                                   if o >= cursor and o not in sub.acked}
            topic.subs[name] = sub
        return topic
