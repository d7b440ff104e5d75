"""The client's nak, term and in_progress (G11): what an ACK frame carries, and that no
cumulative ack ever covers a nak'd offset."""

from __future__ import annotations

import pytest

from flux import errors
from flux.client.subscription import AckSession
from flux.client.types import Message, check_reason


def _session() -> AckSession:
    session = AckSession(1, 7, 0)
    session.deliver_first(range(0, 6))
    return session


def test_a_nakd_offset_stays_unacked_so_no_through_covers_it() -> None:
    session = _session()
    assert session.settle(2, "nak", 1.5)
    for o in (0, 1, 3, 4, 5):
        session.ack(o)
    explicit, through = session.take_ack() or ([], -1)
    assert through < 2 and {3, 4, 5} <= set(explicit)
    assert session.take_settle() == {"nak": [[2, 1.5]]}
    assert session.take_settle() is None


def test_a_termed_offset_counts_as_acked_only_once_the_shard_confirmed_it() -> None:
    session = _session()
    assert session.settle(1, "term", "bad")
    assert session.settle(3, "progress", None)
    assert not session.settle(1, "term", "again")  # termed already
    assert session.take_settle() == {"term": [[1, "bad"]], "progress": [3]}
    for o in (0, 2):
        session.ack(o)
    assert session.take_ack() == ([0, 2], -1)  # no through across the termed offset
    session.termed([1], set())
    assert session.is_acked(1) and not session.is_acked(3)
    assert session.low() == 3
    session.ack(3)
    session.ack(4)
    assert session.take_ack() == ([], 4)  # a confirmed term may be covered


def test_a_refused_term_leaves_the_offset_unacked() -> None:
    session = _session()
    session.settle(1, "term", "bad")
    session.termed([1], {1})
    assert not session.is_acked(1) and session.settle(1, "term", "again")


async def test_bad_delays_and_reasons_raise_before_anything_is_queued() -> None:
    sent: list[object] = []

    def acker(msg: Message) -> None:
        sent.append(msg)

    acker.settle = lambda msg, kind, value: sent.append((kind, value))  # type: ignore[attr-defined]
    msg = Message("t", 0, 7, "id", b"", 0.0, 1, None, acker)
    with pytest.raises(errors.InvalidDelay):
        await msg.nak(-1)
    with pytest.raises(errors.InvalidDelay):
        await msg.nak("soon")  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidRequest):
        await msg.term("r" * 1025)
    assert sent == []
    await msg.nak(0.5)
    await msg.term("why")
    await msg.in_progress()
    assert sent == [("nak", 0.5), ("term", "why"), ("progress", None)]
    assert check_reason("é" * 512) == "é" * 512
