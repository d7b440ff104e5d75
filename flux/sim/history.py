"""One schema of client-visible events, shared by the simulator and chaos runs.

A :class:`History` is metadata (seed, scenario, broker config, fault plan) plus
a list of events: publishes, subscribe replies, deliveries, acks, session ends,
faults and phases, and optionally *oracle* facts the broker itself reports
(cleanup trims, subscription deletions) where the runner can see them. Plain data
only: no trio here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

E = TypeVar("E", bound="Event")


@dataclass(frozen=True, slots=True)
class Event:
    """Something a client saw (or, for oracle events, the broker reported) at time ``t``."""

    kind: ClassVar[str] = "event"
    t: float

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            data[f.name] = list(value) if isinstance(value, tuple) else value
        return data


_KINDS: dict[str, type[Event]] = {}


def _event(cls: type[E]) -> type[E]:
    _KINDS[cls.kind] = cls
    return cls


# -- publishing ------------------------------------------------------------------------

def payload_key(data: bytes) -> str:
    """How a history names a payload: the text of a short ASCII one (the simulator's
    are), else a digest of it."""
    if len(data) <= 64 and data.isascii():
        return data.decode()
    return "#" + hashlib.blake2b(data, digest_size=8).hexdigest()


def meta_key(key: str | None, headers: dict[str, str] | None) -> str | None:
    """How a history names a message's key and headers (None: it has neither)."""
    if key is None and not headers:
        return None
    return json.dumps([key, headers or {}], sort_keys=True, separators=(",", ":"))


@_event
@dataclass(frozen=True, slots=True)
class PublishCalled(Event):
    """User code called ``publish`` or ``publish_many`` (the user-level operation, one
    however many attempts the client makes): ``call`` numbers a producer's calls;
    ``ids`` is None when the client chose the ids."""

    kind: ClassVar[str] = "publish_called"
    producer: str
    call: int
    topic: str
    payloads: tuple[str, ...]
    ids: tuple[str, ...] | None


@_event
@dataclass(frozen=True, slots=True)
class PublishReturned(Event):
    """The call returned its acks (message ``i``: ``ids[i]`` at ``offsets[i]`` of
    ``generations[i]``), or raised ``error`` (then the tuples are empty)."""

    kind: ClassVar[str] = "publish_returned"
    producer: str
    call: int
    topic: str
    ids: tuple[str, ...]
    offsets: tuple[int, ...]
    generations: tuple[int, ...]
    duplicates: tuple[bool, ...]
    error: str = ""


@_event
@dataclass(frozen=True, slots=True)
class PublishAttempted(Event):
    """A PUBLISH item left the client; ``op`` is its request id, ``attempt`` counts the
    client's sends of this (topic, id)."""

    kind: ClassVar[str] = "publish_attempted"
    producer: str
    op: int
    topic: str
    id: str
    attempt: int
    payload: str | None = None   # payload_key of what it carried (None: not recorded)
    delay: float = 0.0           # the delay it asked for (G12; 0: none)
    meta: str | None = None      # meta_key of its key and headers


@_event
@dataclass(frozen=True, slots=True)
class PublishAcked(Event):
    kind: ClassVar[str] = "publish_acked"
    producer: str
    op: int
    topic: str
    id: str
    generation: int
    offset: int
    duplicate: bool
    due: float | None = None     # the due time PUBLISHED gave a delayed message (wall)


@_event
@dataclass(frozen=True, slots=True)
class PublishFailed(Event):
    """The publish call raised: the message may or may not be stored (indefinite)."""

    kind: ClassVar[str] = "publish_failed"
    producer: str
    op: int
    topic: str
    id: str
    error: str
    generation: int | None = None   # the PUBLISHED reply's, when it refused the item


# -- subscribing -----------------------------------------------------------------------

@_event
@dataclass(frozen=True, slots=True)
class Subscribed(Event):
    """A session attached: the SUBSCRIBED reply. ``session`` counts a subscriber's attachments."""

    kind: ClassVar[str] = "subscribed"
    subscriber: str
    session: int
    client: str
    shard: int
    topic: str
    name: str | None
    generation: int
    created: bool
    start: int
    cursor: int
    reset: bool
    max_in_flight: int          # the window the shard says it applies
    asked_max_in_flight: int | None  # the window the SUBSCRIBE asked for
    requested: float            # when the SUBSCRIBE was sent
    known_generation: int | None  # the generation the SUBSCRIBE carried
    read_old: bool = False      # the start options the SUBSCRIBE carried
    from_offset: int | None = None
    on_reset: str = "earliest"
    mode: str = "push"          # "pull": a pull subscription (nothing attached; FETCH/COMMIT)
    # the generation of the shard incarnation that answered (HELLO_OK on this connection):
    # ``generation`` when the topic is in memory; a disk topic has its own (G9)
    shard_generation: int | None = None
    shared: bool = False        # a member of a shared subscription (G10)
    key_ordered: bool = False


@_event
@dataclass(frozen=True, slots=True)
class Delivered(Event):
    """A message reached the subscriber's code (``attempt`` 1 = first push in this session)."""

    kind: ClassVar[str] = "delivered"
    subscriber: str
    session: int
    topic: str
    generation: int
    offset: int
    id: str
    attempt: int
    timestamp: float
    payload: str | None = None   # payload_key of what it carried (None: not recorded)
    due: float | None = None     # a delayed message's due time (wall), as DELIVER gave it
    meta: str | None = None      # meta_key of its key and headers


@_event
@dataclass(frozen=True, slots=True)
class Consumed(Event):
    """The subscription iterator handed a message to user code."""

    kind: ClassVar[str] = "consumed"
    subscriber: str
    topic: str
    generation: int
    offset: int
    id: str
    attempt: int


@_event
@dataclass(frozen=True, slots=True)
class AckSent(Event):
    kind: ClassVar[str] = "ack_sent"
    subscriber: str
    session: int
    topic: str
    generation: int
    offsets: tuple[int, ...]
    through: int
    # G11, the ACK's settle items: (offset, delay) naks, termed and in-progress offsets
    naks: tuple[tuple[int, float], ...] = ()
    terms: tuple[int, ...] = ()
    progress: tuple[int, ...] = ()


@_event
@dataclass(frozen=True, slots=True)
class AckConfirmed(Event):
    """The shard confirmed acks (the ACKED reply to the ACK sent at ``requested``, its
    AckSent); ``cursor`` is the subscription's lowest unacked offset when it answered."""

    kind: ClassVar[str] = "ack_confirmed"
    subscriber: str
    session: int
    topic: str
    generation: int
    offsets: tuple[int, ...]    # explicit offsets the shard accepted
    through: int
    cursor: int
    requested: float            # when the ACK was sent
    naks: tuple[tuple[int, float], ...] = ()  # settle items the shard accepted (G11)
    terms: tuple[int, ...] = ()
    progress: tuple[int, ...] = ()


@_event
@dataclass(frozen=True, slots=True)
class AckRefused(Event):
    kind: ClassVar[str] = "ack_refused"
    subscriber: str
    session: int
    topic: str
    generation: int
    offset: int
    error: str
    settle: bool = False    # a refused nak, term or in_progress (G11), not an ack


@_event
@dataclass(frozen=True, slots=True)
class TopicWasReset(Event):
    """The subscription moved to a new generation (G7)."""

    kind: ClassVar[str] = "reset"
    subscriber: str
    session: int
    topic: str
    old: int
    new: int


@_event
@dataclass(frozen=True, slots=True)
class SessionEnded(Event):
    """A session stopped receiving. ``reason``: inactive, taken_over, unsubscribed,
    lost (the connection broke or the broker closed it), closed (the client closed it)."""

    kind: ClassVar[str] = "session_ended"
    subscriber: str
    session: int
    topic: str
    reason: str
    requested: float | None = None  # "unsubscribed": when the UNSUBSCRIBE was sent


# -- the pull path ---------------------------------------------------------------------

@_event
@dataclass(frozen=True, slots=True)
class FetchSent(Event):
    """A FETCH left the client: read ``topic`` from ``offset`` on, for pull subscription
    ``name`` (None: an anonymous read), in the ``generation`` the client knows (or None)."""

    kind: ClassVar[str] = "fetch_sent"
    subscriber: str
    client: str
    shard: int
    topic: str
    name: str | None
    generation: int | None
    offset: int
    max_messages: int


@_event
@dataclass(frozen=True, slots=True)
class Fetched(Event):
    """The FETCHED reply to the FETCH sent at ``requested``: message ``i`` is
    ``(first + i, ids[i])`` of ``generation``; ``[oldest, next)`` is what the shard held."""

    kind: ClassVar[str] = "fetched"
    subscriber: str
    client: str
    shard: int
    topic: str
    name: str | None
    generation: int
    asked_generation: int | None  # the generation the FETCH carried
    offset: int                   # the offset the FETCH asked for
    max_messages: int
    oldest: int
    next: int
    first: int
    ids: tuple[str, ...]
    requested: float
    payloads: tuple[str, ...] = ()   # payload_key of each message (empty: not recorded)
    metas: tuple[str | None, ...] = ()  # meta_key of each message (empty: not recorded)
    offsets: tuple[int, ...] = ()    # each message's offset, when a page has holes
    holes: bool = False              # the page gave its offsets one by one (``offsets``)

    def page(self) -> tuple[int, ...] | range:
        """The offset of each message of the page."""
        return self.offsets if self.holes else range(self.first, self.first + len(self.ids))


@_event
@dataclass(frozen=True, slots=True)
class CommitSent(Event):
    """A COMMIT left the client: move pull subscription ``name``'s cursor to ``offset``."""

    kind: ClassVar[str] = "commit_sent"
    subscriber: str
    client: str
    shard: int
    topic: str
    name: str
    generation: int | None
    offset: int


@_event
@dataclass(frozen=True, slots=True)
class Committed(Event):
    """The COMMITTED reply to the COMMIT of ``offset`` sent at ``requested``: the
    subscription's cursor after it."""

    kind: ClassVar[str] = "committed"
    subscriber: str
    client: str
    shard: int
    topic: str
    name: str
    generation: int | None      # the generation the COMMIT carried
    offset: int
    cursor: int
    requested: float


@_event
@dataclass(frozen=True, slots=True)
class PullRefused(Event):
    """An ERROR answered a FETCH or COMMIT (``request``) sent at ``requested``."""

    kind: ClassVar[str] = "pull_refused"
    subscriber: str
    client: str
    shard: int
    topic: str
    name: str | None
    request: str                # "fetch" or "commit"
    generation: int | None
    offset: int
    error: str
    requested: float


@_event
@dataclass(frozen=True, slots=True)
class ShardHello(Event):
    """A client connected to shard ``shard`` and learnt its generation (HELLO_OK)."""

    kind: ClassVar[str] = "shard_hello"
    client: str
    shard: int
    generation: int
    requested: float | None = None  # when the HELLO was sent (None: not recorded)


# -- bad input (G8) --------------------------------------------------------------------

@_event
@dataclass(frozen=True, slots=True)
class BadRequestSent(Event):
    """A client sent shard ``shard`` a request that is wrong on purpose (``what``); for a
    PUBLISH, ``valid`` lists the items that are fine and must be judged on their own."""

    kind: ClassVar[str] = "bad_request_sent"
    client: str
    shard: int
    rid: int
    what: str
    valid: tuple[int, ...] = ()


@_event
@dataclass(frozen=True, slots=True)
class BadRequestAnswered(Event):
    """The answer to a bad request: an ERROR (``error``: its class name) or a PUBLISHED
    with ``stored`` items and ``refused`` ones (``"index:ErrorName"``)."""

    kind: ClassVar[str] = "bad_request_answered"
    client: str
    shard: int
    rid: int
    what: str
    error: str = ""
    stored: tuple[int, ...] = ()
    refused: tuple[str, ...] = ()


@_event
@dataclass(frozen=True, slots=True)
class BadRequestUnanswered(Event):
    """No answer came to a bad request: the connection ``closed`` or it timed out."""

    kind: ClassVar[str] = "bad_request_unanswered"
    client: str
    shard: int
    rid: int
    what: str
    reason: str
    sent: float


# -- who may do what (G13) ---------------------------------------------------------------

@_event
@dataclass(frozen=True, slots=True)
class AuthChecked(Event):
    """A client tried ``operation`` ("publish", "subscribe", "fetch", "commit") on
    ``topic`` as its user: ``outcome`` is "accepted" or the error's class name."""

    kind: ClassVar[str] = "auth_checked"
    client: str
    operation: str
    topic: str
    outcome: str


# -- the world -------------------------------------------------------------------------

@_event
@dataclass(frozen=True, slots=True)
class FaultInjected(Event):
    kind: ClassVar[str] = "fault"
    fault: str          # crash, restart, pause, resume, partition, heal, reset, stall, slow...
    target: str
    detail: str = ""


@_event
@dataclass(frozen=True, slots=True)
class Phase(Event):
    """The run entered a phase: ``faults``, ``heal`` (liveness: faults over), ``end``."""

    kind: ClassVar[str] = "phase"
    name: str


@_event
@dataclass(frozen=True, slots=True)
class Trimmed(Event):
    """Oracle: a shard's cleanup deleted ``count`` messages of ``topic`` from ``first`` on."""

    kind: ClassVar[str] = "trimmed"
    shard: int
    generation: int
    topic: str
    first: int
    count: int


@_event
@dataclass(frozen=True, slots=True)
class SubscriptionGone(Event):
    """Oracle: a shard deleted a named subscription (G6 cleanup)."""

    kind: ClassVar[str] = "subscription_deleted"
    shard: int
    generation: int
    topic: str
    name: str


@_event
@dataclass(frozen=True, slots=True)
class EphemeralGone(Event):
    """Oracle: a shard deleted the ephemeral subscription of client session ``session``
    because that session ended there (an UNSUBSCRIBE, the connection closing, two silent
    heartbeat periods, a message out of pushes), perhaps before the client heard of it."""

    kind: ClassVar[str] = "ephemeral_deleted"
    shard: int
    generation: int
    topic: str
    session: int


@_event
@dataclass(frozen=True, slots=True)
class ShardStopped(Event):
    """Oracle: a shard incarnation ended (crashed, drained, or exited orphaned): every
    subscription of its generation is gone with it."""

    kind: ClassVar[str] = "shard_stopped"
    shard: int
    generation: int


def event_from_dict(data: dict[str, Any]) -> Event:
    """Rebuild an event from :meth:`Event.to_dict` output."""
    data = dict(data)
    cls = _KINDS[data.pop("kind")]
    for f in dataclasses.fields(cls):
        if isinstance(data.get(f.name), list):
            data[f.name] = tuple(tuple(x) if isinstance(x, list) else x
                                 for x in data[f.name])
    return cls(**data)


@dataclass
class History:
    """Metadata plus events in the order they happened."""

    meta: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)

    def add(self, event: Event) -> None:
        self.events.append(event)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    def of(self, cls: type[E]) -> list[E]:
        """Events of one kind, in order."""
        return [e for e in self.events if type(e) is cls]

    def lines(self) -> Iterator[str]:
        """Canonical JSON lines: the metadata first, then one line per event."""
        yield _canonical({"kind": "meta", **self.meta})
        for event in self.events:
            yield _canonical(event.to_dict())

    def digest(self) -> str:
        """sha256 over the canonical serialisation: equal histories, equal digests."""
        h = hashlib.sha256()
        for line in self.lines():
            h.update(line.encode())
            h.update(b"\n")
        return h.hexdigest()

    def dump(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            for line in self.lines():
                f.write(line + "\n")

    @classmethod
    def load(cls, path: str) -> History:
        history = cls()
        with open(path, encoding="utf-8") as f:
            for line in f:
                data = json.loads(line)
                if data.get("kind") == "meta":
                    data.pop("kind")
                    history.meta = data
                else:
                    history.add(event_from_dict(data))
        return history


def _canonical(data: dict[str, Any]) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def describe(event: Event) -> str:
    """One short human line for a trace."""
    fields = " ".join(f"{f.name}={_short(getattr(event, f.name))}"
                      for f in dataclasses.fields(event) if f.name != "t")
    return f"{event.t:12.6f} {event.kind:<20} {fields}"


def _short(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value > 1 << 32:
        return f"{value:#x}"[:10]
    if isinstance(value, tuple) and len(value) > 8:
        return f"({value[0]}..{value[-1]} n={len(value)})"
    return str(value)
