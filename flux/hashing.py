"""Topic -> shard placement: jump consistent hash over xxh3_64 of the topic name.

``shard_for(topic, n) == jump_consistent_hash(xxh3_64(topic_utf8, seed=0), n)``.
Changing ``n`` moves about 1/n of the topics. PROTOCOL.md pins the function
with test vectors, so clients in other languages place topics identically.

A dead-letter topic (G11) is named ``TOPIC~SUBSCRIPTION``: ``~`` is outside the
topic-name alphabet, so no user topic has such a name, and placement hashes only
the part before the first ``~`` (the source topic): it lives on its source's
shard, and every plain topic's placement (the test vectors) is unchanged.
"""

from __future__ import annotations

import xxhash

_MASK64 = (1 << 64) - 1
DEAD_LETTER_SEP = "~"  # joins a dead-letter topic's source topic and subscription
_LCG_MULTIPLIER = 2862933555777941757


def jump_consistent_hash(key: int, buckets: int) -> int:
    """Lamping & Veach's jump consistent hash of a 64-bit ``key`` into ``buckets``."""
    if buckets < 1:
        raise ValueError("buckets must be at least 1")
    key &= _MASK64
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * _LCG_MULTIPLIER + 1) & _MASK64
        j = int((b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return b


def topic_hash(topic: str) -> int:
    """xxh3_64 of the topic's UTF-8 bytes with seed 0."""
    return xxhash.xxh3_64_intdigest(topic.encode("utf-8"), seed=0)


def shard_for(topic: str, shard_count: int) -> int:
    """The index of the shard that owns ``topic`` among ``shard_count`` shards (a
    dead-letter topic: its source topic's)."""
    if DEAD_LETTER_SEP in topic:
        topic = topic.split(DEAD_LETTER_SEP, 1)[0]
    return jump_consistent_hash(topic_hash(topic), shard_count)


def dead_letter_topic(topic: str, subscription: str) -> str:
    """The name of the dead-letter topic of ``subscription`` on ``topic`` (G11)."""
    return f"{topic}{DEAD_LETTER_SEP}{subscription}"


def dead_letter_source(name: str) -> str | None:
    """The source topic of dead-letter topic ``name``; None for any other name."""
    if DEAD_LETTER_SEP not in name:
        return None
    return name.split(DEAD_LETTER_SEP, 1)[0]


def dead_letter_parts(name: str) -> tuple[str, str] | None:
    """(source topic, subscription) of dead-letter topic ``name``; None for another name."""
    if DEAD_LETTER_SEP not in name:
        return None
    topic, subscription = name.split(DEAD_LETTER_SEP, 1)
    return topic, subscription
