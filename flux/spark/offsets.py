"""Spark offsets for Flux topics, and the planning that turns them into reads.

Pure functions, no I/O and no pyspark: a Spark offset is, per topic, the
generation and the next offset to read (``{"orders.eu": {"generation": g,
"next": n}}``); :func:`plan_end` decides a micro-batch's end from what the
shards hold, and :func:`split` cuts a batch into partitions.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from flux import errors, protocol

EARLIEST = "earliest"
LATEST = "latest"
# Kafka's connector spells "earliest" and "latest" as -2 and -1 in startingOffsets JSON.
_KAFKA_SPELLING = {-2: EARLIEST, -1: LATEST}


DataLoss = errors.DataLoss  # where the Spark source raises it from


@dataclass(frozen=True)
class Position:
    """Where a query stands in one topic: a generation and the next offset to read."""

    generation: int
    next: int

    def to_json(self) -> dict[str, int]:
        return {"generation": self.generation, "next": self.next}

    @classmethod
    def from_json(cls, value: Any, where: str = "offset") -> Position:
        """Parse ``{"generation": g, "next": n}``; g may also be a hex string like ``"0x2a"``."""
        if not isinstance(value, Mapping) or "generation" not in value or "next" not in value:
            raise ValueError(f"{where}: expected {{\"generation\": g, \"next\": n}}, got {value!r}")
        generation = value["generation"]
        if isinstance(generation, str):
            generation = int(generation, 0)
        nxt = value["next"]
        if type(generation) is not int or type(nxt) is not int or nxt < 0:
            raise ValueError(f"{where}: generation and next must be integers, next >= 0")
        return cls(generation, nxt)


@dataclass(frozen=True)
class TopicStatus:
    """What a shard says of a topic right now (a FETCH reply without its messages)."""

    generation: int
    oldest: int
    next: int


@dataclass(frozen=True)
class Range:
    """Offsets ``start`` (inclusive) to ``end`` (exclusive) of one topic generation."""

    topic: str
    generation: int
    start: int
    end: int


Offsets = dict[str, Position]
Start = str | int | Position  # "earliest", "latest", an offset, or a full position
Warn = Callable[[str], None]


def parse_topics(value: str | None) -> list[str]:
    """The ``topics`` option: comma-separated names, validated, duplicates dropped."""
    if not value or not value.strip():
        raise ValueError("option 'topics' is required: a comma-separated list of topic names")
    out: list[str] = []
    for raw in value.split(","):
        name = raw.strip()
        if not name:
            continue
        try:
            protocol.check_topic(name)
        except errors.InvalidTopic as exc:
            raise ValueError(f"option 'topics': {exc}") from None
        if name not in out:
            out.append(name)
    return out


def parse_starting(value: str | None, topics: list[str], default: str = LATEST,
                   option: str = "startingOffsets") -> dict[str, Start]:
    """Parse ``startingOffsets``/``endingOffsets``: ``earliest``, ``latest`` or JSON.

    JSON maps every topic to an offset (-2 = earliest, -1 = latest, as in Kafka's
    connector), to ``"earliest"``/``"latest"``, or to ``{"generation", "next"}``.
    Raises ValueError naming the option when the value is malformed or a topic is missing.
    """
    text = (value or default).strip()
    if text.lower() in (EARLIEST, LATEST):
        return dict.fromkeys(topics, text.lower())
    try:
        spec = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(f"option {option!r}: expected 'earliest', 'latest' or JSON,"
                         f" got {text!r}") from None
    if not isinstance(spec, dict):
        raise ValueError(f"option {option!r}: JSON must map topic names to offsets")
    missing = [t for t in topics if t not in spec]
    if missing:
        raise ValueError(f"option {option!r}: no offset for topic(s) {', '.join(missing)}")
    out: dict[str, Start] = {}
    for topic in topics:
        item = spec[topic]
        where = f"option {option!r}, topic {topic!r}"
        if isinstance(item, str) and item.lower() in (EARLIEST, LATEST):
            out[topic] = item.lower()
        elif type(item) is int and item in _KAFKA_SPELLING:
            out[topic] = _KAFKA_SPELLING[item]
        elif type(item) is int and item >= 0:
            out[topic] = item
        elif isinstance(item, dict):
            out[topic] = Position.from_json(item, where)
        else:
            raise ValueError(f"{where}: expected an offset >= 0, -2, -1, 'earliest', 'latest'"
                             f" or {{\"generation\", \"next\"}}, got {item!r}")
    return out


def encode(offsets: Offsets, topics: Iterable[str]) -> dict[str, Any]:
    """The JSON-able Spark offset, topics in a fixed order (Spark compares the JSON text)."""
    return {t: offsets[t].to_json() for t in topics if t in offsets}


def decode(value: Mapping[str, Any]) -> Offsets:
    """Parse a Spark offset made by :func:`encode` (raises ValueError when malformed)."""
    if not isinstance(value, Mapping):
        raise ValueError(f"a flux offset is a JSON object, got {value!r}")
    return {topic: Position.from_json(item, f"offset of topic {topic!r}")
            for topic, item in value.items()}


def resolve_start(start: Start, status: TopicStatus, topic: str) -> Position:
    """The position ``start`` names in ``topic``, given what its shard holds.

    Raises ValueError for an offset past the topic's end. A position of another
    generation, or one already cleaned up, is returned as is: :func:`plan_end`
    and :func:`batch_ranges` decide what that loss means.
    """
    if start == EARLIEST:
        return Position(status.generation, status.oldest)
    if start == LATEST:
        return Position(status.generation, status.next)
    if isinstance(start, Position):
        return start
    assert isinstance(start, int)
    if start > status.next:
        raise ValueError(f"starting offset {start} of topic {topic!r} is past its next offset"
                         f" {status.next} (generation {status.generation:#x})")
    return Position(status.generation, start)


def plan_end(start: Offsets, status: Mapping[str, TopicStatus], topics: list[str], *,
             max_messages: int | None, target: Offsets | None, fail_on_data_loss: bool,
             warn: Warn) -> Offsets:
    """The end offset of the next micro-batch.

    Per topic: a generation change or a start already cleaned up either raises
    :class:`DataLoss` or (``fail_on_data_loss=False``) warns and moves the topic's
    position to what is held, reading nothing of it in this batch. A topic new to
    the query starts at its oldest held message. ``max_messages`` caps the batch
    (shared across topics in proportion to what each has waiting); ``target``
    caps each topic at a position recorded earlier (Trigger.AvailableNow).
    """
    begin: dict[str, Position] = {}
    out: Offsets = {}
    waiting: dict[str, int] = {}
    for topic in topics:
        st = status[topic]
        pos = start.get(topic)
        if pos is None:
            out[topic] = Position(st.generation, st.oldest)
            continue
        if pos.generation != st.generation:
            check_loss(fail_on_data_loss, warn,
                       f"topic {topic!r} was reset (its shard restarted): generation"
                       f" {pos.generation:#x} -> {st.generation:#x}; messages from offset"
                       f" {pos.next} of the old generation on may be lost. Continuing at"
                       f" offset 0 of the new one.")
            out[topic] = Position(st.generation, 0)
            continue
        if st.next < pos.next:
            raise DataLoss(f"topic {topic!r}: the query's offset {pos.next} is past the topic's"
                           f" next offset {st.next} in generation {st.generation:#x}")
        if st.oldest > pos.next:
            check_loss(fail_on_data_loss, warn,
                       f"topic {topic!r}: offsets {pos.next}..{st.oldest - 1} were cleaned up"
                       f" before the query read them (generation {st.generation:#x})."
                       f" Continuing at offset {st.oldest}.")
            out[topic] = Position(st.generation, st.oldest)
            continue
        end = st.next
        cap = target.get(topic) if target is not None else None
        if cap is not None:
            # a reset since the target was taken means everything held came later
            end = min(end, cap.next) if cap.generation == st.generation else pos.next
        begin[topic] = pos
        waiting[topic] = max(0, end - pos.next)
    takes = share(waiting, max_messages)
    for topic, pos in begin.items():
        out[topic] = Position(pos.generation, pos.next + takes[topic])
    return out


def batch_ranges(starts: dict[str, Start], ends: dict[str, Start],
                 status: Mapping[str, TopicStatus], topics: list[str], *,
                 fail_on_data_loss: bool, warn: Warn) -> list[Range]:
    """What a batch read covers per topic, from ``startingOffsets``/``endingOffsets``.

    A position of another generation, or a start already cleaned up, raises
    :class:`DataLoss` or (``fail_on_data_loss=False``) warns and reads what is held.
    Raises ValueError for an offset past a topic's end.
    """
    out: list[Range] = []
    for topic in topics:
        st = status[topic]
        lo, hi = resolve_start(starts[topic], st, topic), resolve_start(ends[topic], st, topic)
        stale = [p for p in (lo, hi) if p.generation != st.generation]
        if stale:
            check_loss(fail_on_data_loss, warn,
                       f"topic {topic!r} was reset (its shard restarted): generation"
                       f" {stale[0].generation:#x} -> {st.generation:#x}. Skipping the topic.")
            continue
        if hi.next > st.next:
            raise ValueError(f"ending offset {hi.next} of topic {topic!r} is past its next"
                             f" offset {st.next}")
        start = lo.next
        if start < st.oldest:
            if start < hi.next:
                check_loss(fail_on_data_loss, warn,
                           f"topic {topic!r}: offsets {start}..{min(st.oldest, hi.next) - 1}"
                           f" were cleaned up (generation {st.generation:#x}).")
            start = st.oldest
        if hi.next > start:
            out.append(Range(topic, st.generation, start, hi.next))
    return out


def share(waiting: dict[str, int], budget: int | None) -> dict[str, int]:
    """Split ``budget`` messages over topics in proportion to what each has waiting
    (largest remainders first, ties in topic order); ``None`` takes everything."""
    total = sum(waiting.values())
    if budget is None or total <= budget:
        return dict(waiting)
    takes = {t: budget * n // total for t, n in waiting.items()}
    left = budget - sum(takes.values())
    order = sorted(waiting, key=lambda t: -((budget * waiting[t]) % total))
    for topic in order:
        if left == 0:
            break
        if takes[topic] < waiting[topic]:
            takes[topic] += 1
            left -= 1
    return takes


def ranges(start: Offsets, end: Offsets, topics: list[str]) -> list[Range]:
    """The offsets a batch reads per topic: nothing where the generation changed
    (:func:`plan_end` moved to the new one) or where the topic is new to the query."""
    out: list[Range] = []
    for topic in topics:
        a, b = start.get(topic), end.get(topic)
        if a is None or b is None or a.generation != b.generation or b.next <= a.next:
            continue
        out.append(Range(topic, b.generation, a.next, b.next))
    return out


def split(batch: list[Range], max_per_partition: int, min_partitions: int = 1) -> list[Range]:
    """Cut ranges into partitions of at most ``max_per_partition`` messages, smaller
    when needed to make at least ``min_partitions`` (deterministic: a re-run batch
    gets the same partitions)."""
    total = sum(r.end - r.start for r in batch)
    if not total:
        return []
    size = max(1, min(max_per_partition, math.ceil(total / max(1, min_partitions))))
    out: list[Range] = []
    for r in batch:
        count = math.ceil((r.end - r.start) / size)
        step = math.ceil((r.end - r.start) / count)  # even pieces rather than a small tail
        lo = r.start
        while lo < r.end:
            hi = min(r.end, lo + step)
            out.append(Range(r.topic, r.generation, lo, hi))
            lo = hi
    return out


def check_loss(fail: bool, warn: Warn, message: str) -> None:
    """Raise :class:`DataLoss` with ``message`` when ``fail``, else pass it to ``warn``."""
    if fail:
        raise DataLoss(message + " Set failOnDataLoss=false to skip ahead with a warning.")
    warn(message)
