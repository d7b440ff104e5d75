"""A PUBLISH record's body as recovery reads it: ids and payload lengths, no payloads.

Recovery keeps a disk topic's payloads in the log and holds only each message's id
and payload length (:meth:`flux.shard.topic.TopicLog.extend_placed`). Building a
bytes object per payload just to measure it was most of the cost of reading a long
log, so :func:`packed_lengths` reads the lengths from the MessagePack headers of
the payload array when every payload has the same length (the usual case), and
:func:`read_publish` falls back to unpacking the payloads only when they do not.
The layout is PROTOCOL.md §14.3: ``[first offset, wall time, [id, ...], [payload, ...]]``.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence
from typing import Any

import msgpack

from flux.shard.packed_ids import PackedIds
from flux.shard.topic import payload_lengths

# a MessagePack bin header's first byte -> (header size, bytes of its length field)
_BIN = {0xC4: (2, 1), 0xC5: (3, 2), 0xC6: (5, 4)}
# a MessagePack str8/str16 header's first byte -> (header size, bytes of its length field)
_STR = {0xD9: (2, 1), 0xDA: (3, 2)}
# a MessagePack uint's first byte -> bytes of the number after it
_UINT = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}
_FLOAT64 = struct.Struct(">d")


def packed_ids(buf: bytes, at: int) -> tuple[PackedIds, int, int] | None:
    """(the ids, their characters in all, where the array ends) of the MessagePack array
    of str at ``buf[at:]``, kept packed, if every id is ASCII and they all have one
    length (the usual case: generated ids); None otherwise (unpack them then).

    Every header is checked as in :func:`packed_lengths`; the ids' bytes are checked
    for ASCII with the header columns that are not ASCII zeroed (so they decode later,
    and a str's length is its byte count)."""
    head = array_header(buf, at)
    if head is None:
        return None
    count, p = head
    if count == 0:
        return PackedIds(buf[at:p], 0), 0, p
    if p >= len(buf):
        return None
    kind = _STR.get(buf[p])
    if kind is None:
        first = buf[p]
        if not 0xA0 <= first <= 0xBF:   # fixstr
            return None
        size, length = 1, first & 0x1F
    else:
        size, field = kind
        if p + size > len(buf):
            return None
        length = int.from_bytes(buf[p + 1:p + 1 + field], "big")
    stride = size + length
    end = p + count * stride
    if end > len(buf):
        return None
    header = buf[p:p + size]
    for j in range(size):
        if buf[p + j:end:stride] != header[j:j + 1] * count:
            return None
    chars = bytearray(buf[p:end])
    for j in range(size):
        if header[j] >= 0x80:
            chars[j::stride] = bytes(count)
    if not chars.isascii():
        return None
    return PackedIds(buf[at:end], count), count * length, end


def array_header(buf: bytes, at: int) -> tuple[int, int] | None:
    """(element count, where the elements start) of the MessagePack array at ``buf[at]``."""
    if at >= len(buf):
        return None
    first = buf[at]
    if 0x90 <= first <= 0x9F:
        return first & 0x0F, at + 1
    if first == 0xDC and at + 3 <= len(buf):
        return int.from_bytes(buf[at + 1:at + 3], "big"), at + 3
    if first == 0xDD and at + 5 <= len(buf):
        return int.from_bytes(buf[at + 1:at + 5], "big"), at + 5
    return None


def packed_lengths(buf: bytes, at: int, count: int) -> bytes | array[int] | None:
    """The payload lengths (as :func:`~flux.shard.topic.payload_lengths` gives them) of
    the array at ``buf[at:]``, if it is exactly an array of ``count`` bins that all have
    the same length and ends where ``buf`` does; None otherwise (unpack it then).

    Every element's header is checked, not only the first: the array parses as
    ``count`` bins of one length exactly when each header sits one stride after the
    last and is the same bytes. The comparisons run over strided slices (C loops).
    """
    head = array_header(buf, at)
    if head is None or head[0] != count:
        return None
    end = len(buf)
    p = head[1]
    if count == 0:
        return b"" if p == end else None
    if p >= end:
        return None
    kind = _BIN.get(buf[p])
    if kind is None:
        return None
    size, field = kind
    if p + size > end:
        return None
    length = int.from_bytes(buf[p + 1:p + 1 + field], "big")
    stride = size + length
    if end - p != count * stride:
        return None
    header = buf[p:p + size]
    for j in range(size):
        if buf[p + j:end:stride] != header[j:j + 1] * count:
            return None
    if length < 256:
        return bytes((length,)) * count
    return array("I", (length,)) * count


def read_publish(body: bytes) -> tuple[int, float, Sequence[str], int, bytes | array[int],
                                      dict[str, Any] | None]:
    """(first offset, wall time, ids, their characters in all, payload lengths, the
    optional fifth field: keys, headers and due times) of a PUBLISH record's body. The
    ids are a :class:`PackedIds` when they can stay packed, else a tuple.

    Raises ValueError or another msgpack error for a body that is not a PUBLISH record's."""
    start = _head(body)
    if start is None:
        head = msgpack.Unpacker(raw=False, use_list=False)
        head.feed(body[:32])   # the array's header, the first offset and the wall time: <= 23
        fields = head.read_array_header()
        if fields == 5:   # with keys, headers or due times: rare, read whole
            first, wall, id_list, payloads, meta = msgpack.unpackb(body, raw=False,
                                                                   use_list=True)
            if not isinstance(id_list, list) or not isinstance(meta, dict):
                raise ValueError("a PUBLISH record's ids are an array and its fifth field"
                                 " a map")
            return (first, wall, tuple(id_list), len("".join(id_list)),
                    payload_lengths(payloads), meta)
        if fields != 4:
            raise ValueError("a PUBLISH record's body is an array of 4 or 5")
        start = head.unpack(), head.unpack(), head.tell()
    first, wall, at = start
    ids: Sequence[str]
    kept = packed_ids(body, at)
    if kept is not None:
        ids, size, at = kept
    else:
        rest = msgpack.Unpacker(raw=False, use_list=False)
        rest.feed(body[at:])
        ids = rest.unpack()
        if not isinstance(ids, tuple):
            raise ValueError("a PUBLISH record's ids are an array")
        size = len("".join(ids))
        at += rest.tell()
    lens = packed_lengths(body, at, len(ids))
    if lens is None:  # raises ExtraData (a ValueError) if anything follows the payloads
        lens = payload_lengths(msgpack.unpackb(body[at:], raw=False, use_list=False))
    return first, wall, ids, size, lens, None


def _head(body: bytes) -> tuple[int, float, int] | None:
    """(first offset, wall time, where the ids start) of a PUBLISH body of four fields
    whose offset is a uint and wall time a float64 (as Flux writes them); None for
    any other (an Unpacker reads it then, in three times as long)."""
    if len(body) < 20 or body[0] != 0x94:
        return None
    lead = body[1]
    if lead < 0x80:
        first, at = lead, 2
    else:
        width = _UINT.get(lead)
        if width is None:
            return None
        first, at = int.from_bytes(body[2:2 + width], "big"), 2 + width
    if body[at] != 0xCB:
        return None
    return first, _FLOAT64.unpack_from(body, at + 1)[0], at + 9
