"""Topic -> shard placement: jump consistent hash over xxh3_64 of the topic name.

``shard_for(topic, n) == jump_consistent_hash(xxh3_64(topic_utf8, seed=0), n)``.
Changing ``n`` moves about 1/n of the topics. PROTOCOL.md pins the function
with test vectors, so clients in other languages place topics identically.
"""

from __future__ import annotations

import xxhash

_MASK64 = (1 << 64) - 1
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
    """The index of the shard that owns ``topic`` among ``shard_count`` shards."""
    return jump_consistent_hash(topic_hash(topic), shard_count)
