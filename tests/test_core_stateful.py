"""Hypothesis stateful test of ShardCore against a plain model of G1-G6 (push subscriptions).

The model predicts exactly: publish results (offsets, dedup windows), subscribe
replies, which offset each first delivery must be, when every re-push, ack
timeout, session close, subscription deletion and message cleanup must happen,
and what each ack must refuse. Time moves only through ``tick`` at every
deadline the core reports; config values and steps are multiples of 0.5 s, so
every time is an exact binary fraction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from test_core_support import make_config

from flux import errors
from flux import protocol as P
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


@dataclass(eq=False)
class MSub:
    key: str
    ephemeral: bool
    start: int
    acked: set[int] = field(default_factory=set)
    att: Att | None = None
    inactive_since: float | None = None
    deleted: bool = False

    def cursor(self) -> int:
        c = self.start
        while c in self.acked:
            c += 1
        return c


@dataclass(eq=False)
class Att:
    conn: int
    sid: int
    sub: MSub
    credit: int
    mif: int
    pushes: dict[int, tuple[int, float]] = field(default_factory=dict)  # unacked: attempt, at
    delivered: set[int] = field(default_factory=set)
    last_first: int = -1
    live: bool = True
    takeover_expected: bool = False


class ShardModel(RuleBasedStateMachine):
    """ShardCore vs the model; every rule checks its own replies, invariants the rest."""

    def __init__(self) -> None:
        super().__init__()
        self.core: ShardCore | None = None

    @initialize(preset=st.sampled_from(range(len(PRESETS))))
    def setup(self, preset: int) -> None:
        cfg = make_config(PRESETS[preset])
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
        self.dedup: dict[str, tuple[int, float]] = {}
        self.ids: list[str] = []
        self.oldest = 0

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
        return replies

    # -- what the core sends ------------------------------------------------------------

    def _candidates(self, att: Att) -> list[int]:
        """Offsets this attachment may still get as a first delivery, in order."""
        sub = att.sub
        return [o for o in range(max(sub.cursor(), att.last_first + 1), len(self.messages))
                if o not in sub.acked and o not in att.delivered]

    def _on_deliver(self, conn: int, frame: list[Any]) -> None:
        _, sid, generation, items = frame
        assert generation == GEN
        att = self.atts.get((conn, sid))
        assert att is not None and att.live, f"DELIVER to a detached sid {sid} on {conn}"
        repushed = [item[0] for item in items if item[4] > 1]
        assert repushed == sorted(repushed), "G1: redeliveries due together in offset order"
        for offset, mid, payload, ts, attempt in items:
            assert offset >= att.sub.start, "G2: delivered before the subscription's start"
            assert offset not in att.sub.acked and offset >= att.sub.cursor(), \
                "G1: delivered an offset the subscription acked"
            assert (mid, payload, ts) == self.messages[offset]
            if attempt == 1:
                assert offset == self._candidates(att)[0], "G1/G2: first deliveries in order"
                assert att.credit > 0 and len(att.pushes) < att.mif
                att.credit -= 1
                att.pushes[offset] = (1, self.now)
                att.delivered.add(offset)
                att.last_first = offset
            else:
                prev, at = att.pushes[offset]
                assert attempt == prev + 1 <= self.max_pushes, "G4: attempt numbers"
                assert self.now == at + self.T + self.R, "G4: re-push off schedule"
                att.pushes[offset] = (attempt, self.now)

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
            due = [at + self.T for a, at in att.pushes.values() if a == self.max_pushes]
            assert self.now in due, "G4: inactive only when the last push times out"
        self._end(att)

    def _on_closed(self, conn: int) -> None:
        del self.conns[conn]
        for att in [a for a in self.atts.values() if a.conn == conn]:
            self._end(att)

    # -- rules --------------------------------------------------------------------------

    def _pick_conn(self, i: int) -> int | None:
        conns = sorted(self.conns)
        return conns[i % len(conns)] if conns else None

    @rule()
    def connect(self) -> None:
        assert self.core is not None
        if len(self.conns) < 3:
            self.conns[self.core.connect(self.now)] = self.now

    @rule(i=st.integers(0, 9), batch=st.lists(st.tuples(st.booleans(), st.integers(0, 50),
                                                        st.integers(0, 3)), min_size=1, max_size=3))
    def publish(self, i: int, batch: list[tuple[bool, int, int]]) -> None:
        """One PUBLISH frame of new ids and retried ones (possibly the same id twice)."""
        conn = self._pick_conn(i)
        if conn is None:
            return
        items: list[list[Any]] = []
        expected: list[list[Any]] = []
        for new, reuse, size in batch:
            if new or not self.ids:
                mid = f"id{len(self.ids)}"
                self.ids.append(mid)
            else:
                mid = self.ids[reuse % len(self.ids)]
            payload = mid.encode() * size
            items.append([TOPIC, mid, payload])
            known = self.dedup.get(mid)
            if known is not None and self.now < known[1] + self.cfg.message.dedup_window:
                expected.append([P.OK, known[0], True])
                event("publish: duplicate")
            else:
                # stored: in the model before the DELIVERs of the same batch are checked
                expected.append([P.OK, len(self.messages), False])
                self.dedup[mid] = (len(self.messages), self.now)
                self.messages.append((mid, payload, self.now))
        rid = self._next_rid()
        [reply] = self._send(conn, [P.PUBLISH, rid, items])
        assert reply == [P.PUBLISHED, rid, GEN, expected], ("G1/G3", reply, expected)

    @rule(i=st.integers(0, 9), sid=st.integers(1, 3), name=st.sampled_from(["s1", "s2", None]),
          read_old=st.booleans(), mif=st.sampled_from([1, 2, 5]),
          credit=st.sampled_from([None, 0, 1, 3, 100]))
    def subscribe(self, i: int, sid: int, name: str | None, read_old: bool, mif: int,
                  credit: int | None) -> None:
        conn = self._pick_conn(i)
        if conn is None:
            return
        rid = self._next_rid()
        frame = [P.SUBSCRIBE, rid, sid, {"topic": TOPIC, "name": name, "read_old": read_old,
                                          "max_in_flight": mif, "credit": credit}]
        if (conn, sid) in self.atts:
            [reply] = self._send(conn, frame)
            assert reply[0] == P.ERROR and reply[2] == errors.InvalidRequest.code
            return
        key = name if name is not None else f"~{conn}.{sid}"
        sub = self.subs.get(key)
        created = sub is None
        if sub is None:
            sub = MSub(key, name is None, self.oldest if read_old else len(self.messages))
        else:
            event(f"subscribe: reattach, gap above cursor={bool(sub.acked - {sub.cursor()})}")
            if sub.att is not None:
                sub.att.takeover_expected = True
                event("subscribe: takeover")
        cap = self.cfg.subscriber.max_in_flight
        att = Att(conn, sid, sub, credit=min(mif, cap) if credit is None else credit,
                  mif=min(mif, cap))

        def attach(_outputs: Any) -> None:
            # the reply is in this batch: attach in the model before its DELIVERs are checked
            self.subs[key] = sub
            old = sub.att
            sub.att = att
            sub.inactive_since = None
            self.atts[(conn, sid)] = att
            if old is not None:
                old_frames = [f for c, fs, _ in _outputs if c == old.conn for f in fs]
                assert [P.SUB_ENDED, old.sid, errors.SubscriptionTakenOver.code] in \
                    [f[:3] for f in old_frames], "G6: takeover is announced"

        self.conns[conn] = self.now
        assert self.core is not None
        self.core.receive(conn, frame, self.now)
        [reply] = self._drain(conn, handle_first=attach)
        assert reply == [P.SUBSCRIBED, rid, sid, {
            "created": created, "start_offset": sub.start, "cursor": sub.cursor(),
            "generation": GEN, "clamped": False, "reset": False,
            "next_offset": len(self.messages), "max_in_flight": att.mif}], reply

    def _pick_att(self, i: int) -> Att | None:
        atts = [self.atts[k] for k in sorted(self.atts)]
        return atts[i % len(atts)] if atts else None

    @rule(i=st.integers(0, 9), picks=st.lists(st.integers(0, 20), min_size=1, max_size=4),
          extra=st.sampled_from([None, None, None, -1, 0, 2, 40]),
          through=st.sampled_from([False, False, False, True]),
          bad_generation=st.integers(0, 9))
    def ack(self, i: int, picks: list[int], extra: int | None, through: bool,
            bad_generation: int) -> None:
        """Ack some offsets in flight (an ack of an acked one now and then), maybe cumulative,
        maybe with an offset never delivered to this session."""
        att = self._pick_att(i)
        if att is None:
            return
        pool = sorted(att.pushes) if att.pushes and picks[0] % 4 else sorted(att.delivered)
        offsets = [pool[p % len(pool)] for p in picks[1:]] if pool else []
        if extra is not None:
            offsets.append(extra if extra >= 0 else len(self.messages) + 1)
        upto = max(offsets) if through and offsets else -1
        rid = self._next_rid()
        generation = GEN + 1 if bad_generation == 0 else GEN
        if generation != GEN:
            [reply] = self._send(att.conn, [P.ACK, rid, att.sid, generation, offsets, upto])
            assert reply[0] == P.ERROR and reply[2] == errors.TopicReset.code
            return
        # apply to the model first: the DELIVERs the acks make room for come in the same batch
        refused = [o for o in offsets if o not in att.delivered]
        if refused:
            event("ack: refused")
        for o in offsets:
            if o in att.delivered:
                att.pushes.pop(o, None)
                att.sub.acked.add(o)
        if upto >= 0:
            for o in [o for o in att.pushes if o <= upto]:
                del att.pushes[o]
                att.sub.acked.add(o)
        [reply] = self._send(att.conn, [P.ACK, rid, att.sid, generation, offsets, upto])
        assert att.live, "an ack's reply cannot end the attachment"
        assert reply[:4] == [P.ACKED, rid, att.sid, att.sub.cursor()], (reply, att.sub.cursor())
        assert [(r[0], r[1]) for r in reply[4]] == \
            [(o, errors.NotDelivered.code) for o in refused], "acks: refusals"

    @rule(i=st.integers(0, 9), sid=st.integers(1, 3))
    def ack_detached_sid(self, i: int, sid: int) -> None:
        """Acks on a sid that is not attached here are refused and change nothing."""
        conn = self._pick_conn(i)
        if conn is None or (conn, sid) in self.atts:
            return
        rid = self._next_rid()
        [reply] = self._send(conn, [P.ACK, rid, sid, GEN, list(range(len(self.messages))), 10**6])
        assert reply[0] == P.ERROR and reply[2] in (
            errors.UnknownSubscription.code, errors.SubscriptionInactive.code,
            errors.SubscriptionTakenOver.code), reply

    @rule(i=st.integers(0, 9), n=st.integers(0, 3))
    def credit(self, i: int, n: int) -> None:
        att = self._pick_att(i)
        if att is None:
            return
        att.credit += n  # before sending: the DELIVERs it allows come in the same batch
        assert self._send(att.conn, [P.CREDIT, att.sid, n]) == []

    @rule(i=st.integers(0, 9), sid=st.integers(1, 3))
    def unsubscribe(self, i: int, sid: int) -> None:
        conn = self._pick_conn(i)
        if conn is None:
            return
        att = self.atts.get((conn, sid))
        if att is not None:
            self._end(att)
        rid = self._next_rid()
        assert self._send(conn, [P.UNSUBSCRIBE, rid, sid]) == [[P.UNSUBSCRIBED, rid, sid]]

    @rule(i=st.integers(0, 9))
    def disconnect(self, i: int) -> None:
        conn = self._pick_conn(i)
        if conn is None:
            return
        assert self.core is not None
        self._on_closed(conn)
        self.core.disconnect(conn, self.now)
        assert self.core.take_output() == []

    @rule(i=st.integers(0, 9))
    def ping(self, i: int) -> None:
        conn = self._pick_conn(i)
        if conn is not None:
            rid = self._next_rid()
            assert self._send(conn, [P.PING, rid]) == [[P.PONG, rid]]

    @rule(keepalive=st.booleans())
    def advance_to_next_deadline(self, keepalive: bool) -> None:
        """Run exactly the next thing the core has scheduled."""
        assert self.core is not None
        self.advance(self.core.next_deadline() - self.now, keepalive)

    @rule(dt=st.sampled_from([0.5, 1.0, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 6.5, 10.0, 17.0, 25.0]),
          keepalive=st.booleans())
    def advance(self, dt: float, keepalive: bool) -> None:
        """Let time pass; with keepalive every connection pings each heartbeat, as clients do."""
        if not keepalive:
            self._advance_to(self.now + dt)
            return
        end = self.now + dt
        while self.now < end:
            self._advance_to(min(end, self.now + self.cfg.subscriber.heartbeat))
            for conn in sorted(self.conns):
                rid = self._next_rid()
                assert self._send(conn, [P.PING, rid]) == [[P.PONG, rid]]

    def _advance_to(self, target: float) -> None:
        assert self.core is not None
        while True:
            at = self.core.next_deadline()
            assert at > self.now, f"next_deadline {at} is not after now {self.now}"
            if at > target:
                break
            self.now = at
            self.core.tick(at)
            self._drain(None, handle_first=None)
            self._after_tick()
        if target > self.now:  # a tick between deadlines does nothing observable
            self.now = target
            self.core.tick(target)
            assert self._drain(None, handle_first=None) == []
            self._after_tick()

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
        topic = self.core.topics.get(TOPIC)
        log_oldest = topic.log.oldest if topic is not None else 0
        if self._is_pass(self.cfg.message.cleanup_time):
            # G5: the pass trims exactly the expired messages below every existing cursor
            below = min([s.cursor() for s in self.subs.values()] + [len(self.messages)])
            cutoff = self.now - self.cfg.message.ttl
            expected = self.oldest
            while expected < below and self.messages[expected][2] <= cutoff:
                expected += 1
            assert log_oldest == expected, ("G5 cleanup", log_oldest, expected)
        assert log_oldest == self.oldest or self._is_pass(self.cfg.message.cleanup_time)
        if log_oldest > self.oldest:
            event("messages trimmed")
        for offset in range(self.oldest, log_oldest):
            assert self.messages[offset][2] + self.cfg.message.ttl <= self.now, "G2: ttl"
            for sub in self.subs.values():
                assert offset < sub.start or offset in sub.acked, "G5: trimmed unacked"
        self.oldest = log_oldest
        if self._is_pass(self.cfg.subscriber.cleanup_time):
            for sub in list(self.subs.values()):
                since = sub.inactive_since
                if since is not None and self.now - since >= self.cfg.subscriber.inactive_time:
                    event("subscription deleted by cleanup")
                    sub.deleted = True
                    del self.subs[sub.key]

    # -- invariants ---------------------------------------------------------------------

    @invariant()
    def subscriptions_match_the_model(self) -> None:
        if self.core is None:
            return
        topic = self.core.topics.get(TOPIC)
        core_subs = topic.subs if topic is not None else {}
        assert sorted(core_subs) == sorted(self.subs), "G6: which subscriptions exist"
        for key, sub in self.subs.items():
            real = core_subs[key]
            assert real.cursor == sub.cursor(), (key, real.cursor, sub.cursor())
            assert real.active == (sub.att is not None), key
            if sub.att is not None:
                assert real.session == (sub.att.conn, sub.att.sid)
                assert sorted(real.in_flight) == sorted(sub.att.pushes)
                assert {o: a for o, (a, _) in sub.att.pushes.items()} == real.in_flight

    @invariant()
    def every_deliverable_message_is_pushed(self) -> None:
        """G2: an attachment with room and credit has no message waiting for it."""
        for att in self.atts.values():
            if att.credit > 0 and len(att.pushes) < att.mif:
                assert self._candidates(att) == [], "G2: a message was not pushed"

    @invariant()
    def core_sessions_match(self) -> None:
        if self.core is not None:
            assert sorted(self.core.sessions) == sorted(self.conns)


ShardModel.TestCase.settings = settings(
    max_examples=150, stateful_step_count=100, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestShardCoreAgainstModel = ShardModel.TestCase
