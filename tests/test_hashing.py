"""Topic -> shard placement: published test vectors, a pinned table and the 1/N property.

The table below is the one PROTOCOL.md publishes ("Topic -> shard"): clients in
other languages check themselves against it, so changing it breaks them.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import xxhash

from flux.hashing import jump_consistent_hash, shard_for, topic_hash

U64 = 1 << 64


def reference_jump(key: int, buckets: int) -> int:
    """Lamping & Veach (2014), "A Fast, Minimal Memory, Consistent Hash Algorithm",
    written out again from the paper: a 64-bit LCG drives jumps forward from
    bucket 0; the last bucket before a jump past ``buckets`` is the answer."""
    key %= U64
    bucket, jump = -1, 0
    while jump < buckets:
        bucket = jump
        key = (key * 2862933555777941757 + 1) % U64
        # the paper: (b + 1) * (double(1 << 31) / double((key >> 33) + 1))
        jump = math.floor((bucket + 1) * (float(2**31) / float((key >> 33) + 1)))
    return bucket


# Published vectors for the same algorithm (Guava's Hashing.consistentHash tests,
# repeated by the Go, Rust and C ports): keys 0..19 into 100 buckets, and a few more.
GOLDEN_100 = [0, 55, 62, 8, 45, 59, 86, 97, 82, 59, 73, 37, 17, 56, 86, 21, 90, 37, 38, 83]
GOLDEN_MORE = [
    (10863919174838991, 11, 6),
    (2016238256797177309, 11, 3),
    (1673758223894951030, 11, 5),
    (2, 100001, 80343),
    (2201, 100001, 22152),
    (2202, 100001, 15018),
]

# xxHash's own sanity vectors for XXH3_64bits with seed 0.
XXH3_PUBLISHED = [(b"", 0x2D06800538D394C2), (b"a", 0xE6C632B61E964E1F), (b"abc", 0x78AF5F94892F3950)]

# Computed once with flux.hashing and pinned: topic -> (xxh3_64, shard for N = 1, 2, 3, 8, 16).
SHARD_COUNTS = (1, 2, 3, 8, 16)
PINNED = {
    "orders": (0xA88CCDC9FA4974FB, (0, 0, 0, 0, 8)),
    "orders.eu": (0x45199B9C79B0D24D, (0, 1, 1, 7, 7)),
    "orders.us": (0x84C04F7111F5494A, (0, 1, 2, 3, 9)),
    "payments": (0x9DC28A75CB77B43D, (0, 0, 0, 4, 12)),
    "users.signup": (0x4C2FC713930F255D, (0, 1, 1, 6, 6)),
    "a": (0xE6C632B61E964E1F, (0, 1, 1, 1, 14)),
    "metrics.cpu.host-1": (0xC496E349D16C7A7B, (0, 0, 0, 0, 0)),
    "logs_app": (0x5DD4F8543EE2DD4F, (0, 0, 0, 3, 3)),
    "x.y.z": (0x7C42F5AE75830F5B, (0, 1, 1, 6, 6)),
    "Z9": (0x2A7F6763E6831E9A, (0, 1, 1, 6, 6)),
    "billing.invoices.2024": (0x5A7CEE9157B2DBD1, (0, 0, 0, 7, 7)),
}


@pytest.mark.parametrize("key", range(len(GOLDEN_100)))
def test_jump_hash_matches_published_golden_vectors_for_100_buckets(key: int) -> None:
    assert jump_consistent_hash(key, 100) == GOLDEN_100[key]


@pytest.mark.parametrize(("key", "buckets", "expected"), GOLDEN_MORE)
def test_jump_hash_matches_published_vectors_for_large_keys_and_bucket_counts(
        key: int, buckets: int, expected: int) -> None:
    assert jump_consistent_hash(key, buckets) == expected


def test_reference_derivation_agrees_with_the_published_vectors() -> None:
    # guards the reference itself, so the comparison below means something
    assert [reference_jump(k, 100) for k in range(20)] == GOLDEN_100
    assert [reference_jump(k, b) for k, b, _ in GOLDEN_MORE] == [e for _, _, e in GOLDEN_MORE]


def test_jump_hash_equals_the_reference_derivation_over_many_keys_and_bucket_counts() -> None:
    keys = [0, 1, U64 - 1, 1 << 63, 0xDEADBEEF] + [topic_hash(f"k{i}") for i in range(300)]
    for key in keys:
        for buckets in (1, 2, 3, 5, 7, 8, 16, 31, 64, 100, 1000, 65536):
            assert jump_consistent_hash(key, buckets) == reference_jump(key, buckets), (key, buckets)


def test_jump_hash_reduces_keys_modulo_2_to_the_64() -> None:
    assert jump_consistent_hash(-1, 1000) == jump_consistent_hash(U64 - 1, 1000)
    assert jump_consistent_hash(U64 + 5, 1000) == jump_consistent_hash(5, 1000)


@pytest.mark.parametrize("buckets", [0, -1])
def test_jump_hash_refuses_fewer_than_one_bucket(buckets: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        jump_consistent_hash(1, buckets)


@pytest.mark.parametrize(("data", "expected"), XXH3_PUBLISHED, ids=["empty", "a", "abc"])
def test_xxhash_package_gives_published_xxh3_64_vectors(data: bytes, expected: int) -> None:
    assert xxhash.xxh3_64_intdigest(data, seed=0) == expected


@pytest.mark.parametrize(("data", "expected"), XXH3_PUBLISHED, ids=["empty", "a", "abc"])
def test_topic_hash_is_xxh3_64_of_the_utf8_bytes_with_seed_0(data: bytes, expected: int) -> None:
    assert topic_hash(data.decode()) == expected


def test_topic_hash_encodes_non_ascii_as_utf8() -> None:
    assert topic_hash("é.ü") == xxhash.xxh3_64_intdigest("é.ü".encode(), seed=0)
    assert topic_hash("é.ü") != xxhash.xxh3_64_intdigest("é.ü".encode("latin-1"), seed=0)


@pytest.mark.parametrize("topic", sorted(PINNED))
def test_topic_hash_of_pinned_topics_is_unchanged(topic: str) -> None:
    assert topic_hash(topic) == PINNED[topic][0]


@pytest.mark.parametrize("topic", sorted(PINNED))
def test_shard_for_pinned_topics_is_unchanged(topic: str) -> None:
    assert tuple(shard_for(topic, n) for n in SHARD_COUNTS) == PINNED[topic][1]


def test_shard_for_is_jump_hash_of_topic_hash() -> None:
    for i in range(200):
        topic = f"orders.region-{i}"
        for n in (1, 4, 13):
            assert shard_for(topic, n) == reference_jump(topic_hash(topic), n)


def test_shard_for_stays_within_range_and_uses_every_shard() -> None:
    for n in (1, 2, 3, 8, 16):
        seen = {shard_for(f"t.{i}", n) for i in range(2000)}
        assert seen == set(range(n))


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 8, 15, 16, 31])
def test_growing_from_n_to_n_plus_1_shards_moves_only_to_the_new_shard_about_1_over_n_plus_1(
        n: int) -> None:
    keys = 10_000
    moved = 0
    for i in range(keys):
        topic = f"topic.{i}"
        before, after = shard_for(topic, n), shard_for(topic, n + 1)
        if before != after:
            assert after == n, f"{topic} moved {before} -> {after}, not to the new shard {n}"
            moved += 1
    p = 1 / (n + 1)
    expected = keys * p
    # a fixed key set makes this deterministic; 5 binomial standard deviations of slack
    assert abs(moved - expected) <= 5 * math.sqrt(keys * p * (1 - p)), (moved, expected)


def test_protocol_md_publishes_the_pinned_shard_table() -> None:
    text = (Path(__file__).resolve().parents[1] / "PROTOCOL.md").read_text()
    rows = re.findall(r"^\| `([^`]+)` \| `([0-9a-f]{16})` \|((?: +\d+ \|){5})$", text, re.MULTILINE)
    documented = {t: (int(h, 16), tuple(int(x) for x in cells.split("|") if x.strip()))
                  for t, h, cells in rows}
    assert documented == PINNED
