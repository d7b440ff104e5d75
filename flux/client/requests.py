"""What the client asks shards for: publish items and retried request/reply calls (sans-IO).

A :class:`PublishBatch` is messages of one topic on their way (one waiter per
``publish_many`` call), sent as :class:`PublishPart` ranges that
:mod:`flux.client.dispatch` coalesces into PUBLISH frames. A :class:`Call` is any
other request (FETCH, COMMIT, STATS, pull SUBSCRIBE): it knows its frame and
how to read the reply. Both carry their retry deadline and last error.
"""

from __future__ import annotations

from itertools import repeat
from operator import add
from typing import Any, Literal

from flux import errors, protocol
from flux.client.types import FetchedMessage, FetchResult, PublishAcks, SubscribeInfo, Waiter
from flux.message_meta import read_columns

P = protocol
ITEM_OVERHEAD = 8        # msgpack headers of one id and one payload in a PUBLISH group, at most
GROUP_OVERHEAD = 16      # msgpack headers of one PUBLISH group, besides its topic
MAX_BATCH = 256          # items per PUBLISH frame
PUBLISH_WINDOW = 32      # PUBLISH frames awaiting their reply, per connection

CallKind = Literal["fetch", "commit", "stats", "subscribe_pull"]
_REPLY = {"fetch": P.FETCHED, "commit": P.COMMITTED, "stats": P.STATS_OK,
          "subscribe_pull": P.SUBSCRIBED}


class PublishBatch(Waiter):
    """Messages of one topic published together (``publish`` is a batch of one).

    Done once every message is stored or failed; results are kept in parallel
    arrays (offsets, generations, duplicate flags) rather than one object per
    message, and :meth:`result` builds the acks. Each id is fixed for every
    retry (G3).
    """

    __slots__ = ("_sizes", "deadline", "dues", "duplicates", "failures", "generations", "ids",
                 "left", "offsets", "options", "payloads", "queued_at", "topic", "total_size")

    def __init__(self, topic: str, ids: list[str], payloads: list[bytes], deadline: float,
                 queued_at: float, id_bytes: int,
                 options: dict[str, Any] | None = None, options_size: int = 0) -> None:
        super().__init__()
        n = len(ids)
        # the PUBLISH group's options (PROTOCOL.md §6.4: keys, headers, delay, deliver_at,
        # each a column of n or one value for all); None: a plain group
        self.options = options
        self.dues: list[float | None] | None = None  # wall due times of delayed items
        self.topic = topic
        self.ids = ids
        self.payloads = payloads
        self.deadline = deadline
        self.queued_at = queued_at   # when the caller published it (linger counts from here)
        self.left = n                # messages neither stored nor failed yet
        self.offsets: list[int] = [P.REFUSED] * n
        self.generations: list[int] = [0] * n
        self.duplicates: list[bool] = [False] * n
        self.failures: dict[int, errors.FluxError] = {}   # index -> why it failed
        self.total_size = sum(map(len, payloads)) + id_bytes + n * ITEM_OVERHEAD + options_size
        self._sizes: list[int] | None = None

    def options_of(self, lo: int, hi: int) -> dict[str, Any]:
        """The group options of messages ``lo`` to ``hi`` (excluded)."""
        options = self.options
        assert options is not None
        if lo == 0 and hi == len(self.ids):
            return options
        return {name: value[lo:hi] if type(value) is list else value
                for name, value in options.items()}

    def set_dues(self, lo: int, dues: list[Any]) -> None:
        """The due times PUBLISHED gave messages from ``lo`` on (None: due when stored)."""
        if self.dues is None:
            self.dues = [None] * len(self.ids)
        self.dues[lo:lo + len(dues)] = [d if isinstance(d, float) else None for d in dues]

    def size(self, lo: int, hi: int) -> int:
        """Roughly the PUBLISH bytes of messages ``lo`` to ``hi`` (excluded)."""
        if lo == 0 and hi == len(self.ids):
            return self.total_size
        return sum(self.item_sizes()[lo:hi])

    def item_sizes(self) -> list[int]:
        """Each message's share of :meth:`size` (made when a part of the batch is sent)."""
        if self._sizes is None:
            ids = self.ids
            if not all(map(str.isascii, ids)):
                ids = [i.encode() for i in ids]   # type: ignore[misc]
            self._sizes = list(map(add, map(len, self.payloads),
                                   map(ITEM_OVERHEAD.__add__, map(len, ids))))
            if self.options is not None:  # keys and headers: share their bytes out
                each = (self.total_size - sum(self._sizes)) // max(1, len(ids)) + 1
                self._sizes = [size + each for size in self._sizes]
        return self._sizes

    def finish(self, count: int) -> bool:
        """``count`` more messages are stored or failed; True when that finished the batch."""
        self.left -= count
        if self.left <= 0 and not self.done:
            self.done = True
            return True
        return False

    def result(self) -> PublishAcks:
        """The acks in message order, or raise the first failure (in message order)."""
        if not self.done:
            raise RuntimeError("result() called before the batch finished")
        if self._error is not None:
            raise self._error
        if self.failures:
            raise self.failures[min(self.failures)]
        return PublishAcks(self.topic, self.ids, self.offsets, self.generations,
                           self.duplicates, self.dues)

    @property
    def error(self) -> errors.FluxError | None:
        if self._error is None and self.failures and self.done:
            return self.failures[min(self.failures)]
        return self._error

    def __repr__(self) -> str:
        return (f"<PublishBatch {self.topic} {len(self.ids)} messages, {self.left} left"
                f" {'done' if self.done else 'pending'}>")


class PublishPart:
    """Messages ``lo`` to ``hi`` (excluded) of a batch, on their way together.

    The unit that is queued, sent and retried: a whole batch normally; a frame
    that cannot take all of it splits it, and items refused one by one are split
    off (each keeps its attempts), so retries stay per message.
    """

    __slots__ = ("attempts", "batch", "hi", "in_flight", "last_error", "lo")

    def __init__(self, batch: PublishBatch, lo: int, hi: int, attempts: int = 0) -> None:
        self.batch = batch
        self.lo = lo
        self.hi = hi
        self.attempts = attempts
        self.in_flight = False
        self.last_error: errors.FluxError | None = None

    @property
    def done(self) -> bool:
        return self.batch.done

    @property
    def deadline(self) -> float:
        return self.batch.deadline

    @property
    def queued_at(self) -> float:
        return self.batch.queued_at

    @property
    def topic(self) -> str:
        return self.batch.topic

    @property
    def size(self) -> int:
        return self.batch.size(self.lo, self.hi)

    def split(self, count: int) -> PublishPart:
        """Cut off and return the first ``count`` messages; this part keeps the rest."""
        head = PublishPart(self.batch, self.lo, self.lo + count, self.attempts)
        head.last_error = self.last_error
        self.lo += count
        return head

    def fail(self, exc: errors.FluxError) -> bool:
        """Every message of the part failed with ``exc``; True if that finished the batch."""
        batch = self.batch
        if batch.done:
            return False
        batch.failures.update(dict.fromkeys(range(self.lo, self.hi), exc))
        return batch.finish(self.hi - self.lo)

    def describe(self) -> str:
        ids = self.batch.ids
        if self.hi - self.lo == 1:
            return f"publish of id {ids[self.lo]!r} to {self.topic!r}"
        return (f"publish of {self.hi - self.lo} messages (ids {ids[self.lo]!r} ..."
                f" {ids[self.hi - 1]!r}) to {self.topic!r}")

    def __repr__(self) -> str:
        return (f"<PublishPart {self.topic} [{self.lo}:{self.hi}] attempts={self.attempts}"
                f" {'done' if self.done else 'pending'}>")


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
                count = P.check_fetched(frame)
                body, first, ids, payloads, times = frame[2:7]
                gen = int(body["generation"])
                topic = str(self.topic)
                # offsets may have holes (DESIGN.md "Offsets with gaps")
                offsets = P.offsets_of(first, count)
                meta = read_columns(frame[7] if len(frame) > 7 else None, count)
                keys, headers, dues = meta if meta is not None else (
                    repeat(None, count), repeat(None, count), repeat(None, count))
                # FetchedMessage(...) of each, built by C code, as Message is
                messages = list(map(tuple.__new__, repeat(FetchedMessage, count), zip(
                    repeat(topic, count), offsets, repeat(gen, count),
                    ids, payloads, P.times_of(times), keys, headers, dues, strict=True)))
                return FetchResult(topic, gen, int(body["oldest"]), int(body["next"]),
                                   messages)
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
