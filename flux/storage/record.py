"""The record format: a 9-byte header (length, CRC32C, type) and an opaque body.

A record is ``length:u32 crc:u32 type:u8 body`` in little-endian; the CRC32C
covers the length, the type and the body. Type 0 is never written, so a
zero-filled tail never parses as a record. See PROTOCOL.md, "The on-disk log".
"""

from __future__ import annotations

import dataclasses
import struct

import google_crc32c

HEADER = struct.Struct("<IIB")
HEADER_SIZE = HEADER.size        # 9
MAX_BODY = 64 * 1024 * 1024      # a longer length field is damage, not a record
MAX_TYPE = 255

_LENGTH = struct.Struct("<I")


@dataclasses.dataclass(frozen=True, slots=True)
class Record:
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
    crc = google_crc32c.value(_LENGTH.pack(length) + bytes((rtype,)))
    return int(google_crc32c.extend(crc, body))


def encode(rtype: int, body: bytes) -> bytes:
    """One record's bytes. Raises ValueError for a type outside 1..255 or a body over MAX_BODY."""
    if not 1 <= rtype <= MAX_TYPE:
        raise ValueError(f"record type must be 1..{MAX_TYPE}, not {rtype}")
    if len(body) > MAX_BODY:
        raise ValueError(f"record body of {len(body)} bytes is over {MAX_BODY}")
    return HEADER.pack(len(body), checksum(len(body), rtype, body), rtype) + body


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
    length, crc, rtype = HEADER.unpack_from(buf, at)
    if length > MAX_BODY:
        raise Bad(f"length {length} is over {MAX_BODY}")
    start = at + HEADER_SIZE
    if len(buf) - start < length:
        raise Torn(f"length {length} runs past the end ({len(buf) - start} bytes left)")
    body = bytes(buf[start:start + length])
    if rtype == 0:
        raise Bad("type 0 (zero-filled?)")
    if checksum(length, rtype, body) != crc:
        raise Bad("checksum mismatch")
    return Record(position, rtype, body)
