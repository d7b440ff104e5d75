"""The wire protocol: length-prefixed MessagePack frames, shared by broker and clients.

Sans-IO: :class:`FrameDecoder` turns bytes into frames and :func:`encode` turns
frames into bytes; nothing here touches a socket or a clock. A frame is a
MessagePack array whose first element is its kind (the constants below).
PROTOCOL.md documents every frame; the field order here is the wire order.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain, repeat
from typing import Any, Final, overload

import msgpack

from flux import errors
from flux.hashing import DEAD_LETTER_SEP

VERSION: Final = 6
# the versions a broker speaks: a client of version 5 (before shared subscriptions,
# nak/term and dead letters) keeps working for what it knew
SUPPORTED_VERSIONS: Final = (5, 6)
DEFAULT_MAX_FRAME_BYTES: Final = 8 * 1024 * 1024
HEADER = struct.Struct(">I")

# -- frame kinds ----------------------------------------------------------------------
# connection
HELLO: Final = 1          # [HELLO, rid, {version, role, ...}]
HELLO_OK: Final = 2       # [HELLO_OK, rid, {version, shard_count, shards, ...}]
ERROR: Final = 3          # [ERROR, rid, code, message, details]
PING: Final = 4           # [PING, rid]
PONG: Final = 5           # [PONG, rid]
# publishing
PUBLISH: Final = 10       # [PUBLISH, rid, [[topic, [id, ...], [payload, ...](, opts)], ...]]
PUBLISHED: Final = 11     # [PUBLISHED, rid, generation, [[offsets, duplicates, refused(, gen(, due))], ...]]
# push subscriptions
SUBSCRIBE: Final = 20     # [SUBSCRIBE, rid, sid, {options}]
SUBSCRIBED: Final = 21    # [SUBSCRIBED, rid, sid, {reply}]
UNSUBSCRIBE: Final = 22   # [UNSUBSCRIBE, rid, sid]
UNSUBSCRIBED: Final = 23  # [UNSUBSCRIBED, rid, sid]
CREDIT: Final = 24        # [CREDIT, sid, n]
DELIVER: Final = 30       # [DELIVER, sid, generation, attempt, offsets, ids, payloads, times(, meta)]
SUB_ENDED: Final = 31     # [SUB_ENDED, sid, code, message]
ACK: Final = 40           # [ACK, rid, sid, generation, [offset, ...], through(, settle)]
ACKED: Final = 41         # [ACKED, rid, sid, cursor, [[offset, code, message], ...]]
# pull path
FETCH: Final = 50         # [FETCH, rid, {topic, name, generation, offset, max_messages, max_bytes}]
FETCHED: Final = 51       # [FETCHED, rid, {generation, oldest, next}, offsets, ids, payloads, times(, meta)]
COMMIT: Final = 52        # [COMMIT, rid, {topic, name, generation, offset}]
COMMITTED: Final = 53     # [COMMITTED, rid, {cursor}]
STATS: Final = 60         # [STATS, rid]
STATS_OK: Final = 61      # [STATS_OK, rid, {...}]
# router control (shard <-> router, on control listeners only; refused on client ports)
REGISTER: Final = 80      # [REGISTER, rid, {index, pid, generation, address, advertise,
                          #                  shard_count, control, recovering, nonce, proof}]
REGISTERED: Final = 81    # [REGISTERED, rid, {proof, auth}]
DRAIN: Final = 82         # [DRAIN, rid] or, refusing a REGISTER, [DRAIN, rid, {proof}]
ADOPT: Final = 83         # [ADOPT, rid, {control, nonce, proof}]
CHALLENGE: Final = 84     # [CHALLENGE, 0, {nonce}]: a control listener's first frame
ADOPTED: Final = 85       # [ADOPTED, rid, {proof}]
AUTH: Final = 86          # [AUTH, 0, {auth}]: the router's reloaded auth section (SIGHUP)
READY: Final = 87         # [READY, 0]: a shard that registered recovering now serves
# the kinds a client-facing port refuses (NotAuthorized) whatever their body
CONTROL_KINDS: Final = frozenset({REGISTER, REGISTERED, DRAIN, ADOPT, CHALLENGE, ADOPTED,
                                  AUTH, READY})

KIND_NAMES: Final = {
    v: k for k, v in list(globals().items()) if k.isupper() and isinstance(v, int)
    and k not in {"VERSION", "DEFAULT_MAX_FRAME_BYTES"}
}

# the offset PUBLISHED gives a refused item (its error is in the group's ``refused``)
REFUSED: Final = -1

MAX_TOPIC_BYTES: Final = 255
MAX_ID_BYTES: Final = 128
_TOPIC_RE = re.compile(r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*\Z")

_packer = msgpack.Packer(use_bin_type=True)


def control_refused(kind: int) -> errors.NotAuthorized:
    """The refusal of a control frame (CONTROL_KINDS) that reached a client-facing port."""
    return errors.NotAuthorized(
        f"{KIND_NAMES.get(kind, str(kind))} is a control frame: only the broker's own"
        " processes send it, on their control listeners, never on a client port")


def encode(frame: list[Any] | tuple[Any, ...]) -> bytes:
    """Encode one frame with its 4-byte big-endian length prefix."""
    body = _pack_body(frame)
    return HEADER.pack(len(body)) + body


def encode_many(frames: list[Any]) -> bytes:
    """Encode several frames into one buffer, ready for a single ``send_all``."""
    parts: list[bytes] = []
    for frame in frames:
        body = _pack_body(frame)
        parts.append(HEADER.pack(len(body)))
        parts.append(body)
    return b"".join(parts)


def _pack_body(frame: list[Any] | tuple[Any, ...]) -> bytes:
    n = len(frame)
    if n >= 7:
        # DELIVER and FETCHED end with [..., payloads, times(, meta)], the payloads often
        # held as MessagePack already: splice them in, never re-encode them
        i = n - 2 if type(frame[n - 2]) is PackedPayloads else \
            n - 3 if type(frame[n - 3]) is PackedPayloads else 0
        if i:
            payloads: PackedPayloads = frame[i]
            head = _packer.pack(frame[:i])  # a short array: its first byte becomes the frame's
            return b"".join((bytes((0x90 | n,)), memoryview(head)[1:],
                             array_header(payloads.length), *payloads.parts,
                             *map(_packer.pack, frame[i + 1:])))
    body: bytes = _packer.pack(frame)
    return body


# -- offsets as a first offset or an array (PUBLISHED, DELIVER), store times as runs
# (DELIVER, FETCHED) ---------------------------------------------------------------------


def offsets_field(offsets: Sequence[int]) -> int | list[int]:
    """An ``offsets`` field: the first offset of a contiguous run (a ``range``), else
    the offsets as an array."""
    if type(offsets) is range:
        return offsets.start
    return offsets if type(offsets) is list else list(offsets)


def time_runs(times: Iterable[float]) -> list[float | int]:
    """A ``times`` field (DELIVER, FETCHED): per-message store times as runs,
    ``[time, count, ...]``."""
    runs: list[float | int] = []
    last: float | None = None
    for t in times:
        if t == last:
            runs[-1] += 1
        else:
            runs += (t, 1)
            last = t
    return runs


def offsets_of(offsets: int | list[int], count: int) -> Sequence[int]:
    """The ``count`` offsets an ``offsets`` field (PUBLISHED, DELIVER) stands for."""
    if isinstance(offsets, int):
        return range(offsets, offsets + count)
    return offsets


def times_of(runs: list[Any]) -> Iterator[float]:
    """Per-message store times from a ``times`` field's runs (DELIVER, FETCHED)."""
    if len(runs) == 2:
        return repeat(runs[0], runs[1])
    return chain.from_iterable(map(repeat, runs[0::2], runs[1::2]))


def check_fetched(frame: list[Any]) -> int:
    """The message count of a well-formed FETCHED; ValueError for any other shape."""
    if len(frame) not in (7, 8) or not isinstance(frame[2], dict):
        raise ValueError("FETCHED needs seven fields (eight with meta), the third a map")
    first, ids, payloads, runs = frame[3:7]
    count = _check_columns(ids, payloads, runs)
    if not ((type(first) is int and first >= 0)
            or (type(first) is list and len(first) == count)):
        raise ValueError("FETCHED needs a first offset >= 0 or an offset per message")
    return count


def _check_columns(ids: Any, payloads: Any, runs: Any) -> int:
    """The message count of ``ids``, ``payloads``, ``times`` columns (equal lengths, the
    times as runs); ValueError for any other shape."""
    if type(ids) is not list or type(runs) is not list \
            or type(payloads) not in (list, PackedPayloads):
        raise ValueError("ids, payloads and times must be arrays")
    count = len(ids)
    if len(payloads) != count:
        raise ValueError(f"{count} ids but {len(payloads)} payloads")
    counts = runs[1::2]
    if len(runs) % 2 or not set(map(type, counts)) <= {int} or sum(counts) != count \
            or (counts and min(counts) < 1):
        raise ValueError("times must be [time, count, ...] runs covering every message")
    return count


def check_deliver(frame: list[Any]) -> int:
    """The message count of a well-formed DELIVER; ValueError for any other shape."""
    if len(frame) not in (8, 9):
        raise ValueError("DELIVER needs eight fields (nine with meta)")
    _, _, generation, attempt, offsets, ids, payloads, runs = frame[:8]
    count = _check_columns(ids, payloads, runs)
    if type(generation) is not int or type(attempt) is not int or attempt < 1:
        raise ValueError("DELIVER needs an integer generation and an attempt >= 1")
    first_ok = type(offsets) is int and offsets >= 0
    if not (first_ok or (type(offsets) is list and len(offsets) == count)):
        raise ValueError("DELIVER needs a first offset or an offset per message")
    return count


def array_header(count: int) -> bytes:
    """The MessagePack header of an array of ``count`` items."""
    if count <= 15:
        return bytes((0x90 | count,))
    if count <= 0xFFFF:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


def bin_header_size(size: int) -> int:
    """Bytes of the MessagePack header of a ``size``-byte binary (the shortest form)."""
    return 2 if size < 0x100 else 3 if size < 0x10000 else 5


class PackedPayloads(Sequence[bytes]):
    """A column of payloads already in wire form: ``length`` MessagePack binaries
    (shortest headers) laid end to end in ``parts``, holding ``size`` payload bytes.

    A shard holds payloads this way and splices them into DELIVER frames as they
    are. As a sequence it reads the payloads back (tests, rare paths); it is equal
    to any sequence of the same payloads.
    """

    __slots__ = ("length", "parts", "size")

    def __init__(self, parts: list[bytes | memoryview], length: int, size: int) -> None:
        self.parts = parts
        self.length = length
        self.size = size

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[bytes]:
        unpacker = msgpack.Unpacker(raw=False)
        for part in self.parts:
            unpacker.feed(part)
        return iter(unpacker)

    @overload
    def __getitem__(self, index: int) -> bytes: ...
    @overload
    def __getitem__(self, index: slice) -> list[bytes]: ...
    def __getitem__(self, index: int | slice) -> bytes | list[bytes]:
        return list(self)[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (PackedPayloads, list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PackedPayloads({list(self)!r})"


class FrameDecoder:
    """Incremental decoder: feed bytes, get whole frames.

    Raises :class:`~flux.errors.FrameTooLarge` when a length prefix is over
    ``max_frame_bytes`` and :class:`~flux.errors.ProtocolError` when a body is
    not a MessagePack array starting with an integer kind. Both mean the stream
    is corrupt; the caller handles the error's ``complete_frames`` (the whole
    frames that came before the corruption), sends an ERROR frame and closes.
    """

    __slots__ = ("_buf", "_pos", "max_frame_bytes")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._pos = 0

    @property
    def pending(self) -> int:
        """Bytes received but not yet part of a whole frame."""
        return len(self._buf) - self._pos

    def feed(self, data: bytes | bytearray | memoryview) -> list[list[Any]]:
        """Add received bytes and return every frame they complete, in order.

        Frame bodies are decoded in place (through a memoryview): when nothing is
        pending, straight from ``data``, and only an incomplete tail is copied."""
        buf = self._buf
        if self._pos == len(buf):  # nothing pending: no copy of what decodes whole
            frames, used = self._frames(data, 0)
            buf[:] = memoryview(data)[used:]  # the incomplete tail, if any
            self._pos = 0
            return frames
        buf += data
        frames, pos = self._frames(buf, self._pos)
        if pos == len(buf):
            buf.clear()
            pos = 0
        elif pos > 65536:
            del buf[:pos]
            pos = 0
        self._pos = pos
        return frames

    def _frames(self, data: bytes | bytearray | memoryview, pos: int
                ) -> tuple[list[list[Any]], int]:
        """The whole frames in ``data`` from ``pos`` on, and where the rest starts."""
        frames: list[list[Any]] = []
        end = len(data)
        with memoryview(data) as view:  # released before ``data`` may be resized
            try:
                while end - pos >= 4:
                    (size,) = HEADER.unpack_from(view, pos)
                    if size > self.max_frame_bytes:
                        raise errors.FrameTooLarge(
                            f"frame of {size} bytes is over max_frame_bytes={self.max_frame_bytes}",
                            size=size, limit=self.max_frame_bytes)
                    if end - pos - 4 < size:
                        break
                    body = view[pos + 4:pos + 4 + size]
                    try:
                        frames.append(decode_body(body))
                    finally:
                        body.release()  # even if a traceback keeps it: ``data`` stays resizable
                    pos += 4 + size
            except errors.ProtocolError as exc:
                # the whole frames before the corruption are good: the caller answers them first
                exc.complete_frames = frames
                raise
        return frames, pos


def decode_body(body: bytes | memoryview) -> list[Any]:
    """Decode one frame body (without its length prefix)."""
    try:
        frame = msgpack.unpackb(body, raw=False, use_list=True, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise errors.ProtocolError(f"undecodable frame: {exc.__class__.__name__}: {exc}") from None
    if not isinstance(frame, list) or not frame or type(frame[0]) is not int:
        raise errors.ProtocolError("a frame must be an array whose first element is its kind")
    return frame


# -- validation shared by broker and clients --------------------------------------------


def check_topic(topic: object) -> str:
    """Return ``topic`` if it is a valid topic name, else raise InvalidTopic."""
    if not isinstance(topic, str):
        raise errors.InvalidTopic(f"topic must be a string, not {type(topic).__name__}")
    size = len(topic.encode("utf-8", "surrogatepass"))
    if not 1 <= size <= MAX_TOPIC_BYTES:
        raise errors.InvalidTopic(f"topic must be 1-{MAX_TOPIC_BYTES} bytes, got {size}")
    if not _TOPIC_RE.match(topic):
        if DEAD_LETTER_SEP in topic:
            raise errors.InvalidTopic(
                f"{topic!r} is a dead-letter topic (TOPIC~SUBSCRIPTION): only the broker"
                " writes to it; read it with subscribe or fetch")
        raise errors.InvalidTopic(
            f"bad topic {topic!r}: use tokens of [A-Za-z0-9_-] separated by single dots"
            " ('*' and '>' are reserved)")
    return topic


def check_readable_topic(topic: object) -> str:
    """Return ``topic`` if it names a topic or a dead-letter topic (``TOPIC~SUBSCRIPTION``,
    G11: read by SUBSCRIBE, FETCH and COMMIT, never published to), else raise
    InvalidTopic."""
    if isinstance(topic, str) and DEAD_LETTER_SEP in topic:
        source, _, subscription = topic.partition(DEAD_LETTER_SEP)
        check_topic(source)
        if not subscription or len(subscription.encode("utf-8", "surrogatepass")) > 255:
            raise errors.InvalidTopic(
                f"bad dead-letter topic {topic!r}: TOPIC~SUBSCRIPTION, the subscription"
                " name 1-255 bytes")
        return topic
    return check_topic(topic)


def check_message_id(message_id: object) -> str:
    """Return ``message_id`` if it is a valid id (1-128 bytes of UTF-8), else raise."""
    if not isinstance(message_id, str):
        raise errors.InvalidMessageId(
            f"message id must be a string, not {type(message_id).__name__}")
    try:
        size = len(message_id.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate: MessagePack could not send it
        raise errors.InvalidMessageId("message id must be valid Unicode text") from None
    if not 1 <= size <= MAX_ID_BYTES:
        raise errors.InvalidMessageId(f"message id must be 1-{MAX_ID_BYTES} bytes, got {size}")
    return message_id


def error_frame(rid: int, exc: errors.FluxError) -> list[Any]:
    """The ERROR frame that answers request ``rid`` with ``exc``."""
    details = _plain(exc.details)
    if isinstance(exc, errors.TopicReset):  # old/new are attributes, not details
        details.update(old=exc.old, new=exc.new)
    return [ERROR, rid, exc.code, str(exc), details]


def error_from_frame(frame: list[Any]) -> errors.RemoteError:
    """Rebuild the typed error an ERROR frame carries."""
    code = frame[2] if len(frame) > 2 and isinstance(frame[2], int) else errors.RemoteError.code
    message = frame[3] if len(frame) > 3 and isinstance(frame[3], str) else "remote error"
    raw = frame[4] if len(frame) > 4 and isinstance(frame[4], dict) else {}
    # details become keyword arguments: keep only names that cannot break the call
    details = {k: v for k, v in raw.items() if isinstance(k, str) and k not in ("self", "message")}
    return errors.from_code(code, message, details)


def _plain(details: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in details.items()
            if v is None or isinstance(v, (int, float, str, bytes, bool))}


def parse_address(address: str) -> tuple[str, int]:
    """Split ``host:port`` (or ``[v6]:port``, or a ``flux://`` URL) into host and port."""
    if address.startswith("flux://"):
        address = address[len("flux://"):].rstrip("/")
    host, sep, port = address.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ValueError(f"address {address!r} is not host:port (port 0-65535)")
    return host.strip("[]") or "127.0.0.1", int(port)
