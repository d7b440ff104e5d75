"""Flux's typed errors: one class per failure a caller can act on.

Every error the broker sends travels as a numeric code plus a message
(PROTOCOL.md, "Error codes"); :func:`from_code` maps it back to the class here,
so clients raise exactly what the shard meant. Local failures (timeouts, a lost
connection) live in the same tree under :class:`FluxError`.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar


class FluxError(Exception):
    """Base of every Flux error."""

    code: ClassVar[int] = 1
    retryable: ClassVar[bool] = False

    def __init__(self, message: str = "", **details: Any) -> None:
        super().__init__(message or self.__class__.__doc__ or self.__class__.__name__)
        self.message = message
        self.details = details


# -- errors a shard or router reports (remote) ----------------------------------------


class RemoteError(FluxError):
    """The broker refused a request."""


class ProtocolError(RemoteError):
    """A frame could not be decoded or broke the protocol's rules."""

    code = 10
    #: frames decoded whole from the same input before the corruption was found
    complete_frames: list[Any]

    def __init__(self, message: str = "", **details: Any) -> None:
        super().__init__(message, **details)
        self.complete_frames = []


class FrameTooLarge(ProtocolError):
    """A frame's length prefix is over ``max_frame_bytes``."""

    code = 11


class UnsupportedVersion(ProtocolError):
    """The peer speaks a protocol version this side does not."""

    code = 12


class HelloTimeout(ProtocolError):
    """No HELLO arrived within ``limits.hello_timeout``; the connection is closed."""

    code = 13


class InvalidRequest(RemoteError):
    """A request had a wrong type, a missing field or an out-of-range value."""

    code = 20


class InvalidTopic(InvalidRequest):
    """A topic name breaks the naming rules (1-255 bytes, dot-separated tokens)."""

    code = 21


class InvalidMessageId(InvalidRequest):
    """A message id is empty or longer than 128 bytes."""

    code = 22


class MessageTooLarge(InvalidRequest):
    """A payload cannot fit in one frame."""

    code = 23


class InvalidKey(InvalidRequest):
    """A message key is not a string of 1-255 bytes of UTF-8."""

    code = 24


class InvalidHeaders(InvalidRequest):
    """Message headers are not a map of str to str, or use a name reserved for the
    broker (``flux-...``)."""

    code = 25


class InvalidDelay(InvalidRequest):
    """A ``delay`` or ``deliver_at`` is not a number, is negative, or is further away
    than the topic's ``message.max_delay``."""

    code = 26


class WrongShard(RemoteError):
    """This shard does not own the topic; refresh the shard map and retry."""

    code = 30
    retryable = True


class TopicFull(RemoteError):
    """The topic holds ``topic.max_bytes``; retry after consumers ack and cleanup runs."""

    code = 40
    retryable = True


class Busy(RemoteError):
    """Too many publishes of one topic are waiting, or the shard is still recovering its
    disk topics; retry (a publish with the same id)."""

    code = 41
    retryable = True


class StorageUnavailable(RemoteError):
    """A disk topic's log cannot take records now (disk full, an I/O error, recovering);
    nothing acked is lost. Retry with the same id."""

    code = 42
    retryable = True


class TopicReset(RemoteError):
    """The topic's shard restarted (new generation); offsets began again at 0."""

    code = 50

    def __init__(self, message: str = "", *, old: int | None = None, new: int | None = None,
                 **details: Any) -> None:
        super().__init__(message or f"topic reset: generation {old} -> {new}", **details)
        self.old = old
        self.new = new


class UnknownSubscription(RemoteError):
    """The subscription does not exist (never made, unsubscribed or cleaned up)."""

    code = 60


class SubscriptionInactive(RemoteError):
    """The subscription was deactivated; subscribe again with its name to resume."""

    code = 61


class SubscriptionTakenOver(RemoteError):
    """Another session subscribed with the same name; this one no longer receives."""

    code = 62


class NotDelivered(RemoteError):
    """An ack named an offset that was never delivered to this session."""

    code = 63


class OffsetOutOfRange(RemoteError):
    """A FETCH or COMMIT named an offset outside what the topic holds."""

    code = 64


class SubscriptionKindMismatch(InvalidRequest):
    """A subscribe asked for another kind than the named subscription is: a plain
    subscribe to a shared one (or the reverse), another ``key_ordered``, or a
    shared pull subscription. Nothing changed."""

    code = 65


class ShuttingDown(RemoteError):
    """The server is draining; reconnect and retry."""

    code = 70
    retryable = True


class NotAuthorized(RemoteError):
    """The request is not allowed on this connection: the user's permissions (``auth``)
    do not allow this operation on this topic, or it is a control frame on a client
    port (only the broker's own processes send those, on their control listeners).
    Nothing was done; the connection stays open."""

    code = 80


class TooManyConnections(RemoteError):
    """The router or shard holds ``limits.max_connections``; the connection is closed.
    Retry later."""

    code = 81
    retryable = True


class TooManySubscriptions(RemoteError):
    """The session holds ``limits.max_subscriptions`` push subscriptions; unsubscribe
    one, or subscribe on another connection."""

    code = 82


class SlowConsumer(RemoteError):
    """The client did not read its replies and deliveries: more than
    ``limits.max_output_bytes`` waited for it, so the connection is closed."""

    code = 83
    retryable = True


class AuthenticationFailed(RemoteError):
    """HELLO did not prove an identity the broker's ``auth`` section knows (a wrong or
    missing token, user or password), or the identity was removed by a reload; the
    connection is closed. Fix the credentials: retrying the same ones fails again."""

    code = 84


class SessionExpired(RemoteError):
    """The session token from the router's login is past its ``auth.session_ttl``;
    the connection is closed. The clients log in at the router again and retry."""

    code = 85
    retryable = True


class TooManyLogins(RemoteError):
    """This address tried more passwords than ``auth.logins_per_minute`` allows; the
    connection is closed. Retry later (a token login is never limited)."""

    code = 86
    retryable = True


# -- errors raised on the caller's side (local) ----------------------------------------


class LocalError(FluxError):
    """A failure seen by the client itself."""


class ConnectionLost(LocalError):
    """The connection closed before the request was answered."""

    code = 100
    retryable = True


class RequestTimeout(LocalError):
    """No reply arrived within ``request_timeout``."""

    code = 101
    retryable = True


class RetryDeadlineExceeded(LocalError):
    """A publish kept failing until ``retry_deadline`` ran out; it may or may not be stored."""

    code = 102


class ConfigError(LocalError):
    """A configuration key is unknown or its value is invalid."""

    code = 110

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"config {path}: {problem}")
        self.path = path
        self.problem = problem


class ClientClosed(LocalError):
    """The client or subscription was closed."""

    code = 120


class DataLoss(LocalError):
    """Messages a reader should get are gone: their shard restarted (a new
    generation) or cleanup deleted them (the Spark source's ``failOnDataLoss``)."""

    code = 130


def _all_remote() -> dict[int, type[RemoteError]]:
    out: dict[int, type[RemoteError]] = {}
    stack: list[type[RemoteError]] = [RemoteError]
    while stack:
        cls = stack.pop()
        out.setdefault(cls.code, cls)
        stack.extend(cls.__subclasses__())
    return out


_BY_CODE = _all_remote()


def from_code(code: int, message: str, details: dict[str, Any] | None = None) -> RemoteError:
    """Build the error class for a wire error ``code``; unknown codes become RemoteError."""
    cls = _BY_CODE.get(code, RemoteError)
    details = dict(details or {})
    if cls is TopicReset:
        return TopicReset(message, old=details.pop("old", None), new=details.pop("new", None),
                          **details)
    return cls(message, **details)


E = TypeVar("E", bound=BaseException)


def first_of(exc: BaseException, kind: type[E]) -> E | None:
    """The first ``kind`` in ``exc``: itself, or nested in exception groups (trio's
    nurseries wrap what their tasks raise)."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = first_of(inner, kind)
            if found is not None:
                return found
    return None
