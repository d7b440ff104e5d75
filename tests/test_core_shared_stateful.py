"""Hypothesis stateful test of shared subscriptions (G10) in ShardCore.

Rules: members join (windows and credit of their own, key-ordered or not), leave
(unsubscribe or disconnect), ack what they hold (one by one or cumulatively, and
offsets they do not hold), settle it (nak with or without a delay, term,
in_progress), grant credit, publish keyed and unkeyed messages (some delayed),
and let time pass (ack timeouts, re-pushes, exhaustion: the pool ends, or with a
dead-letter policy the message is a dead letter). A model checks every DELIVER
as it arrives (in time order): the message is stored, unacked and due, held by
no other member, pushed with the next push count, within the member's window; a
re-push to its holder falls on G4's schedule from its push or in_progress, a
nak'd one comes no earlier than its delay says; with key order, its key is on no
other member and a key's first pushes of undelayed messages come in offset order.
Invariants after every step: the cursor is the lowest unacked offset, the dead-
letter topic holds exactly the dead letters, and the pool is work-conserving: a
due message nobody holds waits only while no member could take it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from test_core_support import TOPIC, Client, Received, Shard

from flux import errors
from flux import protocol as P
from flux.hashing import dead_letter_topic
from flux.message_meta import read_columns
from flux.shard import held_keys

NAME = "pool"
_BUILT = held_keys.fast
TIMEOUT, RETRY_INTERVAL, RETRY_COUNT = 7.0, 3.0, 2


class Member:
    def __init__(self, client: Client, sid: int, window: int, credit: int) -> None:
        self.client, self.sid, self.window, self.credit = client, sid, window, credit
        self.held: dict[int, int] = {}    # offset -> its push number
        self.since: dict[int, float] = {}  # offset -> its push (or in_progress) time
        self.top = -1                     # the highest offset pushed to it
        self.late: set[int] = set()


class SharedPool(RuleBasedStateMachine):
    @initialize(key_ordered=st.booleans(), dead_letter=st.booleans())
    def setup(self, key_ordered: bool, dead_letter: bool = False) -> None:
        self.shard = Shard({"message.ttl": 1e6,  # nothing is trimmed under the model
                            "subscriber.timeout": TIMEOUT,
                            "subscriber.retry_interval": RETRY_INTERVAL,
                            "subscriber.retry_count": RETRY_COUNT,
                            "dead_letter.enabled": dead_letter})
        self.key_ordered = key_ordered
        self.dead_letter = dead_letter
        self.publisher = self.shard.connect()
        self.keys: list[str | None] = []   # offset -> key
        self.dues: dict[int, float] = {}   # delayed offset -> due time (G12)
        self.acked: set[int] = set()
        self.counts: dict[int, int] = {}   # pushes used, per unacked offset
        self.nak_at: dict[int, float] = {}  # nak'd offset -> when it may go again
        self.letters: list[tuple[int, int, str]] = []  # offset, pushes, reason
        self.members: list[Member] = []
        self.first_pushed: dict[str, int] = {}  # key -> highest offset first-pushed
        self.sids = 0

    # -- frames in ---------------------------------------------------------------------

    def _receive(self) -> None:
        """Check every frame the members got since the last step, in time order: at one
        time the pushes first (a member may hear that the pool ended before another
        gets its last push)."""
        got: list[tuple[float, bool, int, Member, list[Any]]] = []
        for member in list(self.members):
            received: list[Received] = member.client.inbox
            member.client.inbox = []
            got += [(r.at, r.frame[0] == P.SUB_ENDED, len(got) + k, member, r.frame)
                    for k, r in enumerate(received) if r.frame[1] == member.sid]
        for at, ended, _, member, frame in sorted(got, key=lambda g: g[:3]):
            self._dead_letter_exhausted(at)
            if ended:
                assert frame[2] == errors.SubscriptionInactive.code
                assert not self.dead_letter, "G11: with the policy, a dead letter instead"
                self._ended(member, int(frame[3].split()[1]))  # "offset N was ..."
            elif frame[0] == P.DELIVER:
                self._deliver(member, frame, at)
        self._dead_letter_exhausted(self.shard.now)
        if self.dead_letter:
            self._dead_letter_handed_off()

    def _dead_letter_handed_off(self) -> None:
        """With a dead-letter policy, a message no member holds that used all its pushes
        (its holder left, or the pool ended) becomes a dead letter instead of one push
        too many (G10, G11), when the pool next pushes. The model takes such dead
        letters as the core writes them; the pool's work-conserving check sees that
        none waits while a member has room."""
        dlq = self.shard.core.topics.get(dead_letter_topic(TOPIC, NAME))
        if dlq is None:
            return
        held = {o for m in self.members for o in m.held}
        for offset, pushes, reason in sorted((Counter(_letters(dlq)) - Counter(self.letters)
                                              ).elements()):
            assert (reason, pushes, self.counts.get(offset)) == \
                ("exhausted", 1 + RETRY_COUNT, 1 + RETRY_COUNT), (offset, pushes, reason)
            assert offset not in held and offset not in self.acked, offset
            self._settled(offset, pushes, reason)

    def _dead_letter_exhausted(self, now: float) -> None:
        """With a dead-letter policy, a last push whose ack timed out by ``now`` is a
        dead letter and counts as acked (G11)."""
        if not self.dead_letter:
            return
        for member in self.members:
            for offset, attempt in list(member.held.items()):
                if attempt == 1 + RETRY_COUNT and member.since[offset] + TIMEOUT <= now:
                    self._let_go(member, offset)
                    self._settled(offset, attempt, "exhausted")

    def _let_go(self, member: Member, offset: int) -> None:
        del member.held[offset]
        del member.since[offset]
        member.late.discard(offset)

    def _settled(self, offset: int, pushes: int, reason: str | None) -> None:
        """``offset`` counts as acked: by an ack, a term, or as a dead letter (reason)."""
        self.acked.add(offset)
        self.counts.pop(offset, None)
        self.nak_at.pop(offset, None)
        if reason is not None and self.dead_letter:
            self.letters.append((offset, pushes, reason))

    def _deliver(self, member: Member, frame: list[Any], at: float) -> None:
        count = P.check_deliver(frame)
        offsets = P.offsets_of(frame[4], count)
        keys = read_columns(frame[8], count)[0] if len(frame) > 8 else [None] * count
        attempt = frame[3]
        for offset, key in zip(offsets, keys, strict=True):
            assert offset < len(self.keys) and offset not in self.acked, offset
            assert key == self.keys[offset]
            assert self.dues.get(offset, 0.0) <= at, (offset, "G12: pushed before it is due")
            if offset in member.held:  # a re-push to its holder: G4's schedule
                assert at == member.since[offset] + TIMEOUT + RETRY_INTERVAL, (offset, at)
            if offset in self.nak_at:
                assert at >= self.nak_at.pop(offset), (offset, "G11: before its nak delay")
            for other in self.members:
                assert other is member or offset not in other.held, (offset, "held twice")
                if self.key_ordered and key is not None and other is not member:
                    assert all(self.keys[o] != key for o in other.held), (key, "on two members")
            assert attempt == self.counts.get(offset, 0) + 1, (offset, attempt, self.counts)
            assert attempt <= 1 + RETRY_COUNT
            if self.key_ordered and key is not None and offset not in self.counts \
                    and offset not in self.dues:
                assert offset > self.first_pushed.get(key, -1), (key, offset, "key order")
                self.first_pushed[key] = offset
            self.counts[offset] = attempt
            if offset <= member.top and offset not in member.held:
                member.late.add(offset)  # (a re-push to its holder is not late)
            member.top = max(member.top, offset)
            if offset not in member.held and attempt == 1:
                member.credit -= 1
            member.held[offset] = attempt
            member.since[offset] = at
            assert len(member.held) <= member.window

    def _ended(self, member: Member, offset: int) -> None:
        """The pool went inactive (``offset`` used all its pushes): each member hears it
        (after what was pushed to it before); the message's count starts afresh, and with
        it the round's first pushes."""
        if offset in self.counts:  # the first member to hear it
            assert self.counts[offset] == 1 + RETRY_COUNT, (offset, self.counts)
            del self.counts[offset]
        self.first_pushed = {}
        if member in self.members:
            self.members.remove(member)

    # -- rules -------------------------------------------------------------------------

    @rule(window=st.integers(1, 4), credit=st.integers(0, 6))
    @precondition(lambda self: len(self.members) < 4)
    def join(self, window: int, credit: int) -> None:
        client = self.shard.connect()
        self.sids += 1
        reply = client.subscribe_frame(self.sids, name=NAME, shared=True,
                                       key_ordered=self.key_ordered, max_in_flight=window,
                                       credit=credit, read_old=True)
        assert reply[0] == P.SUBSCRIBED, reply
        if reply[3]["created"]:  # (made again after it was deleted, inactive too long)
            self.acked = set(range(reply[3]["start_offset"]))
            self.counts = {}
            self.nak_at = {}
            self.first_pushed = {}
        self.members.append(Member(client, self.sids, window, credit))
        self._receive()

    @rule(i=st.integers(0, 3), disconnect=st.booleans())
    @precondition(lambda self: self.members)
    def leave(self, i: int, disconnect: bool) -> None:
        member = self.members.pop(i % len(self.members))
        if disconnect:
            self.shard.core.disconnect(member.client.conn, self.shard.now)
            self.shard.collect()
        else:
            member.client.unsubscribe(member.sid)
        self._receive()

    @rule(keys=st.lists(st.sampled_from(["a", "b", "c", None]), min_size=1, max_size=8),
          delays=st.lists(st.sampled_from([None, None, 1.0, 4.0, 12.0]), max_size=8))
    def publish(self, keys: list[str | None], delays: list[float | None] | None = None
                ) -> None:
        ids = [f"m{len(self.keys) + i}" for i in range(len(keys))]
        delays = ((delays or []) + [None] * len(keys))[:len(keys)]
        reply = self.publisher.publish_frame([[TOPIC, ids, [b"x"] * len(ids),
                                               {"keys": keys, "delay": delays}]])
        assert reply[0] == P.PUBLISHED, reply
        for i, delay in enumerate(delays):
            if delay is not None:
                self.dues[len(self.keys) + i] = self.shard.now + delay
        self.keys += keys
        self._receive()

    @rule(i=st.integers(0, 3), pick=st.integers(0, 10), cumulative=st.booleans())
    @precondition(lambda self: self.members)
    def ack(self, i: int, pick: int, cumulative: bool) -> None:
        member = self.members[i % len(self.members)]
        client = member.client
        if cumulative:
            through = pick
            cursor, refused = client.ack(member.sid, through=through)
            assert refused == []
            # (never a late push, nor a delayed message: PROTOCOL §6.7)
            covered = [o for o in member.held
                       if o <= through and o not in member.late and o not in self.dues]
        else:
            offset = pick % max(1, len(self.keys))
            cursor, refused = client.ack(member.sid, offset)
            if offset in member.held:
                assert refused == []
                covered = [offset]
            elif offset in self.acked:
                assert refused == []  # acked already: changes nothing
                covered = []
            else:
                assert [r[1] for r in refused] == [errors.NotDelivered.code], (offset, refused)
                covered = []
        for offset in covered:
            self._let_go(member, offset)
            self._settled(offset, 0, None)
        expected = next(o for o in range(len(self.keys) + 1) if o not in self.acked)
        assert cursor == expected, (cursor, expected)
        self._receive()

    @rule(i=st.integers(0, 3), items=st.lists(st.tuples(
        st.sampled_from(["nak", "term", "progress"]), st.integers(0, 10)), min_size=1,
        max_size=3), delay=st.sampled_from([0.0, 2.0, 5.0]))
    @precondition(lambda self: self.members)
    def settle(self, i: int, items: list[tuple[str, int]], delay: float) -> None:
        """nak, term and in_progress of what a member holds, now and then of an offset it
        does not hold (NotDelivered): G11 for a shared subscription."""
        member = self.members[i % len(self.members)]
        pool = sorted(member.held)
        body: dict[str, list[Any]] = {"nak": [], "term": [], "progress": []}
        for kind, pick in items:
            o = pool[pick % len(pool)] if pool and pick < 9 else pick
            body[kind].append(o if kind == "progress" else [o, delay] if kind == "nak"
                              else [o, "why"])
        now = self.shard.now
        refused: list[int] = []
        ends = False
        for o, _ in body["nak"]:  # naks, then terms, then progress, as the core does
            if o not in member.held:
                refused.append(o)
                continue
            pushes = member.held[o]
            self._let_go(member, o)
            if pushes < 1 + RETRY_COUNT:
                self.nak_at[o] = now + delay  # to any member (its key's) from then on
            elif self.dead_letter:
                self._settled(o, pushes, "exhausted")
            else:
                ends = True  # on its last push: the pool ends (SUB_ENDED)
        for o, _ in body["term"]:
            if o in member.held:
                pushes = member.held[o]
                self._let_go(member, o)
                self._settled(o, pushes, "term: why")  # (an ack without the policy)
            else:
                refused.append(o)
        for o in body["progress"]:
            if o not in member.held:
                refused.append(o)
            else:  # as if pushed now (after its ack timeout too)
                member.since[o] = now
        reply = member.client.request([P.ACK, member.client.rid(), member.sid,
                                       self.shard.generation, [], -1, body])
        assert reply[0] == P.ACKED, reply
        assert [(r[0], r[1]) for r in reply[4]] == \
            [(o, errors.NotDelivered.code) for o in refused], ("G11: refusals", reply)
        self.shard.after(0.0)  # a nak with no delay: the tick now re-pushes
        self._receive()
        # (the room a settle frees may end it too: a hand-off out of pushes, G10)
        assert not ends or member not in self.members, "G11: a nak on the last push ends it"

    @rule(i=st.integers(0, 3), n=st.integers(1, 4))
    @precondition(lambda self: self.members)
    def credit(self, i: int, n: int) -> None:
        member = self.members[i % len(self.members)]
        member.client.credit(member.sid, n)
        member.credit += n
        self._receive()

    @rule(dt=st.sampled_from([1.0, 5.0, 10.0]))
    def wait(self, dt: float) -> None:
        self.shard.after(dt)
        self._receive()

    # -- invariants --------------------------------------------------------------------

    @invariant()
    def work_conserving(self) -> None:
        """A message nobody holds waits only while no member could take it: every
        member's window is full, or (a first push) it has no credit; with key order, or
        because its key is on a member with no room."""
        if not hasattr(self, "members") or not self.members:
            return
        held = {o for m in self.members for o in m.held}
        now = self.shard.now
        for offset in range(len(self.keys)):
            if offset in self.acked or offset in held:
                continue
            if self.dues.get(offset, 0.0) > now or self.nak_at.get(offset, 0.0) > now:
                if self.key_ordered and self.keys[offset] is not None:
                    return  # later ones of its key may wait behind it
                continue  # not due yet (G12), or nak'd with a delay not over (G11)
            first = offset not in self.counts
            key = self.keys[offset]
            owners = [m for m in self.members if self.key_ordered and key is not None
                      and any(self.keys[o] == key for o in m.held)]
            takers = owners or self.members
            assert not any(len(m.held) < m.window and (m.credit > 0 or not first)
                           for m in takers), (offset, "waits though a member has room")
            if self.key_ordered and key is not None:
                return  # later ones of this key may wait behind it (and others: the limit)


    @invariant()
    def dead_letters_match(self) -> None:
        """G11: the pool's dead-letter topic holds exactly its dead letters."""
        if not hasattr(self, "members"):
            return
        dlq = self.shard.core.topics.get(dead_letter_topic(TOPIC, NAME))
        found = _letters(dlq) if dlq is not None else []
        assert sorted(found) == sorted(self.letters), ("G11: dead letters", found)


def _letters(dlq: Any) -> list[tuple[int, int, str]]:
    """(offset, pushes, reason) of each dead letter in a dead-letter topic, in order."""
    out = []
    for offset in range(dlq.log.oldest, dlq.log.next_offset):
        headers = dlq.log.meta_of(offset)[1] or {}
        out.append((int(headers["flux-offset"]), int(headers["flux-pushes"]),
                    headers["flux-reason"]))
    return out


TestSharedPool = SharedPool.TestCase
TestSharedPool.settings = settings(max_examples=400, stateful_step_count=50, deadline=None,
                                   suppress_health_check=[HealthCheck.too_slow])


class SharedPoolInPython(SharedPool):
    """The same, with the members' held keys kept by the Python functions rather than
    the C ones (:mod:`flux.shard.held_keys`): Flux built without a C compiler."""

    def __init__(self) -> None:
        super().__init__()
        held_keys.fast = None

    def teardown(self) -> None:
        held_keys.fast = _BUILT
        super().teardown()


TestSharedPoolInPython = SharedPoolInPython.TestCase
TestSharedPoolInPython.settings = settings(max_examples=200, stateful_step_count=50,
                                           deadline=None,
                                           suppress_health_check=[HealthCheck.too_slow])


def test_a_released_keys_waiting_message_goes_where_it_was_placed() -> None:
    """Found by the model: a key released with a message waiting was pinned to a member
    that had room for it, then that room went to another waiting key, and the message
    waited though another member could take it."""
    pool = SharedPool()
    pool.setup(key_ordered=True)
    steps: list[tuple[str, dict[str, Any]]] = [
        ("publish", {"keys": ["a", "a", "b", "c", "b", "c"]}),
        ("join", {"credit": 0, "window": 1}), ("join", {"credit": 0, "window": 2}),
        ("publish", {"keys": ["a"]}), ("join", {"credit": 2, "window": 2}),
        ("publish", {"keys": ["a"]}), ("credit", {"i": 1, "n": 3}),
        ("publish", {"keys": ["a"]}), ("credit", {"i": 0, "n": 1}),
        ("publish", {"keys": ["a"]}), ("ack", {"cumulative": False, "i": 1, "pick": 2})]
    for name, args in steps:
        getattr(pool, name)(**args)
        pool.work_conserving()


def test_two_messages_nakd_on_their_last_push_end_two_rounds_one_after_the_other() -> None:
    """Found by the machine above: a member naks two hand-offs, each on its last push
    (no dead-letter policy). The pool ends on the first; the second kept no count, so the
    next round pushed it as a first push (attempt 1, and a first push waited on credit
    with a member's window free). It keeps its count now and ends the next round."""
    pool = SharedPool()
    pool.setup(key_ordered=False, dead_letter=False)
    pool.join(credit=2, window=2)
    pool.publish(delays=[], keys=["a", "a"])
    pool.wait(dt=10.0)
    pool.join(credit=0, window=2)
    pool.leave(disconnect=False, i=0)   # its two messages go to the other, third pushes
    assert pool.counts == {0: 1 + RETRY_COUNT, 1: 1 + RETRY_COUNT}
    pool.settle(delay=0.0, i=0, items=[("nak", 0), ("nak", 1)])
    assert not pool.members and pool.counts == {1: 1 + RETRY_COUNT}
    pool.join(credit=2, window=2)       # offset 1 ends this round (the model checks it)
    pool.work_conserving()
    assert pool.counts == {} and not pool.members
    pool.join(credit=0, window=1)
    pool.work_conserving()
    pool.teardown()
