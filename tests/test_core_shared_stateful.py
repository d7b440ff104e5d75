"""Hypothesis stateful test of shared subscriptions (G10) in ShardCore.

Rules: members join (windows and credit of their own, key-ordered or not), leave
(unsubscribe or disconnect), ack what they hold (one by one or cumulatively, and
offsets they do not hold), grant credit, publish keyed and unkeyed messages, and
let time pass (ack timeouts, re-pushes, exhaustion). A model checks every DELIVER
as it arrives: the message is stored and unacked, held by no other member, pushed
with the next push count, within the member's window; with key order, its key is
on no other member and a key's first pushes come in offset order. Invariants after
every step: the cursor is the lowest unacked offset, and the pool is work-
conserving: a message nobody holds waits only while no member could take it.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from test_core_support import TOPIC, Client, Shard

from flux import errors
from flux import protocol as P
from flux.message_meta import read_columns

NAME = "pool"
TIMEOUT, RETRY_INTERVAL, RETRY_COUNT = 7.0, 3.0, 2


class Member:
    def __init__(self, client: Client, sid: int, window: int, credit: int) -> None:
        self.client, self.sid, self.window, self.credit = client, sid, window, credit
        self.held: dict[int, int] = {}    # offset -> its push number
        self.top = -1                     # the highest offset pushed to it
        self.late: set[int] = set()


class SharedPool(RuleBasedStateMachine):
    @initialize(key_ordered=st.booleans())
    def setup(self, key_ordered: bool) -> None:
        self.shard = Shard({"message.ttl": 1e6,  # nothing is trimmed under the model
                            "subscriber.timeout": TIMEOUT,
                            "subscriber.retry_interval": RETRY_INTERVAL,
                            "subscriber.retry_count": RETRY_COUNT})
        self.key_ordered = key_ordered
        self.publisher = self.shard.connect()
        self.keys: list[str | None] = []   # offset -> key
        self.acked: set[int] = set()
        self.counts: dict[int, int] = {}   # pushes used, per unacked offset
        self.members: list[Member] = []
        self.first_pushed: dict[str, int] = {}  # key -> highest offset first-pushed
        self.sids = 0

    # -- frames in ---------------------------------------------------------------------

    def _receive(self) -> None:
        """Check every frame the members got since the last step: the pushes first (a
        member may hear that the pool ended before another gets its last push)."""
        got = [(member, member.client.take()) for member in list(self.members)]
        for member, frames in got:
            for frame in frames:
                if frame[0] == P.DELIVER and frame[1] == member.sid:
                    self._deliver(member, frame)
        for member, frames in got:
            for frame in frames:
                if frame[0] == P.SUB_ENDED and frame[1] == member.sid:
                    assert frame[2] == errors.SubscriptionInactive.code
                    self._ended(member, int(frame[3].split()[1]))  # "offset N was ..."

    def _deliver(self, member: Member, frame: list[Any]) -> None:
        count = P.check_deliver(frame)
        offsets = P.offsets_of(frame[4], count)
        keys = read_columns(frame[8], count)[0] if len(frame) > 8 else [None] * count
        attempt = frame[3]
        for offset, key in zip(offsets, keys, strict=True):
            assert offset < len(self.keys) and offset not in self.acked, offset
            assert key == self.keys[offset]
            for other in self.members:
                assert other is member or offset not in other.held, (offset, "held twice")
                if self.key_ordered and key is not None and other is not member:
                    assert all(self.keys[o] != key for o in other.held), (key, "on two members")
            assert attempt == self.counts.get(offset, 0) + 1, (offset, attempt, self.counts)
            assert attempt <= 1 + RETRY_COUNT
            if self.key_ordered and key is not None and offset not in self.counts:
                assert offset > self.first_pushed.get(key, -1), (key, offset, "key order")
                self.first_pushed[key] = offset
            self.counts[offset] = attempt
            if offset <= member.top and offset not in member.held:
                member.late.add(offset)  # (a re-push to its holder is not late)
            member.top = max(member.top, offset)
            if offset not in member.held and attempt == 1:
                member.credit -= 1
            member.held[offset] = attempt
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

    @rule(keys=st.lists(st.sampled_from(["a", "b", "c", None]), min_size=1, max_size=8))
    def publish(self, keys: list[str | None]) -> None:
        ids = [f"m{len(self.keys) + i}" for i in range(len(keys))]
        reply = self.publisher.publish_frame([[TOPIC, ids, [b"x"] * len(ids), {"keys": keys}]])
        assert reply[0] == P.PUBLISHED, reply
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
            covered = [o for o in member.held if o <= through and o not in member.late]
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
            del member.held[offset]
            member.late.discard(offset)
            self.acked.add(offset)
            self.counts.pop(offset, None)
        expected = next(o for o in range(len(self.keys) + 1) if o not in self.acked)
        assert cursor == expected, (cursor, expected)
        self._receive()

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
        for offset in range(len(self.keys)):
            if offset in self.acked or offset in held:
                continue
            first = offset not in self.counts
            key = self.keys[offset]
            owners = [m for m in self.members if self.key_ordered and key is not None
                      and any(self.keys[o] == key for o in m.held)]
            takers = owners or self.members
            assert not any(len(m.held) < m.window and (m.credit > 0 or not first)
                           for m in takers), (offset, "waits though a member has room")
            if self.key_ordered and key is not None:
                return  # later ones of this key may wait behind it (and others: the limit)


TestSharedPool = SharedPool.TestCase
TestSharedPool.settings = settings(max_examples=300, stateful_step_count=50, deadline=None,
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
