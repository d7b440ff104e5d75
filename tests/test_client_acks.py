"""AckSession against a model: what a session delivered, what the user acked, and the
shard's confirmed cursor; cumulative acks never cover an offset the user has not acked."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from flux.client.subscription import AckSession


class AckSessionModel(RuleBasedStateMachine):
    """One attachment: first deliveries in offset order, redeliveries of unacked
    offsets, user acks, ACK frames taken, and ACKED cursors the shard could send."""

    @initialize(cursor=st.integers(0, 50))
    def start(self, cursor: int) -> None:
        self.session = AckSession(1, 7, cursor)
        self.cursor = cursor            # the shard's confirmed cursor
        self.delivered: set[int] = set()
        self.acked: set[int] = set()    # user acks at or above the cursor
        self.sent: set[int] = set()     # acked and handed to an ACK frame (explicit or through)
        self.next = cursor              # the next first delivery

    def unacked(self) -> list[int]:
        return sorted(o for o in self.delivered if o >= self.cursor and o not in self.acked)

    @rule(n=st.integers(1, 40), gap=st.integers(0, 3), as_range=st.booleans())
    def deliver_first(self, n: int, gap: int, as_range: bool) -> None:
        first = self.next + gap        # offsets acked elsewhere may be skipped
        offsets = range(first, first + n)
        self.session.deliver_first(offsets if as_range else list(offsets))
        self.delivered.update(offsets)
        self.next = first + n

    @rule(runs=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 12)), min_size=1,
                        max_size=4))
    def deliver_runs(self, runs: list[tuple[int, int]]) -> None:
        """A key-ordered member's first deliveries: a few runs, other members' offsets
        between them."""
        offsets: list[int] = []
        start = self.next
        for gap, n in runs:
            offsets.extend(range(start + gap, start + gap + n))
            start += gap + n
        self.session.deliver_first(offsets)
        self.delivered.update(offsets)
        self.next = start

    @precondition(lambda self: bool(self.unacked()))
    @rule(data=st.data())
    def redeliver(self, data: st.DataObject) -> None:
        offset = data.draw(st.sampled_from(self.unacked()))
        self.session.deliver(offset)

    @precondition(lambda self: bool(self.delivered))
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        offset = data.draw(st.sampled_from(sorted(self.delivered)))
        new = offset >= self.cursor and offset not in self.acked
        assert self.session.ack(offset) == new
        if new:
            self.acked.add(offset)

    @rule()
    def take_ack(self) -> None:
        taken = self.session.take_ack()
        queued = self.acked - self.sent
        if taken is None:
            assert not queued
            return
        explicit, through = taken
        assert set(explicit) <= queued
        if through >= 0:
            # nothing delivered at or below ``through`` is unacked by the user
            assert not [o for o in self.unacked() if o <= through]
            assert through in queued
        covered = set(explicit) | {o for o in queued if o <= through}
        assert covered == queued, "every queued ack goes out in this frame"
        self.sent |= queued

    @rule(data=st.data())
    def confirm(self, data: st.DataObject) -> None:
        # the shard's cursor after the acks it got: up to the lowest offset not acked
        # through the frames sent (or beyond, over offsets acked in another session)
        low = self.cursor
        while low in self.sent or (low < self.next and low not in self.delivered):
            low += 1
        cursor = data.draw(st.integers(self.cursor, low))
        self.session.confirm(cursor)
        if cursor > self.cursor:
            self.cursor = cursor
            self.acked = {o for o in self.acked if o >= cursor}
            self.sent = {o for o in self.sent if o >= cursor}

    @invariant()
    def agrees(self) -> None:
        s = self.session
        assert s.confirmed == self.cursor
        for o in range(max(0, self.cursor - 3), self.next + 2):
            assert s.is_acked(o) == (o < self.cursor or o in self.acked), o
            if o in self.delivered and not s.is_acked(o):
                assert s.delivered(o), o
            elif o not in self.delivered:
                assert not s.delivered(o), o
            assert s.seen(o) == (o in self.delivered or s.is_acked(o)), o
        unacked = self.unacked()
        assert s.low() == (unacked[0] if unacked else s.next_offset)
        assert s.acked == self.acked


TestAckSession = AckSessionModel.TestCase
TestAckSession.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)


def test_a_delayed_message_is_acked_by_its_offset_never_by_a_cumulative_ack() -> None:
    session = AckSession(1, 7, 0)
    session.deliver_first(range(0, 4))
    session.delayed.add(2)  # DELIVER gave offset 2 a due time: pushed out of offset order
    for offset in (0, 1, 2, 3):
        session.ack(offset)
    # through 3 covers 0, 1 and 3 (the shard applies it to no delayed message); 2 is listed
    assert session.take_ack() == ([2], 3)


def test_a_held_message_keeps_the_session_small() -> None:
    """A message held unacked at the cursor (a long job) while 100,000 later ones are
    delivered and acked: the session holds runs, not an entry per message."""
    session = AckSession(1, 7, 0)
    for first in range(0, 100_000, 100):
        session.deliver_first(range(first, first + 100))
        for offset in range(max(first, 1), first + 100):
            session.ack(offset)
        taken = session.take_ack()
        assert taken is not None and taken[1] == -1  # nothing cumulative passes offset 0
        session.confirm(0)
    assert session.low() == 0
    assert (session.deliveries.runs, session.acked.runs) == (1, 1)
    assert session.ack(0) and session.low() == 100_000
    session.confirm(100_000)
    assert not session.acked and not session.deliveries
