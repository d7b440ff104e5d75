"""Values the client hands to callers (acks, messages, fetch results) and :class:`Waiter`.

Plain data with no I/O: the sans-IO core creates them, the trio (and later
asyncio) shells return them. A :class:`Waiter` is a one-shot result slot that a
shell parks a task on; the core fills it and lists it in ``take_woken()``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, overload

from flux import errors
from flux.message_meta import check_delay


class Wakeable:
    """Something a shell task may wait on; ``waker`` is the shell's (e.g. a trio.Event)."""

    __slots__ = ("waker",)

    def __init__(self) -> None:
        self.waker: Any = None


class Waiter(Wakeable):
    """A one-shot result: a value or a typed error, set once by the core."""

    __slots__ = ("_error", "_value", "done")

    def __init__(self) -> None:
        self.waker = None  # Wakeable.__init__, inlined: one Waiter is made per publish
        self.done = False
        self._value: Any = None
        self._error: errors.FluxError | None = None

    def set_value(self, value: Any) -> None:
        if not self.done:
            self.done, self._value = True, value

    def set_error(self, exc: errors.FluxError) -> None:
        if not self.done:
            self.done, self._error = True, exc

    def result(self) -> Any:
        """The value, or raise the error. Only valid once ``done``."""
        if not self.done:
            raise RuntimeError("result() called before the waiter finished")
        if self._error is not None:
            raise self._error
        return self._value

    @property
    def error(self) -> errors.FluxError | None:
        return self._error

    def __repr__(self) -> str:
        state = "pending" if not self.done else (
            f"error={self._error!r}" if self._error is not None else f"value={self._value!r}")
        return f"<{type(self).__name__} {state}>"


class PublishAck(NamedTuple):
    """The broker stored a message (or had already: ``duplicate``) at ``offset``.

    Immutable; a named tuple because one is made per published message."""

    topic: str
    id: str
    offset: int
    generation: int
    duplicate: bool
    due: float | None = None  # when it is due (wall seconds): a delayed message's (G12)


class PublishAcks(Sequence[PublishAck]):
    """The acks of a ``publish_many`` call, in message order.

    A read-only sequence (``len``, indexing, slicing, iteration, ``==`` with any
    sequence) whose :class:`PublishAck` items are made as they are read, so a
    producer that does not look at its acks does not pay for one object a message.
    """

    __slots__ = ("_dues", "_duplicates", "_generations", "_ids", "_offsets", "_topic")

    def __init__(self, topic: str, ids: Sequence[str], offsets: Sequence[int],
                 generations: Sequence[int], duplicates: Sequence[bool],
                 dues: Sequence[float | None] | None = None) -> None:
        self._topic = topic
        self._ids = ids
        self._offsets = offsets
        self._generations = generations
        self._duplicates = duplicates
        self._dues = dues

    def __len__(self) -> int:
        return len(self._ids)

    @overload
    def __getitem__(self, index: int) -> PublishAck: ...

    @overload
    def __getitem__(self, index: slice) -> list[PublishAck]: ...

    def __getitem__(self, index: int | slice) -> PublishAck | list[PublishAck]:
        if isinstance(index, slice):
            return list(self)[index]
        i = range(len(self._ids))[index]  # negative indexes and IndexError as a list's
        return PublishAck(self._topic, self._ids[i], self._offsets[i], self._generations[i],
                          self._duplicates[i], self._dues[i] if self._dues is not None else None)

    def __iter__(self) -> Iterator[PublishAck]:
        n = len(self._ids)
        dues = self._dues if self._dues is not None else repeat(None, n)
        # tuple.__new__ makes each named tuple in C
        return map(tuple.__new__, repeat(PublishAck, n), zip(  # type: ignore[arg-type]
            repeat(self._topic, n), self._ids, self._offsets, self._generations,
            self._duplicates, dues, strict=True))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PublishAcks | list):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PublishAcks({list(self)!r})"


@dataclass(frozen=True, slots=True)
class SubscribeInfo:
    """The shard's SUBSCRIBED reply: where the subscription starts and stands."""

    created: bool
    start_offset: int
    cursor: int
    generation: int
    clamped: bool
    reset: bool
    next_offset: int
    max_in_flight: int

    @classmethod
    def from_reply(cls, body: dict[str, Any]) -> SubscribeInfo:
        return cls(created=bool(body["created"]), start_offset=int(body["start_offset"]),
                   cursor=int(body["cursor"]), generation=int(body["generation"]),
                   clamped=bool(body.get("clamped", False)), reset=bool(body.get("reset", False)),
                   next_offset=int(body.get("next_offset", 0)),
                   max_in_flight=int(body.get("max_in_flight", 0)))


class StoredMessage(tuple[Any, ...]):
    """What pushed and fetched messages share: where and when a message was stored, its
    id and payload. Immutable; a tuple underneath (made in bulk, by C code)."""

    __slots__ = ()

    if TYPE_CHECKING:
        topic: str
        offset: int
        generation: int
        id: str
        payload: bytes
        timestamp: float
    else:
        topic = property(itemgetter(0), doc="the topic")
        offset = property(itemgetter(1), doc="the offset in the topic (of this generation)")
        generation = property(itemgetter(2), doc="the shard generation it was stored in")
        id = property(itemgetter(3), doc="the message id")
        payload = property(itemgetter(4), doc="the payload bytes")
        timestamp = property(itemgetter(5), doc="when the shard stored it (epoch seconds)")

    def __getnewargs__(self) -> tuple[Any, ...]:
        return tuple(self)

    # where key, headers and due are in the tuple, after a subclass's fields; a message
    # that has none of them is a shorter tuple (made faster, in bulk)
    _META: ClassVar[int] = 6

    @property
    def key(self) -> str | None:
        """The message's key, if it was published with one."""
        i = self._META
        key: str | None = self[i] if len(self) > i else None
        return key

    @property
    def headers(self) -> dict[str, str]:
        """The message's headers (empty if it was published with none)."""
        i = self._META + 1
        headers: dict[str, str] | None = self[i] if len(self) > i else None
        return dict(headers) if headers else {}

    @property
    def due(self) -> float | None:
        """When a delayed message was due (wall seconds, G12); None: due when stored."""
        i = self._META + 2
        due: float | None = self[i] if len(self) > i else None
        return due


class Message(StoredMessage):
    """A pushed message. ``attempt`` is 1 for a first delivery in this session.

    ``await msg.ack()`` queues the ack (idempotent); it never raises: a refused
    ack surfaces from the subscription's iterator. Immutable; a tuple underneath
    (one is made per delivered message, in bulk, by C code).
    """

    __slots__ = ()
    _META: ClassVar[int] = 9

    if TYPE_CHECKING:
        attempt: int
        _session: object
        _acker: Callable[[Message], None] | None
    else:
        attempt = property(itemgetter(6), doc="push number in this session (1: first)")
        _session = property(itemgetter(7))
        _acker = property(itemgetter(8))

    def __new__(cls, topic: str, offset: int, generation: int, id: str, payload: bytes,
                timestamp: float, attempt: int, session: object = None,
                acker: Callable[[Message], None] | None = None, key: str | None = None,
                headers: dict[str, str] | None = None, due: float | None = None) -> Message:
        return tuple.__new__(cls, (topic, offset, generation, id, payload, timestamp, attempt,
                                   session, acker, key, headers, due))

    async def ack(self) -> None:
        """Queue the ack of this message; it is sent coalesced with others."""
        acker = self[8]
        if acker is not None:
            acker(self)

    async def nak(self, delay: float = 0) -> None:
        """Give the message back (G11): it leaves the in-flight window now and is pushed
        again ``delay`` seconds from when the shard gets the nak (that push counts; a
        nak on its last allowed push exhausts it at once). Sent at once, never raises
        for the broker: a refusal (NotDelivered: not held by this session any more)
        surfaces from the subscription's iterator. Raises InvalidDelay for a negative
        or non-numeric ``delay`` (over the topic's ``message.max_delay``: refused)."""
        delay = check_delay(delay, math.inf, "nak delay")
        settle = settler(self)
        if settle is not None:
            settle(self, "nak", delay)

    async def term(self, reason: str = "") -> None:
        """No more pushes of this message (G11): with the topic's ``dead_letter`` policy
        it goes to the subscription's dead-letter topic with ``reason``; without, it
        counts as acked. Sent at once; a refusal surfaces from the iterator. Raises
        InvalidRequest for a ``reason`` that is not a string of at most 1024 bytes."""
        check_reason(reason)
        settle = settler(self)
        if settle is not None:
            settle(self, "term", reason)

    async def in_progress(self) -> None:
        """Still working on it (G11): the message's ack deadline becomes now plus the
        topic's ``subscriber.timeout``; no push is used. Sent at once; a refusal
        surfaces from the iterator."""
        settle = settler(self)
        if settle is not None:
            settle(self, "progress", None)

    def __repr__(self) -> str:
        return (f"<Message {self.topic}@{self.offset} gen={self.generation:#x} id={self.id!r}"
                f" attempt={self.attempt} {len(self.payload)}B>")


MAX_REASON_BYTES = 1024  # a term's reason (the shard's limit too)


def check_reason(reason: object) -> str:
    """Return a term ``reason`` if it is a string of at most 1024 bytes, else raise
    InvalidRequest."""
    if not isinstance(reason, str) or len(reason.encode("utf-8", "replace")) > MAX_REASON_BYTES:
        raise errors.InvalidRequest(f"a term reason is a string of at most {MAX_REASON_BYTES}"
                                    " bytes")
    return reason


def settler(msg: Message) -> Callable[[Message, str, Any], None] | None:
    """The function that queues ``msg``'s nak, term or in_progress (None: not ackable)."""
    acker = msg[8]
    return getattr(acker, "settle", None) if acker is not None else None


class FetchedMessage(StoredMessage):
    """A message read through the pull path (FETCH); nothing to ack, COMMIT instead.
    One is made per message of a FETCHED, in bulk."""

    __slots__ = ()

    def __new__(cls, topic: str, offset: int, generation: int, id: str, payload: bytes,
                timestamp: float, key: str | None = None, headers: dict[str, str] | None = None,
                due: float | None = None) -> FetchedMessage:
        return tuple.__new__(cls, (topic, offset, generation, id, payload, timestamp, key,
                                   headers, due))

    def __repr__(self) -> str:
        return (f"FetchedMessage(topic={self.topic!r}, offset={self.offset},"
                f" generation={self.generation:#x}, id={self.id!r},"
                f" payload={self.payload!r}, timestamp={self.timestamp!r})")


@dataclass(frozen=True, slots=True)
class FetchResult:
    """A FETCH reply: held range ``[oldest, next)`` and the messages read from it."""

    topic: str
    generation: int
    oldest: int
    next: int
    messages: list[FetchedMessage]
