"""Shared subscriptions (G10): members of one subscription drain it together.

Every session attached to a shared subscription is a *member* (:class:`Member`)
with its own credit, window (``max_in_flight``), in-flight pushes and ack
deadlines. What members share lives in the subscription's :class:`Group`: the
cursor and acks (the subscription's own, so G5 and the journal treat the group
as one subscription), which member holds each offset in flight, push counts that
survive hand-offs and re-attaching, hand-offs waiting for a member with room,
and, with ``key_ordered``, the member each key is pinned to.

- A message is in flight to at most one member; only that member may ack it.
- A member that leaves (unsubscribe, disconnect, heartbeat loss) hands its
  unacked messages to the others at once, in offset order, within their windows
  and credit; each hand-off is a push. With no member left the group is
  inactive; the next member to attach resumes from the cursor.
- An ack timeout re-pushes the message to the member holding it (G4's schedule
  per message); a message that used all its pushes, a hand-off included, makes
  the whole group inactive (G4), unless a dead-letter policy takes it.
- ``key_ordered``: a keyed message goes to the member its key is pinned to; a key
  is pinned when a member gets one of its messages and released when that member
  holds none of them unacked. A key's first pushes go in offset
  order: one that cannot go now (its member's window is full) waits in the key's
  queue, and later ones of that key queue behind it instead of overtaking it.
- A member's pushes of an offset below the highest it was pushed before (hand-offs,
  a nak'd message back, a key's queued messages) are *late*: a cumulative ack never
  covers them, since the client may not have seen them when it sent it; they are
  acked by offset, as the client library does for every offset delivered below one
  it had. A re-push after an ack timeout is not late: the member had the message.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import groupby, islice
from operator import lt
from typing import Any, cast

from flux import errors
from flux.hashing import dead_letter_topic
from flux.message_meta import check_delay
from flux.shard.dead_letters import dead_letter_reason
from flux.shard.delivery import Delivery
from flux.shard.held_keys import hold_keys, let_go
from flux.shard.naks import MAX_REASON_BYTES, check_item, settle_items
from flux.shard.state import P, Session
from flux.shard.subscription import PushTimers, Subscription

# Most messages of a key-ordered group that may wait for their key's member at once;
# past it, the group takes no new message until some of them went out (memory bound).
MAX_QUEUED_BY_KEY = 10_000


@dataclass(eq=False)
class Member(PushTimers):
    """One session attached to a shared subscription (``sub``)."""

    sub: Subscription
    topic: str
    conn: int
    sid: int
    credit: int
    max_in_flight: int
    joined_at: float
    # offset -> the push number it went out with (the message's push count then)
    in_flight: dict[int, int] = field(default_factory=dict)
    late: set[int] = field(default_factory=set)   # acked by offset only (module docstring)
    top: int = -1                                  # the highest offset pushed to it
    key_of: dict[int, str] = field(default_factory=dict)  # held keyed offset -> key
    keys: dict[str, int] = field(default_factory=dict)    # pinned key -> held unacked
    waiting_keys: set[str] = field(default_factory=set)   # pinned keys with a queue
    extended: dict[int, float] = field(default_factory=dict)  # in_progress: offset -> deadline
    deadlines: deque[tuple[float, Any, Any, int]] = field(default_factory=deque)
    repushes: deque[tuple[float, int, int, int]] = field(default_factory=deque)
    epoch: int = 0
    wake_at: float | None = None
    deleted: bool = False   # it left

    def is_current(self, offset: int, pushes: int, epoch: int) -> bool:
        """Whether a timer entry still refers to an unacked push to this member."""
        return epoch == self.epoch and self.in_flight.get(offset) == pushes


@dataclass(eq=False)
class Group:
    """What the members of one shared subscription share."""

    key_ordered: bool
    members: dict[tuple[int, int], Member] = field(default_factory=dict)
    # pushes used by unacked offsets not in flight now (handed off, or pushed before the
    # group was last inactive): their next push continues the count
    pushes: dict[int, int] = field(default_factory=dict)
    waiting: list[int] = field(default_factory=list)  # hand-offs without a member yet, sorted
    pins: dict[str, Member] = field(default_factory=dict)    # key_ordered: key -> member
    queued: dict[str, deque[int]] = field(default_factory=dict)  # key -> first pushes waiting
    queued_count: int = 0
    unpinned: set[str] = field(default_factory=set)  # keys with a queue whose member left
    turn: int = 0                   # where the next round of member choice starts
    counted_below: int = 0          # offsets from here on have no count from an earlier round
    # nak'd messages out of every window until their re-push (G11): offset -> when, and
    # the timer that wakes the group for them (it outlives members and rounds)
    nak_at: dict[int, float] = field(default_factory=dict)
    timer: NakTimer | None = None

    @property
    def holder(self) -> Holders:
        """Offset in flight -> the member holding it (read from the members' windows:
        no map is kept per push)."""
        return Holders(self.members)

    def clear_round(self) -> None:
        """Forget what one activation of the group had pending (counts are kept)."""
        self.waiting = []
        self.pins = {}
        self.queued = {}
        self.queued_count = 0
        self.unpinned = set()
        self.counted_below = max(self.pushes, default=-1) + 1


class Holders(Mapping[int, Member]):
    """Which member holds each offset in flight: a view of the members' windows (each
    offset is in at most one, G10), looked up member by member."""

    __slots__ = ("_members",)

    def __init__(self, members: dict[tuple[int, int], Member]) -> None:
        self._members = members

    def __getitem__(self, offset: int) -> Member:
        for m in self._members.values():
            if offset in m.in_flight:
                return m
        raise KeyError(offset)

    def __contains__(self, offset: object) -> bool:
        return any(offset in m.in_flight for m in self._members.values())

    def __iter__(self) -> Iterator[int]:
        for m in self._members.values():
            yield from m.in_flight

    def __len__(self) -> int:
        return sum(len(m.in_flight) for m in self._members.values())


@dataclass(eq=False)
class NakTimer(PushTimers):
    """Wakes a shared subscription when its nak'd messages are due (G11)."""

    sub: Subscription
    topic: str
    naks: list[tuple[float, int]] = field(default_factory=list)  # (at, offset) heap
    deadlines: deque[tuple[float, Any, Any, int]] = field(default_factory=deque)
    repushes: deque[tuple[float, int, int, int]] = field(default_factory=deque)
    epoch: int = 0
    wake_at: float | None = None
    deleted: bool = False

    def next_timer(self) -> float | None:
        return self.naks[0][0] if self.naks else None


class Sharing(Delivery):
    """Members joining and leaving, the group's pushes, timers and acks."""

    # -- joining and leaving -------------------------------------------------------------

    def _join(self, sub: Subscription, session: Session, sid: int, credit: int,
              max_in_flight: int, now: float) -> Member:
        """Attach ``session``'s ``sid`` as a member; the first member of an inactive
        group starts a new round from the cursor (push counts kept)."""
        group = sub.group
        assert group is not None
        if not group.members:
            sub.start_round(now)
            group.clear_round()
            # messages pushed in an earlier round go first, as hand-offs (window room
            # only); the round's scan skips them
            for o, n in sub.push_counts.items():  # counts a restart kept (G9, G11)
                if o >= sub.cursor and o not in sub.acked and n > group.pushes.get(o, 0):
                    group.pushes[o] = n
            sub.push_counts = {}  # (taken: from now on the group and its members keep them)
            group.counted_below = max(group.pushes, default=-1) + 1
            group.waiting = sorted(o for o in group.pushes
                                   if o >= sub.cursor and o not in sub.acked
                                   and o not in group.nak_at and o not in sub.dead_pending)
            self._attach_delays(self.topics[sub.topic], sub, now)
        member = Member(sub, sub.topic, session.conn, sid, credit, max_in_flight, now)
        group.members[(session.conn, sid)] = member
        sub.last_activity = now
        session.subs[sid] = sub
        self._dirty[id(sub)] = sub
        self._emit("joined", sub.topic, sub.name, (session.conn, sid))
        return member

    def _detach_sid(self, sub: Subscription, conn: int, sid: int, now: float) -> None:
        group = sub.group
        if group is None:
            super()._detach_sid(sub, conn, sid, now)
        elif (member := group.members.get((conn, sid))) is not None:
            self._leave(sub, member, now)

    def _member(self, sub: Subscription, conn: int, sid: int) -> Member | None:
        group = sub.group
        return None if group is None else group.members.get((conn, sid))

    def _leave(self, sub: Subscription, member: Member, now: float, hand_off: bool = True
               ) -> None:
        """``member`` leaves: its unacked messages wait for the others (the pump hands
        them on at once), its keys are released; the last one makes the group inactive."""
        group = sub.group
        assert group is not None
        if group.members.get((member.conn, member.sid)) is not member:
            return
        del group.members[(member.conn, member.sid)]
        member.deleted = True
        member.epoch += 1
        group.pushes.update(member.in_flight)
        if member.in_flight and hand_off:
            group.waiting = sorted({*group.waiting, *member.in_flight})
        member.in_flight.clear()
        member.deadlines.clear()
        member.repushes.clear()
        for key in member.keys:
            del group.pins[key]
        group.unpinned |= member.waiting_keys
        member.keys.clear()
        member.key_of.clear()
        member.waiting_keys.clear()
        self._emit("left", sub.topic, sub.name, (member.conn, member.sid))
        if not group.members:
            group.clear_round()
            if sub.active:
                sub.active = False
                sub.inactive_since = now
        else:
            self._dirty[id(sub)] = sub

    def _end_group(self, sub: Subscription, code: int, message: str, now: float,
                   keep: int | None = None) -> None:
        """Every member leaves, each told why (SUB_ENDED); the group is inactive. The
        push count of ``keep`` (an exhausted message) starts afresh next round."""
        group = sub.group
        assert group is not None
        for member in list(group.members.values()):
            session = self.sessions.get(member.conn)
            if session is not None:
                session.out.append([P.SUB_ENDED, member.sid, code, message])
            self._leave(sub, member, now, hand_off=False)
        if keep is not None:
            group.pushes.pop(keep, None)

    # -- pushing -----------------------------------------------------------------------

    def _pump(self, now: float) -> None:
        """Send first deliveries to every subscription that may have room for them.

        Until none is marked again: a push of counts kept from an earlier attachment
        (G11) may leave room it was given unused (a re-push uses no credit; a message
        out of pushes is dead-lettered instead, which marks the dead-letter topic's
        readers too) and marks the subscription anew; each round pushes or settles a
        message, so this ends."""
        while self._dirty:
            dirty = self._dirty
            self._dirty = {}
            for sub in dirty.values():
                if sub.session is not None:
                    self._push_new(sub, now)
                elif sub.group is not None and sub.group.members:
                    self._push_shared(sub, now)

    def _push_shared(self, sub: Subscription, now: float) -> None:
        """Hand-offs, then keys' queued messages, then new messages, to the members with
        room: one DELIVER per member and push count."""
        group = sub.group
        assert group is not None
        free = [m for m in group.members.values() if len(m.in_flight) < m.max_in_flight]
        if not free:
            return
        topic = self.topics[sub.topic]
        log = topic.log
        if not group.waiting and not group.queued and self._nothing_new(sub, topic):
            # (a member's ack marks the group: usually nothing is left to push then)
            group.turn += 1
            self._schedule_members(free)
            return
        max_pushes = 1 + topic.settings.retry_count
        # room in each member's window, and its credit (first pushes only use credit)
        rooms = {id(m): m.max_in_flight - len(m.in_flight) for m in free}
        credits = {id(m): m.credit for m in free}
        counts = group.pushes
        plan: dict[int, list[int]] = {}
        firsts: dict[int, range | None] = {}
        keyed = group.key_ordered and bool(log.metas)
        turn = group.turn % len(free)
        group.turn += 1
        order = free[turn:] + free[:turn]

        spin = [0]

        def fits(m: Member, offset: int) -> bool:
            """Whether ``m`` has room for ``offset`` (and credit, for a first push)."""
            return rooms.get(id(m), 0) > 0 and (credits[id(m)] > 0 or offset in counts)

        def pick(offset: int) -> Member | None:
            """The next member ``offset`` fits, round robin (messages and keys spread)."""
            n = len(order)
            for i in range(n):
                m = order[(spin[0] + i) % n]
                if fits(m, offset):
                    spin[0] += i + 1
                    return m
            return None

        exhausted: list[int] = []
        dead: list[tuple[int, int]] = []
        dead_letter = topic.settings.dead_letter
        key_at: dict[int, str] = {}   # key_ordered: the key of each assigned keyed offset

        def assign(m: Member, offset: int, key: str | None = None) -> None:
            if key is not None:
                key_at[offset] = key
            count = counts.get(offset, 0) if counts else 0
            if count >= max_pushes:  # a hand-off, or a count kept from an earlier round
                if dead_letter:
                    dead.append((offset, count))  # to the dead-letter topic, not pushed
                    return
                exhausted.append(offset)
            rooms[id(m)] -= 1
            if not count:
                credits[id(m)] -= 1
            plan.setdefault(id(m), []).append(offset)

        def key_of(offset: int) -> str | None:
            return log.meta_of(offset)[0] if keyed else None

        def pin(key: str, m: Member) -> None:
            group.pins[key] = m
            m.keys.setdefault(key, 0)
            if key in group.unpinned:  # its queue follows it
                group.unpinned.discard(key)
                m.waiting_keys.add(key)

        # 1. hand-offs of members that left, in offset order
        if group.waiting:
            kept: list[int] = []
            for offset in group.waiting:
                if not log.holds(offset) or offset < sub.cursor or offset in sub.acked \
                        or offset in sub.dead_pending:
                    group.pushes.pop(offset, None)
                    continue
                if dead_letter and counts.get(offset, 0) >= max_pushes:
                    # out of pushes: a dead letter, with no member chosen for it (one
                    # chosen would keep its key pinned while holding none of it, G10)
                    dead.append((offset, counts[offset]))
                    continue
                key = key_of(offset)
                target = group.pins.get(key) if key is not None else None
                if target is None:
                    target = pick(offset)
                    if target is not None and key is not None:
                        pin(key, target)
                if target is None or not fits(target, offset):
                    kept.append(offset)
                    continue
                assign(target, offset, key)
            group.waiting = kept
        # 2. keys' queued first pushes: to their members, or (member gone) to any
        def drain(m: Member, key: str) -> None:
            queue = group.queued[key]
            while queue and fits(m, queue[0]):
                assign(m, queue.popleft(), key)
                group.queued_count -= 1
            if not queue:
                del group.queued[key]
                m.waiting_keys.discard(key)

        if group.queued:
            for key in list(group.unpinned):
                target = pick(group.queued[key][0])
                if target is None:
                    break
                pin(key, target)
                drain(target, key)  # at once: the room it was chosen for is its own
            for m in order:
                for key in list(m.waiting_keys):
                    if rooms[id(m)] <= 0:
                        break
                    drain(m, key)
        # 3. new messages, from the round's scan (and due heap, G12); no more of them
        # than first pushes fit (so each one fits some member)
        total = sum(min(rooms[id(m)], credits[id(m)]) for m in free)
        while total > 0 and group.queued_count < MAX_QUEUED_BY_KEY:
            picks = self._next_firsts(sub, topic, total)
            if not picks:
                break
            lowest = picks.start if type(picks) is range else min(picks)  # (due order: any)
            if lowest < group.counted_below or group.nak_at or sub.dead_pending:
                # pushed in an earlier round (waiting as hand-offs, or out again already),
                # nak'd and not due again, or parked for its dead letter (G11)
                holder, nak_at, parked = group.holder, group.nak_at, sub.dead_pending
                picks = [o for o in picks if o not in counts and o not in holder
                         and o not in nak_at and o not in parked]
            if not keyed:
                if type(picks) is range and not picks.start < group.counted_below:
                    # the usual case: a run of first pushes, a slice to each member
                    for m, part in _slices(picks, order, rooms, credits):
                        firsts[id(m)] = part
                    break
                for offset in picks:
                    target = pick(offset)
                    assert target is not None
                    assign(target, offset)
            else:
                pins = group.pins
                keys = log.keys_of(picks)
                if type(picks) is range and not picks.start < group.counted_below \
                        and not group.queued and None not in keys \
                        and pins.keys().isdisjoint(keys) and len(set(keys)) == len(keys):
                    # the usual case: each key new and once: a slice of the run to each
                    # member, as for unkeyed messages, which pins the slice's keys to it
                    new_keys = cast(list[str], keys)
                    for m, part in _slices(picks, order, rooms, credits):
                        taken = new_keys[part.start - picks.start:part.stop - picks.start]
                        pins.update(dict.fromkeys(taken, m))
                        m.keys.update(dict.fromkeys(taken, 0))
                        key_at.update(zip(part, taken, strict=True))
                        plan.setdefault(id(m), []).extend(part)
                    break
                queued = group.queued
                targets = _pinned(keys, pins, queued, counts, picks) \
                    if not lowest < group.counted_below else None
                if targets is not None:
                    # the usual case under load: each key pinned already (its member
                    # holds some of it), once, none with a queue: to their members at
                    # once (what the loop below does for each)
                    self._to_pinned(group, picks, cast(list[str], keys), targets, rooms,
                                    credits, plan, key_at)
                    total = sum(min(rooms[id(m)], credits[id(m)]) for m in free)
                    continue
                # otherwise offset by offset; a new key (or none) goes to the member of
                # the current block: a member takes an even share of the picks in a row,
                # so its first pushes are mostly runs (one span of the log each)
                block = _Block(-(-len(picks) // len(order)))
                for offset, key in zip(picks, keys, strict=True):
                    if key is None:
                        assign(block.member(offset, fits, pick), offset)
                        continue
                    waiting = queued.get(key)
                    if waiting is not None:
                        waiting.append(offset)
                        group.queued_count += 1
                        continue
                    target = pins.get(key)
                    if target is None:  # a new key: to the block's member (it fits)
                        target = block.member(offset, fits, pick)
                        pin(key, target)
                    mid = id(target)
                    if rooms.get(mid, 0) > 0 and (credits[mid] > 0 or offset in counts):
                        if counts and offset in counts:
                            assign(target, offset, key)
                        else:  # the usual first push: what assign() does for one
                            key_at[offset] = key
                            rooms[mid] -= 1
                            credits[mid] -= 1
                            plan.setdefault(mid, []).append(offset)
                    else:
                        queued[key] = deque([offset])
                        group.queued_count += 1
                        target.waiting_keys.add(key)
            total = sum(min(rooms[id(m)], credits[id(m)]) for m in free)
        if exhausted:
            # a message that used all its pushes (a hand-off or a new round would be one
            # more): nothing of this round goes out
            self._group_exhausted(sub, exhausted[0], max_pushes, now)
            return
        for offset, count in dead:
            counts.pop(offset, None)
            self._dead_letter(topic, sub, offset, count, "exhausted", now)
        by_id = {id(m): m for m in free}
        for mid, m in by_id.items():
            run = firsts.get(mid)
            offsets = plan.get(mid)
            if run is not None or offsets:
                self._send_to_member(sub, m, topic, run, offsets or [], key_at, now)
        self._schedule_members(free)

    @staticmethod
    def _to_pinned(group: Group, picks: Sequence[int], keys: list[str],
                   targets: list[Member], rooms: dict[int, int], credits: dict[int, int],
                   plan: dict[int, list[int]], key_at: dict[int, str]) -> None:
        """First pushes of ``picks``, each of a key pinned to ``targets[i]`` (distinct, none
        queued): each member takes what its room and credit allow, in offset order; the
        rest wait in their keys' queues."""
        key_at.update(zip(picks, keys, strict=True))
        # each member's share, in pick order: targets come in runs (a member's keys are
        # mostly blocks of them), so cut them where the member changes
        shares: dict[Member, list[tuple[int, int]]] = {}
        start = 0
        for m, run in groupby(targets):
            stop = start + len(list(run))
            shares.setdefault(m, []).append((start, stop))
            start = stop
        for m, spans in shares.items():
            mid = id(m)
            offsets: list[int] = []
            for a, b in spans:
                offsets += picks[a:b]
            take = max(0, min(len(offsets), rooms.get(mid, 0), credits.get(mid, 0)))
            if take:
                plan.setdefault(mid, []).extend(offsets[:take] if take < len(offsets)
                                                else offsets)
                rooms[mid] -= take
                credits[mid] -= take
            if take < len(offsets):  # no room: they wait behind the member's window
                waiting: list[str] = []
                for a, b in spans:
                    waiting += keys[a:b]
                del waiting[:take]
                for offset, key in zip(offsets[take:], waiting, strict=True):
                    group.queued[key] = deque([offset])
                    del key_at[offset]
                group.queued_count += len(waiting)
                m.waiting_keys.update(waiting)

    @staticmethod
    def _nothing_new(sub: Subscription, topic: Any) -> bool:
        """Whether :meth:`_next_firsts` has nothing for the group, whatever its room."""
        start = max(sub.next_push, sub.cursor, topic.log.oldest)
        delayed = topic.delayed
        return start >= topic.exposed and not (delayed and (sub.due_heap
                                                            or delayed.last >= start))

    def _next_firsts(self, sub: Subscription, topic: Any, room: int) -> Sequence[int]:
        """At most ``room`` offsets the group has still to first-push this round, in push
        order (a range when they are a run), moving its scan past them."""
        log = topic.log
        end = topic.exposed
        start = max(sub.next_push, sub.cursor, log.oldest)
        delayed = topic.delayed
        if delayed and (sub.due_heap or delayed.last >= start):
            picks, next_push = self._due_order(sub, topic, start, end, room)
            pushed, group = sub.due_pushed, sub.group
            assert group is not None
            if len(pushed) > 2 * (len(group.holder) + len(group.nak_at)
                                  + len(group.waiting)) + 4096:
                # the acked ones go (they are never wanted again): a round's pushes add up
                cursor, acked = sub.cursor, sub.acked
                sub.due_pushed = pushed = {o for o in pushed if o >= cursor and o not in acked}
            pushed.update(o for o in picks if o in delayed)
            sub.next_push = next_push
            return picks
        if start >= end:
            return ()
        stop = min(end, start + room)
        acked = sub.acked
        # acks above the cursor: a few while members ack out of order, every later ack
        # while one message stays unacked (a poison key)
        if acked and acked.any_in(start, stop):
            offsets = acked.missing(start, stop)
            o = stop
            while len(offsets) < room and o < end:
                if o not in acked:
                    offsets.append(o)
                o += 1
            sub.next_push = o if len(offsets) >= room or o >= end else stop
            return offsets
        sub.next_push = stop
        return range(start, stop)

    def _send_to_member(self, sub: Subscription, m: Member, topic: Any, run: range | None,
                        offsets: list[int], key_at: dict[int, str], now: float) -> None:
        """Push ``offsets`` (any, in the order picked) and ``run`` (first pushes of
        never-counted offsets, after them) to ``m``: counts, holders, keys (``key_at``:
        each keyed offset's, as the member choice read it), deadlines, one DELIVER per
        push count (the order the client sees them in decides which are late: the shard
        marks them in that same order)."""
        group = sub.group
        assert group is not None
        session = self.sessions.get(m.conn)
        log = topic.log
        pushes, in_flight, late = group.pushes, m.in_flight, m.late
        by_count: dict[int, Sequence[int]] = {}
        if offsets and (not pushes or pushes.keys().isdisjoint(offsets)):
            # first pushes all (the usual case), often a run in line (a block of new keys;
            # not kept ones below the oldest: a span reads in-line messages only)
            first, last, n = offsets[0], offsets[-1], len(offsets)
            by_count[1] = (range(first, last + 1) if last - first == n - 1
                           and first >= log.oldest
                           and all(map(lt, offsets, islice(offsets, 1, None))) else offsets)
            in_flight.update(dict.fromkeys(offsets, 1))
        else:
            counted: dict[int, list[int]] = {}
            for offset in offsets:
                count = pushes.pop(offset, 0) + 1
                in_flight[offset] = count
                counted.setdefault(count, []).append(offset)
            by_count.update(counted)
        if key_at:
            hold_keys(m.key_of, m.keys, offsets, key_at)
        # one frame per push count, in the order they were picked (hand-offs by offset,
        # then keys' queued ones, then first pushes in push order: G12's due order)
        batches: list[tuple[Sequence[int], int]] = [
            (batch, count) for count, batch in by_count.items()]
        if run is not None and len(run):
            in_flight.update(dict.fromkeys(run, 1))
            batches.append((run, 1))
        top = m.top
        for batch, _ in batches:
            if batch and batch[0] > top and (type(batch) is range or all(
                    map(lt, batch, islice(batch, 1, None)))):
                top = batch[-1]  # (the usual case: rising, above all it had: none late)
                continue
            for offset in batch:
                if offset <= top:
                    late.add(offset)
                else:
                    top = offset
        m.top = top
        n = (len(run) if run is not None else 0) + len(offsets)
        # credit is for first pushes, as a client gives it back for those only (a hand-off
        # or a message pushed before is bounded by the window alone)
        m.credit -= n - sum(len(batch) for count, batch in by_count.items() if count > 1)
        self.counters["delivered"] += n
        timeout = topic.settings.timeout
        for batch, count in batches:
            self._await_ack(session, m, now + timeout, batch, count)
            self._count_pushes(topic, sub, batch, count)  # survive a restart (G9)
            if count > 1:
                self.counters["redelivered"] += len(batch)
                sub.redelivered += len(batch)
            if session is None:
                continue
            try:  # a disk topic's evicted payloads are read back here
                if type(batch) is range:
                    ids, payloads, times = log.span(batch.start, batch.stop, self.epoch)
                else:  # a few runs (a key-ordered member's keys) packed as they are
                    ids, payloads, times = log.spans(batch, self.epoch) \
                        or self._columns(log, batch)
            except errors.StorageUnavailable:
                continue  # damage read back (its topic is recovered): times out as lost
            meta = log.meta_columns(batch, self.epoch)  # (None fast: no key, header or due)
            self._deliver(session, m.sid, topic.generation, count, batch, ids, payloads,
                          times, meta)

    def _schedule_members(self, members: list[Member]) -> None:
        for m in members:
            self._schedule(m)

    # -- timers --------------------------------------------------------------------------

    def _run_timers(self, sub: PushTimers, now: float) -> None:
        if type(sub) is Member:
            self._member_timers(sub, now)
        elif type(sub) is NakTimer:
            self._naks_due(sub, now)
        else:
            assert isinstance(sub, Subscription)
            super()._run_timers(sub, now)

    def _member_timers(self, m: Member, now: float) -> None:
        """``m``'s ack deadlines and re-pushes due by ``now`` (G4, per message)."""
        sub = m.sub
        if m.deleted:
            return
        settings = self.topics[sub.topic].settings
        max_pushes = 1 + settings.retry_count
        retry_interval = settings.retry_interval
        repush: list[tuple[float, int, int]] = []
        while True:
            d = m.deadlines[0] if m.deadlines else None
            r = m.repushes[0] if m.repushes else None
            if d is not None and d[0] <= now and (r is None or d[0] <= r[0]):
                m.deadlines.popleft()
                at, offsets, counts, epoch = d
                for i, offset in enumerate(offsets):
                    count = counts if type(counts) is int else counts[i]
                    if not m.is_current(offset, count, epoch) or (
                            m.extended and self._deferred(m, offset, at)):
                        continue
                    if count >= max_pushes:
                        if self.topics[sub.topic].settings.dead_letter:
                            self._let_go(sub, m, offset)
                            self._dead_letter(self.topics[sub.topic], sub, offset, count,
                                              "exhausted", now)
                            continue
                        self._group_exhausted(sub, offset, count, now)
                        return
                    if retry_interval <= 0:
                        repush.append((at, offset, count))
                    else:
                        m.add_repush(at + retry_interval, offset, count)
            elif r is not None and r[0] <= now:
                m.repushes.popleft()
                at, offset, count, epoch = r
                if m.is_current(offset, count, epoch) and not (
                        m.extended and self._overtaken(m, offset, at, retry_interval)):
                    repush.append((at, offset, count))
            else:
                break
        if repush:
            self._member_redeliver(m, repush)
        self._schedule(m)

    def _member_redeliver(self, m: Member, due: list[tuple[float, int, int]]) -> None:
        """Re-push ``due`` (at, offset, count) to ``m``, which holds them."""
        sub = m.sub
        topic = self.topics[sub.topic]
        log, timeout = topic.log, topic.settings.timeout
        session = self.sessions.get(m.conn)
        by_count: dict[int, list[int]] = {}
        for at, offset, count in sorted(due, key=lambda e: (e[0], e[1])):
            if not log.holds(offset) or m.in_flight.get(offset) != count:
                continue  # a doubled timer entry, re-pushed already (as in _redeliver)
            m.extended.pop(offset, None)  # (an in_progress of the push before)
            m.in_flight[offset] = count + 1  # (not late: the member has seen it before)
            self._await_ack(session, m, at + timeout, [offset], count + 1)
            self._count_pushes(topic, sub, [offset], count + 1)
            by_count.setdefault(count + 1, []).append(offset)
        if session is None:
            return
        for offsets, count in sorted((sorted(o), c) for c, o in by_count.items()):
            try:
                columns = self._columns(log, offsets)
            except errors.StorageUnavailable:
                continue
            self.counters["redelivered"] += len(offsets)
            sub.redelivered += len(offsets)
            self._deliver(session, m.sid, topic.generation, count, offsets, *columns,
                          log.meta_columns(offsets, self.epoch))

    def _group_exhausted(self, sub: Subscription, offset: int, pushes: int, now: float) -> None:
        """A message of a shared subscription used all its pushes: the group is inactive
        (G4), every member told; its push count starts afresh when a member attaches."""
        self._emit("exhausted", sub.topic, sub.name, offset)
        self._end_group(sub, errors.SubscriptionInactive.code,
                        f"offset {offset} was pushed {pushes} times without an ack; subscribe"
                        " again to resume", now, keep=offset)
        # its count starts afresh, after a restart too (a count of 0 journaled)
        self._count_pushes(self.topics[sub.topic], sub, [offset], 0)
        sub.push_counts.pop(offset, None)

    # -- acks --------------------------------------------------------------------------

    def _member_ack(self, sub: Subscription, m: Member, offsets: list[Any], through: int,
                    refused: list[list[Any]]) -> int:
        """Apply one ACK of member ``m``; returns how many it acked (refusals appended)."""
        acked = 0
        in_flight = m.in_flight
        if offsets and not m.extended:
            # the usual case, in bulk: every offset held by m, none with a deadline of its
            # own, late ones too (what _member_acked does for each); None: not so, nothing
            # done
            released = let_go(in_flight, m.key_of, m.keys, offsets)
            if released is not None:
                if m.late:
                    m.late.difference_update(offsets)
                for key in released:
                    self._unpin(sub, m, key)
                sub.mark_acked_all(offsets)
                acked, offsets = len(offsets), []
        for offset in offsets:
            if type(offset) is not int:
                refused.append([offset, errors.InvalidRequest.code, "offset must be an integer"])
            elif offset in in_flight:
                self._member_acked(sub, m, offset)
                acked += 1
            elif offset >= sub.cursor and offset not in sub.acked:
                refused.append([offset, errors.NotDelivered.code,
                                f"offset {offset} is not held by this member"])
        if through >= 0 and in_flight:
            late = m.late
            delayed = self.topics[sub.topic].delayed
            if delayed or late:
                covered = [o for o in in_flight
                           if o <= through and o not in late and o not in delayed]
            else:  # (the usual case: nothing to leave out)
                covered = [o for o in in_flight if o <= through]
            if covered and not m.extended:
                self._let_go_all(sub, m, covered)
                sub.mark_acked_all(covered)
            else:
                for offset in covered:
                    self._member_acked(sub, m, offset)
            acked += len(covered)
        return acked

    def _let_go_all(self, sub: Subscription, m: Member, offsets: Sequence[int]) -> None:
        """:meth:`_let_go` of each of ``offsets``, distinct and held by ``m``, none
        extended (what is left to do for them then), in bulk."""
        released = let_go(m.in_flight, m.key_of, m.keys, offsets)
        assert released is not None, "offsets not held"
        if m.late:
            m.late.difference_update(offsets)
        for key in released:
            self._unpin(sub, m, key)

    def _member_acked(self, sub: Subscription, m: Member, offset: int) -> None:
        self._let_go(sub, m, offset)
        sub.mark_acked(offset)

    def _let_go(self, sub: Subscription, m: Member, offset: int) -> None:
        """``m`` no longer holds ``offset`` (acked, nak'd, termed or dead-lettered): out
        of its window; its key is released once none of it is held."""
        del m.in_flight[offset]
        m.late.discard(offset)
        m.extended.pop(offset, None)
        key = m.key_of.pop(offset, None) if m.key_of else None
        if key is not None:
            left = m.keys[key] - 1
            if left:
                m.keys[key] = left
            else:
                self._release_key(sub, m, key)

    def _release_key(self, sub: Subscription, m: Member, key: str) -> None:
        """``m`` holds none of ``key`` unacked: the key is released; its waiting messages
        (if any) go to whichever member has room first."""
        del m.keys[key]
        self._unpin(sub, m, key)

    def _unpin(self, sub: Subscription, m: Member, key: str) -> None:
        """:meth:`_release_key` once ``key`` is out of ``m.keys`` (:func:`let_go` took it)."""
        group = sub.group
        assert group is not None
        del group.pins[key]
        if key in m.waiting_keys:
            m.waiting_keys.discard(key)
            group.unpinned.add(key)
            self._dirty[id(sub)] = sub

    # -- nak, term and in_progress (G11) -----------------------------------------------

    def _member_settle(self, sub: Subscription, m: Member, topic: Any, body: Any,
                       refused: list[list[Any]], now: float,
                       exhausted: list[tuple[int, int]]) -> list[Any]:
        """An ACK's nak, term and progress items from member ``m`` (as
        :meth:`Settling._settle` for a plain subscription); only the member holding an
        offset may settle it. A nak on a message's last push without a dead-letter policy
        goes to ``exhausted``: the caller ends the group once the frame's acks are
        applied. Returns the dead-letter journals written to."""
        journals: list[Any] = []
        for name, offset, value in settle_items(body):
            try:
                check_item(name, offset)
                count = m.in_flight.get(offset)
                if count is None:
                    raise errors.NotDelivered(
                        f"offset {offset} is not held by this member: nothing to {name}")
                if name == "nak":
                    self._member_nak(sub, m, topic, offset, count, value, now, exhausted)
                elif name == "term":
                    journal = self._member_term(sub, m, topic, offset, count, value, now)
                    if journal is not None and journal not in journals:
                        journals.append(journal)
                else:
                    at = now + topic.settings.timeout
                    m.extended[offset] = at
                    m.add_deadlines(at, [offset], count)
                    self._schedule(m)
            except errors.FluxError as exc:
                refused.append([offset if type(offset) is int else -1, exc.code, str(exc)])
        return journals

    def _member_nak(self, sub: Subscription, m: Member, topic: Any, offset: int, count: int,
                    delay: Any, now: float, exhausted: list[tuple[int, int]]) -> None:
        """The message leaves ``m``'s window now and is pushed again (to any member, or its
        key's) at ``now + delay``; on its last allowed push it is exhausted at once."""
        delay = check_delay(delay, topic.settings.max_delay, "nak delay")
        group = sub.group
        assert group is not None
        if count >= 1 + topic.settings.retry_count:
            self._let_go(sub, m, offset)  # exhausted: the frame's later items refuse it
            if topic.settings.dead_letter:
                self._dead_letter(topic, sub, offset, count, "exhausted", now)
            else:
                # the group ends on the frame's first; the others keep their counts (out
                # of every window now), so each ends a later round in its turn rather
                # than going out again as a first push
                group.pushes[offset] = count
                exhausted.append((offset, count))
            return
        self._let_go(sub, m, offset)
        group.pushes[offset] = count
        group.nak_at[offset] = now + delay
        timer = group.timer
        if timer is None:
            timer = group.timer = NakTimer(sub, sub.topic)
        heapq.heappush(timer.naks, (now + delay, offset))
        self._schedule(timer)
        self._dirty[id(sub)] = sub  # a slot of the window is free

    def _member_term(self, sub: Subscription, m: Member, topic: Any, offset: int, count: int,
                     reason: Any, now: float) -> Any:
        """No more pushes: to the dead-letter topic, or (no policy) counted as an ack."""
        if not isinstance(reason, str) or len(reason.encode("utf-8", "replace")) \
                > MAX_REASON_BYTES:
            raise errors.InvalidRequest(f"a term reason is a string of at most"
                                        f" {MAX_REASON_BYTES} bytes")
        self._let_go(sub, m, offset)
        if topic.settings.dead_letter:
            if self._dead_letter(topic, sub, offset, count, dead_letter_reason("term", reason),
                                 now):
                dlq = self.topics.get(dead_letter_topic(topic.name, sub.name))
                return dlq.journal if dlq is not None else None
            return None
        self._count_dead(topic, sub, offset)
        return None

    def _naks_due(self, timer: NakTimer, now: float) -> None:
        """nak'd messages due again join the hand-offs (the next push round takes them)."""
        sub = timer.sub
        group = sub.group
        if sub.deleted or group is None:
            return
        due: list[int] = []
        while timer.naks and timer.naks[0][0] <= now:
            at, offset = heapq.heappop(timer.naks)
            if group.nak_at.get(offset) == at:
                del group.nak_at[offset]
                due.append(offset)
        if due and group.members:
            group.waiting = sorted({*group.waiting, *due})
            self._dirty[id(sub)] = sub
        self._schedule(timer)

    def _count_dead(self, topic: Any, sub: Subscription, offset: int) -> None:
        group = sub.group
        if group is not None:
            m = group.holder.get(offset)
            if m is not None:
                self._let_go(sub, m, offset)
            group.pushes.pop(offset, None)
            group.nak_at.pop(offset, None)
        super()._count_dead(topic, sub, offset)

    def _park(self, topic: Any, sub: Subscription, offset: int, pushes: int, reason: str,
              exc: errors.FluxError) -> None:
        group = sub.group
        if group is not None:
            m = group.holder.get(offset)
            if m is not None:
                self._let_go(sub, m, offset)
            group.pushes[offset] = pushes
        super()._park(topic, sub, offset, pushes, reason, exc)


def _pinned(keys: Sequence[str | None], pins: dict[str, Member], queued: dict[str, Any],
            counts: dict[int, int], picks: Sequence[int]) -> list[Member] | None:
    """The member each of ``keys`` is pinned to, if every one is a key, pinned, once in
    ``keys`` and without a queue, and no pick has a push count (else None)."""
    distinct = set(keys)
    if None in distinct or len(distinct) != len(keys) \
            or (queued and not queued.keys().isdisjoint(distinct)) \
            or (counts and not counts.keys().isdisjoint(picks)):
        return None
    try:
        return list(map(pins.__getitem__, cast(list[str], keys)))
    except KeyError:  # (a key not pinned)
        return None


class _Block:
    """Whom a round's new keys go to, in blocks: a member takes ``share`` of them in a
    row (while it has room), then the next one in turn."""

    __slots__ = ("current", "share", "taken")

    def __init__(self, share: int) -> None:
        self.share = share
        self.current: Member | None = None
        self.taken = 0

    def member(self, offset: int, fits: Callable[[Member, int], bool],
               pick: Callable[[int], Member | None]) -> Member:
        """The member ``offset`` (a first push of a new key, or of none) goes to."""
        current = self.current
        if current is None or self.taken >= self.share or not fits(current, offset):
            current = self.current = pick(offset)
            assert current is not None  # (no more picks than fit: one always does)
            self.taken = 0
        self.taken += 1
        return current


def _slices(picks: range, order: list[Member], rooms: dict[int, int],
            credits: dict[int, int]) -> list[tuple[Member, range]]:
    """A run of first pushes cut into an even slice for each member with room and credit
    (both taken from ``rooms`` and ``credits``), the fullest last: what one cannot take
    goes to the next, which can take more, so the last takes what is left."""
    start, left = picks.start, len(picks)
    takers = sorted((m for m in order if min(rooms[id(m)], credits[id(m)]) > 0),
                    key=lambda m: min(rooms[id(m)], credits[id(m)]))
    out: list[tuple[Member, range]] = []
    for i, m in enumerate(takers):
        n = min(rooms[id(m)], credits[id(m)], -(-left // (len(takers) - i)))
        if n > 0:
            out.append((m, range(start, start + n)))
            rooms[id(m)] -= n
            credits[id(m)] -= n
            start += n
            left -= n
    return out
