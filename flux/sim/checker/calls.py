"""Checks on publish calls, the user-level operation (G2, G3): one call stores each of
its messages at most once per generation, and returns acks for its own messages.

Producers that let the client choose ids give each call's messages payloads of their
own, so a message is known by its payload too: copies a client stored under ids it
changed between attempts are still one call's (explicit ids are the id rules')."""

from __future__ import annotations

from flux.sim import history as h
from flux.sim.checker import Report
from flux.sim.checker.index import Index


def check(index: Index, report: Report) -> None:
    calls: dict[str, h.PublishCalled] = {}        # payload -> the call that carried it
    returned: list[h.PublishReturned] = []
    seen: dict[tuple[str, int, int], str] = {}     # (topic, generation, offset) -> payload
    sent: dict[tuple[str, str, str], str] = {}     # (client, topic, id) -> payload
    stored: dict[tuple[str, str, int], dict[int, float]] = {}  # (topic, payload, gen) -> offsets
    for e in index.history:
        if isinstance(e, h.PublishCalled):
            if e.ids is None:
                for payload in e.payloads:
                    calls[payload] = e
        elif isinstance(e, h.PublishReturned):
            returned.append(e)
        elif isinstance(e, h.PublishAttempted):
            if e.payload is not None:
                sent[(e.producer, e.topic, e.id)] = e.payload
        elif isinstance(e, h.PublishAcked):
            carried = sent.get((e.producer, e.topic, e.id))
            if carried is not None and carried in calls:
                stored.setdefault((e.topic, carried, e.generation), {}).setdefault(e.offset, e.t)
        elif isinstance(e, h.Delivered):
            if e.payload is not None:
                _seen(e.t, e.topic, e.generation, e.offset, e.payload, seen, stored, calls)
        elif isinstance(e, h.Fetched) and "~" not in e.topic:  # (a dead-letter topic's
            # messages were stored by the broker, not by a call: G11's rules judge them)
            for offset, payload in zip(e.page(), e.payloads, strict=False):
                _seen(e.t, e.topic, e.generation, offset, payload, seen, stored, calls)
    _check_stored_once(stored, calls, report)
    _check_returned(returned, calls, seen, sent, report)
    report.count("client_id_calls", len({id(c) for c in calls.values()}))


def _seen(t: float, topic: str, generation: int, offset: int, payload: str,
          seen: dict[tuple[str, int, int], str],
          stored: dict[tuple[str, str, int], dict[int, float]],
          calls: dict[str, h.PublishCalled]) -> None:
    seen.setdefault((topic, generation, offset), payload)
    if payload in calls:
        stored.setdefault((topic, payload, generation), {}).setdefault(offset, t)


def _check_stored_once(stored: dict[tuple[str, str, int], dict[int, float]],
                       calls: dict[str, h.PublishCalled], report: Report) -> None:
    """G3/call-stored-twice: a message of a call whose ids the client chose is held at
    one offset per generation. Sound under any delay and fault: the client draws a
    message's id once per call and resends it on every retry, and stops retrying
    within ``retry_deadline``, which it keeps below ``dedup_window`` (G3), so every
    attempt of the call lands inside the window of the first one stored; a shard
    restart (a new generation) may store it again, in that generation only. The
    payload names the call and the message (the producer makes it so), so two
    offsets holding it are two copies, whatever ids they were stored under."""
    for (topic, payload, generation), offsets in stored.items():
        report.examine("G3", "call-stored-twice")
        if len(offsets) > 1:
            call = calls[payload]
            report.add("G3", "call-stored-twice", max(offsets.values()),
                       f"{call.producer} call {call.call} (publish at {call.t:.3f}, ids chosen"
                       f" by the client) stored {payload!r} at {sorted(offsets)} of {topic}"
                       f" generation {generation:#x}")


def _check_returned(returned: list[h.PublishReturned], calls: dict[str, h.PublishCalled],
                    seen: dict[tuple[str, int, int], str], sent: dict[tuple[str, str, str], str],
                    report: Report) -> None:
    """G2/call-ack-mismatch: the acks a call returns are its own messages', in order: ack
    ``i`` names an id the client sent with payload ``i``, and the offset it names
    holds that payload wherever a client read it. Sound under any delay: an offset
    holds one message per generation (G1), a duplicate's ack names the original's
    offset and the original is this call's (ids the client draws are 128 random
    bits, unique to the call), and reads show what the offset holds."""
    by_call = {(c.producer, c.call): c for c in calls.values()}
    for r in returned:
        call = by_call.get((r.producer, r.call))
        if call is None or r.error:
            continue
        report.examine("G2", "call-ack-mismatch")
        if len(r.offsets) != len(call.payloads):
            report.add("G2", "call-ack-mismatch", r.t,
                       f"{r.producer} call {r.call} published {len(call.payloads)} message(s)"
                       f" and got {len(r.offsets)} ack(s)")
            continue
        for i, payload in enumerate(call.payloads):
            offset, generation, message_id = r.offsets[i], r.generations[i], r.ids[i]
            carried = sent.get((r.producer, r.topic, message_id))
            held = seen.get((r.topic, generation, offset))
            if carried != payload or (held is not None and held != payload):
                what = f"id {message_id!r} was sent with {carried!r}" if carried != payload \
                    else f"offset {offset} holds {held!r}"
                report.add("G2", "call-ack-mismatch", r.t,
                           f"{r.producer} call {r.call}: ack {i} of {r.topic} names offset"
                           f" {offset} for {payload!r}, but {what}")
