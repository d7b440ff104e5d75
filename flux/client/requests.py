"""What the client asks shards for: publish items and retried request/reply calls (sans-IO).

A :class:`PublishItem` is one message on its way; items of one shard are
coalesced into PUBLISH frames by :mod:`flux.client.core`. A :class:`Call` is any
other request (FETCH, COMMIT, STATS, pull SUBSCRIBE): it knows its frame and
how to read the reply. Both carry their retry deadline and last error.
"""

from __future__ import annotations

from typing import Any, Literal

from flux import errors, protocol
from flux.client.types import FetchedMessage, FetchResult, SubscribeInfo, Waiter

P = protocol
ITEM_OVERHEAD = 16       # msgpack array and length headers of one PUBLISH item, roughly
MAX_BATCH = 256          # items per PUBLISH frame
PUBLISH_WINDOW = 32      # PUBLISH frames awaiting their reply, per connection

CallKind = Literal["fetch", "commit", "stats", "subscribe_pull"]
_REPLY = {"fetch": P.FETCHED, "commit": P.COMMITTED, "stats": P.STATS_OK,
          "subscribe_pull": P.SUBSCRIBED}


class PublishItem(Waiter):
    """One message to publish; its id is fixed for every retry (G3)."""

    __slots__ = ("attempts", "deadline", "id", "in_flight", "last_error", "payload", "queued_at",
                 "size", "topic")

    def __init__(self, topic: str, message_id: str, payload: bytes, deadline: float,
                 queued_at: float = 0.0) -> None:
        super().__init__()
        self.topic = topic
        self.id = message_id
        self.payload = payload
        self.size = (len(topic) + len(payload) + ITEM_OVERHEAD
                     + (len(message_id) if message_id.isascii() else len(message_id.encode())))
        self.deadline = deadline
        self.queued_at = queued_at   # when the caller published it (linger counts from here)
        self.attempts = 0
        self.in_flight = False
        self.last_error: errors.FluxError | None = None

    def describe(self) -> str:
        return f"publish of id {self.id!r} to {self.topic!r}"

    def __repr__(self) -> str:
        return (f"<PublishItem {self.topic} id={self.id!r} {len(self.payload)}B"
                f" attempts={self.attempts} {'done' if self.done else 'pending'}>")


class Call(Waiter):
    """A request with one reply, retried on retryable errors until ``deadline``."""

    __slots__ = ("attempts", "body", "deadline", "in_flight", "kind", "last_error", "shard",
                 "topic")

    def __init__(self, kind: CallKind, *, topic: str | None, shard: int | None,
                 body: dict[str, Any], deadline: float) -> None:
        super().__init__()
        self.kind = kind
        self.topic = topic
        self.shard = shard          # fixed target (STATS); else routed by topic
        self.body = body
        self.deadline = deadline
        self.attempts = 0
        self.in_flight = False
        self.last_error: errors.FluxError | None = None

    def describe(self) -> str:
        return f"{self.kind} of {self.topic!r}" if self.topic is not None else self.kind

    def __repr__(self) -> str:
        where = self.topic if self.topic is not None else f"shard {self.shard}"
        return f"<Call {self.kind} {where} attempts={self.attempts}>"

    def frame(self, rid: int, sid: int) -> list[Any]:
        if self.kind == "fetch":
            return [P.FETCH, rid, self.body]
        if self.kind == "commit":
            return [P.COMMIT, rid, self.body]
        if self.kind == "stats":
            return [P.STATS, rid]
        return [P.SUBSCRIBE, rid, sid, self.body]

    def parse(self, frame: list[Any]) -> Any:
        """The caller's value from the reply frame; raises ProtocolError if malformed."""
        if frame[0] != _REPLY[self.kind]:
            raise errors.ProtocolError(
                f"{P.KIND_NAMES.get(frame[0], frame[0])} does not answer {self.kind}")
        try:
            if self.kind == "fetch":
                body = frame[2]
                gen = int(body["generation"])
                topic = str(self.topic)
                return FetchResult(topic, gen, int(body["oldest"]), int(body["next"]), [
                    FetchedMessage(topic, int(m[0]), gen, m[1], m[2], float(m[3]))
                    for m in body["messages"]])
            if self.kind == "commit":
                return int(frame[2]["cursor"])
            if self.kind == "stats":
                return dict(frame[2])
            return SubscribeInfo.from_reply(frame[3])
        except (IndexError, KeyError, TypeError, ValueError) as exc:
            raise errors.ProtocolError(
                f"malformed reply to {self.kind}: {exc.__class__.__name__}: {exc}") from None


def retryable(exc: errors.FluxError) -> bool:
    """Whether the client retries after ``exc`` (TopicFull is back-pressure: the caller's)."""
    return exc.retryable and not isinstance(exc, errors.TopicFull)


def deadline_exceeded(what: str, last: errors.FluxError | None) -> errors.RetryDeadlineExceeded:
    reason = f": last error {type(last).__name__}: {last}" if last is not None else ""
    exc = errors.RetryDeadlineExceeded(f"{what} kept failing until retry_deadline{reason}")
    exc.__cause__ = last
    return exc
