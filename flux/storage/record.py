"""The record format: a 9-byte header (CRC32C, length, type) and an opaque body.

A record is ``crc:u32 length:u32 type:u8 body`` in little-endian; the CRC32C
covers everything after it (length, type, body), one contiguous run of bytes.
Type 0 is never written, so a zero-filled tail never parses as a record. Type
255 (:data:`JUMP`) belongs to the storage layer: compaction writes it where it left
records out, to say at which log position the next record sits. See PROTOCOL.md,
"The on-disk log".
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import google_crc32c

HEADER = struct.Struct("<IIB")   # crc, length, type
HEADER_SIZE = HEADER.size        # 9
MAX_BODY = 64 * 1024 * 1024      # a longer length field is damage, not a record
MAX_TYPE = 254                   # the largest type an owner may give its records
JUMP = 255                       # body: u64 position of the next record (compacted segments)

_LENGTH_TYPE = struct.Struct("<IB")
_U64 = struct.Struct("<Q")
JUMP_SIZE = HEADER_SIZE + _U64.size


class Record(NamedTuple):
    """A record read back from the log: where it starts, its type and body."""

    position: int
    type: int
    body: bytes

    @property
    def end(self) -> int:
        """The log position just after this record."""
        return self.position + HEADER_SIZE + len(self.body)


def checksum(length: int, rtype: int, body: bytes | memoryview) -> int:
    """The CRC32C of a record's length, type and body."""
    return int(google_crc32c.extend(google_crc32c.value(_LENGTH_TYPE.pack(length, rtype)), body))


def encode(rtype: int, body: bytes) -> bytes:
    """One record's bytes. Raises ValueError for a type outside 1..255 or a body over MAX_BODY."""
    if not 1 <= rtype <= MAX_TYPE:
        raise ValueError(f"record type must be 1..{MAX_TYPE}, not {rtype}")
    if len(body) > MAX_BODY:
        raise ValueError(f"record body of {len(body)} bytes is over {MAX_BODY}")
    rest = _LENGTH_TYPE.pack(len(body), rtype) + body
    return int(google_crc32c.value(rest)).to_bytes(4, "little") + rest


def encode_jump(target: int) -> bytes:
    """A JUMP record: the next record of the segment sits at log position ``target``
    (a jump takes no room among positions: the records left out did)."""
    rest = _LENGTH_TYPE.pack(_U64.size, JUMP) + _U64.pack(target)
    return int(google_crc32c.value(rest)).to_bytes(4, "little") + rest


def jump_target(body: bytes) -> int:
    """Where a JUMP record's body says the next record is."""
    return int(_U64.unpack(body)[0])


def body_length(buf: bytes | memoryview, at: int) -> int:
    """The length field of the record header at ``buf[at:]`` (which must hold a header)."""
    return int.from_bytes(buf[at + 4:at + 8], "little")


def encoded_size(body_len: int) -> int:
    """Bytes a record with a body of ``body_len`` bytes takes in the log."""
    return HEADER_SIZE + body_len


class Torn(Exception):
    """Not a whole record: the bytes end inside the header or the body."""


class Bad(Exception):
    """A whole record's worth of bytes that is not a record (checksum, type or length)."""


def decode(buf: bytes | memoryview, at: int, position: int) -> Record:
    """The record at ``buf[at:]``, whose log position is ``position``.

    Raises :class:`Torn` when ``buf`` ends before the record does, and :class:`Bad`
    when the header or checksum is wrong. Never returns a record that fails its check.
    """
    if len(buf) - at < HEADER_SIZE:
        raise Torn(f"{len(buf) - at} bytes left, a header takes {HEADER_SIZE}")
    crc, length, rtype = HEADER.unpack_from(buf, at)
    if length > MAX_BODY:
        raise Bad(f"length {length} is over {MAX_BODY}")
    start = at + HEADER_SIZE
    end = start + length
    if len(buf) < end:
        raise Torn(f"length {length} runs past the end ({len(buf) - start} bytes left)")
    if rtype == 0:
        raise Bad("type 0 (zero-filled?)")
    body = bytes(buf[start:end])    # the C checksum takes bytes, not a memoryview
    if google_crc32c.extend(google_crc32c.value(_LENGTH_TYPE.pack(length, rtype)), body) != crc:
        raise Bad("checksum mismatch")
    if rtype == JUMP and (length != _U64.size or jump_target(body) < position):
        raise Bad("a jump that does not go forward")
    return Record(position, rtype, body)


def decode_run(buf: bytes | memoryview, at: int, position: int, out: list[Record],
               jumps: list[tuple[int, int]] | None = None) -> tuple[int, int]:
    """Decode the whole, valid records at ``buf[at:]`` (log position ``position``) into
    ``out``; returns where they stop in ``buf`` and the log position there.

    JUMP records are followed, not returned: each moves the position to its target,
    and is noted in ``jumps`` (if given) as (target, index in ``buf`` after the jump).
    The fast path of scans: it stops silently at the first spot that is not a whole
    valid record (the end of ``buf``, or damage); :func:`decode` there says which.
    Each body is copied out of ``buf`` once: its checksum is the header's extended
    over it (a copy of the covered bytes, then of the body, took twice as long).
    """
    unpack = HEADER.unpack_from
    crc32c = google_crc32c.value
    extend = google_crc32c.extend
    pack = _LENGTH_TYPE.pack
    size = len(buf)
    base = position - at
    while size - at >= HEADER_SIZE:
        crc, length, rtype = unpack(buf, at)
        end = at + HEADER_SIZE + length
        if length > MAX_BODY or end > size or rtype == 0:
            break
        body = bytes(buf[at + HEADER_SIZE:end])   # (the C checksum takes bytes only)
        if extend(crc32c(pack(length, rtype)), body) != crc:
            break
        if rtype == JUMP:
            if length != _U64.size:
                break
            target = jump_target(body)
            if target < base + at:
                break
            base = target - end
            if jumps is not None:
                jumps.append((target, end))
        else:
            out.append(Record(base + at, rtype, body))
        at = end
    return at, base + at
