"""The model ShardCore is checked against (G1-G6, G11, G12), driven by
tests/test_core_stateful.py.

:class:`ShardState` holds the plain model (messages and their due times, dedup
window, subscriptions, attachments, connections, dead letters) next to a real
ShardCore, feeds it frames at explicit times, and checks every frame the core
sends as it arrives: which offset each first delivery must be ((due, offset)
order), the exact G4 push schedule and nak re-push times, exhaustion (a dead
letter with the policy), takeover, session closes, cleanup passes (delayed
messages held out of line) and subscription deletion. No tests live here.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any

from hypothesis import event as _hypothesis_event
from hypothesis.errors import InvalidArgument
from test_core_support import deliver_messages, make_config

from flux import errors
from flux import protocol as P
from flux.hashing import dead_letter_topic
from flux.message_meta import read_columns
from flux.shard.core import ShardCore

GEN = 77
TOPIC = "model.topic"

PRESETS: list[dict[str, Any]] = [
    {   # pushes every 4 s, passes on 2 s / 4 s grids: many coincident timers
        "message.ttl": 6.0, "message.cleanup_time": 2.0, "message.dedup_window": 9.0,
        "subscriber.retry_count": 2, "subscriber.retry_interval": 1.0,
        "subscriber.timeout": 3.0, "subscriber.cleanup_time": 4.0,
        "subscriber.inactive_time": 7.0, "subscriber.heartbeat": 5.0,
        "subscriber.max_in_flight": 3,
    },
    {   # strict mode cap, no retry interval, ttl 0, immediate deletion of inactive subs
        "message.ttl": 0.0, "message.cleanup_time": 1.0, "message.dedup_window": 3.0,
        "subscriber.retry_count": 1, "subscriber.retry_interval": 0.0,
        "subscriber.timeout": 2.0, "subscriber.cleanup_time": 3.0,
        "subscriber.inactive_time": 0.0, "subscriber.heartbeat": 4.0,
        "subscriber.max_in_flight": 1,
    },
    {   # retry_interval longer than timeout
        "message.ttl": 4.0, "message.cleanup_time": 3.0, "message.dedup_window": 20.0,
        "subscriber.retry_count": 3, "subscriber.retry_interval": 5.0,
        "subscriber.timeout": 1.0, "subscriber.cleanup_time": 5.0,
        "subscriber.inactive_time": 2.0, "subscriber.heartbeat": 6.0,
        "subscriber.max_in_flight": 4,
    },
]


def event(note: str) -> None:
    """Count a notable situation in Hypothesis's statistics (a no-op in the random walks)."""
    with contextlib.suppress(InvalidArgument):
        _hypothesis_event(note)


@dataclass(eq=False)
class MSub:
    key: str
    ephemeral: bool
    start: int
    acked: set[int] = field(default_factory=set)
    # pushes used by each unacked offset, kept across attachments (a dead-letter policy)
    counts: dict[int, int] = field(default_factory=dict)
    att: Att | None = None
    inactive_since: float | None = None
    deleted: bool = False
    pull: bool = False
    committed: int = 0         # pull: the committed cursor
    last_activity: float = 0.0  # pull: last SUBSCRIBE, FETCH or COMMIT

    def cursor(self) -> int:
        if self.pull:
            return self.committed
        c = self.start
        while c in self.acked:
            c += 1
        return c

    def holds(self, offset: int) -> bool:
        """Whether this subscription still needs ``offset`` (G5)."""
        return offset >= self.cursor() if self.pull else \
            offset >= self.start and offset not in self.acked


@dataclass(eq=False)
class Att:
    conn: int
    sid: int
    sub: MSub
    credit: int
    mif: int
    pushes: dict[int, tuple[int, float]] = field(default_factory=dict)  # unacked: attempt, at
    delivered: set[int] = field(default_factory=set)
    naked: dict[int, tuple[int, float]] = field(default_factory=dict)  # pushes, due again
    live: bool = True
    takeover_expected: bool = False
    nak_exhausted: bool = False  # a nak on a last push ends it (no dead-letter policy)


class ShardState:
    """A ShardCore and the model it must agree with; the state machine adds the rules."""

    def __init__(self) -> None:
        super().__init__()
        self.core: ShardCore | None = None

    def start(self, preset: int, dead_letter: bool = False) -> None:
        cfg = make_config({**PRESETS[preset], "dead_letter.enabled": dead_letter})
        self.dead_letter = dead_letter
        self.cfg = cfg
        self.T = cfg.subscriber.timeout
        self.R = cfg.subscriber.retry_interval
        self.max_pushes = 1 + cfg.subscriber.retry_count
        self.core = ShardCore(cfg, generation=GEN, now=0.0)
        self.now = 0.0
        self.rid = 0
        self.conns: dict[int, float] = {}         # open connection -> time of its last frame
        self.atts: dict[tuple[int, int], Att] = {}  # live attachments
        self.subs: dict[str, MSub] = {}           # existing (not deleted) subscriptions
        self.messages: list[tuple[str, bytes, float]] = []
        self.dues: dict[int, float] = {}          # delayed offsets -> due time (G12)
        self.dedup: dict[str, tuple[int, float]] = {}
        self.ids: list[str] = []
        self.oldest = 0                           # the log's contiguous run starts here
        self.kept: set[int] = set()               # delayed ones held out of line below it
        self.letters: list[tuple[str, int, int, str]] = []  # sub, offset, pushes, reason
        self.open_connection()
        self.open_connection()

    def open_connection(self) -> None:
        assert self.core is not None
        if len(self.conns) < 3:
            self.conns[self.core.connect(self.now)] = self.now

    # -- driving the core ---------------------------------------------------------------

    def _next_rid(self) -> int:
        self.rid += 1
        return self.rid

    def _send(self, conn: int, frame: list[Any]) -> list[list[Any]]:
        """Send a frame; returns the frames for ``conn`` that are not DELIVER/SUB_ENDED
        (those are checked against the model as they arrive)."""
        assert self.core is not None
        self.conns[conn] = self.now
        self.core.receive(conn, frame, self.now)
        return self._drain(conn, handle_first=None)

    def _drain(self, conn: int | None, handle_first: Any) -> list[list[Any]]:
        assert self.core is not None
        replies: list[list[Any]] = []
        outputs = self.core.take_output()
        if handle_first is not None:
            handle_first(outputs)
        for c, frames, close in outputs:
            assert c in self.conns, f"output for a closed connection {c}"
            for f in frames:
                P.encode(f)
                if f[0] == P.DELIVER:
                    self._on_deliver(c, f)
                elif f[0] == P.SUB_ENDED:
                    self._on_sub_ended(c, f)
                elif c == conn:
                    replies.append(f)
                else:
                    assert f[0] == P.ERROR and f[1] == 0 and close, (c, f)
            if close:
                self._on_closed(c)
        for att in self.atts.values():  # (those the core dead-lettered with no push after)
            self._settle_carried(att)
        return replies

    # -- what the core sends ------------------------------------------------------------

    def due(self, offset: int) -> float:
        """When ``offset`` is due: its delay's end, or when it was stored (G12)."""
        return self.dues.get(offset, self.messages[offset][2])

    @property
    def lowest(self) -> int:
        """The oldest message held, a kept one included (where read_old starts, G6)."""
        return min(self.kept, default=self.oldest)

    def held(self, offset: int) -> bool:
        return self.oldest <= offset < len(self.messages) or offset in self.kept

    def _candidates(self, att: Att) -> list[int]:
        """Offsets this attachment may still get as a first delivery, in (due, offset)
        order: held, due, not acked, not pushed to it yet."""
        sub = att.sub
        return sorted((o for o in range(sub.cursor(), len(self.messages))
                       if o not in sub.acked and o not in att.delivered and self.held(o)
                       and self.due(o) <= self.now), key=lambda o: (self.due(o), o))

    def _dead_letter(self, sub: MSub, offset: int, pushes: int, reason: str) -> None:
        """G11: the message goes to the dead-letter topic and counts as acked."""
        event(f"dead letter: {reason.split(':')[0]}")
        sub.acked.add(offset)
        sub.counts.pop(offset, None)
        self.letters.append((sub.key, offset, pushes, reason))

    def _settle_carried(self, att: Att) -> None:
        """A first push whose count, kept from an earlier attachment, is used up goes to
        the dead-letter topic instead when its turn comes (room and credit for it)."""
        while att.credit > 0 and len(att.pushes) < att.mif:
            candidates = self._candidates(att)
            if not candidates or att.sub.counts.get(candidates[0], 0) < self.max_pushes:
                return
            att.delivered.add(candidates[0])  # counted as sent to it (acked in it)
            self._dead_letter(att.sub, candidates[0], self.max_pushes, "exhausted")

    def _on_deliver(self, conn: int, frame: list[Any]) -> None:
        _, sid, generation, attempt, *_ = frame
        assert generation == GEN
        messages = deliver_messages(frame)
        offsets = [m[0] for m in messages]
        dues = read_columns(frame[8], len(offsets))[2] if len(frame) > 8 else []
        if any(d is not None for d in dues) or any(o in self.dues for o in offsets):
            assert dues == [self.dues.get(o) for o in offsets], "G12: DELIVER's due times"
        att = self.atts.get((conn, sid))
        assert att is not None and att.live, f"DELIVER to a detached sid {sid} on {conn}"
        if all(o in att.pushes or o in att.naked for o in offsets):
            assert offsets == sorted(offsets), "G1: redeliveries due together in offset order"
        for offset, mid, payload, ts in messages:
            assert offset >= att.sub.start, "G2: delivered before the subscription's start"
            assert offset not in att.sub.acked and offset >= att.sub.cursor(), \
                "G1: delivered an offset the subscription acked"
            assert (mid, payload, ts) == self.messages[offset]
            assert self.due(offset) <= self.now, "G12: pushed before it is due"
            if offset in att.naked:
                prev, at = att.naked.pop(offset)
                assert attempt == prev + 1, "G11: a nak's re-push counts"
                assert self.now == at, "G11: re-pushed at t_nak + delay"
            elif offset in att.pushes:
                prev, at = att.pushes[offset]
                assert attempt == prev + 1 <= self.max_pushes, "G4: attempt numbers"
                assert self.now == at + self.T + self.R, "G4: re-push off schedule"
            else:
                self._settle_carried(att)
                # those with a count kept from an earlier attachment go as re-pushes, a
                # frame per attempt number; the others in (due, offset) order
                candidates = self._candidates(att)
                if attempt > 1:
                    assert offset in candidates, "G11: a carried push of a held message"
                else:
                    assert offset == next((o for o in candidates if o not in att.sub.counts),
                                          None), \
                        "G1/G2/G12: first deliveries in order"
                assert att.credit > 0 and len(att.pushes) < att.mif
                # a count kept from an earlier attachment goes on (G11); else it starts at 1
                assert attempt == att.sub.counts.get(offset, 0) + 1, "G11: push counts survive"
                if attempt == 1:
                    att.credit -= 1
                att.delivered.add(offset)
            att.pushes[offset] = (attempt, self.now)
            if self.dead_letter:
                att.sub.counts[offset] = attempt

    def _end(self, att: Att) -> None:
        att.live = False
        del self.atts[(att.conn, att.sid)]
        sub = att.sub
        if sub.att is att:
            sub.att = None
            sub.inactive_since = self.now
            if sub.ephemeral:
                sub.deleted = True
                del self.subs[sub.key]

    def _on_sub_ended(self, conn: int, frame: list[Any]) -> None:
        _, sid, code, message = frame
        assert isinstance(message, str) and message
        att = self.atts.get((conn, sid))
        assert att is not None and att.live, f"SUB_ENDED for a detached sid {sid}"
        event(f"SUB_ENDED {code}")
        if code == errors.SubscriptionTakenOver.code:
            assert att.takeover_expected
        else:
            assert code == errors.SubscriptionInactive.code
            assert not self.dead_letter, "G11: with the policy exhausted ones are dead letters"
            due = [at + self.T for a, at in att.pushes.values() if a == self.max_pushes]
            assert self.now in due or att.nak_exhausted, \
                "G4/G11: inactive only when the last push times out or is nak'd"
        self._end(att)

    def _on_closed(self, conn: int) -> None:
        del self.conns[conn]
        for att in [a for a in self.atts.values() if a.conn == conn]:
            self._end(att)

    # -- picking what a rule acts on ----------------------------------------------------

    def _pick_conn(self, i: int) -> int:
        if not self.conns:  # a client whose connection closed reconnects
            self.open_connection()
        conns = sorted(self.conns)
        return conns[i % len(conns)]

    def _pick_att(self, i: int) -> Att | None:
        atts = [self.atts[k] for k in sorted(self.atts)]
        return atts[i % len(atts)] if atts else None

    # -- pull path ----------------------------------------------------------------------

    def _touch_pull(self, name: str) -> MSub | None:
        sub = self.subs.get(name)
        if sub is not None:
            sub.last_activity = self.now
            sub.inactive_since = None
        return sub

    # -- time ---------------------------------------------------------------------------

    def _advance_to(self, target: float) -> None:
        assert self.core is not None
        while True:
            at = self.core.next_deadline()
            assert at > self.now, f"next_deadline {at} is not after now {self.now}"
            if at > target:
                break
            self.now = at
            self._dead_letter_exhausted()
            self.core.tick(at)
            self._drain(None, handle_first=None)
            self._after_tick()
        if target > self.now:  # a tick between deadlines does nothing observable
            self.now = target
            self._dead_letter_exhausted()
            self.core.tick(target)
            assert self._drain(None, handle_first=None) == []
            self._after_tick()

    def _dead_letter_exhausted(self) -> None:
        """With a dead-letter policy, a last push whose ack timed out by now is a dead
        letter (G11); applied before the tick, whose pushes may fill the room it frees."""
        if not self.dead_letter:
            return
        for att in self.atts.values():
            for offset, (attempt, at) in list(att.pushes.items()):
                if attempt >= self.max_pushes and at + self.T <= self.now:
                    del att.pushes[offset]
                    self._dead_letter(att.sub, offset, attempt, "exhausted")

    # -- what must have happened by a tick ----------------------------------------------

    def _is_pass(self, interval: float) -> bool:
        return self.now > 0 and math.fmod(self.now, interval) == 0

    def _after_tick(self) -> None:
        assert self.core is not None
        limit = 2 * self.cfg.subscriber.heartbeat
        for conn, last in self.conns.items():
            assert last + limit > self.now, f"G6: connection {conn} silent for {limit}s is open"
        for att in self.atts.values():
            for offset, (attempt, at) in att.pushes.items():
                due = at + self.T + (self.R if attempt < self.max_pushes else 0)
                assert due > self.now, f"G4: offset {offset} attempt {attempt} overdue"
            for offset, (_, at) in att.naked.items():
                assert at > self.now, f"G11: nak'd offset {offset} not pushed again at {at}"
        topic = self.core.topics.get(TOPIC)
        # a retired topic (forgotten while empty) continues at its next offset
        log_oldest = topic.log.oldest if topic is not None else self.core.retired.get(TOPIC, 0)
        log_kept = set(topic.log.kept_from(0)) if topic is not None else set()
        before = self.kept | set(range(self.oldest, len(self.messages)))
        if self._is_pass(self.cfg.message.cleanup_time):
            expected, kept = self._cleanup_pass()
            assert (log_oldest, log_kept) == (expected, kept), \
                ("G5/G12 cleanup", log_oldest, log_kept, expected, kept)
        assert (log_oldest, log_kept) == (self.oldest, self.kept) or \
            self._is_pass(self.cfg.message.cleanup_time)
        if log_kept:
            event("delayed messages kept out of line")
        gone = before - log_kept - set(range(log_oldest, len(self.messages)))
        if gone:
            event("messages trimmed")
        limit = self.now - self.cfg.message.ttl
        for offset in gone:
            assert self.messages[offset][2] <= limit, "G2: ttl"
            assert self.dues.get(offset, -math.inf) <= limit, "G12: held ttl after due"
            for sub in self.subs.values():
                assert not sub.holds(offset), "G5: trimmed a message a subscription needs"
        self.oldest, self.kept = log_oldest, log_kept
        if self._is_pass(self.cfg.subscriber.cleanup_time):
            idle = 2 * self.cfg.subscriber.heartbeat
            for sub in self.subs.values():
                if sub.pull and sub.inactive_since is None and \
                        self.now - sub.last_activity >= idle:
                    event("pull subscription inactive")
                    sub.inactive_since = sub.last_activity + idle
            for sub in list(self.subs.values()):
                since = sub.inactive_since
                if since is not None and self.now - since >= self.cfg.subscriber.inactive_time:
                    event("subscription deleted by cleanup")
                    sub.deleted = True
                    del self.subs[sub.key]

    def _cleanup_pass(self) -> tuple[int, set[int]]:
        """Where a pass leaves the log: its run from the first expired message some
        subscription still needs (G5); a delayed message not ``ttl`` past its due time
        that the run leaves behind stays, held out of line (G12); one held so is
        released once it is ``ttl`` past due and no subscription needs it."""
        limit = self.now - self.cfg.message.ttl
        subs = list(self.subs.values())

        def pending(o: int) -> bool:
            return self.dues.get(o, -math.inf) > limit

        oldest, kept = self.oldest, set(self.kept)
        while oldest < len(self.messages) and self.messages[oldest][2] <= limit:
            if pending(oldest):
                kept.add(oldest)
            elif any(sub.holds(oldest) for sub in subs):
                break
            oldest += 1
        return oldest, {o for o in kept if pending(o) or any(s.holds(o) for s in subs)}

    # -- invariants ---------------------------------------------------------------------

    def check_subscriptions(self) -> None:
        if self.core is None:
            return
        topic = self.core.topics.get(TOPIC)
        core_subs = topic.subs if topic is not None else {}
        assert sorted(core_subs) == sorted(self.subs), "G6: which subscriptions exist"
        # shard.max_memory counts what every topic holds, kept up to date as it changes
        assert self.core.memory == sum(t.footprint() for t in self.core.topics.values())
        # the subscriber pass walks the topics indexed as subscribed: all of them
        assert self.core._subscribed == {
            name: t for name, t in self.core.topics.items() if t.subs}, "subscribed index"
        for key, sub in self.subs.items():
            real = core_subs[key]
            assert real.cursor == sub.cursor(), (key, real.cursor, sub.cursor())
            assert real.mode == ("pull" if sub.pull else "push")
            if sub.pull:
                assert real.active == (sub.inactive_since is None), key
                continue
            assert real.active == (sub.att is not None), key
            if sub.att is not None:
                assert real.session == (sub.att.conn, sub.att.sid)
                assert sorted(real.in_flight) == sorted(sub.att.pushes)
                assert {o: a for o, (a, _) in sub.att.pushes.items()} == real.in_flight
                assert real.nak_waiting == {o: a for o, (a, _) in sub.att.naked.items()}

    def check_every_deliverable_message_is_pushed(self) -> None:
        """G2: an attachment with room and credit has no message waiting for it."""
        for att in self.atts.values():
            self._settle_carried(att)
            if att.credit > 0 and len(att.pushes) < att.mif:
                assert self._candidates(att) == [], "G2/G12: a due message was not pushed"

    def check_dead_letters(self) -> None:
        """G11: each subscription's dead-letter topic holds exactly its dead letters."""
        if self.core is None:
            return
        found: list[tuple[str, int, int, str]] = []
        for name, topic in self.core.topics.items():
            if name == TOPIC:
                continue
            log = topic.log
            for offset in range(log.oldest, log.next_offset):
                _, headers, _ = log.meta_of(offset)
                assert headers is not None and headers["flux-topic"] == TOPIC, headers
                assert name == dead_letter_topic(TOPIC, headers["flux-subscription"])
                found.append((headers["flux-subscription"], int(headers["flux-offset"]),
                              int(headers["flux-pushes"]), headers["flux-reason"]))
        assert sorted(found) == sorted(self.letters), ("G11: dead letters", found)

    def check_sessions(self) -> None:
        if self.core is not None:
            assert sorted(self.core.sessions) == sorted(self.conns)

