"""A ShardCore driven in-process: no sockets, no clock of its own, each connection's
frames in its own inbox.

Time moves only through :meth:`LocalShard.advance`, which runs ``tick`` at every
deadline the core asks for. The core's tests drive the shard through it (their support
module adds frame builders and checks), and so does the core benchmark
(:mod:`flux.bench.core`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from flux import protocol as P
from flux.config import Config
from flux.shard.core import ShardCore


@dataclass
class Received:
    """A frame a connection was sent, and when."""

    at: float
    frame: list[Any]


class LocalShard:
    """A ShardCore plus a clock and what each connection has been sent."""

    def __init__(self, config: Config, *, index: int = 0, shard_count: int = 1,
                 generation: int = 1, now: float = 0.0) -> None:
        self.config = config
        self.core = ShardCore(config, index=index, shard_count=shard_count,
                              generation=generation, now=now)
        self.generation = generation
        self.now = now
        self.clients: dict[int, LocalClient] = {}
        self.ticks: list[float] = []

    def connect(self) -> LocalClient:
        """A new connection."""
        conn = self.core.connect(self.now)
        client = self.clients[conn] = self._client(conn)
        return client

    def _client(self, conn: int) -> LocalClient:
        return LocalClient(self, conn)

    def collect(self) -> None:
        """Move what the core has to send into each connection's inbox."""
        for conn, frames, close in self.core.take_output():
            client = self.clients.get(conn)
            if client is None:
                raise RuntimeError(f"output for unknown connection {conn}")
            at = self.now
            client.inbox.extend(Received(at, f) for f in frames)
            if close:
                client.closed = True

    def advance(self, to: float) -> None:
        """Move time to ``to``, ticking at every deadline on the way (and at ``to``).
        RuntimeError if time would go back or a tick leaves a deadline behind it."""
        if to < self.now:
            raise RuntimeError(f"time never goes back ({to} < {self.now})")
        while True:
            # a deadline before now is overdue (``now`` moved by hand): run it now
            deadline = max(self.core.next_deadline(), self.now)
            if deadline > to:
                break
            self.now = deadline
            self.core.tick(deadline)
            self.ticks.append(deadline)
            self.collect()
            if self.core.next_deadline() <= deadline:
                raise RuntimeError(f"tick({deadline}) left a deadline at or before it")
        self.now = to
        self.core.tick(to)
        self.collect()

    def after(self, dt: float) -> None:
        self.advance(self.now + dt)

    def stats(self) -> dict[str, Any]:
        return self.core.stats(self.now)


@dataclass
class LocalClient:
    """One connection: sends frames at the shard's current time and keeps what it gets."""

    shard: LocalShard
    conn: int
    inbox: list[Received] = field(default_factory=list)
    closed: bool = False
    _rids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def rid(self) -> int:
        return next(self._rids)

    def send(self, frame: list[Any]) -> list[list[Any]]:
        """Send one frame; returns every frame this connection got because of it."""
        before = len(self.inbox)
        self.shard.core.receive(self.conn, frame, self.shard.now)
        self.shard.collect()
        return [r.frame for r in self.inbox[before:]]

    def request(self, frame: list[Any]) -> list[Any]:
        """Send a request and return its one reply (matched by rid), taking it from the
        inbox. RuntimeError unless exactly one reply came."""
        rid = frame[1]
        before = len(self.inbox)
        self.send(frame)
        new = self.inbox[before:]
        replies = [r for r in new if r.frame[0] not in (P.DELIVER, P.SUB_ENDED)
                   and r.frame[1] == rid]
        if len(replies) != 1:
            raise RuntimeError(f"expected one reply to rid {rid}, got {new}")
        self.inbox.remove(replies[0])
        return replies[0].frame

    def take(self, kind: int | None = None) -> list[list[Any]]:
        """Remove and return received frames (of one kind, or all)."""
        if kind is None:
            out = [r.frame for r in self.inbox]
            self.inbox = []
            return out
        keep: list[Received] = []
        out = []
        for r in self.inbox:
            if r.frame[0] == kind:
                out.append(r.frame)
            else:
                keep.append(r)
        self.inbox = keep
        return out

    def take_timed(self, kind: int) -> list[Received]:
        """Remove and return received frames of one kind, with when each came."""
        out = [r for r in self.inbox if r.frame[0] == kind]
        self.inbox = [r for r in self.inbox if r.frame[0] != kind]
        return out


def deliver_messages(frame: list[Any]) -> list[tuple[int, str, bytes, float]]:
    """A DELIVER frame's messages as (offset, id, payload, timestamp); ValueError if it
    is not a DELIVER frame with messages."""
    if frame[0] != P.DELIVER:
        raise ValueError(f"not a DELIVER frame: {frame!r:.200}")
    count = P.check_deliver(frame)
    if count <= 0:
        raise ValueError(f"a DELIVER frame without messages: {frame!r:.200}")
    offsets, ids, payloads, times = frame[4:8]
    return list(zip(P.offsets_of(offsets, count), ids, payloads, P.times_of(times),
                    strict=True))
