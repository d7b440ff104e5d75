"""A subscription: a named cursor on one topic, its acks and its in-flight pushes.

The cursor is the lowest unacked offset; acks above it are remembered in
``acked``. While a session is attached, ``in_flight`` maps each pushed, unacked
offset to how many pushes it has used, and two FIFO queues drive selective
redelivery (G4): ack deadlines (one entry per DELIVER batch) and re-push times.
Push ``k`` of a message falls at ``t0 + k*(timeout + retry_interval)``. Timeouts
are uniform, so each queue is already in time order and needs no heap.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from flux.acks import Acks
from flux.shard.inflight import InFlight

if TYPE_CHECKING:
    from flux.shard.sharing import Group

Mode = Literal["push", "pull"]

DEADLINE = 0
REPUSH = 1


class PushTimers:
    """Ack deadlines and re-push times of one attachment (a plain subscription's
    session, or a member of a shared one): two FIFO queues, already in time order."""

    deadlines: deque[tuple[float, Any, Any, int]]
    repushes: deque[tuple[float, int, int, int]]
    epoch: int
    wake_at: float | None
    topic: str
    deleted: bool

    def next_timer(self) -> float | None:
        """When the earliest deadline or re-push falls, if any."""
        d = self.deadlines[0][0] if self.deadlines else None
        r = self.repushes[0][0] if self.repushes else None
        if d is None:
            return r
        if r is None:
            return d
        return min(d, r)

    def add_deadlines(self, at: float, offsets: Sequence[int], pushes: Any) -> None:
        """Push ``pushes`` of each of ``offsets`` waits for its ack until ``at`` (a
        member's ``pushes`` may be one number per offset)."""
        q = self.deadlines
        if q and q[-1][0] > at:  # a late tick; keep the queue ordered
            at = q[-1][0]
        q.append((at, offsets, pushes, self.epoch))

    def add_repush(self, at: float, offset: int, pushes: int) -> None:
        q = self.repushes
        if q and q[-1][0] > at:
            at = q[-1][0]
        q.append((at, offset, pushes, self.epoch))


@dataclass(eq=False)
class Subscription(PushTimers):
    """State of one subscription; the shard core mutates it."""

    topic: str
    name: str
    ephemeral: bool
    mode: Mode
    cursor: int
    start_offset: int
    created_at: float
    acked: Acks = field(default_factory=Acks)
    # a disk topic's: once its cursor was journaled, the acks added to ``acked`` since
    # the last CURSOR record (the next one carries only those, as runs)
    recording: bool = False
    unrecorded: Acks = field(default_factory=Acks)
    # push state, valid for the attached session only (reset on attach/detach)
    session: tuple[int, int] | None = None   # (connection id, client's sid)
    epoch: int = 0
    next_push: int = 0
    credit: int = 0
    max_in_flight: int = 1
    in_flight: InFlight = field(default_factory=InFlight)
    # what this attachment was sent: offsets in [attached_from, next_push) except those
    # already acked when it attached (skipped, never pushed to it)
    attached_from: int = 0
    preacked: Acks = field(default_factory=Acks)
    # (at, offsets, pushes, epoch): one entry per batch of pushes that share a deadline
    deadlines: deque[tuple[float, Any, Any, int]] = field(default_factory=deque)
    repushes: deque[tuple[float, int, int, int]] = field(default_factory=deque)
    # activity (G6)
    active: bool = False
    inactive_since: float = 0.0
    last_activity: float = 0.0
    deleted: bool = False
    wake_at: float | None = None  # earliest time the shard's timer heap will wake us
    redelivered: int = 0  # re-pushes after ack timeouts since the subscription was made
    # delayed delivery (G12), for the attached session: the delayed messages that are due
    # and still to be first-pushed, as (wall due, offset), and those it was first pushed;
    # ``delayed`` is the topic's map of delayed offsets (shared, not copied)
    due_heap: list[tuple[float, int]] = field(default_factory=list)
    due_pushed: set[int] = field(default_factory=set)
    delayed: Container[int] | None = None
    # G11, for the attached session (reset on attach/detach): nak'd offsets out of the
    # window until their re-push -> pushes used, their re-push times as a heap of (at,
    # offset, pushes, epoch), and in_progress's later ack deadlines (offset -> when)
    nak_waiting: dict[int, int] = field(default_factory=dict)
    naks: list[tuple[float, int, int, int]] = field(default_factory=list)
    extended: dict[int, float] = field(default_factory=dict)
    # G11, across attachments: pushes used by each unacked offset (kept only when the
    # topic has a dead-letter policy: "push counts that survive"; a shared subscription's
    # members and group keep its counts, and this holds only those a restart kept until
    # a member attaches: surviving_counts), and the offsets whose dead letter the
    # dead-letter topic refused (full): not pushed, (pushes, reason) each
    push_counts: dict[int, int] = field(default_factory=dict)
    dead_pending: dict[int, tuple[int, str]] = field(default_factory=dict)
    carry_max: int = -1            # the highest offset with a count when it last attached
    dead_lettered: int = 0         # messages written to its dead-letter topic
    dead_letter_refused: int = 0   # messages its dead-letter topic refused (at first)
    # a shared subscription (G10): its members and what they share; None: a plain one
    group: Group | None = None

    @property
    def shared(self) -> bool:
        return self.group is not None

    @property
    def pushing(self) -> bool:
        """Whether a session (or, shared, a member) is attached to take pushes."""
        return self.session is not None or (self.group is not None and bool(self.group.members))

    def attached_as(self, conn: int, sid: int) -> bool:
        """Whether connection ``conn``'s ``sid`` is attached to this subscription now."""
        group = self.group
        if group is None:
            return self.session == (conn, sid)
        return (conn, sid) in group.members

    def surviving_counts(self) -> dict[int, int]:
        """Pushes used by each unacked offset that has a count kept (G11): a shared
        subscription's are its members' in-flight counts and its group's (handed off,
        nak'd, from an earlier round), beside those a restart kept."""
        group = self.group
        if group is None:
            return self.push_counts
        counts = dict(self.push_counts)
        counts.update(group.pushes)
        for m in group.members.values():
            counts.update(m.in_flight)
        cursor, acked = self.cursor, self.acked
        return {o: n for o, n in sorted(counts.items()) if o >= cursor and o not in acked}

    # -- cursor and acks ---------------------------------------------------------------

    def was_delivered(self, offset: int) -> bool:
        """Whether ``offset`` was pushed to the attached session (acked since or not)."""
        if offset in self.in_flight:
            return True
        if self.session is None:
            return False
        delayed = self.delayed
        if delayed and offset in delayed:  # pushed from the due heap, if at all (one acked
            # in this attachment was pushed in it: due_pushed lets those go)
            return offset in self.due_pushed or (
                offset >= self.attached_from and offset not in self.preacked
                and (offset < self.cursor or offset in self.acked))
        return self.attached_from <= offset < self.next_push and offset not in self.preacked

    def ack(self, offset: int) -> bool:
        """Ack one pushed offset of the attached session; False if it was not in flight."""
        if self.in_flight.pop(offset, None) is None:
            return False
        self.mark_acked(offset)
        return True

    def mark_acked(self, offset: int) -> None:
        """Count ``offset`` (unacked, at or above the cursor) as acked: move the cursor
        over it and the acks above it, or remember it above the cursor."""
        if offset == self.cursor:
            self.cursor = self.acked.take_run(offset + 1)
        else:
            self.acked.add(offset)
            if self.recording:
                self.unrecorded.add(offset)

    def mark_acked_all(self, offsets: Sequence[int]) -> None:
        """:meth:`mark_acked` of each of ``offsets`` (distinct, unacked, at or above the
        cursor; any order), in bulk when they are one run (a member's usual ack)."""
        ordered = sorted(offsets)
        first, last = ordered[0], ordered[-1]
        acked = self.acked
        run = last - first == len(ordered) - 1
        if run:
            acked.add_range(first, last + 1)
        else:  # a few runs, as a key-ordered member's acks are
            acked.add_sorted(ordered)
        cursor = self.cursor = acked.take_run(self.cursor)
        if self.recording and last >= cursor:
            if run:
                self.unrecorded.add_range(max(first, cursor), last + 1)
            else:
                self.unrecorded.add_sorted(ordered[bisect_left(ordered, cursor):])

    def count_acked(self, offset: int) -> bool:
        """Count ``offset`` as acked whether or not it is in flight (G11: a dead letter,
        or a term without a dead-letter policy); False if it was acked already."""
        self.in_flight.pop(offset, None)
        self.nak_waiting.pop(offset, None)
        self.extended.pop(offset, None)
        self.dead_pending.pop(offset, None)
        self.push_counts.pop(offset, None)
        if offset < self.cursor or offset in self.acked:
            return False
        self.mark_acked(offset)
        return True

    def ack_through(self, through: int) -> int:
        """Ack every in-flight offset <= ``through`` except delayed messages (G12: pushed
        out of offset order, a client may not have seen one when it sent ``through``);
        returns how many."""
        # in_flight is in increasing offset order: first pushes go out in offset order
        # (G1) and a re-push updates its entry in place; unless a delayed message was
        # pushed out of offset order (G12): then every entry is looked at
        in_flight = self.in_flight
        if not in_flight:
            return 0
        ordered = not self.due_pushed
        first = in_flight.first() if ordered else min(in_flight)
        if first > through:
            return 0
        last = in_flight.last()
        n = len(in_flight)
        if ordered and not self.acked and first == self.cursor and last - first == n - 1:
            # the usual case: in flight is exactly the run cursor..last (increasing,
            # distinct keys), and all or a prefix of it is acked: what ack() does, in bulk
            if through >= last:
                in_flight.clear()
                self.cursor = last + 1
                return n
            in_flight.drop_through(through)
            self.cursor = through + 1
            return through + 1 - first
        due: list[int] = []
        pushed_late = self.due_pushed
        for offset in in_flight:
            if offset > through:
                if ordered:
                    break
                continue
            if offset not in pushed_late:  # a delayed message is acked by its offset only
                due.append(offset)
        ack = self.ack
        for offset in due:
            ack(offset)
        return len(due)

    def commit(self, offset: int) -> None:
        """Move a pull subscription's cursor forward to ``offset`` (never back)."""
        if offset > self.cursor:
            self.acked.drop_below(offset)
            self.cursor = self.acked.take_run(offset)

    # -- sessions ----------------------------------------------------------------------

    def attach(self, session: tuple[int, int], credit: int, max_in_flight: int,
               now: float) -> None:
        """Attach a session: pushes resume from the cursor with fresh push counts."""
        self.start_round(now)
        self.session = session
        self.credit = credit
        self.max_in_flight = max_in_flight

    def start_round(self, now: float) -> None:
        """Become active with pushes starting over from the cursor (no session yet: a
        shared subscription's members attach to it, :mod:`flux.shard.sharing`)."""
        self._reset_push_state()
        self.next_push = self.cursor
        self.attached_from = self.cursor
        self.preacked = self.acked.copy()
        self.active = True
        self.last_activity = now

    def detach(self, now: float) -> None:
        """Make the subscription inactive: no pushes, cursor and acks kept."""
        self._reset_push_state()
        self.session = None
        if self.active:
            self.active = False
            self.inactive_since = now

    def _reset_push_state(self) -> None:
        self.epoch += 1
        self.in_flight.clear()
        self.deadlines.clear()
        self.repushes.clear()
        self.credit = 0
        self.preacked = Acks()
        self.due_heap = []
        self.due_pushed = set()
        self.nak_waiting.clear()
        self.naks = []
        self.extended.clear()

    # -- timers ------------------------------------------------------------------------

    def next_timer(self) -> float | None:
        """When the earliest deadline, re-push or nak'd message's re-push (G11) falls."""
        at = super().next_timer()
        if self.naks:
            n = self.naks[0][0]
            return n if at is None else min(at, n)
        return at
    def drop_acked_deadlines(self) -> None:
        """Forget the oldest ack deadlines whose batches are all below the cursor (acked):
        they would only expire with nothing to do, held for ``subscriber.timeout``."""
        q, cursor = self.deadlines, self.cursor
        while q and (not q[0][1] or q[0][1][-1] < cursor):
            q.popleft()
        if self.extended:  # and in_progress deadlines of acked messages (else kept)
            for offset in [o for o in self.extended if o < cursor]:
                del self.extended[offset]

    def is_current(self, offset: int, pushes: int, epoch: int) -> bool:
        """Whether a timer entry still refers to an unacked push of this attachment."""
        return epoch == self.epoch and self.in_flight.get(offset) == pushes
