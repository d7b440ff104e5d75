"""ShardCore: the shard's whole broker logic as a functional core, with no I/O.

Every call gets ``now`` (the shard's monotonic clock). Frames go in through
:meth:`ShardCore.receive`; frames to send come out of :meth:`take_output`;
:meth:`next_deadline` says when :meth:`tick` must run next. The trio shell
(``flux.shard.server``) and the simulator drive the same object, so every rule
of DESIGN.md §1 (G1-G8) lives here and nowhere else: this module receives frames
and runs timers; the mixins it combines handle each kind of request.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any, ClassVar

from flux import errors
from flux.hashing import dead_letter_source
from flux.shard.access import BEFORE_HELLO, Access
from flux.shard.cache import TopicPayloads
from flux.shard.cleanup import Cleanup
from flux.shard.delivery import Delivery
from flux.shard.journal import TopicJournal
from flux.shard.publishing import Publishing
from flux.shard.pull import Pull
from flux.shard.state import (
    P,
    Session,
    Topic,
    _map,
    _next_pass,
)
from flux.shard.subscribing import Subscribing
from flux.shard.subscription import PushTimers, Subscription

__all__ = ["Session", "ShardCore", "Topic"]


# frame kinds a recovering shard handles (control kinds get their own refusal; CREDIT has
# no reply to give)
_WHILE_RECOVERING = P.CONTROL_KINDS | {P.CREDIT, P.STATS}


class ShardCore(Publishing, Subscribing, Pull, Delivery, Cleanup, Access):
    """All state of one shard incarnation (one generation), and its frame handlers."""

    def connect(self, now: float, certificate: str | None = None) -> int:
        """Register a new connection; returns its id for later calls. It must send
        HELLO within ``limits.hello_timeout`` (see :meth:`next_deadline`).
        ``certificate``: the common name of its TLS client certificate, if any."""
        conn = next(self._conn_ids)
        self.sessions[conn] = Session(conn, now, now, certificate=certificate)
        self._next_session_check = min(self._next_session_check,
                                       now + self.config.limits.hello_timeout)
        return conn

    def disconnect(self, conn: int, now: float) -> None:
        """The connection ended: its subscriptions become inactive (ephemeral: deleted)."""
        session = self.sessions.pop(conn, None)
        if session is None:
            return
        self._end_session_attachments(session, now)
        session.subs.clear()
        self._pump(now)  # a shared subscription's members take its messages at once (G10)

    def fail(self, conn: int, exc: errors.FluxError, now: float) -> None:
        """Close ``conn`` for a reason the shell saw (framing corruption, output the
        client does not read): an ERROR frame with rid 0, then close."""
        session = self.sessions.get(conn)
        if session is None or session.close:
            return
        self._close_session(session, exc, now)

    def pause(self, conn: int, paused: bool, now: float) -> None:
        """The shell stopped (or resumed) reading ``conn`` because the client does not
        read its output: while paused the session is not silent, whatever the time;
        on resuming its silence counts from ``now``."""
        session = self.sessions.get(conn)
        if session is not None:
            session.paused = paused
            session.last_seen = max(session.last_seen, now)

    def receive(self, conn: int, frame: list[Any], now: float) -> None:
        """Handle one decoded frame from ``conn``."""
        if self._delays:
            self._fire_delays(now)
        self._handle(conn, frame, now)
        self._pump(now)
        if self.cache.changed or self.cache.over:
            self._settle_cache()

    def receive_many(self, conn: int, frames: list[list[Any]], now: float) -> None:
        """Handle frames that arrived together from ``conn``, in order, then push once:
        an ACK and a CREDIT read together make one DELIVER, not two half-size ones."""
        if self._delays:
            self._fire_delays(now)
        for frame in frames:
            self._handle(conn, frame, now)
        self._pump(now)
        if self.cache.changed or self.cache.over:
            self._settle_cache()

    def _handle(self, conn: int, frame: list[Any], now: float) -> None:
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
        has_rid = len(frame) > 1 and type(frame[1]) is int
        rid = frame[1] if has_rid and kind != P.CREDIT else 0
        if not has_rid and kind != P.CREDIT:
            # no integer rid: nothing could match a reply to it (PROTOCOL.md §4)
            session.out.append(P.error_frame(0, errors.InvalidRequest(
                f"a {P.KIND_NAMES.get(kind, kind)} request needs an integer rid in position 1;"
                " nothing was done")))
            return
        if self.recovering is not None and kind not in _WHILE_RECOVERING:
            # its disk topics are not rebuilt yet (G9): nothing is served, HELLO included,
            # so a client that hears this incarnation answer knows the recovery is over
            # (STATS is: it says how far the recovery got)
            session.out.append(P.error_frame(rid, errors.Busy(
                f"shard {self.index} is recovering its disk topics ({self.recovering});"
                " retry shortly")))
            return
        if handler is None:
            session.out.append(P.error_frame(rid, errors.InvalidRequest(
                f"unknown frame kind {kind}")))
            return
        if self.auth is not None and session.identity is None and kind not in BEFORE_HELLO:
            session.out.append(P.error_frame(rid, self._not_yet(kind)))
            return
        try:
            handler(self, session, frame, now)
        except errors.FluxError as exc:
            session.out.append(P.error_frame(rid, exc))
        except (IndexError, TypeError, ValueError, KeyError, AttributeError) as exc:
            name = P.KIND_NAMES.get(kind, str(kind))
            session.out.append(P.error_frame(rid, errors.InvalidRequest(
                f"malformed {name} frame: {exc.__class__.__name__}: {exc}")))

    def _hello(self, session: Session, frame: list[Any], now: float) -> None:
        rid, body = frame[1], _map(frame, 2)
        version = body.get("version")
        if version not in P.SUPPORTED_VERSIONS or type(version) is not int:
            # the connection closes now: the ERROR goes ahead of replies still held for
            # durability (which never go), as for every closing error
            (session.ready if session.holds else session.out).append(P.error_frame(
                rid, errors.UnsupportedVersion(f"protocol version {version!r} is not"
                                               " supported; this shard speaks"
                                               f" {', '.join(map(str, P.SUPPORTED_VERSIONS))}")))
            session.close = True
            return
        try:
            self._authenticate(session, body, now)
        except (errors.AuthenticationFailed, errors.SessionExpired) as exc:
            # failed authentication closes (DESIGN.md), its ERROR ahead of held replies
            (session.ready if session.holds else session.out).append(P.error_frame(rid, exc))
            session.close = True
            self._end_session_attachments(session, now)
            return
        session.hello = True
        reply = {
            "version": version, "role": "shard", "index": self.index,
            "shard_count": self.shard_count, "generation": self.generation,
            "heartbeat": self.config.subscriber.heartbeat,
            "max_frame_bytes": self.config.max_frame_bytes,
        }
        if session.identity is not None:
            reply["user"] = session.identity.user
        session.out.append([P.HELLO_OK, rid, reply])

    def _ping(self, session: Session, frame: list[Any], now: float) -> None:
        session.out.append([P.PONG, frame[1]])

    def _control(self, session: Session, frame: list[Any], now: float) -> None:
        # the broker's own frames come only on control listeners (flux.control_proof)
        raise P.control_refused(frame[0])

    def _stats(self, session: Session, frame: list[Any], now: float) -> None:
        session.out.append([P.STATS_OK, frame[1], self.stats(now, self._visible(session))])

    def stats(self, now: float, visible: Callable[[str], bool] | None = None) -> dict[str, Any]:
        """What this shard holds: topics, messages, bytes, subscriptions (only the topics
        ``visible`` allows, if given: a non-admin user's)."""
        topics: dict[str, Any] = {}
        for name, topic in self.topics.items():
            if visible is not None and not visible(dead_letter_source(name) or name):
                continue
            info: dict[str, Any] = {
                "oldest": topic.log.oldest, "next_offset": topic.log.next_offset,
                "held": len(topic.log), "held_bytes": topic.held_bytes(now),
                "dedup_ids": len(topic.dedup),
                "generation": topic.generation,
                "storage": self._storage_stats(topic),
                "policy": topic.settings.as_dict(),
                "subscriptions": {
                    s.name: self._subscription_stats(topic, s, now)
                    for s in topic.subs.values()},
            }
            if topic.settings.dead_letter:  # its dead-letter topics' sizes (G11)
                info.update(self._dead_letter_stats(topic))
            source = dead_letter_source(name)
            if source is not None:
                info["dead_letter_of"] = source
            topics[name] = info
        reply: dict[str, Any] = {
            "index": self.index, "generation": self.generation,
            "shard_count": self.shard_count, "uptime": now - self._started,
            "sessions": len(self.sessions), "counters": dict(self.counters),
            "memory": self.memory, "max_memory": self.max_memory,
            "payload_cache": self.cache.stats(),
            "retired_topics": len(self.retired),
            "publish_ack_seconds": self.publish_acks.as_dict(),
            "fsync_seconds": self.fsync_times.as_dict(), "recovering": self.recovering,
            "topics_recovering": dict(self.down),
            "topics_refused": {name: why for name, why in self.refused.items()
                               if visible is None or visible(dead_letter_source(name)
                                                             or name)},
            "topics": topics}
        if self.process_stats is not None:
            reply["gc"] = self.process_stats()
        return reply

    def _subscription_stats(self, topic: Topic, s: Subscription, now: float) -> dict[str, Any]:
        # lag is exact: offsets above the cursor acked already are not lag, and delayed
        # messages not due yet are a figure of their own (G12)
        pending = self._pending_of(topic, s, now) if topic.delayed else 0
        log = topic.log
        if s.cursor < log.oldest:  # below the oldest in line: only kept ones are held there
            unacked = (log.next_offset - log.oldest - len(s.acked)
                       + s.acked.count_below(log.oldest)
                       + sum(1 for o in log.kept_from(s.cursor) if o not in s.acked))
        else:
            unacked = log.next_offset - s.cursor - len(s.acked)
        info: dict[str, Any] = {"mode": s.mode, "cursor": s.cursor, "active": s.active,
                "in_flight": len(s.in_flight), "ephemeral": s.ephemeral,
                "lag": max(0, unacked - pending),
                "delayed": pending, "redelivered": s.redelivered}
        if topic.settings.dead_letter or s.dead_lettered or s.dead_letter_refused:
            info.update(dead_lettered=s.dead_lettered, dead_letter_refused=s.dead_letter_refused,
                        dead_letter_pending=len(s.dead_pending))  # G11
        group = s.group
        if group is not None:
            info.update(shared=True, key_ordered=group.key_ordered,
                        in_flight=len(group.holder), waiting=len(group.waiting),
                        queued_by_key=group.queued_count, pinned_keys=len(group.pins),
                        members=[{"in_flight": len(m.in_flight), "credit": m.credit,
                                  "max_in_flight": m.max_in_flight, "keys": len(m.keys),
                                  "since": now - m.joined_at}
                                 for m in group.members.values()])
        return info

    def _storage_stats(self, topic: Topic) -> dict[str, Any] | None:
        """A disk topic's log: its size, marks and what recovery found (None: memory)."""
        journal = topic.journal
        if journal is None:
            return None
        writer = journal.writer
        info: dict[str, Any] = {"log_bytes": writer.size, "appended": writer.appended,
                                "durable": writer.durable, "exposed": journal.exposed,
                                "failed": journal.failed, "compactions": journal.compactions,
                                "compacted_bytes": journal.compacted_bytes}
        info.update(self.recovery_info.get(topic.name, {}))
        return info

    _handlers: ClassVar[dict[int, Callable[[Any, Session, list[Any], float], None]]] = {
        P.HELLO: _hello, P.PING: _ping, P.PUBLISH: Publishing._publish,
        P.SUBSCRIBE: Subscribing._subscribe, P.UNSUBSCRIBE: Subscribing._unsubscribe,
        P.CREDIT: Subscribing._credit, P.ACK: Subscribing._ack, P.FETCH: Pull._fetch,
        P.COMMIT: Pull._commit, P.STATS: _stats,
        **dict.fromkeys(P.CONTROL_KINDS, _control),
    }

    def next_deadline(self) -> float:
        """The time :meth:`tick` must next run (cleanup passes, timers, heartbeats)."""
        at = self._next_session_check
        if self.recovering is None:  # cleanup waits until every disk topic is rebuilt
            at = min(at, self._next_message_cleanup, self._next_subscriber_cleanup)
        if self._timers:
            at = min(at, self._timers[0][0])
        if self._delays:
            at = min(at, self._delays[0][0])
        return at

    def tick(self, now: float) -> None:
        """Run everything due at ``now``: delayed messages, redeliveries, ack timeouts,
        cleanup, heartbeats."""
        if self._delays:
            self._fire_delays(now)
        timers = self._timers
        due: dict[int, PushTimers] = {}
        while timers and timers[0][0] <= now:
            _, _, sub = heapq.heappop(timers)
            sub.wake_at = None
            due[id(sub)] = sub
        for sub in due.values():
            self._run_timers(sub, now)
        if now >= self._next_session_check:
            self._check_sessions(now)
        if self.recovering is not None:
            return  # cleanup waits until every disk topic is rebuilt
        if now >= self._next_message_cleanup and self._cleanup_messages(now):
            # an unfinished pass stays due: the shell runs its next slice at once,
            # after serving the sockets
            self._next_message_cleanup = _next_pass(self._next_message_cleanup,
                                                    self.config.message.cleanup_time, now)
        if now >= self._next_subscriber_cleanup:
            self._cleanup_subscribers(now)
            self._next_subscriber_cleanup = _next_pass(self._next_subscriber_cleanup,
                                                       self.config.subscriber.cleanup_time, now)
        self._pump(now)
        if self.cache.changed or self.cache.over:
            self._settle_cache()

    def take_output(self) -> list[tuple[int, list[list[Any]], bool]]:
        """Frames to send per connection, and whether to close it after sending."""
        out: list[tuple[int, list[list[Any]], bool]] = []
        for conn, session in list(self.sessions.items()):
            if session.ready or session.holds:  # replies held for durability (G9)
                if not session.holds:  # all released: what came after them goes too
                    session.ready += session.out
                    session.out = []
                if session.ready or session.close:
                    out.append((conn, session.ready, session.close))
                    session.ready = []
                    if session.close:
                        self.disconnect(conn, session.last_seen)
            elif session.out or session.close:
                out.append((conn, session.out, session.close))
                session.out = []
                if session.close:
                    self.disconnect(conn, session.last_seen)
        return out

    def adopt_recovered(self, topic: Topic, now: float,
                        info: dict[str, Any] | None = None) -> None:
        """Hold a disk topic rebuilt from its log (before the shard serves); ``info``:
        what its recovery read and found, for STATS."""
        if info is not None:
            self.recovery_info[topic.name] = info
        self.topics[topic.name] = topic
        self.retired.pop(topic.name, None)
        if topic.subs:
            self._subscribed[topic.name] = topic
        journal = topic.journal
        if journal is not None:
            journal.writer.snapshot = lambda: self._snapshot(topic)
            self._back(topic)
        for run in topic.delayed.runs():  # delayed messages survive restarts (G12)
            run.fire(now)  # those due by now are pushed as soon as a session attaches
            due = run.next_due()
            run.timer = math.inf if due is None else due
            if due is not None:
                heapq.heappush(self._delays, (due, next(self._timer_seq), run))
        self._recount(topic)
        self._reconcile_dead_letters(topic)  # a dead letter's record is its ack too (G11)

    def storage_progress(self, journal: TopicJournal, now: float) -> None:
        """The durable mark of ``journal`` moved: release replies, expose offsets, push."""
        if self._delays:
            self._fire_delays(now)
        ready, moved = journal.advance()
        if ready:
            self._pushes_sent(self._release(ready), now)
        topic = self.topics.get(journal.topic)
        if topic is not None and topic.journal is journal:
            if topic.log.settle_kept(journal.writer.durable):  # kept messages leave memory
                self._recount(topic)
            if moved:
                for sub in topic.subs.values():
                    if sub.pushing:
                        self._dirty[id(sub)] = sub
        self._pump(now)
        if self.cache.changed or self.cache.over:
            self._settle_cache()

    def storage_stopped(self, journal: TopicJournal, reason: str, now: float) -> None:
        """``journal``'s log failed (:meth:`storage_failed`), at ``now``."""
        self._pushes_sent(self.storage_failed(journal, reason), now)

    def take_down(self, name: str, reason: str, now: float) -> None:
        """Take disk topic ``name`` out of service while the shell recovers its log alone
        (damage read back, G9); the shard's other topics serve on. Replies waiting on its
        log fail (StorageUnavailable), each session attached to one of its subscriptions
        is told (SUB_ENDED StorageUnavailable), and requests naming it get Busy until
        :meth:`bring_up`. Its subscriptions are rebuilt from the log, not deleted."""
        self.down[name] = reason
        topic = self.topics.get(name)
        if topic is None:
            return
        if topic.journal is not None:
            self.storage_stopped(topic.journal, reason, now)
        message = (f"topic {name!r} is recovering its log after damage was read back;"
                   " subscribe again shortly")
        for session in self.sessions.values():
            for sid, sub in list(session.subs.items()):
                if sub.topic == name and sub.attached_as(session.conn, sid):
                    session.out.append([P.SUB_ENDED, sid, errors.StorageUnavailable.code,
                                        message])
                    self._detach_sid(sub, session.conn, sid, now)
        for sub in topic.subs.values():
            sub.deleted = True  # stale: timers, dead letters and pushes pass it by
        del self.topics[name]
        self._taken_down[name] = topic
        self._subscribed.pop(name, None)
        self.memory -= topic.counted
        store = topic.log.store
        if isinstance(store, TopicPayloads):
            for _, first in [key for key in self.cache.lru if key[0] is store]:
                store.drop(first)
        self._emit("topic_down", name, topic.generation)

    def refuse(self, name: str, why: str) -> None:
        """Refuse every request naming disk topic ``name`` from now on (StorageUnavailable,
        saying ``why``): its log directory holds what is not its log, which the shell
        leaves untouched (G9) and looks at again when a request names it
        (:attr:`on_refused`) until :meth:`serve_again`. The shard's other topics serve on."""
        self.refused[name] = why
        self.down.pop(name, None)
        self._taken_down.pop(name, None)

    def serve_again(self, name: str) -> None:
        """Refused topic ``name`` (or a refused directory's path) is refused no more: a
        look again found its log (adopted, :meth:`adopt_recovered`) or no directory."""
        self.refused.pop(name, None)

    def bring_up(self, name: str) -> None:
        """``name`` (adopted again, :meth:`adopt_recovered`) serves again. In the same
        generation (recovery found no damage) each rebuilt subscription that was
        inactive keeps its inactive clock: the shard never stopped (G6, G9)."""
        self.down.pop(name, None)
        old, topic = self._taken_down.pop(name, None), self.topics.get(name)
        if old is None or topic is None or topic.generation != old.generation:
            return
        for sub in topic.subs.values():
            before = old.subs.get(sub.name)
            if before is not None and not before.active:
                sub.inactive_since, sub.last_activity = before.inactive_since, before.last_activity

    def drain(self) -> None:
        """Refuse new publishes from now on (the shard is stopping)."""
        self.draining = True
