"""The shard core's state and the helpers every part of it shares.

:class:`ShardState` holds one shard incarnation's topics, sessions and timers
and the few operations several parts need (ownership, attachments, events).
The frame handlers and timers live in the mixins that ``ShardCore`` combines.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flux import errors, protocol
from flux.acks import Acks
from flux.auth.identity import Identity
from flux.auth.users import AuthConfig
from flux.config import Config
from flux.hashing import DEAD_LETTER_SEP, dead_letter_source, shard_for
from flux.histogram import LatencyHistogram
from flux.policies import TopicSettings
from flux.shard.cache import PayloadCache, TopicPayloads
from flux.shard.dedup import DICT_ID_COST, DedupWindow
from flux.shard.due_index import DueRun, TopicDelays
from flux.shard.journal import (
    CURSOR,
    SNAPSHOT,
    UNSUBSCRIBED,
    Held,
    TopicJournal,
    snapshot_body,
    subscription_row,
)
from flux.shard.subscription import PushTimers, Subscription
from flux.shard.topic import TopicLog

P = protocol
MAX_CREDIT = 1 << 30
# room a DELIVER or FETCHED frame needs around one message's payload and id (the id's
# length is counted in characters: up to 96 more bytes for a 128-byte id)
MESSAGE_FRAME_SLACK = 256
FETCH_MAX_MESSAGES = 10_000
# Memory a held message and a remembered id take beyond their bytes (measured: a held
# 100-byte message with a 32-character id and its dedup entry costs about 140 bytes
# more than payload and id; an id alone about 120 more, its string header included).
# shard.max_memory counts with these, the id twice while its message is held; a publish
# is let in at a dict's cost an id, and a topic is counted again (Topic.footprint) at
# what its window's ids take (less once the window is compact).
MESSAGE_COST = 60
REMEMBERED_ID_COST = DICT_ID_COST


@dataclass(eq=False)
class Topic:
    """A topic's log, dedup window and subscriptions (by name, in creation order), and
    the settings its policy gives it (resolved once, when the topic is made)."""

    name: str
    log: TopicLog
    dedup: DedupWindow
    settings: TopicSettings
    subs: dict[str, Subscription] = field(default_factory=dict)
    counted: int = 0  # its footprint in the shard's ``memory`` when last counted
    generation: int = 0  # a memory topic's is its shard's; a disk topic keeps its own (G9)
    journal: TopicJournal | None = None  # a disk topic's log (None: a memory topic)
    # every held message published with a delay (G12), in runs of offsets; the
    # first pushes of these come from each subscription's due heap
    delayed: TopicDelays = field(default_factory=TopicDelays)

    def __post_init__(self) -> None:
        self.log.dues = self.delayed  # the only place due times are kept

    @property
    def exposed(self) -> int:
        """The end of what deliveries and FETCH may reach: every offset stored, or for a
        disk topic every offset whose record is durable (G9)."""
        journal = self.journal
        return self.log.next_offset if journal is None else journal.exposed

    def held_bytes(self, now: float) -> int:
        """Payload and id bytes held in memory at ``now`` (ids past their dedup window not
        counted; a disk topic's payloads evicted to its log not counted either)."""
        return self.log.held_bytes + self.dedup.live_bytes(now)

    def footprint(self) -> int:
        """The memory its messages and remembered ids take, as shard.max_memory counts it."""
        log, dedup = self.log, self.dedup
        return (log.held_bytes + len(log) * MESSAGE_COST
                + dedup.held_bytes + len(dedup) * dedup.id_cost)


@dataclass(eq=False)
class Session:
    """One client connection to this shard."""

    conn: int
    opened_at: float
    last_seen: float
    hello: bool = False
    identity: Identity | None = None  # who HELLO proved (None: auth is off)
    certificate: str | None = None    # the common name of its TLS client certificate
    paused: bool = False  # the shell does not read it: its output is not being read
    subs: dict[int, Subscription] = field(default_factory=dict)  # client sid -> subscription
    out: list[list[Any]] = field(default_factory=list)  # frames to send (behind any hold)
    close: bool = False
    # replies held for durability (disk topics, G9), oldest first; ``out`` is behind the
    # last of them, and ``ready`` holds what may go out meanwhile
    holds: deque[Held] = field(default_factory=deque)
    ready: list[list[Any]] = field(default_factory=list)



class ShardState:
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
        # users and permissions (G13): None while auth is off; a reload replaces it
        self.auth: AuthConfig | None = config.auth if config.auth.enabled else None
        self.secret = ""  # the broker secret, which signs session tokens (set by the shell)
        self.topics: dict[str, Topic] = {}
        # the next offset of each topic forgotten while empty (see Cleanup._retire):
        # a topic used again continues from there, so no offset is reused (G1)
        self.retired: dict[str, int] = {}
        self._subscribed: dict[str, Topic] = {}  # the topics with a subscription
        # what every topic's messages and ids take (Topic.footprint, summed), and the cap
        self.memory = 0
        self.max_memory = config.shard_max_memory(shard_count)
        # disk topics' payloads in memory beyond what is not durable yet (storage.cache_bytes)
        self.cache = PayloadCache(config.storage.cache_bytes)
        self.publish_acks = LatencyHistogram()  # observed by the shell (PUBLISH -> PUBLISHED)
        self.fsync_times = LatencyHistogram()   # observed by the disk topics' log writers
        self.sessions: dict[int, Session] = {}
        self._conn_ids = itertools.count(1)
        self._timer_seq = itertools.count()
        self._timers: list[tuple[float, int, PushTimers]] = []
        # the runs of delayed messages with some not due yet, as (earliest such due, seq,
        # run): the shard's timer index of G12 (a heap: one entry per run, the earliest on
        # top, nothing else looked at)
        self._delays: list[tuple[float, int, DueRun]] = []
        self._stale_delays = 0  # entries of _delays whose run's timer came earlier since
        self._dirty: dict[int, Subscription] = {}
        self._owned: dict[str, bool] = {}
        self._started = now
        self._next_message_cleanup = now + config.message.cleanup_time
        self._cleanup_pending: list[str] | None = None  # topics the running pass has left
        self._next_subscriber_cleanup = now + config.subscriber.cleanup_time
        self._next_session_check = now + 2 * config.subscriber.heartbeat
        self.draining = False
        # opens a new disk topic's journal (the shell sets it when storage.dir is set):
        # (name, first offset) -> journal
        self.open_journal: Callable[[str, int], TopicJournal] | None = None
        self.recovery_info: dict[str, dict[str, Any]] = {}  # disk topic -> its recovery
        # what the recovery of disk topics has done so far, while it runs (G9): every
        # request gets Busy meanwhile; None once the shard serves
        self.recovering: str | None = None
        # disk topics whose log is being recovered alone (damage read back), and why:
        # requests naming one get Busy meanwhile
        self.down: dict[str, str] = {}
        self._taken_down: dict[str, Topic] = {}   # each one's topic as it was taken down
        # disk topics whose log directory holds what is not their log (G9), and the line
        # that says so; requests naming one get StorageUnavailable. A hashed directory
        # that names no topic is keyed by its path
        self.refused: dict[str, str] = {}
        # told the name of each refused topic a request names (the shell looks at its
        # directory again, ``ShardStorage.recheck``)
        self.on_refused: Callable[[str], None] | None = None
        # why disk topics take no publishes now (the data directory's disk is short of
        # ``storage.reserved_bytes``, or a write found it full); None: they do
        self.disk_full: str | None = None
        # optional observer of internal events, e.g. ("deleted", topic, offset, count)
        self.on_event: Callable[[tuple[Any, ...]], None] | None = None
        # the process's garbage collector figures for STATS ``gc`` (set by a real shard
        # process, flux.shard.__main__; None: no such field, as in the simulator)
        self.process_stats: Callable[[], dict[str, Any]] | None = None
        self.counters = {"published": 0, "duplicates": 0, "delivered": 0, "redelivered": 0,
                         "acked": 0, "trimmed": 0, "bytes_in": 0, "dead_lettered": 0,
                         "dead_letter_refused": 0}
        # subscriptions with dead letters their dead-letter topic refused (G11): the
        # cleanup pass tries them again
        self._dead_pending: dict[int, Subscription] = {}

    def _close_session(self, session: Session, exc: errors.FluxError, now: float) -> None:
        """Tell ``session`` why with an ERROR (rid 0), detach its subscriptions and close
        it once that is sent (one of the reasons DESIGN.md lets a connection close). The
        ERROR goes ahead of any reply still held for durability: the connection closes now."""
        (session.ready if session.holds else session.out).append(P.error_frame(0, exc))
        session.close = True
        self._end_session_attachments(session, now)

    def _authorize(self, session: Session, operation: str, topic: str) -> str:
        """``topic`` if the session may do ``operation`` on it; else NotAuthorized."""
        identity = session.identity
        if identity is None:
            return topic
        # a dead-letter topic (G11) is read by those who may subscribe to its source
        # topic, or administer it (flux dlq)
        source = dead_letter_source(topic)
        if source is not None:
            may = identity.permissions.may
            if may(operation, source) or (operation == "subscribe" and may("admin", source)):
                return topic
            raise errors.NotAuthorized(
                f"user {identity.user!r} may not {operation} on dead-letter topic {topic!r}"
                f" (it needs {operation} or admin on {source!r})")
        if not identity.permissions.may(operation, topic):
            raise errors.NotAuthorized(
                f"user {identity.user!r} may not {operation} on topic {topic!r}")
        return topic

    def _end_session_attachments(self, session: Session, now: float) -> None:
        for sid, sub in list(session.subs.items()):
            self._detach_sid(sub, session.conn, sid, now)

    def _detach_sid(self, sub: Subscription, conn: int, sid: int, now: float) -> None:
        """Connection ``conn``'s ``sid`` stops taking pushes from ``sub`` (if attached);
        a shared subscription's member leaves (:mod:`flux.shard.sharing`)."""
        if sub.session == (conn, sid):
            self._end_attachment(sub, now)

    def _check_owned(self, topic: Any, readable: bool = False) -> str:
        """``topic`` if it is a valid topic name this shard owns; ``readable``: a
        dead-letter topic's name too (G11: SUBSCRIBE, FETCH and COMMIT read those)."""
        if readable and isinstance(topic, str) and DEAD_LETTER_SEP in topic:
            P.check_readable_topic(topic)
            index = shard_for(topic, self.shard_count)
            if self.check_ownership and index != self.index:
                raise errors.WrongShard(f"topic {topic!r} belongs to shard {index}, not"
                                        f" {self.index}; refresh the shard map")
            return self._check_up(topic)
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
        return self._check_up(str(topic))

    def _check_up(self, name: str) -> str:
        """``name``, unless its log is being recovered (damage read back): Busy; or its
        log directory was refused: StorageUnavailable."""
        if self.down and name in self.down:
            raise errors.Busy(f"topic {name!r} is recovering its log ({self.down[name]});"
                              " retry shortly")
        if self.refused and name in self.refused:
            if self.on_refused is not None:
                self.on_refused(name)
            raise errors.StorageUnavailable(f"topic {name!r} cannot be served:"
                                            f" {self.refused[name]}")
        return name

    def _topic(self, name: str) -> Topic:
        """The topic ``name``, made (and registered) if this shard holds none."""
        topic = self.topics.get(name)
        if topic is None:
            topic = self.topics[name] = self._new_topic(name)
            self.retired.pop(name, None)
        return topic

    def _new_topic(self, name: str) -> Topic:
        """An empty topic, not registered: it continues where a retired one stopped.
        Busy while a topic of that name is recovering its log (a dead letter waits)."""
        self._check_up(name)
        settings = self.config.settings_for(name)
        start = self.retired.get(name, 0)
        disk = settings.storage == "disk"
        topic = Topic(name, TopicLog(start, placed=disk), DedupWindow(settings.dedup_window),
                      settings, generation=self.generation)
        if disk:
            if self.open_journal is None:
                raise errors.StorageUnavailable(
                    f"topic {name!r} is a disk topic, but this shard has no data directory")
            topic.journal = journal = self.open_journal(name, start)
            topic.generation = journal.generation
            journal.writer.snapshot = lambda: self._snapshot(topic)
            self._back(topic)
        return topic

    def _back(self, topic: Topic) -> None:
        """Let a disk topic's payloads leave memory: its log reads them back from its
        journal's records, through the shard's cache (if the journal can read records)."""
        journal = topic.journal
        if journal is not None and journal.reader is not None and topic.log.placed:
            topic.log.store = TopicPayloads(self.cache, topic, journal, self.epoch)

    def _settle_cache(self) -> None:
        """Recount the disk topics whose resident payloads changed, and evict the least
        recently used chunks past the cache's budget."""
        cache = self.cache
        if cache.over:
            cache.shrink(cache.used - cache.budget)
        changed = cache.changed
        if changed:
            cache.changed = {}
            for store in changed.values():
                if self.topics.get(store.topic.name) is store.topic:
                    self._recount(store.topic)

    def _make_room(self, topic: Topic, need: int, now: float) -> None:
        """Evict cached payloads so that ``need`` more bytes fit under ``shard.max_memory``
        and the disk topic's ``topic.max_bytes`` (which count only what is in memory)."""
        cache = self.cache
        over = self.memory + need - self.max_memory
        if over > 0:
            cache.shrink(over)
            self._settle_cache()
        store = topic.log.store
        over = topic.held_bytes(now) + need - topic.settings.max_bytes
        if over > 0 and isinstance(store, TopicPayloads):
            cache.shrink(over, owner=store)
            self._settle_cache()

    def _snapshot(self, topic: Topic) -> tuple[int, bytes]:
        """A disk topic's whole state as the record each log segment starts with."""
        epoch = self.epoch
        subs = [subscription_row(sub, epoch) for sub in topic.subs.values() if not sub.ephemeral]
        journal = topic.journal
        if journal is None:
            return SNAPSHOT, snapshot_body(topic.log.next_offset, topic.log.oldest, subs)
        # what the log records so far: a trim whose TRIM (and KEEP records) are not
        # appended yet is not in it
        return SNAPSHOT, snapshot_body(topic.log.next_offset, journal.trimmed_to, subs,
                                       journal.kept)

    def _journal_cursor(self, topic: Topic, sub: Subscription) -> TopicJournal | None:
        """Record a named subscription's cursor and acks in its disk topic's log; the
        journal the reply must wait for (None: a memory topic or an ephemeral one). The
        first record of a subscription (since it was made or recovered) carries every
        ack above the cursor, each later one only the acks added since: a message held
        unacked for long under a stream of acks does not make each record longer. Acks
        travel as runs (``Acks.as_runs``), so even the first costs two numbers a run."""
        journal = topic.journal
        if journal is None or sub.ephemeral:
            return None
        cursor = sub.cursor
        if sub.recording:
            added = sub.unrecorded
            added.drop_below(cursor + 1)
            runs = added.as_runs()
            sub.unrecorded = Acks()
        else:
            runs = sub.acked.as_runs()
            sub.recording = True
        journal.append(CURSOR, [sub.name, cursor, runs])
        return journal

    def _release(self, held: list[Held]) -> list[Held]:
        """Replies whose records became durable may go, each with what queued behind it,
        as soon as every reply held before it on its connection went too. Returns the
        held replies that went (their ``pushes`` start their ack timeouts now)."""
        sessions = self.sessions
        gone: list[Held] = []
        for h in held:
            h.released = True
            session = sessions.get(h.conn)
            if session is None:
                continue
            holds = session.holds
            while holds and holds[0].released:
                first = holds.popleft()
                gone.append(first)
                session.ready.append(first.frame)
                session.ready += first.behind
                if not holds:  # the frames made since the last hold are free too
                    session.ready += session.out
                    session.out = []
        return gone

    def storage_failed(self, journal: TopicJournal, reason: str) -> list[Held]:
        """``journal``'s log stopped: its waiting replies become StorageUnavailable errors;
        its topic refuses publishes from now on (the shell restarts the shard to recover).
        Returns the held replies that went (as :meth:`_release`)."""
        exc = errors.StorageUnavailable(f"the log of topic {journal.topic!r} failed: {reason}")
        failed = journal.fail(reason)
        for held in failed:
            held.waiting = 0
            held.frame = P.error_frame(held.frame[1], exc)
        return self._release(failed)

    def _journal_hold(self, session: Session, frame: list[Any],
                      journals: list[TopicJournal]) -> Held | None:
        """Send ``frame`` once each journal's records appended so far are durable; the
        reply held back, or None if it went out at once (or as an error)."""
        failed = next((j for j in journals if j.failed is not None), None)
        if failed is not None:
            session.out.append(P.error_frame(frame[1], errors.StorageUnavailable(
                f"the log of topic {failed.topic!r} is unavailable ({failed.failed})")))
            return None
        held = Held(session.conn, frame)
        waiting = False
        for journal in journals:
            waiting = journal.hold(held, journal.writer.appended) or waiting
        if not waiting:
            session.out.append(frame)
            return None
        holds = session.holds
        if holds:
            holds[-1].behind += session.out
        else:
            session.ready += session.out
        session.out = []
        holds.append(held)
        return held

    def _recount(self, topic: Topic) -> None:
        """Bring ``memory`` up to date with ``topic`` after it changed."""
        now_counted = topic.footprint()
        self.memory += now_counted - topic.counted
        topic.counted = now_counted

    def _next_offset(self, name: str) -> int:
        """The next offset of ``name`` (held, retired, or never used: 0)."""
        topic = self.topics.get(name)
        return topic.log.next_offset if topic is not None else self.retired.get(name, 0)

    def _end_attachment(self, sub: Subscription, now: float) -> None:
        sub.detach(now)
        if sub.ephemeral:
            self._delete_subscription(sub)

    def _delete_subscription(self, sub: Subscription) -> None:
        topic = self.topics.get(sub.topic)
        if topic is not None and topic.subs.get(sub.name) is sub:
            del topic.subs[sub.name]
            if not topic.subs:
                del self._subscribed[topic.name]
            if topic.journal is not None and not sub.ephemeral:
                topic.journal.append(UNSUBSCRIBED, [sub.name])
        sub.deleted = True
        sub.detach(sub.inactive_since)
        self._emit("deleted_subscription", sub.topic, sub.name)

    def _emit(self, *event: Any) -> None:
        if self.on_event is not None:
            self.on_event(event)


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
