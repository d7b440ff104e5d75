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

from array import array

import msgpack

from flux.shard.topic import payload_lengths

# a MessagePack bin header's first byte -> (header size, bytes of its length field)
_BIN = {0xC4: (2, 1), 0xC5: (3, 2), 0xC6: (5, 4)}


def _array_header(buf: bytes, at: int) -> tuple[int, int] | None:
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
    head = _array_header(buf, at)
    if head is None or head[0] != count:
        return None
    end = len(buf)
    p = head[1]
    if count == 0:
        return b"" if p == end else None
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


def read_publish(body: bytes) -> tuple[int, float, tuple[str, ...], bytes | array[int]]:
    """(first offset, wall time, ids, payload lengths) of a PUBLISH record's body.

    Raises ValueError (or a msgpack error, which is one) for a body that is not a
    PUBLISH record's."""
    unpacker = msgpack.Unpacker(raw=False, use_list=False)
    unpacker.feed(body)
    if unpacker.read_array_header() != 4:
        raise ValueError("a PUBLISH record's body is an array of 4")
    first = unpacker.unpack()
    wall = unpacker.unpack()
    ids = unpacker.unpack()
    if not isinstance(ids, tuple):
        raise ValueError("a PUBLISH record's ids are an array")
    lens = packed_lengths(body, unpacker.tell(), len(ids))
    if lens is None:
        payloads = unpacker.unpack()
        if unpacker.tell() != len(body):
            raise msgpack.ExtraData(payloads, body[unpacker.tell():])
        lens = payload_lengths(payloads)
    return first, wall, ids, lens
