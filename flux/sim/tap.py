"""A wire tap on a client's connections: frames in and out become history events.

:class:`TapStream` wraps the stream a simulated client host opens and passes
every byte through unchanged, decoding a copy of each direction to record what
the client sent and saw (publishes and their acks, SUBSCRIBED replies,
deliveries, acks and confirmations, session ends, and the pull path's FETCH and
COMMIT requests with their replies or errors). It never alters traffic.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import trio

from flux import errors, protocol
from flux.message_meta import read_columns
from flux.sim import history as h
from flux.sim.network import Network, SimStream
from flux.sim.simhost import SimHost

P = protocol
_CODE_NAMES = {cls.code: cls.__name__ for cls in (
    errors.WrongShard, errors.TopicFull, errors.Busy, errors.TopicReset,
    errors.UnknownSubscription, errors.SubscriptionInactive, errors.SubscriptionTakenOver,
    errors.NotDelivered, errors.OffsetOutOfRange, errors.ShuttingDown, errors.InvalidRequest,
    errors.ProtocolError, errors.InvalidDelay, errors.InvalidTopic)}


def error_name(code: Any) -> str:
    return _CODE_NAMES.get(code, f"error{code}")


def _options(options: Any, count: int) -> tuple[list[float], list[str | None]]:
    """Each item's delay (0: none) and meta_key from a PUBLISH group's options."""
    if not isinstance(options, dict):
        return [0.0] * count, [None] * count
    delay = options.get("delay")
    delays = delay if isinstance(delay, list) else [delay] * count
    keys = options.get("keys") or [None] * count
    headers = options.get("headers") or [None] * count
    return ([float(d) if isinstance(d, (int, float)) else 0.0 for d in delays],
            [h.meta_key(k, m) for k, m in zip(keys, headers, strict=True)])


def _columns(extra: Any, count: int) -> tuple[list[Any], list[Any], list[Any]]:
    """The keys, headers and due times of a DELIVER's or FETCHED's trailing map."""
    columns = read_columns(extra, count)
    return columns if columns is not None else ([None] * count,) * 3  # type: ignore[return-value]


class Recorder:
    """Shared by every tapped connection of one run: session numbering and the history.

    ``clock`` stamps the events (trio's clock unless given: a chaos client on
    asyncio passes its loop's).
    """

    def __init__(self, history: h.History, clock: Callable[[], float] | None = None) -> None:
        self.history = history
        self.clock: Callable[[], float] = clock if clock is not None else trio.current_time
        self.sessions = itertools.count(1)
        self.publish_tries: dict[tuple[str, str, str], int] = {}  # (client, topic, id)
        # (connection, sid) -> session, for every ephemeral session on a connection the
        # simulated network numbered: the oracle names the session a shard deleted by it
        self.ephemeral: dict[tuple[int, int], int] = {}
        self.stopped = False

    def add(self, event: h.Event) -> None:
        if not self.stopped:
            self.history.add(event)


class _Session:
    __slots__ = ("generation", "id", "subscriber", "topic")

    def __init__(self, id: int, subscriber: str, topic: str, generation: int) -> None:
        self.id = id
        self.subscriber = subscriber
        self.topic = topic
        self.generation = generation


class WireTap:
    """Decodes both directions of one connection and records events (sans-IO: feed it
    the bytes a client sends and receives, and tell it when the connection ends).
    ``connection`` is the simulated network's number of the connection, if it has one."""

    def __init__(self, recorder: Recorder, client: str, connection: int | None = None) -> None:
        self.rec = recorder
        self.client = client
        self.connection = connection
        self.shard = -1
        self.shard_generation: int | None = None  # of the incarnation this stream reached
        self.out_decoder: P.FrameDecoder | None = P.FrameDecoder(1 << 30)
        self.in_decoder: P.FrameDecoder | None = P.FrameDecoder(1 << 30)
        self.pending: dict[int, tuple[Any, ...]] = {}
        self.sessions: dict[int, _Session] = {}   # sid -> session
        self.ended = False

    def _add(self, event: h.Event) -> None:
        self.rec.add(event)

    def _subscriber(self, name: str | None, sid: int) -> str:
        return f"{self.client}/{name if name is not None else f'~{sid}'}"

    # -- client -> broker --------------------------------------------------------------

    def outgoing(self, data: bytes) -> None:
        if self.out_decoder is None:
            return
        try:
            frames = self.out_decoder.feed(data)
        except errors.FluxError:
            self.out_decoder = None
            return
        now = self.rec.clock()
        for frame in frames:
            try:
                self._out_frame(frame, now)
            except (IndexError, TypeError, ValueError, KeyError):
                continue  # malformed on purpose (a test); the broker judges it

    def _out_frame(self, frame: list[Any], now: float) -> None:
        kind = frame[0]
        if kind == P.HELLO:
            self.pending[frame[1]] = ("hello", now)
        elif kind == P.PUBLISH:
            rid, groups = frame[1], frame[2]
            items: list[list[tuple[str, str]]] = [
                [(group[0], message_id) for message_id in group[1]] for group in groups]
            self.pending[rid] = ("publish", items)
            for items_of, group in zip(items, groups, strict=True):
                delays, metas = _options(group[3] if len(group) > 3 else None, len(items_of))
                for (topic, message_id), payload, delay, meta in zip(
                        items_of, group[2], delays, metas, strict=True):
                    key = (self.client, topic, message_id)
                    tries = self.rec.publish_tries[key] = self.rec.publish_tries.get(key, 0) + 1
                    self._add(h.PublishAttempted(now, self.client, rid, topic, message_id,
                                                 tries, h.payload_key(payload), delay, meta))
        elif kind == P.SUBSCRIBE:
            self.pending[frame[1]] = ("subscribe", frame[2], frame[3], now)
        elif kind == P.UNSUBSCRIBE:
            self.pending[frame[1]] = ("unsubscribe", frame[2], now)
        elif kind == P.FETCH:
            self._pull_request("fetch", frame[1], frame[2], now)
        elif kind == P.COMMIT:
            self._pull_request("commit", frame[1], frame[2], now)
        elif kind == P.ACK:
            rid, sid, generation, offsets, through = frame[1:6]
            settle = frame[6] if len(frame) > 6 and isinstance(frame[6], dict) else {}
            naks = tuple((o, float(d)) for o, d in settle.get("nak") or ())
            terms = tuple(o for o, _ in settle.get("term") or ())
            progress = tuple(settle.get("progress") or ())
            s = self.sessions.get(sid)
            if s is not None:
                self.pending[rid] = ("ack", s, tuple(offsets), through, now, naks, terms,
                                     progress)
                self._add(h.AckSent(now, s.subscriber, s.id, s.topic, generation,
                                    tuple(offsets), through, naks, terms, progress))

    def _pull_request(self, request: str, rid: Any, opts: dict[str, Any], now: float) -> None:
        topic, name, generation = opts["topic"], opts.get("name"), opts.get("generation")
        offset = opts.get("offset") or 0
        if type(offset) is not int:
            raise ValueError("not an offset")  # malformed on purpose: the broker judges it
        subscriber = f"{self.client}/{name if name is not None else '~'}"
        if request == "fetch":
            max_messages = opts.get("max_messages") or 0
            self._add(h.FetchSent(now, subscriber, self.client, self.shard, topic, name,
                                  generation, offset, max_messages))
            self.pending[rid] = ("fetch", subscriber, topic, name, generation, offset,
                                 max_messages, now)
        else:
            self._add(h.CommitSent(now, subscriber, self.client, self.shard, topic, str(name),
                                   generation, offset))
            self.pending[rid] = ("commit", subscriber, topic, name, generation, offset, now)

    # -- broker -> client --------------------------------------------------------------

    def incoming(self, data: bytes) -> None:
        if self.in_decoder is None:
            return
        try:
            frames = self.in_decoder.feed(data)
        except errors.FluxError:
            self.in_decoder = None
            return
        now = self.rec.clock()
        for frame in frames:
            try:
                self._in_frame(frame, now)
            except (IndexError, TypeError, ValueError, KeyError):
                continue

    def _in_frame(self, frame: list[Any], now: float) -> None:
        kind = frame[0]
        if kind == P.DELIVER:
            s = self.sessions.get(frame[1])
            if s is not None:
                _, _, generation, attempt, offsets, ids, payloads, times = frame[:8]
                keys, headers, dues = _columns(frame[8] if len(frame) > 8 else None, len(ids))
                for offset, message_id, payload, timestamp, key, header, due in zip(
                        P.offsets_of(offsets, len(ids)), ids, payloads, P.times_of(times),
                        keys, headers, dues, strict=True):
                    self._add(h.Delivered(now, s.subscriber, s.id, s.topic, generation, offset,
                                          message_id, attempt, timestamp,
                                          h.payload_key(payload), due, h.meta_key(key, header)))
        elif kind == P.PUBLISHED:
            self._published(frame, now)
        elif kind == P.FETCHED:
            pending = self.pending.pop(frame[1], None)
            if pending is not None and pending[0] == "fetch":
                _, subscriber, topic, name, asked, offset, max_messages, sent = pending
                body, first, ids, payloads = frame[2], frame[3], frame[4], frame[5]
                keys, headers, _ = _columns(frame[7] if len(frame) > 7 else None, len(ids))
                holes = type(first) is list  # a page with holes gives each offset
                start = (first[0] if first else max(offset, body["oldest"])) if holes else first
                self._add(h.Fetched(now, subscriber, self.client, self.shard, topic, name,
                                    body["generation"], asked, offset, max_messages,
                                    body["oldest"], body["next"], start, tuple(ids), sent,
                                    tuple(map(h.payload_key, payloads)),
                                    tuple(map(h.meta_key, keys, headers)),
                                    tuple(first) if holes else (), holes))
        elif kind == P.COMMITTED:
            pending = self.pending.pop(frame[1], None)
            if pending is not None and pending[0] == "commit":
                _, subscriber, topic, name, asked, offset, sent = pending
                self._add(h.Committed(now, subscriber, self.client, self.shard, topic, name,
                                      asked, offset, frame[2]["cursor"], sent))
        elif kind == P.ACKED:
            self._acked(frame, now)
        elif kind == P.SUBSCRIBED:
            self._subscribed(frame, now)
        elif kind == P.SUB_ENDED:
            s = self.sessions.pop(frame[1], None)
            if s is not None:
                reason = {errors.SubscriptionInactive.code: "inactive",
                          errors.SubscriptionTakenOver.code: "taken_over"}.get(frame[2], "ended")
                self._add(h.SessionEnded(now, s.subscriber, s.id, s.topic, reason))
        elif kind == P.UNSUBSCRIBED:
            pending = self.pending.pop(frame[1], None)
            sent = pending[2] if pending is not None and pending[0] == "unsubscribe" else None
            s = self.sessions.pop(frame[2], None)
            if s is not None:
                self._add(h.SessionEnded(now, s.subscriber, s.id, s.topic, "unsubscribed", sent))
        elif kind == P.HELLO_OK:
            pending = self.pending.pop(frame[1], None)
            body = frame[2]
            if body.get("role") == "shard":
                self.shard = body["index"]
                self.shard_generation = body["generation"]
                sent = pending[1] if pending is not None and pending[0] == "hello" else None
                self._add(h.ShardHello(now, self.client, self.shard, body["generation"], sent))
        elif kind == P.ERROR:
            self._error(frame, now)

    def _published(self, frame: list[Any], now: float) -> None:
        pending = self.pending.pop(frame[1], None)
        if pending is None or pending[0] != "publish":
            return
        rid = frame[1]
        for group, result in zip(pending[1], frame[3], strict=False):
            offsets, duplicates, refused = result[:3]
            # a disk topic's generation follows its result when it is not the shard's
            generation = result[3] if len(result) > 3 and result[3] is not None else frame[2]
            dues = result[4] if len(result) > 4 else [None] * len(group)
            dups = set(duplicates)
            codes = {index: code for index, code, _message in refused}
            for index, ((topic, message_id), offset) in enumerate(
                    zip(group, P.offsets_of(offsets, len(group)), strict=False)):
                if index in codes:
                    self._add(h.PublishFailed(now, self.client, rid, topic, message_id,
                                              error_name(codes[index]), generation))
                else:
                    self._add(h.PublishAcked(now, self.client, rid, topic, message_id,
                                             generation, offset, index in dups,
                                             dues[index] if index < len(dues) else None))

    def _acked(self, frame: list[Any], now: float) -> None:
        rid, _sid, cursor, refused = frame[1:5]
        pending = self.pending.pop(rid, None)
        if pending is None or pending[0] != "ack":
            return
        _, s, offsets, through, sent, naks, terms, progress = pending
        refused_offsets = {item[0] for item in refused}
        accepted = tuple(o for o in offsets if o not in refused_offsets)
        self._add(h.AckConfirmed(now, s.subscriber, s.id, s.topic, s.generation, accepted,
                                 through, cursor, sent,
                                 tuple(n for n in naks if n[0] not in refused_offsets),
                                 tuple(o for o in terms if o not in refused_offsets),
                                 tuple(o for o in progress if o not in refused_offsets)))
        settled = {n[0] for n in naks} | set(terms) | set(progress)
        for offset, code, _message in refused:
            self._add(h.AckRefused(now, s.subscriber, s.id, s.topic, s.generation, offset,
                                   error_name(code), offset in settled and offset not in offsets))

    def _subscribed(self, frame: list[Any], now: float) -> None:
        rid, sid, body = frame[1], frame[2], frame[3]
        pending = self.pending.pop(rid, None)
        if pending is None or pending[0] != "subscribe":
            return
        opts, sent = pending[2], pending[3]
        name = opts.get("name")
        subscriber = self._subscriber(name, sid)
        pull = opts.get("mode") == "pull"
        old = None if pull else self.sessions.get(sid)
        if old is not None:
            self._add(h.SessionEnded(now, old.subscriber, old.id, old.topic, "replaced"))
        s = _Session(next(self.rec.sessions), subscriber, opts["topic"], body["generation"])
        if not pull:  # a pull SUBSCRIBE attaches nothing: its sid is not used again
            self.sessions[sid] = s
        if name is None and self.connection is not None:
            self.rec.ephemeral[(self.connection, sid)] = s.id
        self._add(h.Subscribed(now, subscriber, s.id, self.client, self.shard, s.topic, name,
                               body["generation"], bool(body["created"]), body["start_offset"],
                               body["cursor"], bool(body.get("reset", False)),
                               body.get("max_in_flight", 0), opts.get("max_in_flight"), sent,
                               opts.get("generation"), bool(opts.get("read_old", False)),
                               opts.get("from_offset"), opts.get("on_reset", "earliest"),
                               "pull" if pull else "push", self.shard_generation,
                               opts.get("shared") is True, opts.get("key_ordered") is True))

    def _error(self, frame: list[Any], now: float) -> None:
        pending = self.pending.pop(frame[1], None)
        if pending is None:
            return
        name = error_name(frame[2])
        if pending[0] == "publish":
            for group in pending[1]:
                for topic, message_id in group:
                    self._add(h.PublishFailed(now, self.client, frame[1], topic, message_id,
                                              name))
        elif pending[0] == "ack":
            s = pending[1]
            self._add(h.AckRefused(now, s.subscriber, s.id, s.topic, s.generation, -1, name))
        elif pending[0] in ("fetch", "commit"):
            request, subscriber, topic, sub_name, generation, offset = pending[:6]
            self._add(h.PullRefused(now, subscriber, self.client, self.shard, topic, sub_name,
                                    request, generation, offset, name, pending[-1]))

    def closed(self, reason: str = "lost") -> None:
        """The connection is gone (``lost``: EOF or reset from the other side; ``closed``:
        this client closed it): its sessions end, its requests get no answer."""
        if self.ended:
            return
        self.ended = True
        now = self.rec.clock()
        for s in self.sessions.values():
            self._add(h.SessionEnded(now, s.subscriber, s.id, s.topic, reason))
        self.sessions.clear()
        self.pending.clear()


class TapStream(trio.abc.HalfCloseableStream):
    """Passes bytes through to ``inner`` and shows a copy of them to a :class:`WireTap`.

    ``inner`` is a simulated stream, or a socket stream in chaos runs (which have no
    connection numbers: the oracle does not see their shards)."""

    def __init__(self, inner: SimStream, recorder: Recorder, client: str) -> None:
        self.inner = inner
        self.tap = WireTap(recorder, client, getattr(inner, "conn_id", None))

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        # recorded before it leaves: an ack is "sent" from the moment it may arrive
        self.tap.outgoing(bytes(data))
        try:
            await self.inner.send_all(data)
        except trio.BrokenResourceError:
            self.tap.closed("lost")
            raise
        except trio.ClosedResourceError:
            self.tap.closed("closed")
            raise

    def try_send(self, data: bytes) -> int:
        sent = self.inner.try_send(data)
        if sent:
            self.tap.outgoing(bytes(data))
        return sent

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        try:
            data: bytes = await self.inner.receive_some(max_bytes)
        except trio.BrokenResourceError:
            self.tap.closed("lost")
            raise
        except trio.ClosedResourceError:
            self.tap.closed("closed")
            raise
        if data:
            self.tap.incoming(data)
        else:
            self.tap.closed("lost")
        return data

    async def aclose(self) -> None:
        self.tap.closed("closed")
        await self.inner.aclose()

    def close_now(self) -> None:
        self.tap.closed("closed")
        self.inner.close_now()


class TappedHost(SimHost):
    """A client's host: every connection it opens is tapped."""

    def __init__(self, network: Network, name: str, *, seed: int, incarnation: int,
                 recorder: Recorder) -> None:
        super().__init__(network, name, seed=seed, incarnation=incarnation)
        self.recorder = recorder
        self._open: dict[int, TapStream] = {}

    async def connect(self, host: str, port: int) -> TapStream:  # type: ignore[override]
        stream: SimStream = await super().connect(host, port)
        tapped = TapStream(stream, self.recorder, self.name)
        self._open[stream.conn_id] = tapped
        return tapped

    def drop_connections(self) -> None:
        """Close every connection the client left open, as the garbage collector closes
        the sockets of a dropped client (or the kernel those of a dead process)."""
        for conn_id, stream in list(self._open.items()):
            stream.close_now()
            del self._open[conn_id]
