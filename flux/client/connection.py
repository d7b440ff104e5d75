"""Bookkeeping of the client's connections: one per shard in use, plus a short-lived one to
the router for the shard map (sans-IO).

:class:`Conn` is one connection's state (what is in flight, what to send, its
heartbeat); :class:`ShardSlot` is what the client keeps per shard index across
connections (queued work, reconnect backoff); :class:`ShardMap` is the router's
HELLO_OK. No sockets here: :mod:`flux.client.core` drives them.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from flux import errors, protocol

if TYPE_CHECKING:
    from flux.client.requests import Call, PublishPart
    from flux.client.subscription import SubState

ConnState = Literal["connecting", "hello", "ready", "closed"]
PendingKind = Literal["hello", "ping", "publish", "call", "subscribe", "ack", "unsubscribe"]

BACKOFF_BASE = 0.05
BACKOFF_CAP = 2.0


def backoff(rng: random.Random, attempt: int) -> float:
    """Exponential backoff with jitter: about 50 ms doubling up to 2 s."""
    delay: float = min(BACKOFF_BASE * 2.0 ** min(attempt, 16), BACKOFF_CAP)
    return delay * (0.5 + rng.random() / 2)


@dataclass(frozen=True)
class ShardMap:
    """The router's view: shard count, and each shard's address and generation."""

    shard_count: int
    addresses: dict[int, tuple[str, int]]
    generations: dict[int, int]

    @classmethod
    def from_hello(cls, body: dict[str, Any]) -> ShardMap:
        count = int(body["shard_count"])
        if count < 1:
            raise ValueError(f"shard_count must be at least 1, got {count}")
        addresses: dict[int, tuple[str, int]] = {}
        generations: dict[int, int] = {}
        for index, address, generation in body.get("shards") or []:
            addresses[int(index)] = protocol.parse_address(str(address))
            if generation is not None:
                generations[int(index)] = int(generation)
        return cls(count, addresses, generations)


class Conn:
    """One connection as the core sees it; ``id`` is what the shell reports events with."""

    def __init__(self, conn_id: int, role: Literal["router", "shard"], index: int | None,
                 address: tuple[str, int], now: float) -> None:
        self.id = conn_id
        self.role = role
        self.index = index
        self.address = address
        self.state: ConnState = "connecting"
        self.opened_at = now
        self.last_send = now
        self.out: list[list[Any]] = []
        self.pending: dict[int, tuple[PendingKind, Any]] = {}
        self.timeouts: deque[tuple[float, int]] = deque()   # (deadline, rid), in send order
        self.heartbeat: float | None = None
        self.max_frame_bytes = protocol.DEFAULT_MAX_FRAME_BYTES
        self.generation: int | None = None
        self.close_reason: errors.FluxError | None = None   # an ERROR frame with rid 0
        self.publish_frames = 0                  # PUBLISH frames awaiting PUBLISHED
        self.subs: dict[int, SubState] = {}      # sid -> subscription attached here
        self.dirty: dict[int, SubState] = {}     # sid -> subscription with credit/acks to send

    def __repr__(self) -> str:
        where = "router" if self.role == "router" else f"shard {self.index}"
        host, port = self.address
        return (f"<Conn #{self.id} {where} {host}:{port} {self.state}"
                f" pending={len(self.pending)}>")


class ShardSlot:
    """Per shard index: the current connection and the work waiting for it."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.conn: Conn | None = None
        self.failures = 0            # consecutive failed connection attempts
        self.retry_at = 0.0          # no new connection before this time
        self.last_error: errors.FluxError | None = None   # why the last connection failed
        self.linger_at = math.inf    # when a lingering partial PUBLISH batch must go out
        self.publishes: deque[PublishPart] = deque()
        self.calls: deque[Call] = deque()
        self.subs: dict[int, SubState] = {}   # id(sub) -> subscription homed on this shard

    def has_work(self) -> bool:
        return bool(self.publishes or self.calls or self.subs)

    def __repr__(self) -> str:
        return (f"<ShardSlot {self.index} conn={self.conn!r} queued={len(self.publishes)}"
                f" calls={len(self.calls)} subs={len(self.subs)}>")
