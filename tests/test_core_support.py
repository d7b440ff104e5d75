"""The tests' driver for ShardCore: :mod:`flux.shard.driver` (explicit time,
per-connection inboxes) with the tests' config, frame builders and checks.

No tests live here; the test_core_* modules import it. Time only moves through
:meth:`Shard.advance`, which runs ``tick`` at every deadline the core asks for,
so timer-driven behaviour (G4-G6) is observed at its exact moment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flux import protocol as P
from flux.config import Config
from flux.shard.driver import LocalClient, LocalShard, Received, deliver_messages

__all__ = ["BASE", "GEN", "OK", "TOPIC", "Client", "Received", "Shard", "deliver_messages",
           "fetched_messages", "group_rows", "item_rows", "make_config"]

GEN = 0x5EED_F1A7
TOPIC = "orders.eu"
# the status of an accepted item in the per-item rows the helpers return (see ``item_rows``)
OK = 0

# Distinct, small values, so that no two timers coincide by accident.
BASE: dict[str, Any] = {
    "message.ttl": 20.0,
    "message.cleanup_time": 5.0,
    "message.dedup_window": 50.0,
    "subscriber.retry_count": 2,
    "subscriber.retry_interval": 3.0,
    "subscriber.timeout": 7.0,
    "subscriber.cleanup_time": 10.0,
    "subscriber.inactive_time": 40.0,
    "subscriber.heartbeat": 1000.0,
    "limits.hello_timeout": 1000.0,  # most tests skip HELLO; test_core_limits does not
    "subscriber.max_in_flight": 100,
}


def make_config(overrides: dict[str, Any] | None = None) -> Config:
    return Config().replace(**{**BASE, **(overrides or {})})


class Shard(LocalShard):
    """A ShardCore plus a clock and what each connection has been sent (the tests'
    config: :data:`BASE` under ``overrides``)."""

    def __init__(self, overrides: dict[str, Any] | None = None, *, index: int = 0,
                 shard_count: int = 1, generation: int = GEN, now: float = 0.0) -> None:
        super().__init__(make_config(overrides), index=index, shard_count=shard_count,
                         generation=generation, now=now)

    def connect(self) -> Client:
        client = super().connect()
        assert isinstance(client, Client)
        return client

    def _client(self, conn: int) -> Client:
        return Client(self, conn)

    def topic_stats(self, topic: str = TOPIC) -> dict[str, Any]:
        """The topic's STATS entry; a retired topic (forgotten while empty) reads as
        empty at its next offset, as FETCH shows it."""
        topics = self.stats()["topics"]
        if topic not in topics and topic in self.core.retired:
            at = self.core.retired[topic]
            return {"oldest": at, "next_offset": at, "held": 0, "held_bytes": 0,
                    "dedup_ids": 0, "subscriptions": {}}
        return dict(topics[topic])


@dataclass
class Client(LocalClient):
    """One connection (:class:`LocalClient`) with the tests' request builders."""

    shard: Shard

    # -- requests ----------------------------------------------------------------------

    def hello(self) -> list[Any]:
        return self.request([P.HELLO, self.rid(), {"version": P.VERSION, "role": "client"}])

    def ping(self) -> list[Any]:
        return self.request([P.PING, self.rid()])

    def publish_frame(self, groups: Any) -> list[Any]:
        """Send one PUBLISH with these groups (``[[topic, ids, payloads], ...]``)."""
        return self.request([P.PUBLISH, self.rid(), groups])

    def publish_rows(self, rows: list[list[Any]]) -> list[list[Any]]:
        """Publish ``[topic, id, payload]`` rows in one frame (each run of one topic is a
        group); returns one row per item (see :func:`item_rows`)."""
        groups = group_rows(rows)
        reply = self.publish_frame(groups)
        assert reply[0] == P.PUBLISHED, reply
        assert reply[2] == self.shard.generation
        return item_rows(groups, reply)

    def publish(self, *ids: str, topic: str = TOPIC, payload: bytes | None = None
                ) -> list[list[Any]]:
        """Publish one message per id in one frame; returns the per-item rows."""
        return self.publish_rows(
            [[topic, i, payload if payload is not None else i.encode()] for i in ids])

    def publish_one(self, message_id: str, topic: str = TOPIC, payload: bytes | None = None
                    ) -> int:
        [[status, offset, duplicate]] = self.publish(message_id, topic=topic, payload=payload)
        assert status == OK and duplicate is False, (status, offset, duplicate)
        return int(offset)

    def subscribe_frame(self, sid: int, **opts: Any) -> list[Any]:
        body = {"topic": TOPIC, "name": None, "mode": "push", "read_old": False,
                "from_offset": None, "max_in_flight": None, "credit": None,
                "generation": None, "on_reset": "earliest"}
        body.update(opts)
        return self.request([P.SUBSCRIBE, self.rid(), sid, body])

    def subscribe(self, sid: int, **opts: Any) -> dict[str, Any]:
        reply = self.subscribe_frame(sid, **opts)
        assert reply[0] == P.SUBSCRIBED, reply
        assert reply[2] == sid
        return dict(reply[3])

    def unsubscribe(self, sid: Any) -> list[Any]:
        return self.request([P.UNSUBSCRIBE, self.rid(), sid])

    def credit(self, sid: Any, n: Any) -> list[list[Any]]:
        return self.send([P.CREDIT, sid, n])

    def ack_frame(self, sid: Any, offsets: Any = (), through: Any = -1,
                  generation: Any = None) -> list[Any]:
        gen = self.shard.generation if generation is None else generation
        offs = list(offsets) if isinstance(offsets, (list, tuple)) else offsets
        return self.request([P.ACK, self.rid(), sid, gen, offs, through])

    def ack(self, sid: int, *offsets: int, through: int = -1) -> tuple[int, list[list[Any]]]:
        """Ack; returns (cursor, refused items)."""
        reply = self.ack_frame(sid, offsets, through)
        assert reply[0] == P.ACKED, reply
        return int(reply[3]), list(reply[4])

    def fetch(self, **opts: Any) -> list[Any]:
        body = {"topic": TOPIC, "name": None, "generation": None, "offset": 0,
                "max_messages": None, "max_bytes": None}
        body.update(opts)
        return self.request([P.FETCH, self.rid(), body])

    def commit(self, name: str, offset: Any, **opts: Any) -> list[Any]:
        body = {"topic": TOPIC, "name": name, "generation": self.shard.generation,
                "offset": offset}
        body.update(opts)
        return self.request([P.COMMIT, self.rid(), body])

    # -- deliveries --------------------------------------------------------------------

    def deliveries(self, sid: int | None = None) -> list[tuple[int, int]]:
        """Take DELIVER frames; returns (offset, attempt) for each item, in order."""
        return [(o, a) for _, o, a in self.timed_deliveries(sid)]

    def timed_deliveries(self, sid: int | None = None) -> list[tuple[float, int, int]]:
        """Take DELIVER frames; returns (time, offset, attempt) per message."""
        out: list[tuple[float, int, int]] = []
        keep: list[Received] = []
        for r in self.inbox:
            f = r.frame
            if f[0] == P.DELIVER and (sid is None or f[1] == sid):
                assert f[2] == self.shard.generation
                out.extend((r.at, o, f[3]) for o, *_ in deliver_messages(f))
            else:
                keep.append(r)
        self.inbox = keep
        return out

    def sub_ended(self) -> list[tuple[int, int]]:
        """Take SUB_ENDED frames; returns (sid, code) for each."""
        return [(f[1], f[2]) for f in self.take(P.SUB_ENDED)]

    def errors(self) -> list[list[Any]]:
        return self.take(P.ERROR)


# -- v2 frames ------------------------------------------------------------------------------


def group_rows(rows: list[list[Any]]) -> list[list[Any]]:
    """PUBLISH groups for ``[topic, id, payload]`` rows: one group per run of one topic."""
    groups: list[list[Any]] = []
    for topic, message_id, payload in rows:
        if not groups or groups[-1][0] != topic:
            groups.append([topic, [], []])
        groups[-1][1].append(message_id)
        groups[-1][2].append(payload)
    return groups


def item_rows(groups: list[list[Any]], reply: list[Any]) -> list[list[Any]]:
    """A PUBLISHED reply as one row per item, in item order: ``[OK, offset, duplicate]``
    or ``[code, message, None]`` for a refused item. Checks the reply's structure."""
    results = reply[3]
    assert len(results) == len(groups), (groups, reply)
    rows: list[list[Any]] = []
    for (_, ids, *_), result in zip(groups, results, strict=True):
        offsets, duplicates, refused = result[:3]
        if type(offsets) is int:  # a first offset: every item stored new
            assert offsets >= 0 and not duplicates and not refused, result
            offsets = list(P.offsets_of(offsets, len(ids)))
        assert len(offsets) == len(ids), (ids, result)
        assert duplicates == sorted(set(duplicates)), result
        assert [r[0] for r in refused] == sorted({r[0] for r in refused}), result
        errs = {i: (code, message) for i, code, message in refused}
        for i, offset in enumerate(offsets):
            if i in errs:
                assert offset == P.REFUSED and i not in duplicates, result
                code, message = errs[i]
                assert type(code) is int and isinstance(message, str) and message, result
                rows.append([code, message, None])
            else:
                assert type(offset) is int and offset >= 0, result
                rows.append([OK, offset, i in duplicates])
    return rows


def fetched_messages(frame: list[Any]) -> list[list[Any]]:
    """A FETCHED frame's messages as ``[offset, id, payload, timestamp]`` (its offsets a
    run, or an array with holes; its meta column, if any, left out); checks its shape."""
    assert frame[0] == P.FETCHED, frame
    count = P.check_fetched(frame)
    offsets, ids, payloads, times = frame[3:7]
    return [list(m) for m in zip(P.offsets_of(offsets, count), ids, payloads,
                                 P.times_of(times), strict=True)]
