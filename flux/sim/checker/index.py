"""Views of a history the checks share: sessions, subscription incarnations, faults.

A *session* is one SUBSCRIBED reply and what followed on it; an *incarnation*
is a subscription (topic, generation, name) from its creation to its deletion;
fault intervals say when a host was disturbed, so timing checks skip those spans.
Shard hosts are named ``shard-<index>``, the router ``router``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import dataclass, field
from typing import Any

from flux import config as config_mod
from flux.config import StorageConfig
from flux.errors import ConfigError
from flux.hashing import dead_letter_topic
from flux.policies import TopicPolicy, TopicSettings, resolve, storage_defaults
from flux.sim import history as h
from flux.sim.faults import decode_plan

# a slow link's latency factor when the history's plan does not say (the largest drawn)
SLOW_FACTOR_UNKNOWN = 30.0
# how far a dead letter's ``flux-time`` (wall seconds printed to the microsecond, read
# back as a float near 1.7e9) may lie after the simulated instant it was written
FLUX_TIME_SLACK = 1e-6
# faults after which a disk topic's dead-letter topic may lack what it held (G9)
DEAD_LETTER_LOSSES = ("power", "flip", "eio")


@dataclass(frozen=True)
class Params:
    """The broker config the checks need, plus the network's one-way latency bound."""

    ttl: float
    message_cleanup: float
    dedup_window: float
    retry_count: int
    retry_interval: float
    timeout: float
    subscriber_cleanup: float
    inactive_time: float
    heartbeat: float
    max_in_flight: int = 1000
    latency: float = 0.1
    dead_letter: bool = False   # the topic's dead-letter policy (G11)

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> Params:
        config = meta.get("config", {})
        m, s = config.get("message", {}), config.get("subscriber", {})
        return cls(ttl=m.get("ttl", 60.0), message_cleanup=m.get("cleanup_time", 5.0),
                   dedup_window=m.get("dedup_window", 120.0),
                   retry_count=s.get("retry_count", 5), retry_interval=s.get("retry_interval", 1.0),
                   timeout=s.get("timeout", 30.0), subscriber_cleanup=s.get("cleanup_time", 10.0),
                   inactive_time=s.get("inactive_time", 300.0), heartbeat=s.get("heartbeat", 5.0),
                   max_in_flight=s.get("max_in_flight", 1000),
                   latency=meta.get("latency_bound", 0.1),
                   dead_letter=bool((config.get("dead_letter") or {}).get("enabled", False)))

    @property
    def period(self) -> float:
        """Time between two pushes of one unacked message (G4)."""
        return self.timeout + self.retry_interval

    def settings(self) -> TopicSettings:
        """The per-topic keys of these params (a policy's keys go over them)."""
        return TopicSettings(match=None, ttl=self.ttl, dedup_window=self.dedup_window,
                             max_bytes=0, retry_count=self.retry_count,
                             retry_interval=self.retry_interval, timeout=self.timeout,
                             inactive_time=self.inactive_time, dead_letter=self.dead_letter)

    def with_settings(self, settings: TopicSettings) -> Params:
        """These params with a topic's settings in place of the global values."""
        return dataclasses.replace(
            self, ttl=settings.ttl, dedup_window=settings.dedup_window,
            retry_count=settings.retry_count, retry_interval=settings.retry_interval,
            timeout=settings.timeout, inactive_time=settings.inactive_time,
            dead_letter=settings.dead_letter)


def topic_policies(meta: dict[str, Any], base: TopicSettings
                   ) -> tuple[tuple[tuple[str, ...], TopicSettings], ...]:
    """The broker's topic policies (meta's config ``topics``), each applied over ``base``,
    validated and ordered as the shards read them. None when the config has none, or
    when they do not validate (a history from a broker that had none)."""
    raw = meta.get("config", {}).get("topics")
    if not raw:
        return ()
    try:
        # (with the storage section: a policy of disk storage needs the data directory)
        storage = meta.get("config", {}).get("storage") or {}
        policies = config_mod.from_dict(
            {"topics": raw, "storage": {"dir": storage.get("dir") or "/data"}}).topics
    except ConfigError:
        return ()
    return tuple((policy.tokens, _by_storage(meta, policy.apply(base), policy))
                 for policy in policies)


def _by_storage(meta: dict[str, Any], settings: TopicSettings,
                policy: TopicPolicy | None) -> TopicSettings:
    """``settings`` with the storage-dependent defaults the shards apply (disk topics'
    ``storage.inactive_time``), through the broker's own rule."""
    config = meta.get("config", {})
    storage = config.get("storage") or {}
    return storage_defaults(
        settings, policy, inactive_time=config.get("subscriber", {}).get("inactive_time", 300.0),
        disk_inactive_time=storage.get("inactive_time", StorageConfig.inactive_time))


@dataclass(eq=False)
class Session:
    sub: h.Subscribed
    incarnation: Incarnation
    events: list[h.Event] = field(default_factory=list)
    end: h.SessionEnded | None = None

    @property
    def host(self) -> str:
        return f"shard-{self.sub.shard}"

    def window(self, cap: int) -> int:
        """The most unacked pushes the shard may have out: what was asked, capped by config."""
        asked = self.sub.asked_max_in_flight
        return min(asked, cap) if asked else cap


@dataclass(eq=False)
class Incarnation:
    """A subscription from its creation (or first sight) to its deletion."""

    topic: str
    generation: int
    name: str | None
    start: int
    created_at: float
    known_start: bool
    sessions: list[Session] = field(default_factory=list)
    events: list[h.Event] = field(default_factory=list)   # every session's, in order
    deleted_at: float | None = None
    died_with_shard: bool = False     # deleted because its shard incarnation ended (G7)
    # where in the history the oracle says its shard deleted it (an index into
    # ``history.events``: a trim at the same instant may come before or after that)
    deleted_event: int | None = None
    # made by a SUBSCRIBE that reset, or asked for read_old or a from_offset, on a topic
    # that carries delayed messages: it starts at the oldest message held (or at its
    # from_offset), which may be a kept delayed message below offsets of its generation
    # cleaned up before it was made, so its start does not prove those held then (G12;
    # one a recovery carried into a new generation has gaps only of the old one's)
    below_gaps: bool = False

    @property
    def key(self) -> tuple[str, int, str | None]:
        return (self.topic, self.generation, self.name)


def _start_asked(sub: h.Subscribed) -> bool:
    """Whether a SUBSCRIBE that made a subscription set its start at the oldest message
    held or at a from_offset (a reset, ``read_old``, ``from_offset``)."""
    return sub.reset or sub.read_old or sub.from_offset is not None


@dataclass(frozen=True)
class Disturbance:
    fault: str
    hosts: tuple[str, ...]
    begin: float
    end: float


class Index:
    """Everything the checks look up, built in one pass over the history."""

    def __init__(self, history: h.History) -> None:
        self.history = history
        self.params = Params.from_meta(history.meta)
        storage = history.meta.get("config", {}).get("storage") or {}
        self._base = _by_storage(history.meta, dataclasses.replace(
            self.params.settings(), storage=storage.get("kind", "memory")), None)
        self._policies = topic_policies(history.meta, self._base)
        self._topic_params: dict[str, Params] = {}
        self.sessions: dict[int, Session] = {}
        self.incarnations: list[Incarnation] = []
        self._current: dict[tuple[str, int, str], Incarnation] = {}
        self.disturbances: list[Disturbance] = []
        self.heal_at = math.inf
        self.stopped: dict[int, float] = {}   # generation -> when its shard stopped
        # the generations of shard incarnations; any other generation is a disk topic's
        # own (G9), which outlives the incarnations of its shard
        self.shard_generations: set[int] = {
            e.generation for e in history.events if isinstance(e, (h.ShardHello, h.ShardStopped))}
        # per shard index: when an incarnation stopped, and when clients heard one answer
        self._stops: dict[int, list[float]] = {}
        self._hellos: dict[int, list[float]] = {}
        for e in history.events:
            if isinstance(e, h.ShardStopped):
                self._stops.setdefault(e.shard, []).append(e.t)
            elif isinstance(e, h.ShardHello) and e.shard >= 0:
                self._hellos.setdefault(e.shard, []).append(e.t)
        self.end_at = history.events[-1].t if history.events else 0.0
        # the topics some publish asked to delay (G12 replaces G1's offset order there)
        self.delayed: set[str] = set()
        self._slow_factor: float | None = None
        # begins of faults not ended yet, per (kind, target): two of one kind may overlap
        open_faults: dict[tuple[str, str], list[float]] = {}
        for position, event in enumerate(history.events):
            if isinstance(event, h.Subscribed):
                self._subscribed(event)
            elif isinstance(event, h.PublishAttempted):
                if event.delay > 0:
                    self.delayed.add(event.topic)
            elif isinstance(event, (h.Delivered, h.AckSent, h.AckConfirmed, h.AckRefused,
                                    h.TopicWasReset, h.SessionEnded)):
                session = self.sessions.get(event.session)
                if session is not None:
                    session.events.append(event)
                    session.incarnation.events.append(event)
                    if isinstance(event, h.SessionEnded) and session.end is None:
                        session.end = event
            elif isinstance(event, h.SubscriptionGone):
                inc = self._current.pop((event.topic, event.generation, event.name), None)
                if inc is not None:
                    inc.deleted_at, inc.deleted_event = event.t, position
            elif isinstance(event, h.EphemeralGone):
                session = self.sessions.get(event.session)
                if session is not None:
                    inc = session.incarnation
                    if inc.name is None and inc.deleted_event is None \
                            and inc.key == (event.topic, event.generation, None) \
                            and session.sub.shard == event.shard:
                        inc.deleted_event = position
            elif isinstance(event, h.ShardStopped):
                self.stopped.setdefault(event.generation, event.t)
                for key in [k for k in self._current if k[1] == event.generation]:
                    inc = self._current.pop(key)
                    inc.deleted_at, inc.deleted_event = event.t, position
                    inc.died_with_shard = True
            elif isinstance(event, h.FaultInjected):
                self._fault(event, open_faults)
            elif isinstance(event, h.Phase) and event.name == "heal":
                self.heal_at = min(self.heal_at, event.t)
        for inc in self.incarnations:  # (no gap above a start where nothing is kept)
            inc.below_gaps = inc.below_gaps and inc.topic in self.delayed
        for (fault, target), begins in open_faults.items():
            if not begins:
                continue
            begin = begins[0]
            end = self.heal_at if self.heal_at < math.inf else self.end_at
            self.disturbances.append(Disturbance(fault, _hosts(target), begin,
                                                 max(begin, end) + self._tail(fault)))

    def stopped_between(self, shard: int, begin: float, end: float) -> bool:
        """Whether an incarnation of ``shard`` stopped at or after ``begin`` and before ``end``."""
        return any(begin <= t < end for t in self._stops.get(shard, ()))

    def recovered_deadline(self, shard: int, since: float, slack: float) -> float:
        """When a disk topic's inactive subscription on ``shard``, inactive since ``since``,
        must be gone: ``slack`` after ``since``, or after the recovery of a restart within
        that span (recovery restarts its inactive clock, G9). A recovery is over by the
        time a client hears the new incarnation answer."""
        deadline = since + slack
        stops, hellos = self._stops.get(shard, []), self._hellos.get(shard, [])
        while True:
            stop = next((t for t in stops if since < t <= deadline), None)
            if stop is None:
                return deadline
            up = next((t for t in hellos if t > stop), None)
            if up is None:
                return math.inf
            since, deadline = up, up + slack

    def _subscribed(self, sub: h.Subscribed) -> None:
        inc: Incarnation | None = None
        if sub.name is not None:
            key = (sub.topic, sub.generation, sub.name)
            inc = self._current.get(key)
            if sub.created and inc is not None and not inc.known_start \
                    and inc.created_at >= sub.requested:
                # replies on two connections crossed: this SUBSCRIBE created the
                # subscription that an earlier-received reply already found
                inc.start, inc.known_start = sub.start, True
                inc.created_at = sub.t
                inc.below_gaps = _start_asked(sub)
            elif sub.created or inc is None:
                inc = Incarnation(sub.topic, sub.generation, sub.name,
                                  sub.start if sub.created else sub.cursor, sub.t, sub.created,
                                  below_gaps=sub.created and _start_asked(sub))
                self._current[key] = inc
                self.incarnations.append(inc)
        else:
            inc = Incarnation(sub.topic, sub.generation, None, sub.start, sub.t, True,
                              below_gaps=_start_asked(sub))
            self.incarnations.append(inc)
        session = Session(sub, inc)
        inc.sessions.append(session)
        inc.events.append(sub)
        self.sessions[sub.session] = session

    def _fault(self, event: h.FaultInjected,
               open_faults: dict[tuple[str, str], list[float]]) -> None:
        key = (event.fault, event.target)
        if event.detail == "begin":
            open_faults.setdefault(key, []).append(event.t)
        elif event.detail == "end":
            # the earliest still open: overlapping spans pair up to cover their union
            begins = open_faults.get(key)
            begin = begins.pop(0) if begins else event.t
            self.disturbances.append(Disturbance(event.fault, _hosts(event.target), begin,
                                                 event.t + self._tail(event.fault)))
        else:  # an instant fault
            self.disturbances.append(Disturbance(event.fault, _hosts(event.target), event.t,
                                                 event.t))

    def _tail(self, fault: str) -> float:
        """How long a fault keeps disturbing its link after it ends: what a slow link sent
        arrives up to ``factor`` latency bounds later, and a stream delivers in order, so
        what is sent just after it ends queues behind that."""
        if fault != "slow":
            return 0.0
        if self._slow_factor is None:
            try:
                plan = decode_plan(str(self.history.meta.get("plan", "")))
            except ValueError:
                plan = None
            factors = [f.factor for f in plan.faults if f.kind == "slow"] if plan else []
            self._slow_factor = max(factors, default=SLOW_FACTOR_UNKNOWN)
        return self._slow_factor * self.params.latency

    def params_for(self, topic: str) -> Params:
        """The params of ``topic``: its policy's ttl, dedup window and subscriber values
        over the global ones, matched as the shards match them (first match wins)."""
        params = self._topic_params.get(topic)
        if params is None:
            settings = resolve(self._policies, topic, self._base)
            params = self.params.with_settings(settings)
            self._topic_params[topic] = params
        return params

    @functools.cached_property
    def dead_letters(self) -> dict[tuple[str, int, str], dict[int, DeadLetter]]:
        """Every dead letter a FETCH of a dead-letter topic showed (G11), by (source topic,
        source generation, subscription) and source offset: the first sighting."""
        found: dict[tuple[str, int, str], dict[int, DeadLetter]] = {}
        epoch = float(self.history.meta.get("epoch", 0.0))
        for e in self.history:
            if not isinstance(e, h.Fetched) or "~" not in e.topic or not e.metas:
                continue
            for i, (message_id, meta) in enumerate(zip(e.ids, e.metas, strict=False)):
                letter = DeadLetter.read(e, i, message_id, meta, epoch)
                if letter is not None:
                    found.setdefault(letter.key, {}).setdefault(letter.offset, letter)
        return found

    @functools.cached_property
    def terms(self) -> dict[tuple[str, int, str | None], dict[int, float]]:
        """When a term of each offset was first sent, by subscription incarnation key."""
        sent: dict[tuple[str, int, str | None], dict[int, float]] = {}
        for inc in self.incarnations:
            for e in inc.events:
                if isinstance(e, h.AckSent) and e.terms:
                    for o in e.terms:
                        sent.setdefault(inc.key, {}).setdefault(o, e.t)
        return sent

    def settled(self, inc: Incarnation) -> dict[int, float]:
        """Offsets of ``inc`` the shard may count acked without an ack (G11): those a term
        was sent for (from its sending) and dead letters seen (from when written)."""
        out = dict(self.terms.get(inc.key, {}))
        if self.params_for(inc.topic).dead_letter and self._dead_letters_may_be_lost(inc):
            # a dead letter no reader saw may be gone: any message delivered may be one
            for e in inc.events:
                if isinstance(e, h.Delivered) and e.offset not in out:
                    out[e.offset] = e.t
        if inc.name is not None:
            for o, letter in self.dead_letters.get((inc.topic, inc.generation, inc.name),
                                                   {}).items():
                at = letter.at - FLUX_TIME_SLACK   # (at the same instant as a trim after it)
                if o not in out or at < out[o]:
                    out[o] = at
        return out

    def _dead_letters_may_be_lost(self, inc: Incarnation) -> bool:
        """Whether a storage fault (power, flipped bits, I/O errors) hit the machine of
        ``inc``'s shard: its dead-letter topic may have lost dead letters (G9)."""
        hosts = {f"shard-{s.sub.shard}" for s in inc.sessions}
        return any(d.fault in DEAD_LETTER_LOSSES and hosts & set(d.hosts)
                   for d in self.disturbances)

    @functools.cached_property
    def _whole_letter_reads(self) -> dict[str, list[tuple[float, int,
                                                           frozenset[tuple[int, int]]]]]:
        """Every FETCHED of a dead-letter topic that showed every dead letter it was ever
        given (from offset 0, none trimmed yet), by topic, in the order sent: (sent, its
        generation, the (source generation, source offset) of each dead letter shown)."""
        reads: dict[str, list[tuple[float, int, frozenset[tuple[int, int]]]]] = {}
        for e in self.history:
            if not isinstance(e, h.Fetched) or "~" not in e.topic or e.offset or e.oldest \
                    or e.holes or e.first + len(e.ids) < e.next \
                    or len(e.metas) != len(e.ids):
                continue
            shown = set()
            for meta in e.metas:
                try:
                    headers = json.loads(meta or "null")[1]
                    shown.add((int(headers["flux-generation"]), int(headers["flux-offset"])))
                except (ValueError, KeyError, TypeError, IndexError):
                    continue
            reads.setdefault(e.topic, []).append((e.requested, e.generation, frozenset(shown)))
        for found in reads.values():
            found.sort(key=lambda read: read[0])
        return reads

    def unseen_letter_from(self, inc: Incarnation, offset: int) -> float:
        """The earliest time a dead letter of ``offset`` that no read showed may have been
        written for named subscription ``inc`` of a memory topic (G11): one written by
        then is in every whole read of its dead-letter topic that the shard handled
        since (after the read was sent), as long as that shard incarnation lives. So
        the latest whole read of the generation without it was sent before it was
        written; it may be unseen for good when the shard stopped after that read.
        ``inf`` without a dead-letter policy, and for a disk topic (a dead letter shows
        only once durable, but it stays: a later read shows it)."""
        if inc.name is None or not self.params_for(inc.topic).dead_letter \
                or inc.generation not in self.shard_generations \
                or offset in self.dead_letters.get((inc.topic, inc.generation, inc.name), {}):
            return math.inf   # (a dead letter seen: its own time counts, in ``settled``)
        earliest = 0.0
        for sent, generation, shown in self._whole_letter_reads.get(
                dead_letter_topic(inc.topic, inc.name), ()):
            if generation == inc.generation and (inc.generation, offset) not in shown:
                earliest = sent
        return earliest

    @functools.cached_property
    def commits(self) -> dict[tuple[str, str], list[tuple[float, int | None, int]]]:
        """Every COMMIT sent, by (topic, pull subscription name): (when, generation, offset)."""
        commits: dict[tuple[str, str], list[tuple[float, int | None, int]]] = {}
        for e in self.history:
            if isinstance(e, h.CommitSent):
                commits.setdefault((e.topic, e.name), []).append((e.t, e.generation, e.offset))
        return commits

    def last_attached(self, session: Session) -> float:
        """A time at which the shard surely had ``session`` attached, as late as the
        history shows: when it handled the SUBSCRIBE or an ACK it confirmed (after they
        were sent, however slow the links), or sent a reply or push that arrived at
        ``t`` over a link no fault touched (within the latency bound before ``t``)."""
        lat = self.params.latency
        hosts = (session.sub.client, session.host)
        latest = session.sub.requested
        for e in (session.sub, *session.events):
            if isinstance(e, h.AckConfirmed):
                latest = max(latest, e.requested)
            if isinstance(e, (h.Subscribed, h.Delivered, h.AckConfirmed)) and e.t - lat > latest \
                    and self.quiet(hosts, e.t - lat, e.t):
                latest = e.t - lat
        return latest

    def quiet(self, hosts: tuple[str, ...], t1: float, t2: float) -> bool:
        """No fault touched any of ``hosts`` between ``t1`` and ``t2`` (with a margin)."""
        margin = self.params.latency
        for d in self.disturbances:
            if d.begin <= t2 + margin and d.end >= t1 - margin \
                    and any(host in d.hosts for host in hosts):
                return False
        return True


@dataclass(frozen=True)
class DeadLetter:
    """A dead letter as a FETCH of its dead-letter topic showed it (G11)."""

    topic: str              # the source topic
    generation: int         # the source topic's generation
    subscription: str
    offset: int             # in the source topic
    id: str
    payload: str            # payload_key
    reason: str
    pushes: int
    at: float               # when it was dead-lettered (simulated time, from flux-time)
    seen: float             # when the FETCHED showing it arrived
    dead_letter_topic: str
    meta: str | None        # meta_key of its key and headers, the reserved ones left out

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.topic, self.generation, self.subscription)

    @classmethod
    def read(cls, e: h.Fetched, i: int, message_id: str, meta: str | None,
             epoch: float) -> DeadLetter | None:
        if meta is None:
            return None
        try:
            key, headers = json.loads(meta)
            letter = cls(headers["flux-topic"], int(headers["flux-generation"]),
                         headers["flux-subscription"], int(headers["flux-offset"]), message_id,
                         e.payloads[i] if i < len(e.payloads) else "", headers["flux-reason"],
                         int(headers["flux-pushes"]), float(headers["flux-time"]) - epoch, e.t,
                         e.topic, h.meta_key(key, {k: v for k, v in headers.items()
                                                   if not k.startswith("flux-")}))
        except (ValueError, KeyError, TypeError):
            return None
        return letter


def _hosts(target: str) -> tuple[str, ...]:
    for sep in ("<->", "->"):
        if sep in target:
            return tuple(target.split(sep))
    return (target,)
