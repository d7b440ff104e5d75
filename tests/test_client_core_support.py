"""Helpers for driving the sans-IO client core by hand (no tests here).

A core with the map of one shard at ``s:1``, and shortcuts to open its shard
connection, answer SUBSCRIBE and push DELIVER frames.
"""

from __future__ import annotations

import random
from typing import Any

from flux import protocol as P
from flux.client.connection import Conn
from flux.client.core import ClientCore
from flux.client.requests import MAX_BATCH, PUBLISH_WINDOW
from flux.client.subscription import SubState

GEN = 7
SHARD_HELLO = {"version": P.VERSION, "role": "shard", "index": 0, "shard_count": 1, "generation": GEN,
               "heartbeat": 5.0, "max_frame_bytes": P.DEFAULT_MAX_FRAME_BYTES}


def ready_core(**kwargs: Any) -> ClientCore:
    """A core that has the shard map of one shard at s:1."""
    core = ClientCore(("r", 1), rng=random.Random(1), now=0.0, **kwargs)
    [router] = core.take_connects()
    assert router.role == "router" and router.address == ("r", 1)
    core.connected(router.id, 0.0)
    [hello] = core.take_output(router.id, 0.0) or []
    assert hello[0] == P.HELLO and hello[2] == {"version": P.VERSION, "role": "client"}
    core.receive(router.id, [P.HELLO_OK, hello[1], {"version": P.VERSION, "shard_count": 1,
                                                     "shards": [[0, "s:1", GEN]]}], 0.0)
    assert core.ready.done and core.take_closes() == [router.id]
    return core


def open_shard(core: ClientCore, now: float = 0.0) -> Conn:
    [conn] = core.take_connects()
    assert conn.role == "shard" and conn.address == ("s", 1)
    core.connected(conn.id, now)
    [hello] = core.take_output(conn.id, now) or []
    assert hello[0] == P.HELLO
    core.receive(conn.id, [P.HELLO_OK, hello[1], SHARD_HELLO], now)
    return conn


def answer_router(core: ClientCore, router: Conn, now: float) -> None:
    core.connected(router.id, now)
    [hello] = core.take_output(router.id, now) or []
    core.receive(router.id, [P.HELLO_OK, hello[1], {"version": P.VERSION, "shard_count": 1,
                                                     "shards": [[0, "s:1", GEN]]}], now)


def reopen_shard(core: ClientCore, now: float) -> tuple[Conn, float]:
    """After a lost connection: answer the map refresh, wait out the backoff, reconnect."""
    for _ in range(10):
        conns = core.take_connects()
        for conn in conns:
            if conn.role == "router":
                answer_router(core, conn, now)
        shard = [c for c in conns if c.role == "shard"]
        if shard:
            core._new_conns[:0] = shard
            return open_shard(core, now), now
        now = max(now, core.next_deadline())
        core.tick(now)
    raise AssertionError("no shard connection was opened")


def out(core: ClientCore, conn: Conn, now: float = 0.0) -> list[list[Any]]:
    return core.take_output(conn.id, now) or []


def subscribed(core: ClientCore, conn: Conn, *, cursor: int = 0, generation: int = GEN,
               **kwargs: Any) -> tuple[SubState, int]:
    sub = core.subscribe("t", kwargs.pop("name", "s"), now=0.0, **kwargs)
    [frame] = out(core, conn)
    assert frame[0] == P.SUBSCRIBE
    core.receive(conn.id, [P.SUBSCRIBED, frame[1], frame[2], {
        "created": True, "start_offset": cursor, "cursor": cursor, "generation": generation,
        "clamped": False, "reset": False, "next_offset": cursor, "max_in_flight": 1000}], 0.0)
    assert sub.ready.done
    return sub, frame[2]


def warm_subscription(**kwargs: Any) -> tuple[ClientCore, Conn, SubState, int]:
    """A ready client with a shard connection open (its first subscription "warm" made
    the client connect) and subscription "s" on topic "t" confirmed: (core, conn, sub, sid)."""
    core = ready_core()
    core.subscribe("t", "warm", now=0.0)
    conn = open_shard(core)
    out(core, conn)
    sub, sid = subscribed(core, conn, **kwargs)
    return core, conn, sub, sid


def full_publish_window() -> tuple[ClientCore, Conn, list[list[Any]]]:
    """A client with one message more queued than its publish window lets out: the
    window's PUBLISH frames sent, the connection's writable flag taken."""
    core = ready_core()
    core.publish_many("t", [b"x"] * (PUBLISH_WINDOW * MAX_BATCH + 1), None, 0.0)
    conn = open_shard(core)
    frames = out(core, conn)
    assert len(frames) == PUBLISH_WINDOW
    core.take_writable()
    return core, conn, frames


def deliver(core: ClientCore, conn: Conn, sid: int, *items: tuple[int, int],
            generation: int = GEN) -> None:
    """DELIVER ``(offset, attempt)`` items: one frame per run of one attempt."""
    runs: list[list[tuple[int, int]]] = []
    for item in items:
        if runs and runs[-1][0][1] == item[1]:
            runs[-1].append(item)
        else:
            runs.append([item])
    for run in runs:
        offsets = [o for o, _ in run]
        # a contiguous run goes as its first offset, as the shard sends it
        field = offsets[0] if offsets == list(range(offsets[0], offsets[0] + len(offsets))) \
            else offsets
        core.receive(conn.id, [P.DELIVER, sid, generation, run[0][1], field,
                               [f"id{o}" for o in offsets], [b"p%d" % o for o in offsets],
                               [1.5, len(offsets)]], 0.0)


def ids_of(frame: list[Any]) -> list[str]:
    """The message ids of a PUBLISH frame, in item order."""
    return [i for group in frame[2] for i in group[1]]


def published(core: ClientCore, conn: Conn, frame: list[Any], offsets: int | list[int],
              duplicates: list[int] = (), refused: list[list[Any]] = (),  # type: ignore[assignment]
              now: float = 0.0) -> None:
    """Answer a one-group PUBLISH frame."""
    assert len(frame[2]) == 1
    core.receive(conn.id, [P.PUBLISHED, frame[1], GEN,
                           [[offsets, list(duplicates), list(refused)]]], now)
