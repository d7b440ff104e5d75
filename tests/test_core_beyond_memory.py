"""Disk topics holding more than memory (G9 "Space"): payloads of durable groups leave
memory past ``storage.cache_bytes`` and are read back from their records (checksum
verified) for deliveries, redeliveries and FETCH; ``shard.max_memory`` and
``topic.max_bytes`` count only what is in memory; a damaged record is never delivered."""

from __future__ import annotations

from typing import Any

from test_core_disk import Disk
from test_core_support import TOPIC, Client, Shard, deliver_messages, fetched_messages

from flux import errors
from flux import protocol as P

PAYLOAD = 1000  # bytes per message: payloads dominate what a shard would hold


def _payload(i: int) -> bytes:
    return (f"{i:08d}".encode() * (PAYLOAD // 8 + 1))[:PAYLOAD]


def _shard(**overrides: Any) -> tuple[Shard, Disk, Client]:
    shard = Shard({"storage.dir": "/data", "storage.kind": "disk", "message.ttl": 600.0,
                   **overrides})
    disk = Disk(shard)
    return shard, disk, shard.connect()


def _publish_durably(shard: Shard, disk: Disk, client: Client, first: int, count: int,
                     group: int = 10) -> None:
    """Publish ``count`` messages from id ``first`` in groups, each made durable before the
    next (so it may be evicted); every one must be stored."""
    for start in range(first, first + count, group):
        ids = [f"m{i}" for i in range(start, min(first + count, start + group))]
        client.send([P.PUBLISH, client.rid(), [[TOPIC, ids, [_payload(int(i[1:]))
                                                              for i in ids]]]])
        disk.sync()
        [reply] = client.take(P.PUBLISHED)
        assert reply[3][0][0] == start, reply  # every item stored, from ``start`` on
        assert shard.core.memory <= shard.core.max_memory


def _fetch_all(client: Client, count: int) -> list[list[Any]]:
    messages: list[list[Any]] = []
    while len(messages) < count:
        frame = client.fetch(offset=len(messages), max_messages=64)
        got = fetched_messages(frame)
        assert got, frame
        messages += got
    return messages


def test_a_disk_topic_holds_several_times_shard_max_memory_and_reads_it_all_back() -> None:
    max_memory = 100_000
    count = 400  # 400 kB of payloads: four times the shard's memory
    shard, disk, client = _shard(**{"shard.max_memory": max_memory,
                                    "topic.max_bytes": 60_000,
                                    "storage.cache_bytes": 20_000})
    _publish_durably(shard, disk, client, 0, count)
    core = shard.core
    topic = core.topics[TOPIC]
    assert len(topic.log) == count
    assert core.cache.used <= 20_000 + 10 * PAYLOAD  # the budget, and at most one group more
    assert topic.log.held_bytes < count * PAYLOAD // 10
    stats = shard.topic_stats()
    assert stats["held"] == count and stats["held_bytes"] < 60_000
    assert core.stats(shard.now)["payload_cache"]["evicted"] > 0

    # FETCH reads every message back intact, from the log where evicted
    reads = disk.writer().reads
    messages = _fetch_all(client, count)
    assert [(m[0], m[1], m[2]) for m in messages] == [
        (i, f"m{i}", _payload(i)) for i in range(count)]
    assert disk.writer().reads > reads
    assert core.memory <= max_memory and core.cache.used <= 20_000

    # and so do deliveries, to a subscription reading from the oldest
    reader = shard.connect()
    reader.subscribe(1, read_old=True, max_in_flight=50, credit=50)
    seen: list[tuple[int, str, bytes]] = []
    while len(seen) < count:
        frames = reader.take(P.DELIVER)
        assert frames, f"stalled after {len(seen)} deliveries"
        for frame in frames:
            seen += [(o, i, p) for o, i, p, _ in deliver_messages(frame)]
        reader.send([P.ACK, reader.rid(), 1, shard.generation, [], seen[-1][0]])
        reader.credit(1, 50)
    assert seen == [(i, f"m{i}", _payload(i)) for i in range(count)]
    assert core.memory <= max_memory
    assert disk.damage == []


def test_a_memory_topic_is_refused_where_a_disk_topic_goes_on() -> None:
    """The same publishes to a memory topic hit shard.max_memory (TopicFull)."""
    shard = Shard({"shard.max_memory": 100_000, "message.ttl": 600.0})
    client = shard.connect()
    refused = 0
    for start in range(0, 400, 10):
        ids = [f"m{i}" for i in range(start, start + 10)]
        reply = client.request([P.PUBLISH, client.rid(), [[TOPIC, ids, [_payload(0)] * 10]]])
        refused += sum(1 for row in reply[3][0][2] if row[1] == errors.TopicFull.code) \
            if type(reply[3][0][0]) is list else 0
    assert refused > 250


def test_redeliveries_of_evicted_messages_are_read_back() -> None:
    shard, disk, client = _shard(**{"storage.cache_bytes": 0, "subscriber.timeout": 1.0,
                                    "subscriber.retry_interval": 0.0})
    reader = shard.connect()
    reader.subscribe(1, read_old=True)
    _publish_durably(shard, disk, client, 0, 30)
    first = [m for f in reader.take(P.DELIVER) for m in deliver_messages(f)]
    assert [m[0] for m in first] == list(range(30))
    assert shard.core.cache.used == 0  # every group evicted once durable and delivered
    shard.after(1.5)
    again = [(m[0], m[2]) for f in reader.take(P.DELIVER) for m in deliver_messages(f)]
    assert again == [(i, _payload(i)) for i in range(30)]


def test_large_payloads_are_evicted_and_read_back_too() -> None:
    """Groups of large payloads are held unpacked; read back they are the same."""
    shard, disk, client = _shard(**{"storage.cache_bytes": 0})
    big = [bytes([i]) * 5000 for i in range(4)]
    client.send([P.PUBLISH, client.rid(), [[TOPIC, ["a", "b", "c", "d"], big]]])
    disk.sync()
    shard.core._settle_cache()
    assert shard.core.cache.used == 0 and shard.core.topics[TOPIC].log.held_bytes == 4
    messages = fetched_messages(client.fetch(offset=1, max_messages=2))
    assert [(m[1], m[2]) for m in messages] == [("b", big[1]), ("c", big[2])]


def test_a_group_not_yet_durable_is_never_evicted() -> None:
    shard, disk, client = _shard(**{"storage.cache_bytes": 0})
    client.send([P.PUBLISH, client.rid(), [[TOPIC, ["a"], [b"x" * 100]]]])
    shard.core._settle_cache()
    assert shard.core.cache.used == 100  # its record is not durable: it stays
    disk.sync()
    assert shard.core.cache.used == 0


def test_a_publish_evicts_cached_payloads_to_fit_topic_max_bytes() -> None:
    """A big cache never makes a disk topic refuse a publish its log could take."""
    shard, disk, client = _shard(**{"topic.max_bytes": 30_000,
                                    "storage.cache_bytes": 1 << 30})
    _publish_durably(shard, disk, client, 0, 100)  # 100 kB through a 30 kB topic
    assert shard.topic_stats()["held_bytes"] <= 30_000
    assert [m[2] for m in _fetch_all(client, 100)] == [_payload(i) for i in range(100)]


def test_a_damaged_record_read_back_is_refused_not_delivered() -> None:
    shard, disk, client = _shard(**{"storage.cache_bytes": 0})
    _publish_durably(shard, disk, client, 0, 20)
    writer = disk.writer()
    second = next(r for r in writer.records if r.type == 1 and r.body[1] == 10)
    writer.data[second.position + 9 + len(second.body) - 50] ^= 0x10  # a bit in a payload
    # the first group reads back intact
    assert [m[0] for m in fetched_messages(client.fetch(offset=0, max_messages=10))] == \
        list(range(10))
    # the second is refused with a typed, retryable error, never its bytes
    reply = client.fetch(offset=10, max_messages=10)
    assert reply[0] == P.ERROR and reply[2] == errors.StorageUnavailable.code, reply
    assert errors.StorageUnavailable.retryable
    assert len(disk.damage) == 1 and "checksum" in disk.damage[0]
    # a push subscription gets nothing of the damaged group (a push of a range that
    # holds it is not sent at all)
    reader = shard.connect()
    reader.subscribe(1, read_old=True, max_in_flight=100)
    assert all(o < 10 for o, _ in reader.deliveries())
    reader.subscribe(2, read_old=True, max_in_flight=10)
    assert [o for o, _ in reader.deliveries(2)] == list(range(10))
    # the topic takes no publishes until the shard recovers (it stops to do so)
    refused = client.request([P.PUBLISH, client.rid(), [[TOPIC, ["late"], [b"late"]]]])
    assert refused[3][0][2][0][1] == errors.StorageUnavailable.code
