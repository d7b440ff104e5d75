"""Segment files: their names (the first log position they hold) and their header.

A log is a directory of segments ``<first position, 20 digits>.log``. Each starts
with a header naming what it belongs to (the owner, e.g. a topic), its generation,
the machine's boot id when it was made and the format version, under a CRC32C.
"""

from __future__ import annotations

import dataclasses
import struct

import google_crc32c

from flux.storage.record import Bad, Torn


class Foreign(Bad):
    """Not a segment this Flux can read: another magic, or another format version (whose
    checksum does not verify with ours: else it is ours, damaged)."""


MAGIC = b"FLUXLOG\n"
VERSION = 1
SUFFIX = ".log"
DAMAGED = ".damaged"       # a segment set aside by recovery, kept for a person to look at
COMPACTING = ".compact"    # a segment being rewritten by compaction (recovery removes it)
UNSYNCED = ".unsynced"     # what recovery set aside past a failed fsync's synced mark
FSYNC_FAILED = "fsync-failed."   # marker: fsync-failed.<synced mark>.<durable mark>
REWRITE = FSYNC_FAILED + "recovery"   # marker: a recovery's fsync failed (rewrite the last)
NAME_DIGITS = 20

_FIXED = struct.Struct("<8sHHQQd")     # magic, version, header length, generation, first position, created
_CRC = struct.Struct("<I")
_U16 = struct.Struct("<H")
MAX_HEADER = 4096
_MIN_HEADER = _FIXED.size + 1 + _U16.size + _CRC.size
_OURS = MAGIC + _U16.pack(VERSION)    # the bytes a header of this Flux starts with


@dataclasses.dataclass(frozen=True, slots=True)
class SegmentHeader:
    """What a segment says about itself."""

    owner: str               # what the log belongs to (a topic name, a shard's metadata log)
    generation: int          # the owner's generation when the segment was made (64-bit)
    first_position: int      # the log position of the segment's first record
    boot_id: str             # the machine's boot id when the segment was made
    created: float = 0.0     # wall-clock seconds when it was made (for people)
    version: int = VERSION


def segment_name(first_position: int) -> str:
    """The file name of the segment whose first record is at ``first_position``."""
    return f"{first_position:0{NAME_DIGITS}d}{SUFFIX}"


def parse_name(name: str) -> int | None:
    """The first position a segment file name states, or None if it is not a segment's name."""
    stem = name[:-len(SUFFIX)] if name.endswith(SUFFIX) else ""
    if len(stem) != NAME_DIGITS or not stem.isdigit():
        return None
    return int(stem)


def fsync_failed_name(synced: int, durable: int) -> str:
    """The name of the (empty) marker a log leaves when an fsync fails: everything past
    ``synced`` is in doubt, and what was past ``durable`` was never exposed."""
    return f"{FSYNC_FAILED}{synced:0{NAME_DIGITS}d}.{durable:0{NAME_DIGITS}d}"


def parse_fsync_failed(name: str) -> tuple[int, int] | None:
    """The (synced, durable) marks a marker's name states, or None if it is not one."""
    if not name.startswith(FSYNC_FAILED):
        return None
    synced, _, durable = name[len(FSYNC_FAILED):].partition(".")
    if not (synced.isdigit() and durable.isdigit()):
        return None
    return int(synced), int(durable)


def encode_header(header: SegmentHeader) -> bytes:
    """The header's bytes. Raises ValueError if the owner or boot id is too long."""
    owner = header.owner.encode()
    boot = header.boot_id.encode()
    if len(boot) > 255 or len(owner) > 1024:
        raise ValueError("owner or boot id too long for a segment header")
    size = _FIXED.size + 1 + len(boot) + _U16.size + len(owner) + _CRC.size
    body = (_FIXED.pack(MAGIC, header.version, size, header.generation, header.first_position,
                        header.created)
            + bytes((len(boot),)) + boot + _U16.pack(len(owner)) + owner)
    return body + _CRC.pack(google_crc32c.value(body))


def _length_from_fields(buf: bytes) -> int | None:
    """The header length its boot id and owner fields imply, if ``buf`` holds them."""
    at = _FIXED.size
    if len(buf) <= at:
        return None
    at += 1 + buf[at]
    if len(buf) < at + _U16.size:
        return None
    owner_len: int = _U16.unpack_from(buf, at)[0]
    return at + _U16.size + owner_len + _CRC.size


def _ours_but_damaged(buf: bytes, size: int) -> bool:
    """Whether ``buf`` is a header this Flux wrote whose magic or version alone was
    damaged: its checksum verifies once ours are put back. A header of another format
    version never does (CRC32C catches every change within 32 bits), nor, but by a
    chance of 1 in 2**32, anything else."""
    if not _MIN_HEADER <= size <= min(len(buf), MAX_HEADER):
        return False
    ours = _OURS + buf[len(_OURS):size - _CRC.size]
    return bool(google_crc32c.value(ours) == _CRC.unpack_from(buf, size - _CRC.size)[0])


def generation_field(buf: bytes) -> int | None:
    """The generation field of the header at the start of ``buf``, unchecked (None if
    ``buf`` is too short to hold it): what a header too damaged to decode still says."""
    if len(buf) < _FIXED.size:
        return None
    return int(_FIXED.unpack_from(buf)[3])


def decode_header(buf: bytes) -> tuple[SegmentHeader, int]:
    """The header at the start of ``buf`` and its length in bytes.

    Raises :class:`Torn` if ``buf`` ends inside it (or holds only zeros: a segment
    whose header never reached the disk), :class:`Foreign` if it is not a Flux
    segment or has another format version, and :class:`Bad` if it fails its checksum
    (also a magic or version that differs from ours while the rest verifies with ours:
    damage to a header this Flux wrote, not a foreign file).
    """
    if len(buf) < _FIXED.size:
        if not buf.strip(b"\0"):
            raise Torn(f"header cut short ({len(buf)} bytes)")
        if not MAGIC.startswith(buf[:len(MAGIC)]):
            raise Foreign("not a Flux log segment (bad magic)")
        raise Torn(f"header cut short ({len(buf)} bytes)")
    magic, version, size, generation, first, created = _FIXED.unpack_from(buf)
    if magic != MAGIC or version != VERSION:
        if not buf[:_FIXED.size].strip(b"\0"):
            raise Torn("header is zero-filled")
        if _ours_but_damaged(buf, size):
            raise Bad(f"header magic or version damaged ({magic!r}, version {version}): its"
                      " checksum verifies with this Flux's")
        if magic != MAGIC:
            raise Foreign("not a Flux log segment (bad magic)")
        raise Foreign(f"format version {version}; this Flux reads version {VERSION}")
    if not _MIN_HEADER <= size <= MAX_HEADER:
        raise Bad(f"header length {size} is impossible")
    derived = _length_from_fields(buf)
    if derived is not None and derived != size:
        # a flipped bit in the length (or in a field's length), not a header cut short
        raise Bad(f"header length {size} does not match its fields ({derived})")
    if len(buf) < size:
        raise Torn(f"header cut short ({len(buf)} of {size} bytes)")
    (crc,) = _CRC.unpack_from(buf, size - _CRC.size)
    if google_crc32c.value(buf[:size - _CRC.size]) != crc:
        raise Bad("header checksum mismatch")
    at = _FIXED.size
    boot_len = buf[at]
    boot = buf[at + 1:at + 1 + boot_len]
    at += 1 + boot_len
    (owner_len,) = _U16.unpack_from(buf, at)
    owner = buf[at + _U16.size:at + _U16.size + owner_len]
    if at + _U16.size + owner_len + _CRC.size != size:
        raise Bad("header fields do not add up to its length")
    try:
        header = SegmentHeader(owner.decode(), generation, first, boot.decode(), created, version)
    except UnicodeDecodeError as e:
        raise Bad("header text is not UTF-8") from e
    return header, size
