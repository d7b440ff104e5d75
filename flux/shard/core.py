"""ShardCore: the shard's whole broker logic as a functional core, with no I/O.

Every call gets ``now`` (the shard's monotonic clock). Frames go in through
:meth:`ShardCore.receive`; frames to send come out of :meth:`take_output`;
:meth:`next_deadline` says when :meth:`tick` must run next. The trio shell
(``flux.shard.server``) and the simulator drive the same object, so every rule
of DESIGN.md §1 (G1-G8) lives here and nowhere else.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flux import errors, protocol
from flux.config import Config
from flux.hashing import shard_for
from flux.shard.subscription import Subscription
from flux.shard.topic import DedupWindow, TopicLog

P = protocol
MAX_CREDIT = 1 << 30
# room a DELIVER or FETCHED frame needs around one message's payload and id (the id's
# length is counted in characters: up to 96 more bytes for a 128-byte id)
MESSAGE_FRAME_SLACK = 256
FETCH_MAX_MESSAGES = 10_000


@dataclass(eq=False)
class Topic:
    """A topic's log, dedup window and subscriptions (by name, in creation order)."""

    name: str
    log: TopicLog
    dedup: DedupWindow
    subs: dict[str, Subscription] = field(default_factory=dict)

    @property
    def held_bytes(self) -> int:
        return self.log.held_bytes + self.dedup.held_bytes


@dataclass(eq=False)
class Session:
    """One client connection to this shard."""

    conn: int
    opened_at: float
    last_seen: float
    hello: bool = False
    subs: dict[int, Subscription] = field(default_factory=dict)  # client sid -> subscription
    out: list[list[Any]] = field(default_factory=list)
    close: bool = False


def _err(code_cls: type[errors.FluxError], message: str) -> list[Any]:
    return [code_cls.code, message, None]


class ShardCore:
    """All state of one shard incarnation (one generation)."""

    def __init__(self, config: Config, *, index: int = 0, shard_count: int = 1,
                 generation: int = 1, now: float = 0.0, epoch: float = 0.0,
                 check_ownership: bool = True) -> None:
        self.config = config
        self.index = index
        self.shard_count = shard_count
        self.generation = generation
        self.epoch = epoch  # wall time = epoch + now (message timestamps only)
        self.check_ownership = check_ownership
        self.topics: dict[str, Topic] = {}
        self.sessions: dict[int, Session] = {}
        self._conn_ids = itertools.count(1)
        self._timer_seq = itertools.count()
        self._timers: list[tuple[float, int, Subscription]] = []
        self._dirty: dict[int, Subscription] = {}
        self._owned: dict[str, bool] = {}
        self._started = now
        self._next_message_cleanup = now + config.message.cleanup_time
        self._next_subscriber_cleanup = now + config.subscriber.cleanup_time
        self._next_session_check = now + 2 * config.subscriber.heartbeat
        self.draining = False
        # optional observer of internal events, e.g. ("deleted", topic, offset, count)
        self.on_event: Callable[[tuple[Any, ...]], None] | None = None
        self.counters = {"published": 0, "duplicates": 0, "delivered": 0, "redelivered": 0,
                         "acked": 0, "trimmed": 0}

    # -- sessions ----------------------------------------------------------------------

    def connect(self, now: float) -> int:
        """Register a new connection; returns its id for later calls."""
        conn = next(self._conn_ids)
        self.sessions[conn] = Session(conn, now, now)
        return conn

    def disconnect(self, conn: int, now: float) -> None:
        """The connection ended: its subscriptions become inactive (ephemeral: deleted)."""
        session = self.sessions.pop(conn, None)
        if session is None:
            return
        self._end_session_attachments(session, now)
        session.subs.clear()

    def _end_session_attachments(self, session: Session, now: float) -> None:
        for sub in list(session.subs.values()):
            if sub.session is not None and sub.session[0] == session.conn:
                self._end_attachment(sub, now)

    def fail(self, conn: int, exc: errors.FluxError, now: float) -> None:
        """Framing corruption on ``conn``: answer with an ERROR frame, then close it."""
        session = self.sessions.get(conn)
        if session is None:
            return
        session.out.append(P.error_frame(0, exc))
        session.close = True
        self._end_session_attachments(session, now)

    # -- frames in ---------------------------------------------------------------------

    def receive(self, conn: int, frame: list[Any], now: float) -> None:
        """Handle one decoded frame from ``conn``."""
        session = self.sessions.get(conn)
        if session is None or session.close:
            return
        session.last_seen = now
        if not isinstance(frame, list) or not frame or type(frame[0]) is not int:
            # FrameDecoder never yields this; a shell or simulator feeding frames directly might
            session.out.append(P.error_frame(0, errors.ProtocolError(
                "a frame must be an array whose first element is its kind")))
            return
        kind = frame[0]
        handler = self._handlers.get(kind)
        # CREDIT has no rid (field 1 is a sid): its errors must not answer a pending request
        rid = frame[1] if len(frame) > 1 and type(frame[1]) is int and kind != P.CREDIT else 0
        if handler is None:
            session.out.append(P.error_frame(rid, errors.InvalidRequest(
                f"unknown frame kind {kind}")))
            return
        try:
            handler(self, session, frame, now)
        except errors.FluxError as exc:
            session.out.append(P.error_frame(rid, exc))
        except (IndexError, TypeError, ValueError, KeyError, AttributeError) as exc:
            name = P.KIND_NAMES.get(kind, str(kind))
            session.out.append(P.error_frame(rid, errors.InvalidRequest(
                f"malformed {name} frame: {exc.__class__.__name__}: {exc}")))
        self._pump(now)

    def _hello(self, session: Session, frame: list[Any], now: float) -> None:
        rid, body = frame[1], _map(frame, 2)
        version = body.get("version")
        if version != P.VERSION:
            session.out.append(P.error_frame(rid, errors.UnsupportedVersion(
                f"protocol version {version!r} is not supported; this shard speaks {P.VERSION}")))
            session.close = True
            return
        session.hello = True
        session.out.append([P.HELLO_OK, rid, {
            "version": P.VERSION, "role": "shard", "index": self.index,
            "shard_count": self.shard_count, "generation": self.generation,
            "heartbeat": self.config.subscriber.heartbeat,
            "max_frame_bytes": self.config.max_frame_bytes,
        }])

    def _ping(self, session: Session, frame: list[Any], now: float) -> None:
        session.out.append([P.PONG, frame[1]])

    # -- publish -----------------------------------------------------------------------

    def _check_owned(self, topic: Any) -> str:
        owned = self._owned.get(topic) if isinstance(topic, str) else None
        if owned is None:
            P.check_topic(topic)
            owned = (not self.check_ownership
                     or shard_for(topic, self.shard_count) == self.index)
            if len(self._owned) > 100_000:
                self._owned.clear()
            self._owned[topic] = owned
        if not owned:
            raise errors.WrongShard(
                f"topic {topic!r} belongs to shard {shard_for(topic, self.shard_count)},"
                f" not {self.index}; refresh the shard map")
        return str(topic)

    def _topic(self, name: str) -> Topic:
        topic = self.topics.get(name)
        if topic is None:
            topic = Topic(name, TopicLog(), DedupWindow(self.config.message.dedup_window))
            self.topics[name] = topic
        return topic

    def _publish(self, session: Session, frame: list[Any], now: float) -> None:
        rid, items = frame[1], frame[2]
        if not isinstance(items, list):
            raise errors.InvalidRequest("PUBLISH items must be an array")
        if self.draining:
            raise errors.ShuttingDown("shard is draining; reconnect and retry")
        results: list[list[Any]] = []
        add = results.append
        counts: dict[str, int] = {}
        buffer = self.config.topic.buffer
        max_bytes = self.config.topic.max_bytes
        max_message = self.config.max_frame_bytes - MESSAGE_FRAME_SLACK
        touched: dict[str, Topic] = {}
        # The hot loop. Items of a frame mostly share a topic: a run of items of one
        # topic is checked against its dedup window and the run's own new ids, and
        # stored at the end of the run with one extend.
        name: Any = None
        topic: Topic | None = None
        count = held = next_offset = duplicates = 0
        dedup_on = True
        known: Callable[[str], int | None] = _nothing
        new_ids: list[str] = []
        new_payloads: list[bytes] = []
        fresh: dict[str, int] = {}
        for item in items:
            if type(item) is not list:
                add(_err(errors.InvalidRequest, "a publish item is [topic, id, payload]"))
                continue
            try:
                item_topic, message_id, payload = item
            except ValueError:
                add(_err(errors.InvalidRequest, "a publish item is [topic, id, payload]"))
                continue
            if item_topic != name or topic is None:
                if topic is not None:
                    counts[name] = count
                    self._store_run(topic, new_ids, new_payloads, fresh, now)
                    new_ids, new_payloads, fresh = [], [], {}
                try:
                    name = self._check_owned(item_topic)
                except errors.FluxError as exc:
                    add([exc.code, str(exc), None])
                    name = topic = None
                    continue
                topic = self._topic(name)
                touched[name] = topic
                count = counts.get(name, 0)
                topic.dedup.expire(now)  # before reading held bytes: expired ids free theirs
                held = topic.held_bytes
                next_offset = topic.log.next_offset
                known = topic.dedup.finder()
                dedup_on = topic.dedup.window > 0  # a zero window remembers nothing (G3)
            if type(message_id) is not str or not 0 < len(message_id) <= 32:
                try:  # 32 characters are at most 128 bytes of UTF-8: longer ids are checked
                    P.check_message_id(message_id)
                except errors.FluxError as exc:
                    add([exc.code, str(exc), None])
                    continue
            if type(payload) is not bytes:
                add(_err(errors.InvalidRequest,
                         f"payload must be binary, not {type(payload).__name__}"))
                continue
            size = len(payload) + len(message_id)
            if size > max_message:
                # stored, it could never be delivered or fetched in one frame (G8)
                add(_err(errors.MessageTooLarge,
                         f"a {len(payload)}-byte payload cannot be delivered in one frame;"
                         f" at most {max_message - len(message_id)} bytes with this id"))
                continue
            count += 1
            if count > buffer:
                add(_err(errors.Busy, f"more than topic.buffer={buffer} publishes of {name!r}"
                                      " in one frame; retry with the same id"))
                continue
            original = known(message_id)
            if original is None and dedup_on:
                original = fresh.get(message_id)
            if original is not None:  # G3: before the TopicFull check
                duplicates += 1
                add([P.OK, original, True])
                continue
            size += len(message_id)  # the dedup window holds the id too
            if held + size > max_bytes:
                add(_err(errors.TopicFull, f"topic {name!r} holds {held} bytes;"
                                           f" topic.max_bytes={max_bytes}"))
                continue
            held += size
            fresh[message_id] = next_offset
            new_ids.append(message_id)
            new_payloads.append(payload)
            add([P.OK, next_offset, False])
            next_offset += 1
        if topic is not None:
            self._store_run(topic, new_ids, new_payloads, fresh, now)
        self.counters["duplicates"] += duplicates
        session.out.append([P.PUBLISHED, rid, self.generation, results])
        for topic in touched.values():
            for sub in topic.subs.values():
                if sub.session is not None:
                    self._dirty[id(sub)] = sub

    def _store_run(self, topic: Topic, ids: list[str], payloads: list[bytes],
                   fresh: dict[str, int], now: float) -> None:
        """Store a run of accepted publishes of one topic (G2) and remember their ids (G3)."""
        if ids:
            topic.log.extend(ids, payloads, now)
            topic.dedup.remember_all(fresh, now)
            self.counters["published"] += len(ids)

    # -- subscribe ---------------------------------------------------------------------

    def _subscribe(self, session: Session, frame: list[Any], now: float) -> None:
        rid, sid, opts = frame[1], frame[2], _map(frame, 3)
        if type(sid) is not int:
            raise errors.InvalidRequest("SUBSCRIBE sid must be an integer")
        name = self._check_owned(opts.get("topic"))
        sub_name = opts.get("name")
        mode = opts.get("mode", "push")
        if mode not in ("push", "pull"):
            raise errors.InvalidRequest(f"mode must be 'push' or 'pull', not {mode!r}")
        if sub_name is not None and (not isinstance(sub_name, str) or not sub_name
                                     or len(sub_name.encode()) > 255 or sub_name[0] == "~"):
            raise errors.InvalidRequest(
                "subscription name must be 1-255 bytes and not start with '~'")
        if sub_name is None and mode == "pull":
            raise errors.InvalidRequest("a pull subscription needs a name")
        read_old = _bool(opts, "read_old", False)
        from_offset = _opt_int(opts, "from_offset")
        known_generation = _opt_int(opts, "generation")
        on_reset = opts.get("on_reset", "earliest")
        if on_reset not in ("earliest", "raise"):
            raise errors.InvalidRequest(f"on_reset must be 'earliest' or 'raise', not {on_reset!r}")
        cap = self.config.subscriber.max_in_flight
        max_in_flight = _opt_int(opts, "max_in_flight")
        if max_in_flight is None:
            max_in_flight = cap
        if max_in_flight < 1:
            raise errors.InvalidRequest("max_in_flight must be at least 1")
        max_in_flight = min(max_in_flight, cap)
        credit = _opt_int(opts, "credit")
        if credit is not None and credit < 0:
            raise errors.InvalidRequest("credit must be >= 0")
        credit = max_in_flight if credit is None else min(credit, MAX_CREDIT)
        if mode == "push" and sid in session.subs and not session.subs[sid].deleted \
                and session.subs[sid].session == (session.conn, sid):
            raise errors.InvalidRequest(f"sid {sid} is already in use on this connection")

        reset = known_generation is not None and known_generation != self.generation
        if reset and on_reset == "raise":
            raise errors.TopicReset(
                f"topic {name!r} was reset: generation {known_generation} -> {self.generation}",
                old=known_generation, new=self.generation)
        # a refused SUBSCRIBE must not leave a new, empty topic behind (G8): register the
        # topic only once the subscription is made
        topic = self.topics.get(name) or Topic(name, TopicLog(),
                                               DedupWindow(self.config.message.dedup_window))
        log = topic.log
        key = sub_name if sub_name is not None else f"~{session.conn}.{sid}"
        sub = topic.subs.get(key)
        created = sub is None
        clamped = False
        if sub is None:
            if reset:
                start = 0
            elif from_offset is not None:
                if from_offset < 0:
                    raise errors.InvalidRequest("from_offset must be >= 0")
                if from_offset > log.next_offset:
                    raise errors.OffsetOutOfRange(
                        f"from_offset {from_offset} is past the next offset {log.next_offset}")
                start = from_offset
            elif read_old:
                start = log.oldest
            else:
                start = log.next_offset
            if start < log.oldest:
                start, clamped = log.oldest, True
            sub = Subscription(topic=name, name=key, ephemeral=sub_name is None, mode=mode,
                               cursor=start, start_offset=start, created_at=now)
            topic.subs[key] = sub
            self.topics[name] = topic
            self._emit("created", name, key, start)
        elif sub.mode != mode:
            raise errors.InvalidRequest(
                f"subscription {sub_name!r} is a {sub.mode} subscription, not {mode}")

        if mode == "pull":
            sub.active = True
            sub.last_activity = now
        else:
            old = sub.session
            if old is not None and old != (session.conn, sid):
                old_session = self.sessions.get(old[0])
                if old_session is not None:
                    old_session.out.append([P.SUB_ENDED, old[1], errors.SubscriptionTakenOver.code,
                                            f"subscription {key!r} was taken over by another"
                                            " session"])
                self._emit("taken_over", name, key, old)
            sub.attach((session.conn, sid), credit, max_in_flight, now)
            session.subs[sid] = sub
            self._dirty[id(sub)] = sub
        session.out.append([P.SUBSCRIBED, rid, sid, {
            "created": created, "start_offset": sub.start_offset, "cursor": sub.cursor,
            "generation": self.generation, "clamped": clamped, "reset": reset,
            "next_offset": log.next_offset, "max_in_flight": sub.max_in_flight,
        }])

    def _unsubscribe(self, session: Session, frame: list[Any], now: float) -> None:
        rid, sid = frame[1], frame[2]
        sub = session.subs.pop(sid, None) if type(sid) is int else None
        if sub is not None and sub.session == (session.conn, sid):
            self._end_attachment(sub, now)
        session.out.append([P.UNSUBSCRIBED, rid, sid])

    def _credit(self, session: Session, frame: list[Any], now: float) -> None:
        sid, n = frame[1], frame[2]
        if type(n) is not int or n < 0:
            raise errors.InvalidRequest("CREDIT n must be a non-negative integer")
        sub = session.subs.get(sid)
        if sub is not None and sub.session == (session.conn, sid):
            sub.credit = min(sub.credit + n, MAX_CREDIT)
            self._dirty[id(sub)] = sub

    def _end_attachment(self, sub: Subscription, now: float) -> None:
        sub.detach(now)
        if sub.ephemeral:
            self._delete_subscription(sub)

    def _delete_subscription(self, sub: Subscription) -> None:
        topic = self.topics.get(sub.topic)
        if topic is not None and topic.subs.get(sub.name) is sub:
            del topic.subs[sub.name]
        sub.deleted = True
        sub.detach(sub.inactive_since)
        self._emit("deleted_subscription", sub.topic, sub.name)

    # -- acks --------------------------------------------------------------------------

    def _attached(self, session: Session, sid: Any) -> Subscription:
        sub = session.subs.get(sid) if type(sid) is int else None
        if sub is None or sub.deleted:
            raise errors.UnknownSubscription(f"no subscription with sid {sid} on this connection")
        if sub.session != (session.conn, sid):
            if sub.session is None:
                raise errors.SubscriptionInactive(
                    f"subscription {sub.name!r} is inactive; subscribe again to resume")
            raise errors.SubscriptionTakenOver(
                f"subscription {sub.name!r} was taken over by another session")
        return sub

    def _ack(self, session: Session, frame: list[Any], now: float) -> None:
        rid, sid, generation, offsets, through = frame[1], frame[2], frame[3], frame[4], frame[5]
        sub = self._attached(session, sid)
        if generation != self.generation:
            raise errors.TopicReset(
                f"ack for generation {generation}, shard is at {self.generation}",
                old=generation if type(generation) is int else None, new=self.generation)
        if not isinstance(offsets, list) or type(through) is not int:
            raise errors.InvalidRequest("ACK offsets must be an array and through an integer")
        refused: list[list[Any]] = []
        acked = 0
        for offset in offsets:
            if type(offset) is not int:
                refused.append([offset, errors.InvalidRequest.code, "offset must be an integer"])
            elif sub.ack(offset):
                acked += 1
            elif not sub.was_delivered(offset):
                refused.append([offset, errors.NotDelivered.code,
                                f"offset {offset} was not delivered to this session"])
        if through >= 0:
            acked += sub.ack_through(through)
        if acked:
            self.counters["acked"] += acked
            self._dirty[id(sub)] = sub
        session.out.append([P.ACKED, rid, sid, sub.cursor, refused])

    # -- pull path ---------------------------------------------------------------------

    def _pull_sub(self, topic: Topic | None, name: Any, now: float) -> Subscription:
        sub = topic.subs.get(name) if topic is not None and isinstance(name, str) else None
        if sub is None:
            raise errors.UnknownSubscription(
                f"no pull subscription {name!r}; SUBSCRIBE with mode 'pull' first")
        if sub.mode != "pull":
            raise errors.InvalidRequest(f"subscription {name!r} is a push subscription")
        sub.active = True
        sub.last_activity = now
        return sub

    def _check_generation(self, generation: Any, topic: str) -> None:
        if generation is not None and generation != self.generation:
            raise errors.TopicReset(
                f"topic {topic!r} was reset: generation {generation} -> {self.generation}",
                old=generation if type(generation) is int else None, new=self.generation)

    def _fetch(self, session: Session, frame: list[Any], now: float) -> None:
        rid, opts = frame[1], _map(frame, 2)
        name = self._check_owned(opts.get("topic"))
        self._check_generation(opts.get("generation"), name)
        offset = _opt_int(opts, "offset") or 0
        max_messages = _opt_int(opts, "max_messages")  # 0: only "oldest" and "next"
        max_messages = min(1000 if max_messages is None else max_messages, FETCH_MAX_MESSAGES)
        max_bytes = min(_opt_int(opts, "max_bytes") or (1 << 20),
                        self.config.max_frame_bytes // 2)
        if offset < 0 or max_messages < 0 or max_bytes < 0:
            raise errors.InvalidRequest("offset, max_messages and max_bytes must be >= 0")
        topic = self.topics.get(name)
        if opts.get("name") is not None:
            self._pull_sub(topic, opts.get("name"), now)
        messages: list[list[Any]] = []
        oldest = next_offset = 0
        if topic is not None:
            log = topic.log
            oldest, next_offset = log.oldest, log.next_offset
            if max_messages:
                for off, entry in log.read(offset, max_messages, max_bytes):
                    messages.append([off, entry.id, entry.payload, self.epoch + entry.stored_at])
        session.out.append([P.FETCHED, rid, {
            "generation": self.generation, "oldest": oldest, "next": next_offset,
            "messages": messages}])

    def _commit(self, session: Session, frame: list[Any], now: float) -> None:
        rid, opts = frame[1], _map(frame, 2)
        name = self._check_owned(opts.get("topic"))
        self._check_generation(opts.get("generation"), name)
        offset = _opt_int(opts, "offset")
        topic = self.topics.get(name)
        sub = self._pull_sub(topic, opts.get("name"), now)
        assert topic is not None
        if offset is None or offset < 0 or offset > topic.log.next_offset:
            raise errors.OffsetOutOfRange(
                f"commit offset {offset} is outside 0..{topic.log.next_offset}")
        sub.commit(offset)
        session.out.append([P.COMMITTED, rid, {"cursor": sub.cursor}])

    def _stats(self, session: Session, frame: list[Any], now: float) -> None:
        session.out.append([P.STATS_OK, frame[1], self.stats(now)])

    def stats(self, now: float) -> dict[str, Any]:
        """What this shard holds: topics, messages, bytes, subscriptions."""
        topics: dict[str, Any] = {}
        for name, topic in self.topics.items():
            topics[name] = {
                "oldest": topic.log.oldest, "next_offset": topic.log.next_offset,
                "held": len(topic.log), "held_bytes": topic.held_bytes,
                "dedup_ids": len(topic.dedup),
                "subscriptions": {
                    s.name: {"mode": s.mode, "cursor": s.cursor, "active": s.active,
                             "in_flight": len(s.in_flight), "ephemeral": s.ephemeral}
                    for s in topic.subs.values()},
            }
        return {"index": self.index, "generation": self.generation,
                "shard_count": self.shard_count, "uptime": now - self._started,
                "sessions": len(self.sessions), "counters": dict(self.counters),
                "topics": topics}

    _handlers: dict[int, Callable[[ShardCore, Session, list[Any], float], None]] = {
        P.HELLO: _hello, P.PING: _ping, P.PUBLISH: _publish, P.SUBSCRIBE: _subscribe,
        P.UNSUBSCRIBE: _unsubscribe, P.CREDIT: _credit, P.ACK: _ack, P.FETCH: _fetch,
        P.COMMIT: _commit, P.STATS: _stats,
    }

    # -- pushing -----------------------------------------------------------------------

    def _pump(self, now: float) -> None:
        """Send first deliveries to every subscription that may have room for them."""
        if not self._dirty:
            return
        dirty = self._dirty
        self._dirty = {}
        for sub in dirty.values():
            if sub.session is not None:
                self._push_new(sub, now)

    def _push_new(self, sub: Subscription, now: float) -> None:
        topic = self.topics[sub.topic]
        log = topic.log
        end = log.next_offset
        room = min(sub.max_in_flight - len(sub.in_flight), sub.credit)
        # the cursor can jump past next_push over offsets acked before this attachment
        # (they are no longer in ``acked``): never push those
        start = max(sub.next_push, sub.cursor, log.oldest)
        if room <= 0 or start >= end:
            return
        assert sub.session is not None
        session = self.sessions.get(sub.session[0])
        if session is None:
            return
        stop = min(end, start + room)
        acked = sub.acked
        if acked and max(acked) >= start:
            offsets = [o for o in range(start, stop) if o not in acked]
            if len(offsets) < stop - start:  # skipped some: fill the room further on
                for o in range(stop, end):
                    if len(offsets) >= room:
                        break
                    if o not in acked:
                        offsets.append(o)
                stop = offsets[-1] + 1 if offsets else stop
        else:
            offsets = list(range(start, stop))
        sub.next_push = stop
        if not offsets:
            return
        epoch = self.epoch
        if len(offsets) == stop - start:  # the usual case: a contiguous run of offsets
            ids, payloads, times = log.span(start, stop)
            items = [[o, i, p, epoch + t, 1]
                     for o, i, p, t in zip(offsets, ids, payloads, times, strict=True)]
            size: int | None = sum(map(len, ids)) + sum(map(len, payloads))
        else:
            items = []
            for o in offsets:
                entry = log.get(o)
                assert entry is not None  # held: at or above the cursor
                items.append([o, entry.id, entry.payload, epoch + entry.stored_at, 1])
            size = None
        sub.in_flight.update(dict.fromkeys(offsets, 1))
        sub.add_deadlines(now + self.config.subscriber.timeout, offsets, 1)
        sub.credit -= len(items)
        self.counters["delivered"] += len(items)
        self._deliver(session, sub.session[1], items, size)
        self._schedule(sub)

    def _deliver(self, session: Session, sid: int, items: list[list[Any]],
                 size: int | None = None) -> None:
        """Queue DELIVER frames for ``items`` (``size``: their ids and payloads, if known),
        split so no frame nears max_frame_bytes."""
        budget = self.config.max_frame_bytes // 2
        if size is None:
            size = sum(len(item[2]) + len(item[1]) for item in items)
        if len(items) * 40 + size <= budget:
            session.out.append([P.DELIVER, sid, self.generation, items])
            return
        start = size = 0
        for i, item in enumerate(items):
            item_size = len(item[2]) + len(item[1]) + 40
            if size + item_size > budget and i > start:
                session.out.append([P.DELIVER, sid, self.generation, items[start:i]])
                start, size = i, 0
            size += item_size
        session.out.append([P.DELIVER, sid, self.generation,
                            items[start:] if start else items])

    def _schedule(self, sub: Subscription) -> None:
        """Make sure the timer heap wakes ``sub`` at its earliest timer."""
        at = sub.next_timer()
        if at is not None and (sub.wake_at is None or at < sub.wake_at):
            sub.wake_at = at
            heapq.heappush(self._timers, (at, next(self._timer_seq), sub))

    # -- time --------------------------------------------------------------------------

    def next_deadline(self) -> float:
        """The time :meth:`tick` must next run (cleanup passes, timers, heartbeats)."""
        at = min(self._next_message_cleanup, self._next_subscriber_cleanup,
                 self._next_session_check)
        if self._timers:
            at = min(at, self._timers[0][0])
        return at

    def tick(self, now: float) -> None:
        """Run everything due at ``now``: redeliveries, ack timeouts, cleanup, heartbeats."""
        timers = self._timers
        due: dict[int, Subscription] = {}
        while timers and timers[0][0] <= now:
            _, _, sub = heapq.heappop(timers)
            sub.wake_at = None
            due[id(sub)] = sub
        for sub in due.values():
            self._run_timers(sub, now)
        if now >= self._next_session_check:
            self._check_sessions(now)
        if now >= self._next_message_cleanup:
            self._cleanup_messages(now)
            self._next_message_cleanup = _next_pass(self._next_message_cleanup,
                                                    self.config.message.cleanup_time, now)
        if now >= self._next_subscriber_cleanup:
            self._cleanup_subscribers(now)
            self._next_subscriber_cleanup = _next_pass(self._next_subscriber_cleanup,
                                                       self.config.subscriber.cleanup_time, now)
        self._pump(now)

    def _run_timers(self, sub: Subscription, now: float) -> None:
        if sub.session is None or sub.deleted:
            return
        cfg = self.config.subscriber
        max_pushes = 1 + cfg.retry_count
        repush: list[tuple[float, int, int]] = []
        while True:
            d = sub.deadlines[0] if sub.deadlines else None
            r = sub.repushes[0] if sub.repushes else None
            if d is not None and d[0] <= now and (r is None or d[0] <= r[0]):
                sub.deadlines.popleft()
                at, offsets, pushes, epoch = d
                for offset in offsets:  # only the unacked ones of the batch time out
                    if not sub.is_current(offset, pushes, epoch):
                        continue
                    if pushes >= max_pushes:
                        self._exhausted(sub, offset, now)
                        return
                    if cfg.retry_interval <= 0:
                        repush.append((at, offset, pushes))
                    else:
                        sub.add_repush(at + cfg.retry_interval, offset, pushes)
            elif r is not None and r[0] <= now:
                sub.repushes.popleft()
                at, offset, pushes, epoch = r
                if sub.is_current(offset, pushes, epoch):
                    repush.append((at, offset, pushes))
            else:
                break
        if repush:
            self._redeliver(sub, repush)
        self._schedule(sub)

    def _redeliver(self, sub: Subscription, due: list[tuple[float, int, int]]) -> None:
        assert sub.session is not None
        session = self.sessions.get(sub.session[0])
        topic = self.topics[sub.topic]
        timeout = self.config.subscriber.timeout
        items: list[list[Any]] = []
        for at, offset, pushes in sorted(due, key=lambda e: (e[0], e[1])):
            entry = topic.log.get(offset)
            if entry is None:
                continue
            sub.in_flight[offset] = pushes + 1
            sub.add_deadlines(at + timeout, [offset], pushes + 1)
            items.append([offset, entry.id, entry.payload, self.epoch + entry.stored_at,
                          pushes + 1])
        if items and session is not None:
            self.counters["redelivered"] += len(items)
            self._deliver(session, sub.session[1], items)

    def _exhausted(self, sub: Subscription, offset: int, now: float) -> None:
        """A message used all its pushes: the subscription becomes inactive (G4)."""
        assert sub.session is not None
        conn, sid = sub.session
        session = self.sessions.get(conn)
        if session is not None:
            session.out.append([P.SUB_ENDED, sid, errors.SubscriptionInactive.code,
                                f"offset {offset} was pushed {1 + self.config.subscriber.retry_count}"
                                " times without an ack; subscribe again to resume"])
        self._emit("exhausted", sub.topic, sub.name, offset)
        self._end_attachment(sub, now)

    def _check_sessions(self, now: float) -> None:
        limit = 2 * self.config.subscriber.heartbeat
        soonest = now + limit
        for session in list(self.sessions.values()):
            expires = session.last_seen + limit
            if expires <= now:
                session.out.append(P.error_frame(0, errors.ProtocolError(
                    f"no frame for {limit:g}s (two heartbeat periods); closing")))
                session.close = True
                self._end_session_attachments(session, now)
            else:
                soonest = min(soonest, expires)
        self._next_session_check = soonest

    def _cleanup_messages(self, now: float) -> None:
        """G5: delete messages whose ttl expired and that every subscription acked."""
        ttl = self.config.message.ttl
        for topic in self.topics.values():
            topic.dedup.expire(now)
            log = topic.log
            if not len(log):
                continue
            below = log.next_offset
            for sub in topic.subs.values():
                if sub.cursor < below:
                    below = sub.cursor
            first = log.oldest
            dropped = log.trim(below, now - ttl)
            if dropped:
                self.counters["trimmed"] += dropped
                self._emit("trimmed", topic.name, first, dropped)

    def _cleanup_subscribers(self, now: float) -> None:
        """G6: delete subscriptions inactive for ``inactive_time``."""
        cfg = self.config.subscriber
        idle = 2 * cfg.heartbeat
        for topic in self.topics.values():
            for sub in list(topic.subs.values()):
                if sub.mode == "pull" and sub.active and now - sub.last_activity >= idle:
                    sub.active = False
                    sub.inactive_since = sub.last_activity + idle
                if not sub.active and now - sub.inactive_since >= cfg.inactive_time:
                    self._delete_subscription(sub)

    # -- output ------------------------------------------------------------------------

    def take_output(self) -> list[tuple[int, list[list[Any]], bool]]:
        """Frames to send per connection, and whether to close it after sending."""
        out: list[tuple[int, list[list[Any]], bool]] = []
        for conn, session in list(self.sessions.items()):
            if session.out or session.close:
                out.append((conn, session.out, session.close))
                session.out = []
                if session.close:
                    self.disconnect(conn, session.last_seen)
        return out

    def drain(self) -> None:
        """Refuse new publishes from now on (the shard is stopping)."""
        self.draining = True

    def _emit(self, *event: Any) -> None:
        if self.on_event is not None:
            self.on_event(event)


def _nothing(message_id: str) -> int | None:
    return None


def _next_pass(previous: float, interval: float, now: float) -> float:
    nxt = previous + interval
    if nxt <= now:
        nxt = previous + interval * (int((now - previous) / interval) + 1)
    return nxt


def _map(frame: list[Any], i: int) -> dict[str, Any]:
    body = frame[i]
    if not isinstance(body, dict):
        raise errors.InvalidRequest(f"field {i} of the frame must be a map")
    return body


def _opt_int(opts: dict[str, Any], key: str) -> int | None:
    value = opts.get(key)
    if value is None:
        return None
    if type(value) is not int:
        raise errors.InvalidRequest(f"{key} must be an integer, not {type(value).__name__}")
    return value


def _bool(opts: dict[str, Any], key: str, default: bool) -> bool:
    value = opts.get(key, default)
    if not isinstance(value, bool):
        raise errors.InvalidRequest(f"{key} must be true or false")
    return value
