"""The wire tap on hand-fed frames: what it records of one connection."""

from __future__ import annotations

from flux import protocol as P
from flux.sim import history as h
from flux.sim.tap import Recorder, WireTap


def test_an_ack_confirmation_carries_when_its_ack_was_sent() -> None:
    """The checker orders an ACKED after what was confirmed before its ACK left."""
    now = [0.0]
    history = h.History()
    tap = WireTap(Recorder(history, clock=lambda: now[0]), "c1")
    tap.outgoing(P.encode([P.SUBSCRIBE, 1, 7, {"topic": "t", "name": "n"}]))
    now[0] = 0.1
    tap.incoming(P.encode([P.SUBSCRIBED, 1, 7, {
        "created": True, "start_offset": 0, "cursor": 0, "generation": 5}]))
    now[0] = 1.0
    tap.outgoing(P.encode([P.ACK, 2, 7, 5, [0, 1], -1]))
    now[0] = 2.5   # the reply was held up
    tap.incoming(P.encode([P.ACKED, 2, 7, 1, [[1, 9, "not delivered"]]]))
    sent = history.of(h.AckSent)
    confirmed = history.of(h.AckConfirmed)
    assert [(e.t, e.offsets) for e in sent] == [(1.0, (0, 1))]
    assert [(e.t, e.requested, e.offsets, e.cursor) for e in confirmed] == [(2.5, 1.0, (0,), 1)]
