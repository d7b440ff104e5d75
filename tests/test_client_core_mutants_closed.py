"""The client core after an unsubscribe or a close, and what its reprs say: cases that
surviving mutants showed no test checked (``make mutate``). Sans-IO.
"""

from __future__ import annotations

from test_client_core_support import deliver, open_shard, out, ready_core, warm_subscription

from flux import errors
from flux import protocol as P
from flux.client.types import Waiter


def test_an_ack_refused_after_unsubscribe_is_not_raised_from_the_closed_subscription() -> None:
    core, conn, sub, sid = warm_subscription()
    deliver(core, conn, sid, (0, 1))
    msg = core.next_message(sub)
    assert msg is not None
    core.ack(sub, msg, 0.0)
    core.unsubscribe(sub, 0.0)
    [ack] = [f for f in out(core, conn) if f[0] == P.ACK]
    core.receive(conn.id, [P.ACKED, ack[1], sid, 0, [[0, errors.NotDelivered.code, "late"]]], 0.0)
    assert not sub.errors
    assert core.next_message(sub) is None


def test_messages_read_after_unsubscribe_give_no_credit_back() -> None:
    core, conn, sub, sid = warm_subscription(prefetch=4)
    deliver(core, conn, sid, *[(o, 1) for o in range(4)])
    core.unsubscribe(sub, 0.0)
    assert [f[0] for f in out(core, conn)] == [P.UNSUBSCRIBE]
    while core.next_message(sub) is not None:
        pass
    assert [f for f in out(core, conn) if f[0] in (P.CREDIT, P.ACK)] == []


def test_reprs_name_the_connection_s_peer_the_waiter_and_a_closed_core() -> None:
    core = ready_core()
    core.publish("t", b"a", "a", 0.0)
    conn = open_shard(core)
    assert repr(conn).startswith(f"<Conn #{conn.id} shard 0 s:1 ready")
    assert repr(Waiter()).startswith("<Waiter ")
    core.close()
    assert repr(core).endswith(" closed>")
