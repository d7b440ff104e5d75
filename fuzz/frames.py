"""What the fuzzer sends: valid client frames of every kind, and mutations of them.

:func:`valid_frame` builds a well-formed frame of a client kind for a topic the
target shard owns. :class:`Mutator` changes it, drawing from a seeded
``random.Random``: a field replaced by a value of another type or size, a field
dropped or added, a key of a body map replaced, removed or added, the kind made
unknown, a control kind (which a client port must refuse), or nothing at all (so
valid requests keep the shard's state moving). :func:`corrupt` works on the
encoded bytes instead: bit flips, a truncation, a bad length prefix.

Every frame the fuzzer sends is classified by what it promises (:func:`expect`):
a reply with its rid, a reply with rid 0 (an error about a frame whose rid is not
usable), or nothing (a valid CREDIT).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from flux import protocol

P = protocol

# the kinds a client sends; the fuzzer mutates each of them
CLIENT_KINDS = (P.HELLO, P.PING, P.PUBLISH, P.SUBSCRIBE, P.UNSUBSCRIBE, P.CREDIT, P.ACK,
                P.FETCH, P.COMMIT, P.STATS)
# every kind the protocol defines (a client sending a server's kind is refused too)
KNOWN_KINDS = tuple(sorted(P.KIND_NAMES))


def _odd_values(rng: random.Random) -> list[Any]:
    """Values of every msgpack type and awkward sizes, to put where another type belongs."""
    return [
        None, True, False, 0, -1, 1, 7, 2**31, -2**31, 2**63 - 1, -2**63, 2**64 - 1,
        0.0, -0.0, 1.5, math.inf, -math.inf, math.nan, 1e308,
        "", "x", "a.b", "*", ">", "no spaces", "\x00", "é" * 40, "x" * 300, "y" * 70_000,
        b"", b"\x00", b"\xff" * 64, rng.randbytes(rng.randint(1, 4096)),
        [], [1, 2, 3], [[]], [None] * 50, _nested(rng.randint(2, 60)),
        {}, {"a": 1}, {1: 2}, {"topic": None}, {b"k": b"v"},
    ]


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def valid_frame(kind: int, rng: random.Random, rid: int, topic: str, tag: str) -> list[Any]:
    """A well-formed frame of ``kind`` about ``topic`` (``tag`` makes ids unique)."""
    sid = rng.randint(1, 40)
    name = rng.choice((None, f"fz{rng.randint(0, 9)}"))
    if kind == P.HELLO:
        return [P.HELLO, rid, {"version": P.VERSION, "role": "client"}]
    if kind == P.PUBLISH:
        n = rng.randint(1, 8)
        group: list[Any] = [topic, [f"{tag}-{i}" for i in range(n)],
                            [rng.randbytes(rng.randint(0, 200)) for _ in range(n)]]
        if rng.random() < 0.3:  # keys, for the key-ordered shared subscriptions
            group.append({"keys": [rng.choice(("k1", "k2", None)) for _ in range(n)]})
        return [P.PUBLISH, rid, [group]]
    if kind == P.SUBSCRIBE:
        options: dict[str, Any] = {"topic": topic, "read_old": rng.random() < 0.5,
                                   "credit": rng.randint(0, 50)}
        if name is not None:
            options["name"] = name
        if rng.random() < 0.3:
            options["mode"] = "pull"
        elif name is not None and rng.random() < 0.4:  # a member of a shared one (G10)
            options["shared"] = True
            options["key_ordered"] = rng.random() < 0.5
            options["max_in_flight"] = rng.randint(1, 5)
        return [P.SUBSCRIBE, rid, sid, options]
    if kind == P.UNSUBSCRIBE:
        return [P.UNSUBSCRIBE, rid, sid]
    if kind == P.CREDIT:
        return [P.CREDIT, sid, rng.randint(1, 100)]
    if kind == P.ACK:
        first = rng.randint(0, 50)
        return [P.ACK, rid, sid, rng.choice((1, 2**63)), [first, first + rng.randint(0, 3)],
                rng.choice((-1, first))]
    if kind == P.FETCH:
        body: dict[str, Any] = {"topic": topic, "offset": rng.randint(0, 100),
                                "max_messages": rng.randint(1, 50)}
        if name is not None:
            body["name"] = name
        return [P.FETCH, rid, body]
    if kind == P.COMMIT:
        return [P.COMMIT, rid, {"topic": topic, "name": name or "fz0",
                                "offset": rng.randint(0, 100)}]
    return [kind, rid]  # PING, STATS


@dataclass(frozen=True)
class Mutation:
    """A frame to send, and how it was made (for the report)."""

    frame: list[Any]
    how: str


class Mutator:
    """Draws mutations of valid frames from ``rng``."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def mutate(self, frame: list[Any]) -> Mutation:
        rng = self.rng
        how = rng.choices(("none", "replace", "drop", "add", "map", "kind", "control"),
                          (3, 5, 2, 2, 3, 1, 0.3))[0]
        out = list(frame)
        if how == "replace" and len(out) > 1:
            out[rng.randrange(1, len(out))] = rng.choice(_odd_values(rng))
        elif how == "drop" and len(out) > 1:
            del out[rng.randrange(1, len(out))]
        elif how == "add":
            out.insert(rng.randint(1, len(out)), rng.choice(_odd_values(rng)))
        elif how == "map":
            how = self._mutate_map(out) or "none"
        elif how == "kind":
            out[0] = rng.choice((0, 6, 99, 255, 2**16, -1, rng.choice(KNOWN_KINDS)))
        elif how == "control":
            out[0] = rng.choice(sorted(P.CONTROL_KINDS))
        else:
            how = "none"
        return Mutation(out, how)

    def _mutate_map(self, frame: list[Any]) -> str | None:
        """Change one key of the frame's body map (or of a PUBLISH group)."""
        rng = self.rng
        maps = [i for i, v in enumerate(frame) if isinstance(v, dict)]
        if frame and frame[0] == P.PUBLISH and len(frame) > 2 and isinstance(frame[2], list) \
                and frame[2] and isinstance(frame[2][0], list):
            group = list(frame[2][0])
            if group:
                i = rng.randrange(len(group))
                if isinstance(group[i], list) and group[i] and rng.random() < 0.5:
                    column = list(group[i])
                    column[rng.randrange(len(column))] = rng.choice(_odd_values(rng))
                    group[i] = column
                else:
                    group[i] = rng.choice(_odd_values(rng))
                frame[2] = [group, *frame[2][1:]]
                return "group"
        if not maps:
            return None
        body = dict(frame[rng.choice(maps)])
        keys = list(body)
        choice = rng.random()
        if keys and choice < 0.5:
            body[rng.choice(keys)] = rng.choice(_odd_values(rng))
        elif keys and choice < 0.75:
            del body[rng.choice(keys)]
        else:
            body[rng.choice(("extra", "topic", "name", "offset", "x" * 100, 5))] = \
                rng.choice(_odd_values(rng))
        frame[maps[0]] = body
        return "map"


def expect(frame: list[Any]) -> int | None:
    """The rid a shard's answer to ``frame`` carries (0: an error about the frame with
    rid 0), or None when a valid frame gets no answer (CREDIT)."""
    kind = frame[0] if frame else None
    if kind == P.CREDIT:
        return None   # no reply when valid; an error with rid 0 when not
    rid = frame[1] if len(frame) > 1 and type(frame[1]) is int else 0
    return rid


def corrupt(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Byte-level damage to encoded frames: bit flips, a truncation, a bad length."""
    how = rng.choice(("flip", "truncate", "length"))
    buf = bytearray(data)
    if how == "flip":
        for _ in range(rng.randint(1, 4)):
            bit = rng.randrange(len(buf) * 8)
            buf[bit // 8] ^= 1 << (bit % 8)
    elif how == "truncate":
        del buf[rng.randrange(1, len(buf)):]
    else:
        buf[:4] = rng.choice((0xFFFFFFFF, 0, 1, 2**24, len(buf) + 1000)).to_bytes(4, "big")
    return bytes(buf), how
