"""Hypothesis stateful test of ShardCore against the model of G1-G6, G11 and G12 in
test_core_model.

Rules publish (new and retried ids, some delayed by ``delay`` or ``deliver_at``),
subscribe (named, ephemeral, read_old or not, strict or windowed), resubscribe
(reactivation, takeover), ack (some, cumulative, undelivered offsets, another
generation), settle (nak with or without a delay, term, in_progress, and offsets
not held), grant credit, unsubscribe, disconnect, ping, pull (subscribe, FETCH,
COMMIT) and let time pass (with or without heartbeats); half the runs have a
dead-letter policy. The model checks each frame as it arrives; invariants compare
the core's subscriptions and dead letters with the model after every step.
test_core_walks takes seeded random walks through the same rules.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from test_core_model import GEN, PRESETS, TOPIC, Att, MSub, ShardState, event
from test_core_support import fetched_messages

from flux import errors
from flux import protocol as P

# how a publish item is delayed: ("delay", seconds) or ("at", deliver_at - now)
DELAYS: list[tuple[str, float] | None] = [None, None, ("delay", 0.5), ("delay", 2.0),
                                          ("delay", 7.0), ("at", 1.5), ("at", -3.0)]


class ShardModel(ShardState, RuleBasedStateMachine):
    """ShardCore vs the model; every rule checks its own replies, invariants the rest."""

    @initialize(preset=st.sampled_from(range(len(PRESETS))), dead_letter=st.booleans())
    def setup(self, preset: int, dead_letter: bool) -> None:
        self.start(preset, dead_letter)

    # -- rules --------------------------------------------------------------------------

    @rule()
    def connect(self) -> None:
        self.open_connection()

    @rule(i=st.integers(0, 9), batch=st.lists(st.tuples(st.booleans(), st.integers(0, 50),
                                                        st.integers(0, 3)), min_size=1, max_size=4),
          cuts=st.sets(st.integers(1, 3), max_size=2),
          delays=st.lists(st.sampled_from(DELAYS), max_size=4))
    def publish(self, i: int, batch: list[tuple[bool, int, int]], cuts: set[int],
                delays: list[tuple[str, float] | None] | None = None) -> None:
        """One PUBLISH frame of new ids and retried ones (possibly the same id twice), the
        items split into groups of the one topic before the indexes in ``cuts``; item k
        delayed as ``delays[k]`` says (``deliver_at`` relative to now; past means now)."""
        conn = self._pick_conn(i)
        delays = delays or []
        groups: list[list[Any]] = []
        expected: list[list[Any]] = []
        for k, (new, reuse, size) in enumerate(batch):
            if k == 0 or k in cuts:
                groups.append([TOPIC, [], [], {"delay": [], "deliver_at": []}])
                expected.append([[], [], [], None, []])
            how = delays[k] if k < len(delays) else None
            groups[-1][3]["delay"].append(how[1] if how and how[0] == "delay" else None)
            groups[-1][3]["deliver_at"].append(
                max(0.0, self.now + how[1]) if how and how[0] == "at" else None)
            due = self.now + how[1] if how and how[1] > 0 else None
            if new or not self.ids:
                mid = f"id{len(self.ids)}"
                self.ids.append(mid)
            else:
                mid = self.ids[reuse % len(self.ids)]
            payload = mid.encode() * size
            index = len(groups[-1][1])
            groups[-1][1].append(mid)
            groups[-1][2].append(payload)
            offsets, duplicates, _, _, dues = expected[-1]
            known = self.dedup.get(mid)
            if known is not None and self.now < known[1] + self.cfg.message.dedup_window:
                offsets.append(known[0])
                duplicates.append(index)
                # the ack carries the original's due time while it is held (G12); once
                # cleaned up, it may or may not (-due: either)
                original = known[0]
                due = self.dues.get(original)
                dues.append(None if due is None else due if self.held(original) else -due)
                event("publish: duplicate")
            else:
                # stored: in the model before the DELIVERs of the same batch are checked
                offsets.append(len(self.messages))
                self.dedup[mid] = (len(self.messages), self.now)
                if due is not None:
                    self.dues[len(self.messages)] = due
                    event("publish: delayed")
                self.messages.append((mid, payload, self.now))
                dues.append(due)
        if len(groups) > 1:
            event("publish: several groups of one topic")
        rid = self._next_rid()
        [reply] = self._send(conn, [P.PUBLISH, rid, groups])
        for result, got in zip(expected, reply[3], strict=False):
            if result[0] and not result[1]:  # every item stored new: the first offset
                result[0] = result[0][0]     # stands for all
            got_dues = got[4] if len(got) > 4 else [None] * len(result[4])
            result[4] = [-d if d is not None and d < 0 and got_dues[k] == -d else
                         None if d is not None and d < 0 else d
                         for k, d in enumerate(result[4])]
            if not any(d is not None for d in result[4]):
                del result[3:]  # (no due column unless an item is delayed)
        assert reply == [P.PUBLISHED, rid, GEN, expected], ("G1/G3", reply, expected)

    # the interesting values first: Hypothesis draws early elements more often
    @rule(i=st.integers(0, 9), sid=st.integers(1, 3), name=st.sampled_from(["s1", "s2", None]),
          read_old=st.booleans(), mif=st.sampled_from([5, 2, 1]),
          credit=st.sampled_from([None, 100, 3, 1, 0]))
    def subscribe(self, i: int, sid: int, name: str | None, read_old: bool, mif: int,
                  credit: int | None) -> None:
        conn = self._pick_conn(i)
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
            sub = MSub(key, name is None, self.lowest if read_old else len(self.messages))
        else:
            gap = any(o > sub.cursor() for o in sub.acked)
            event(f"subscribe: reattach, acked offsets above the cursor={gap}")
            if sub.att is not None:
                sub.att.takeover_expected = True
                event("subscribe: takeover")
        cap = self.cfg.subscriber.max_in_flight
        att = Att(conn, sid, sub, credit=min(mif, cap) if credit is None else credit,
                  mif=min(mif, cap))

        cursor = sub.cursor()

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
            "created": created, "start_offset": sub.start, "cursor": cursor,
            "generation": GEN, "clamped": False, "reset": False,
            "next_offset": len(self.messages), "max_in_flight": att.mif}], reply

    @rule(i=st.integers(0, 9), j=st.integers(0, 9), sid=st.integers(1, 3),
          mif=st.sampled_from([1, 5, 2]), credit=st.sampled_from([None, 1, 100]))
    def resubscribe(self, i: int, j: int, sid: int, mif: int, credit: int | None) -> None:
        """Subscribe again to an existing named subscription (reactivation or takeover)."""
        names = sorted(k for k, sub in self.subs.items() if not sub.ephemeral and not sub.pull)
        if names:
            self.subscribe(i, sid, names[j % len(names)], False, mif, credit)

    @rule(i=st.integers(0, 9))
    def ack_newest(self, i: int) -> None:
        """Ack the highest offset in flight, leaving a gap above the cursor."""
        att = self._pick_att(i)
        if att is not None and len(att.pushes) >= 2:
            self.ack(i, [1, len(att.pushes) - 1], None, False, 1)

    @rule(i=st.integers(0, 9), name=st.sampled_from(["p1", "p2"]), read_old=st.booleans())
    def pull_subscribe(self, i: int, name: str, read_old: bool) -> None:
        conn = self._pick_conn(i)
        rid = self._next_rid()
        sub = self._touch_pull(name)
        created = sub is None
        if sub is None:
            start = self.lowest if read_old else len(self.messages)
            sub = MSub(name, False, start, pull=True, committed=start, last_activity=self.now)
            self.subs[name] = sub
        [reply] = self._send(conn, [P.SUBSCRIBE, rid, 0, {"topic": TOPIC, "name": name,
                                                          "mode": "pull", "read_old": read_old}])
        assert reply[:3] == [P.SUBSCRIBED, rid, 0], reply
        body = dict(reply[3])
        body.pop("max_in_flight")  # meaningless for pull
        assert body == {"created": created, "start_offset": sub.start, "cursor": sub.cursor(),
                        "generation": GEN, "clamped": False, "reset": False,
                        "next_offset": len(self.messages)}, body

    @rule(i=st.integers(0, 9), name=st.sampled_from(["p1", "p2", None]),
          offset=st.integers(0, 40), n=st.integers(1, 5))
    def fetch(self, i: int, name: str | None, offset: int, n: int) -> None:
        """FETCH returns exactly the held messages of the range (G2), keeping a reader alive."""
        conn = self._pick_conn(i)
        rid = self._next_rid()
        frame = [P.FETCH, rid, {"topic": TOPIC, "name": name, "generation": GEN,
                                "offset": offset, "max_messages": n}]
        if name is not None and name not in self.subs:
            [reply] = self._send(conn, frame)
            assert reply[0] == P.ERROR and reply[2] == errors.UnknownSubscription.code, reply
            return
        if name is not None:
            self._touch_pull(name)
        [reply] = self._send(conn, frame)
        held = sorted(self.kept) + list(range(self.oldest, len(self.messages)))
        expected = [[o, *self.messages[o]] for o in held if o >= offset][:n]
        assert reply[:3] == [P.FETCHED, rid, {"generation": GEN, "oldest": min(held or [
            self.oldest]), "next": len(self.messages)}]
        assert fetched_messages(reply) == expected  # whatever is due (G12)

    @rule(i=st.integers(0, 9), name=st.sampled_from(["p1", "p2"]), back=st.integers(-2, 4))
    def commit(self, i: int, name: str, back: int) -> None:
        """COMMIT moves a pull cursor forward (never back); past the end is refused."""
        conn = self._pick_conn(i)
        rid = self._next_rid()
        offset = len(self.messages) - back
        frame = [P.COMMIT, rid, {"topic": TOPIC, "name": name, "generation": GEN,
                                 "offset": offset}]
        sub = self._touch_pull(name)  # any COMMIT naming it counts as the reader's activity
        [reply] = self._send(conn, frame)
        if sub is None:
            assert reply[0] == P.ERROR and reply[2] == errors.UnknownSubscription.code, reply
        elif not 0 <= offset <= len(self.messages):
            assert reply[0] == P.ERROR and reply[2] == errors.OffsetOutOfRange.code, reply
        else:
            sub.committed = max(sub.committed, offset)
            assert reply == [P.COMMITTED, rid, {"cursor": sub.committed}], reply

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
        pool = sorted(att.pushes) if att.pushes and picks[0] % 4 != 3 else sorted(att.delivered)
        offsets = [pool[p % len(pool)] for p in picks[1:]] if pool else []
        if extra is not None:
            offsets.append(extra if extra >= 0 else len(self.messages) + 1)
        # a cumulative ack names an offset of its own, often one not acked individually
        upto = pool[picks[0] % len(pool)] if through and pool else -1
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
                att.naked.pop(o, None)  # acked while waiting for its re-push: not pushed
                att.sub.acked.add(o)
                att.sub.counts.pop(o, None)
        if upto >= 0:  # never over a nak'd one waiting, nor a delayed one (PROTOCOL §6.7)
            for o in [o for o in att.pushes if o <= upto and o not in self.dues]:
                del att.pushes[o]
                att.sub.acked.add(o)
                att.sub.counts.pop(o, None)
        [reply] = self._send(att.conn, [P.ACK, rid, att.sid, generation, offsets, upto])
        assert att.live, "an ack's reply cannot end the attachment"
        assert reply[:4] == [P.ACKED, rid, att.sid, att.sub.cursor()], (reply, att.sub.cursor())
        assert [(r[0], r[1]) for r in reply[4]] == \
            [(o, errors.NotDelivered.code) for o in refused], "acks: refusals"

    @rule(i=st.integers(0, 9), items=st.lists(st.tuples(
        st.sampled_from(["nak", "term", "progress"]), st.integers(0, 20)), min_size=1,
        max_size=4), delay=st.sampled_from([0.0, 0.5, 2.0, 5.0]))
    def settle(self, i: int, items: list[tuple[str, int]], delay: float) -> None:
        """nak (re-pushed at now + delay, counted), term (an ack or a dead letter) and
        in_progress (the ack deadline now + timeout) of held offsets, now and then of one
        not held (G11)."""
        att = self._pick_att(i)
        if att is None:
            return
        sub = att.sub
        pool = sorted(att.pushes) + sorted(att.naked)
        body: dict[str, list[Any]] = {"nak": [], "term": [], "progress": []}
        for kind, pick in items:
            o = pool[pick % len(pool)] if pool and pick < 18 else len(self.messages) + pick
            body[kind].append(o if kind == "progress" else
                              [o, delay] if kind == "nak" else [o, f"why{pick}"])
        refused: list[int] = []
        # the core applies naks, then terms, then progress; each settles its offset alone
        for o, _ in body["nak"]:
            if o not in att.pushes:
                refused.append(o)
                continue
            pushes, _ = att.pushes.pop(o)
            if pushes < self.max_pushes:
                att.naked[o] = (pushes, self.now + delay)
            elif self.dead_letter:
                self._dead_letter(sub, o, pushes, "exhausted")
            else:
                att.nak_exhausted = True  # its last push: the attachment ends
                event("nak: exhausted")
        for o, reason in body["term"]:
            if o in att.pushes or o in att.naked:
                pushes = (att.pushes.pop(o, None) or att.naked.pop(o))[0]
                if self.dead_letter:
                    self._dead_letter(sub, o, pushes, f"term: {reason}")
                else:  # counts as an ack
                    sub.acked.add(o)
            else:
                refused.append(o)
        for o in body["progress"]:
            if o not in att.pushes:
                refused.append(o)
            else:  # as if pushed now, uncounted (after its ack timeout too)
                if att.pushes[o][1] + self.T <= self.now:
                    event("in_progress: in the retry interval")
                att.pushes[o] = (att.pushes[o][0], self.now)
        rid = self._next_rid()
        [reply] = self._send(att.conn, [P.ACK, rid, att.sid, GEN, [], -1, body])
        assert self.core is not None
        if self.core.next_deadline() <= self.now:  # a nak with no delay: the tick now re-pushes
            self.core.tick(self.now)
            self._drain(None, handle_first=None)
        assert reply[:4] == [P.ACKED, rid, att.sid, sub.cursor()], (reply, sub.cursor())
        assert [(r[0], r[1]) for r in reply[4]] == \
            [(o, errors.NotDelivered.code) for o in refused], ("G11: refusals", reply)
        assert att.live != att.nak_exhausted, "G11: a nak on the last push exhausts it"

    @rule(i=st.integers(0, 9), sid=st.integers(1, 3))
    def ack_detached_sid(self, i: int, sid: int) -> None:
        """Acks on a sid that is not attached here are refused and change nothing."""
        conn = self._pick_conn(i)
        if (conn, sid) in self.atts:
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
        att = self.atts.get((conn, sid))
        if att is not None:
            self._end(att)
        rid = self._next_rid()
        assert self._send(conn, [P.UNSUBSCRIBE, rid, sid]) == [[P.UNSUBSCRIBED, rid, sid]]

    @rule(i=st.integers(0, 9))
    def disconnect(self, i: int) -> None:
        conn = self._pick_conn(i)
        assert self.core is not None
        self._on_closed(conn)
        self.core.disconnect(conn, self.now)
        assert self.core.take_output() == []

    @rule(i=st.integers(0, 9))
    def ping(self, i: int) -> None:
        conn = self._pick_conn(i)
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

    # -- invariants ---------------------------------------------------------------------

    @invariant()
    def subscriptions_match_the_model(self) -> None:
        self.check_subscriptions()

    @invariant()
    def every_deliverable_message_is_pushed(self) -> None:
        """G2: an attachment with room and credit has no message waiting for it."""
        self.check_every_deliverable_message_is_pushed()

    @invariant()
    def core_sessions_match(self) -> None:
        self.check_sessions()

    @invariant()
    def dead_letters_match(self) -> None:
        self.check_dead_letters()


ShardModel.TestCase.settings = settings(
    max_examples=300, stateful_step_count=100, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestShardCoreAgainstModel = ShardModel.TestCase
