"""ShardCore with disk topics (G9), its log writer replaced by one whose durable mark the
test moves: nothing is acked, confirmed or exposed before its record is durable, and
the records rebuild the topic (TopicReplay) as the core held it."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from test_core_support import GEN, TOPIC, Client, Shard, deliver_messages

from flux import errors
from flux import protocol as P
from flux.shard import journal as J
from flux.shard.cache import PayloadCache, TopicPayloads
from flux.shard.journal import TopicJournal
from flux.shard.replay import TopicReplay
from flux.storage import Appended, CorruptRecord, LogFailed, NotInLog, Record
from flux.storage import record as R


class FakeWriter:
    """The Appender side of a log writer: records kept in a list, durable when told."""

    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.records: list[Record] = []
        self.appended = 0
        self.durable = 0
        self.snapshot: Any = None
        self.failed: LogFailed | None = None
        self.data = bytearray()  # the records as the log holds them (checksummed)

    @property
    def size(self) -> int:
        return self.appended

    @property
    def synced(self) -> int:
        return self.durable

    def append(self, rtype: int, body: bytes) -> Appended:
        if self.failed is not None:
            raise self.failed
        if not self.records and self.snapshot is not None:  # a segment starts with one
            self._add(*self.snapshot())
        return self._add(rtype, body)

    def _add(self, rtype: int, body: bytes) -> Appended:
        position = self.appended
        self.records.append(Record(position, rtype, bytes(body)))
        self.data += R.encode(rtype, bytes(body))
        self.appended += 9 + len(body)
        return Appended(position, self.appended)

    def read(self, position: int, size_hint: int = 0) -> Record:
        """A record read back as LogReader reads it: below the durable mark, verified."""
        self.reads += 1
        if not 0 <= position < self.durable:
            raise NotInLog(f"position {position} is not durable")
        try:
            return R.decode(bytes(self.data), position, position)
        except (R.Torn, R.Bad) as exc:
            raise CorruptRecord("fake", position, str(exc)) from None

    reads = 0

    def kinds(self) -> list[int]:
        return [r.type for r in self.records]


class Disk:
    """Opens a FakeWriter per disk topic and moves durable marks on demand."""

    def __init__(self, shard: Shard, generation: int = GEN) -> None:
        self.shard = shard
        self.generation = generation
        self.journals: dict[str, TopicJournal] = {}
        self.damage: list[str] = []
        shard.core.open_journal = self.open

    def open(self, name: str, start: int) -> TopicJournal:
        writer = FakeWriter(self.generation)
        journal = TopicJournal(name, writer, exposed=start, reader=writer)
        journal.on_damage = lambda journal, reason: self.damage.append(reason)
        self.journals[name] = journal
        return journal

    def writer(self, topic: str = TOPIC) -> FakeWriter:
        writer = self.journals[topic].writer
        assert isinstance(writer, FakeWriter)
        return writer

    def sync(self, topic: str = TOPIC) -> None:
        writer = self.writer(topic)
        writer.durable = writer.appended
        self.shard.core.storage_progress(self.journals[topic], self.shard.now)
        self.shard.collect()


def _disk_shard(**overrides: Any) -> tuple[Shard, Disk, Client]:
    shard = Shard({"storage.dir": "/data", "storage.kind": "disk", **overrides})
    disk = Disk(shard)
    return shard, disk, shard.connect()


def _publish(client: Client, *ids: str) -> None:
    client.send([P.PUBLISH, client.rid(), [[TOPIC, list(ids), [i.encode() for i in ids]]]])


def test_a_publish_is_acked_only_once_its_record_is_durable() -> None:
    _shard, disk, client = _disk_shard()
    _publish(client, "a", "b")
    assert client.take(P.PUBLISHED) == []
    assert disk.writer().kinds() == [J.SNAPSHOT, J.PUBLISH]
    disk.sync()
    [reply] = client.take(P.PUBLISHED)
    assert reply[2] == GEN and reply[3] == [[0, [], []]]


def test_a_recovering_shard_holds_cleanup_back_without_it_being_due_meanwhile() -> None:
    """While recovery runs (a slow fsync, say) no cleanup pass runs, and none is reported
    due: the shell's ticker slept until a past deadline again and again, and a
    recovery longer than message.cleanup_time spun it at one instant. Once recovered,
    the passes held back are due at once."""
    shard, _disk, _client = _disk_shard(**{"subscriber.heartbeat": 1000.0})
    shard.core.recovering = "topic 1 of 1"
    shard.advance(12.0)   # raises if a tick leaves a deadline at or before it
    assert shard.ticks == []
    assert shard.core.next_deadline() > 12.0
    shard.core.recovering = None
    assert shard.core.next_deadline() == 5.0
    shard.advance(13.0)
    assert shard.ticks == [12.0]   # the passes held back run as one, on their period


def test_a_disk_topic_has_its_own_generation_in_each_group_result() -> None:
    shard = Shard({"storage.dir": "/data", "topics": [{"match": "disk.>", "storage": "disk"}]})
    disk = Disk(shard, generation=0xD15C)
    client = shard.connect()
    client.send([P.PUBLISH, client.rid(), [["mem", ["m"], [b"m"]], ["disk.a", ["d"], [b"d"]]]])
    disk.sync("disk.a")
    [reply] = client.take(P.PUBLISHED)
    assert reply[2] == GEN
    assert reply[3] == [[0, [], []], [0, [], [], 0xD15C]]
    assert shard.stats()["topics"]["disk.a"]["generation"] == 0xD15C


def test_nothing_is_delivered_or_fetched_before_it_is_durable() -> None:
    shard, disk, client = _disk_shard()
    reader = shard.connect()
    reader.subscribe(1)  # ephemeral: its SUBSCRIBED needs no record
    _publish(client, "a", "b")
    assert reader.deliveries() == []
    fetched = reader.fetch()
    assert fetched[2]["next"] == 0 and fetched[4] == []
    disk.sync()
    assert reader.deliveries() == [(0, 1), (1, 1)]
    fetched = reader.fetch()
    assert fetched[2]["next"] == 2 and fetched[4] == ["a", "b"]


def test_a_new_subscription_starts_at_the_durable_end_and_gets_what_becomes_durable() -> None:
    """G9: a SUBSCRIBED tells no offset whose record is not durable (a crash may lose it,
    and the next incarnation uses it again): an ephemeral subscription made while "a"
    and "b" wait for their fsync starts at 0, not 2, and gets them once durable."""
    shard, disk, client = _disk_shard()
    reader = shard.connect()
    _publish(client, "a", "b")
    reply = reader.subscribe(1)
    assert (reply["start_offset"], reply["next_offset"]) == (0, 0)
    [refused] = reader.subscribe_frame(2, from_offset=1)[2:3]
    assert refused == errors.OffsetOutOfRange.code
    disk.sync()
    assert reader.deliveries() == [(0, 1), (1, 1)]


def test_a_duplicate_is_acked_only_once_its_original_is_durable() -> None:
    _shard, disk, client = _disk_shard()
    _publish(client, "a")
    _publish(client, "a")
    assert client.take(P.PUBLISHED) == []
    disk.sync()
    first, second = client.take(P.PUBLISHED)
    assert first[3] == [[0, [], []]] and second[3] == [[[0], [0], []]]


def test_a_new_named_subscription_is_confirmed_durable_before_any_delivery() -> None:
    _shard, disk, client = _disk_shard()
    _publish(client, "a")
    disk.sync()
    client.take()
    client.send([P.SUBSCRIBE, client.rid(), 1, {"topic": TOPIC, "name": "billing",
                                               "read_old": True}])
    assert client.take() == []  # neither SUBSCRIBED nor a DELIVER ahead of it
    assert disk.writer().kinds()[-1] == J.SUBSCRIPTION
    disk.sync()
    kinds = [f[0] for f in client.take()]
    assert kinds == [P.SUBSCRIBED, P.DELIVER]


def test_frames_to_a_connection_never_overtake_a_reply_held_for_durability() -> None:
    shard, disk, first = _disk_shard()
    second = shard.connect()
    _publish(first, "a")
    disk.sync()
    first.take()
    first.send([P.SUBSCRIBE, first.rid(), 1, {"topic": TOPIC, "name": "s", "read_old": True}])
    second.send([P.SUBSCRIBE, second.rid(), 1, {"topic": TOPIC, "name": "s"}])  # takes over
    first.send([P.PING, first.rid()])
    assert first.take() == []  # SUB_ENDED and PONG wait behind the held SUBSCRIBED
    disk.sync()
    assert [f[0] for f in first.take()] == [P.SUBSCRIBED, P.DELIVER, P.SUB_ENDED, P.PONG]
    assert [f[0] for f in second.take()] == [P.SUBSCRIBED, P.DELIVER]


def test_an_ack_is_confirmed_once_its_cursor_record_is_durable() -> None:
    _shard, disk, client = _disk_shard()
    _publish(client, "a", "b")
    disk.sync()
    client.send([P.SUBSCRIBE, client.rid(), 1, {"topic": TOPIC, "name": "billing",
                                               "read_old": True}])
    disk.sync()
    client.take()
    client.send([P.ACK, client.rid(), 1, GEN, [1], -1])
    assert client.take(P.ACKED) == []
    body = msgpack.unpackb(disk.writer().records[-1].body)
    assert disk.writer().records[-1].type == J.CURSOR and body == ["billing", 0, [1, 1]]
    disk.sync()
    [acked] = client.take(P.ACKED)
    assert acked[3] == 0 and acked[4] == []


def test_a_failed_log_answers_what_waits_and_refuses_publishes() -> None:
    shard, disk, client = _disk_shard()
    _publish(client, "a")
    journal = disk.journals[TOPIC]
    disk.writer().failed = LogFailed("fsync failed")
    shard.core.storage_failed(journal, "fsync failed")
    shard.collect()
    [error] = client.take(P.ERROR)
    assert error[2] == errors.StorageUnavailable.code
    rows = client.publish_rows([[TOPIC, "b", b"b"]])
    assert rows[0][0] == errors.StorageUnavailable.code


def test_a_log_over_storage_max_bytes_refuses_publishes_with_topic_full() -> None:
    _shard, disk, client = _disk_shard(**{"storage.max_bytes": 10})
    _publish(client, "a")
    disk.sync()
    client.take()
    rows = client.publish_rows([[TOPIC, "b", b"b"]])
    assert rows[0][0] == errors.TopicFull.code


def test_a_full_disk_refuses_publishes_to_disk_topics_while_acks_go_on() -> None:
    shard, disk, client = _disk_shard()
    _publish(client, "a")
    client.send([P.SUBSCRIBE, client.rid(), 1, {"topic": TOPIC, "name": "billing",
                                               "read_old": True}])
    disk.sync()
    client.take()
    shard.core.disk_full = "the disk holding /data has 0 bytes free"
    rows = client.publish_rows([[TOPIC, "b", b"b"]])
    assert rows[0][0] == errors.StorageUnavailable.code and "0 bytes free" in rows[0][1]
    client.send([P.ACK, client.rid(), 1, GEN, [0, 0], -1])   # acks still get their record
    disk.sync()
    assert client.take(P.ACKED)
    shard.core.disk_full = None
    _publish(client, "b")
    disk.sync()
    [reply] = client.take(P.PUBLISHED)
    assert reply[3] == [[1, [], []]]


def test_a_hello_of_another_version_behind_a_held_reply_still_says_why_it_closes() -> None:
    """Found by the wire fuzzer: the UnsupportedVersion waited behind a PUBLISHED held
    for durability, and the connection closed without it."""
    _shard, _disk, client = _disk_shard()
    _publish(client, "a")                 # held until its record is durable
    client.send([P.HELLO, 9, {"version": 99}])
    [error] = client.take(P.ERROR)
    assert error[1:3] == [9, errors.UnsupportedVersion.code]


def test_the_records_rebuild_the_topic_as_the_core_held_it() -> None:
    shard, disk, client = _disk_shard(**{"message.ttl": 20.0})
    _publish(client, "a", "b", "c")
    client.send([P.SUBSCRIBE, client.rid(), 1, {"topic": TOPIC, "name": "billing",
                                               "read_old": True}])
    client.send([P.SUBSCRIBE, client.rid(), 2, {"topic": TOPIC, "name": "gone"}])
    disk.sync()
    client.send([P.ACK, client.rid(), 1, GEN, [0, 2], -1])
    client.send([P.UNSUBSCRIBE, client.rid(), 2])
    disk.sync()
    held = shard.core.topics[TOPIC]
    shard.core._delete_subscription(held.subs["gone"])
    replay = TopicReplay(TOPIC, held.settings, epoch=0.0)
    for rec in disk.writer().records:
        replay.feed(rec)
    topic = replay.build(GEN, now=shard.now)
    assert (topic.log.oldest, topic.log.next_offset) == (0, 3)
    assert topic.log.held_bytes == 3  # the ids: payloads stay in the log until read
    topic.log.store = TopicPayloads(PayloadCache(1 << 20), topic, disk.journals[TOPIC])
    assert [topic.log.get(o) for o in range(3)] == [  # read back from the records
        (i, i.encode(), 0.0) for i in ("a", "b", "c")]
    assert topic.log.held_bytes == 6
    assert topic.dedup.get("b") == 1
    assert list(topic.subs) == ["billing"]
    billing = topic.subs["billing"]
    assert (billing.cursor, billing.acked, billing.active) == (1, {2}, False)


def test_a_recovery_remembers_only_the_ids_still_inside_their_dedup_window() -> None:
    shard, disk, client = _disk_shard(**{"message.dedup_window": 50.0})
    _publish(client, "old")
    shard.advance(40.0)
    _publish(client, "new")
    disk.sync()
    settings = shard.core.topics[TOPIC].settings

    def recovered(at: float) -> TopicReplay:
        replay = TopicReplay(TOPIC, settings, epoch=0.0, now=at)
        for rec in disk.writer().records:
            replay.feed(rec)
        return replay

    both = recovered(45.0).build(GEN, now=45.0)
    assert (both.dedup.get("old"), both.dedup.get("new")) == (0, 1)
    later = recovered(60.0)  # "old" (stored at 0) left its 50 s window at 50
    rebuilt = later.build(GEN, now=60.0)
    assert len(rebuilt.dedup) == 1
    assert (rebuilt.dedup.get("old"), rebuilt.dedup.get("new")) == (None, 1)
    assert rebuilt.log.next_offset == 2  # the message itself is still there


@pytest.mark.parametrize("segment_at", [1, 2, 3])
def test_a_snapshot_at_any_record_replaces_what_came_before_it(segment_at: int) -> None:
    """A segment begins with a SNAPSHOT of the whole state; the records before it may be
    dropped. Replaying from any snapshot on gives the same subscriptions and head."""
    shard, disk, client = _disk_shard()
    _publish(client, "a", "b")
    client.send([P.SUBSCRIBE, client.rid(), 1, {"topic": TOPIC, "name": "s",
                                               "read_old": True}])
    disk.sync()
    client.send([P.ACK, client.rid(), 1, GEN, [0], -1])
    writer = disk.writer()
    topic = shard.core.topics[TOPIC]
    records = writer.records[:segment_at]
    snap = Record(0, *shard.core._snapshot(topic))
    tail = [r for r in writer.records[segment_at:] if r.type != J.PUBLISH]
    replay = TopicReplay(TOPIC, topic.settings, epoch=0.0)
    for rec in [*records, snap, *tail]:
        replay.feed(rec)
    rebuilt = replay.build(GEN, now=shard.now)
    assert rebuilt.subs["s"].cursor == 1
    assert rebuilt.log.next_offset == 2


def test_keys_headers_and_due_times_survive_in_the_publish_record() -> None:
    shard, disk, client = _disk_shard()
    _publish(client, "old")  # a record without the fifth field replays as before
    client.send([P.PUBLISH, client.rid(), [[TOPIC, ["k", "d"], [b"k", b"d"],
                                            {"keys": ["key", None],
                                             "headers": [{"h": "v"}, None],
                                             "delay": [None, 30.0]}]]])
    disk.sync()
    held = shard.core.topics[TOPIC]
    replay = TopicReplay(TOPIC, held.settings, epoch=0.0)
    for rec in disk.writer().records:
        replay.feed(rec)
    topic = replay.build(GEN, now=shard.now)
    topic.log.store = TopicPayloads(PayloadCache(1 << 20), topic, disk.journals[TOPIC])
    assert [topic.log.get(o) for o in range(3)] == [  # payloads read back past the meta
        (i, i.encode(), 0.0) for i in ("old", "k", "d")]
    assert topic.log.meta_of(1) == ("key", {"h": "v"}, None)
    assert topic.log.meta_of(2) == (None, None, 30.0)
    assert dict(topic.delayed.items()) == {2: 30.0}
    assert topic.log.held_bytes == held.log.held_bytes  # ids, payloads read back, meta


def test_a_cursor_record_carries_only_the_acks_added_since_the_last_one() -> None:
    """A message held unacked while the others are acked (a long job, a pending delayed
    one) must not make every CURSOR record carry every ack above it: each carries the
    acks added since the previous one, and recovery takes their union."""
    shard, disk, client = _disk_shard(**{"subscriber.max_in_flight": 500})
    ids = [f"m{i}" for i in range(400)]
    _publish(client, *ids)
    client.send([P.SUBSCRIBE, client.rid(), 1, {"topic": TOPIC, "name": "s",
                                               "read_old": True, "credit": 500}])
    disk.sync()
    for first in range(1, 400, 50):  # 0 stays unacked: every ack lands above the cursor
        client.send([P.ACK, client.rid(), 1, GEN, list(range(first, min(first + 50, 400))),
                     -1])
    disk.sync()
    cursors = [msgpack.unpackb(r.body) for r in disk.writer().records if r.type == J.CURSOR]
    assert [c[2] for c in cursors] == [[first, min(50, 400 - first)]  # one run each
                                       for first in range(1, 400, 50)]
    assert all(c[1] == 0 for c in cursors)
    topic = shard.core.topics[TOPIC]
    replay = TopicReplay(TOPIC, topic.settings, epoch=0.0)
    for rec in disk.writer().records:
        replay.feed(rec)
    rebuilt = replay.build(GEN, now=shard.now).subs["s"]
    assert (rebuilt.cursor, rebuilt.acked) == (0, set(range(1, 400)))
    client.send([P.ACK, client.rid(), 1, GEN, [0], -1])  # the cursor passes them all
    disk.sync()
    assert msgpack.unpackb(disk.writer().records[-1].body) == ["s", 400, []]


def test_a_topic_taken_down_for_its_log_ends_its_sessions_and_is_busy_while_others_serve() -> None:
    """Damage read back (G9) is one topic's: taking it down ends each session attached
    to it (SUB_ENDED StorageUnavailable, subscribe again), answers its requests Busy
    and shows it in STATS, while the shard's other topics publish and deliver on."""
    shard, disk, client = _disk_shard()
    other = "other.topic"
    reader = shard.connect()
    for sid, topic, name in ((1, TOPIC, "damaged"), (2, other, "spared")):
        reader.send([P.SUBSCRIBE, reader.rid(), sid, {"topic": topic, "name": name}])
        disk.sync(topic)  # a SUBSCRIBED that made a subscription waits for its record
    assert [f[0] for f in reader.take()] == [P.SUBSCRIBED, P.SUBSCRIBED]
    shard.core.take_down(TOPIC, "damage read back at position 9", shard.now)
    shard.collect()
    assert reader.sub_ended() == [(1, errors.StorageUnavailable.code)]
    [busy] = client.publish_rows([[TOPIC, "a", b"a"]])
    assert busy[0] == errors.Busy.code
    assert reader.fetch()[2] == errors.Busy.code
    assert reader.subscribe_frame(3, name="damaged")[2] == errors.Busy.code
    assert shard.stats()["topics_recovering"] == {TOPIC: "damage read back at position 9"}
    assert TOPIC not in shard.stats()["topics"]
    client.send([P.PUBLISH, client.rid(), [[other, ["b"], [b"b"]]]])
    disk.sync(other)
    assert len(client.take(P.PUBLISHED)) == 1 and reader.deliveries(2) == [(0, 1)]
    shard.core.bring_up(TOPIC)
    _publish(client, "c")
    disk.sync()
    assert len(client.take(P.PUBLISHED)) == 1 and shard.stats()["topics_recovering"] == {}


def test_a_refused_topic_gets_storage_unavailable_is_never_made_and_shows_in_stats() -> None:
    """A topic whose log directory holds what is not its log (G9) is refused: every
    request naming it gets StorageUnavailable saying why, no journal is opened for it
    (nothing is written there), STATS shows it, and the shard's other topics serve."""
    shard, disk, client = _disk_shard()
    why = "/data/shard-0/t/00000000000000000000.log: not a Flux log segment; move it away"
    shard.core.refuse(TOPIC, why)
    [refused] = client.publish_rows([[TOPIC, "a", b"a"]])
    assert refused[0] == errors.StorageUnavailable.code and why in refused[1]
    assert client.fetch()[2] == errors.StorageUnavailable.code
    assert client.subscribe_frame(1, name="s")[2] == errors.StorageUnavailable.code
    assert TOPIC not in disk.journals and TOPIC not in shard.core.topics
    stats = shard.stats()
    assert stats["topics_refused"] == {TOPIC: why} and TOPIC not in stats["topics"]
    other = "other.topic"
    client.send([P.PUBLISH, client.rid(), [[other, ["b"], [b"b"]]]])
    disk.sync(other)
    assert len(client.take(P.PUBLISHED)) == 1


@pytest.mark.parametrize("generation", [GEN, GEN + 1])
def test_a_topic_recovered_alone_in_its_generation_keeps_its_inactive_clocks(
        generation: int) -> None:
    """The shard never stopped: a subscription inactive before the topic was taken down
    keeps counting from then, one attached counts from the take-down; a new generation
    (damage cut records) starts every subscription over, as a restart does (G9)."""
    shard, disk, client = _disk_shard()
    for sid, name in ((1, "idle"), (2, "live")):
        client.send([P.SUBSCRIBE, client.rid(), sid, {"topic": TOPIC, "name": name}])
    client.send([P.UNSUBSCRIBE, client.rid(), 1])
    disk.sync()
    idle_since = shard.core.topics[TOPIC].subs["idle"].inactive_since
    shard.advance(5.0)
    shard.core.take_down(TOPIC, "damage read back", shard.now)
    replay = TopicReplay(TOPIC, shard.core.config.settings_for(TOPIC), epoch=0.0)
    for rec in disk.writer().records:
        replay.feed(rec)
    topic = replay.build(generation, now=6.0, reset=generation != GEN)
    shard.core.adopt_recovered(topic, 6.0)
    shard.core.bring_up(TOPIC)
    subs = shard.core.topics[TOPIC].subs
    if generation == GEN:
        assert (subs["idle"].inactive_since, subs["live"].inactive_since) == (idle_since, 5.0)
    else:
        assert subs["idle"].inactive_since == subs["live"].inactive_since == 6.0

def _replayed(shard: Shard, records: list[Record], disk: Disk | None = None
              ) -> tuple[TopicReplay, Any]:
    """The topic the records rebuild (and the replay that rebuilt it); with ``disk``, its
    payloads and kept messages read back from the records ``disk`` wrote."""
    replay = TopicReplay(TOPIC, shard.core.topics[TOPIC].settings, epoch=0.0, now=shard.now)
    for rec in records:
        replay.feed(rec)
    topic = replay.build(GEN, now=shard.now)
    if disk is not None:
        writer = disk.writer()
        journal = TopicJournal(TOPIC, writer, exposed=topic.log.next_offset, reader=writer)
        topic.log.store = TopicPayloads(PayloadCache(1 << 20), topic, journal)
    return replay, topic


def _keep_one_pending(**overrides: Any) -> tuple[Shard, Disk, Client]:
    """A disk topic whose pending delayed message (offset 0, due at 100) a trim passed."""
    shard, disk, client = _disk_shard(**{"message.ttl": 5.0, **overrides})
    client.send([P.PUBLISH, client.rid(), [[TOPIC, ["d"], [b"pending"],
                                            {"delay": [100.0], "keys": ["k"],
                                             "headers": [{"h": "v"}]}]]])
    _publish(client, "a", "b")
    disk.sync()
    shard.advance(10.0)
    disk.sync()
    return shard, disk, client


def test_a_trim_past_a_pending_message_writes_it_whole_in_a_keep_record_first() -> None:
    shard, disk, _ = _keep_one_pending()
    topic = shard.core.topics[TOPIC]
    assert (topic.log.lowest, topic.log.oldest) == (0, 3)  # 1 and 2 went, 0 is kept
    kinds = disk.writer().kinds()
    assert J.KEEP in kinds and kinds.index(J.KEEP) < kinds.index(J.TRIM)
    keep = next(r for r in disk.writer().records if r.type == J.KEEP)
    assert msgpack.unpackb(keep.body) == [[0, "d", 0.0, b"pending", "k", {"h": "v"}, 100.0]]
    assert disk.journals[TOPIC].kept == {0: keep.position}
    # a recovery holds it out of line, due when it was, with its key and headers
    replay, rebuilt = _replayed(shard, disk.writer().records, disk)
    assert (rebuilt.log.lowest, rebuilt.log.oldest, rebuilt.log.next_offset) == (0, 3, 3)
    assert rebuilt.log.get(0) == ("d", b"pending", 0.0)
    assert rebuilt.log.meta_of(0) == ("k", {"h": "v"}, 100.0)
    assert dict(rebuilt.delayed.items()) == {0: 100.0}
    assert rebuilt.log.held_bytes == topic.log.held_bytes
    assert replay.kept_positions() == {0: keep.position}


def test_a_kept_message_comes_back_from_its_keep_record_alone() -> None:
    """The segments holding its PUBLISH record may go: a SNAPSHOT and the KEEP record
    after it rebuild it."""
    shard, disk, _ = _keep_one_pending()
    topic = shard.core.topics[TOPIC]
    records = disk.writer().records
    snap = Record(0, *shard.core._snapshot(topic))
    tail = [r for r in records if r.type in (J.KEEP, J.TRIM)]
    _, rebuilt = _replayed(shard, [snap, *tail], disk)
    assert rebuilt.log.get(0) == ("d", b"pending", 0.0)
    assert rebuilt.log.oldest == 3
    # deliveries carry its key and headers (no message in line has any)
    assert rebuilt.log.keys_of([0]) == ["k"]
    assert rebuilt.log.meta_columns([0], 0.0) == {"keys": ["k"], "headers": [{"h": "v"}],
                                                  "due": [100.0]}


def test_a_released_kept_message_stays_gone_after_a_recovery() -> None:
    shard, disk, _ = _keep_one_pending()
    shard.advance(106.0)  # ttl past its due time, and nobody holds it: released
    disk.sync()
    assert shard.core.topics[TOPIC].log.lowest == 3
    assert disk.writer().kinds()[-1] == J.RELEASE
    assert disk.journals[TOPIC].kept == {}
    records = disk.writer().records
    _, rebuilt = _replayed(shard, records)
    assert rebuilt.log.get(0) is None and rebuilt.log.lowest == 3
    # a SNAPSHOT after the release lists no kept message: the RELEASE itself may go
    snap = Record(0, *shard.core._snapshot(shard.core.topics[TOPIC]))
    _, rebuilt = _replayed(shard, [*(r for r in records if r.type != J.RELEASE), snap])
    assert rebuilt.log.get(0) is None and rebuilt.log.lowest == 3


def _subscribed_disk_shard() -> tuple[Shard, Disk, Client]:
    """A disk topic (ttl 5 s) with a push subscription "s" (sid 1) that never times out."""
    long = 1e4
    shard, disk, client = _disk_shard(**{"message.ttl": 5.0, "subscriber.heartbeat": long,
                                         "subscriber.timeout": long,
                                         "limits.hello_timeout": long})
    client.send([P.SUBSCRIBE, client.rid(), 1, {"topic": TOPIC, "name": "s"}])
    disk.sync()
    return shard, disk, client


def _kept_at_the_cursor() -> tuple[Shard, Disk, Client]:
    """:func:`_subscribed_disk_shard` where "s" acked 1 and 2 but not 0 (due at 20), and
    cleanup kept 0 out of line at 10."""
    shard, disk, client = _subscribed_disk_shard()
    client.send([P.PUBLISH, client.rid(), [[TOPIC, ["d"], [b"d"], {"delay": [20.0]}]]])
    _publish(client, "a", "b")
    disk.sync()
    client.send([P.ACK, client.rid(), 1, GEN, [1, 2], -1])
    disk.sync()
    shard.advance(10.0)  # 1 and 2 acked and ttl old: they go, though 0 is at the cursor
    disk.sync()
    return shard, disk, client


def test_a_kept_message_held_at_a_cursor_goes_once_the_subscription_acks_it() -> None:
    shard, disk, client = _kept_at_the_cursor()
    topic = shard.core.topics[TOPIC]
    assert (topic.log.lowest, topic.log.oldest) == (0, 3)
    shard.advance(40.0)  # due at 20 and ttl past it, but not acked: still kept
    assert topic.log.lowest == 0
    client.send([P.ACK, client.rid(), 1, GEN, [0], -1])
    disk.sync()
    shard.advance(46.0)  # the next cleanup pass
    disk.sync()
    assert topic.log.lowest == 3 and disk.writer().kinds()[-1] == J.RELEASE
    _, rebuilt = _replayed(shard, disk.writer().records)
    assert rebuilt.log.lowest == 3 and rebuilt.subs["s"].cursor == 3


def test_a_kept_message_is_written_again_before_its_keep_record_may_be_dropped() -> None:
    """Segments go from the head as their PUBLISH records do: a KEEP record about to go
    with them is appended again at the tail first, and only the latest survives
    compaction, so a message kept for long costs about its size on disk."""
    shard, disk, client = _keep_one_pending(**{"message.dedup_window": 1.0})
    journal = disk.journals[TOPIC]
    first = journal.kept[0]
    _publish(client, "c")  # after the KEEP record, so that the log does not empty
    disk.sync()
    shard.advance(20.0)     # c goes too; every PUBLISH record up to it may be dropped
    disk.sync()
    records = disk.writer().records
    keeps = [r for r in records if r.type == J.KEEP]
    assert [r.position for r in keeps] == [first, journal.kept[0]] and first < journal.kept[0]
    assert journal.droppable > first
    assert [journal.judge(r) for r in keeps] == [False, True]
    disk.writer().durable = keeps[1].position  # the new one not fsynced: the old one stays
    assert [journal.judge(r) for r in keeps] == [True, True]
    disk.writer().durable = disk.writer().appended
    release = Record(0, J.RELEASE, msgpack.packb([0]))
    assert journal.judge(release) is False
    # what is left once the log before ``droppable`` is dropped still holds it
    snap = Record(0, *shard.core._snapshot(shard.core.topics[TOPIC]))
    _, rebuilt = _replayed(shard, [snap, *(r for r in records if r.position >= journal.droppable)],
                           disk)
    assert rebuilt.log.get(0) == ("d", b"pending", 0.0)


def test_a_snapshot_lists_only_the_kept_messages_recorded_before_it() -> None:
    shard, disk, _ = _keep_one_pending()
    body = msgpack.unpackb(shard.core._snapshot(shard.core.topics[TOPIC])[1])
    assert body[1:] == [3, [], [0]]
    journal = disk.journals[TOPIC]
    journal.trimmed_to, journal.kept = 1, {}  # as if the trim had not been recorded yet
    body = msgpack.unpackb(shard.core._snapshot(shard.core.topics[TOPIC])[1])
    assert body[1:] == [1, []]


def test_a_fetch_below_a_kept_message_reads_nothing_not_durable_yet() -> None:
    shard, disk, client = _keep_one_pending()
    _publish(client, "e")  # offset 3, its record not durable yet
    reader = shard.connect()  # (the publisher's next reply waits behind its PUBLISHED)
    fetched = reader.fetch(offset=0)
    assert fetched[2]["next"] == 3 and fetched[3] == [0] and fetched[4] == ["d"]
    disk.sync()
    fetched = reader.fetch(offset=0)
    assert fetched[2]["next"] == 4 and fetched[3] == [0, 3] and fetched[4] == ["d", "e"]


def test_kept_messages_go_in_keep_records_of_about_keep_bytes_each() -> None:
    writer = FakeWriter(GEN)
    journal = TopicJournal(TOPIC, writer, exposed=0)
    big = b"x" * (J.KEEP_BYTES // 2 + 1)
    journal.keep([[o, f"m{o}", 0.0, big, None, None, 9.0] for o in range(5)])
    assert [len(msgpack.unpackb(r.body)) for r in writer.records] == [2, 2, 1]
    assert list(journal.kept) == [0, 1, 2, 3, 4]
    assert [journal.kept[o] for o in (0, 2, 4)] == [r.position for r in writer.records]


def test_a_kept_message_leaves_memory_and_is_delivered_and_fetched_from_its_keep_record(
        ) -> None:
    """Once its KEEP record is durable, a kept message holds only its key in memory; its
    push when due and a FETCH read it back from that record (G12 with G9 "Space")."""
    shard, disk, client = _subscribed_disk_shard()
    client.send([P.PUBLISH, client.rid(), [[TOPIC, ["d"], [b"pending"],
                                            {"delay": [20.0], "keys": ["k"],
                                             "headers": [{"h": "v"}]}]]])
    _publish(client, "a", "b")
    disk.sync()
    assert client.deliveries(1) == [(1, 1), (2, 1)]
    client.send([P.ACK, client.rid(), 1, GEN, [1, 2], -1])
    disk.sync()
    shard.advance(10.0)  # 1 and 2 go; 0 is kept, whole in memory until its KEEP is durable
    log = shard.core.topics[TOPIC].log
    assert (log.lowest, log.oldest) == (0, 3) and log.held_bytes == 1 + 7 + 3
    disk.sync()
    assert log.held_bytes == len("k")
    reads = disk.writer().reads
    shard.advance(20.0)  # due: pushed, read back from its KEEP record
    pushed = [deliver_messages(f) for f in client.take(P.DELIVER)]
    assert [m[:3] for m in pushed[0]] == [(0, "d", b"pending")]
    assert disk.writer().reads == reads + 1 and log.held_bytes == len("k")
    fetched = shard.connect().fetch(offset=0)
    assert fetched[3] == [0] and fetched[4] == ["d"] and fetched[5] == [b"pending"]
    assert fetched[7]["keys"] == ["k"] and fetched[7]["headers"] == [{"h": "v"}]


def test_a_damaged_keep_record_read_back_is_never_served_and_recovers_its_topic() -> None:
    shard, disk, _ = _keep_one_pending()
    writer = disk.writer()
    keep = next(r for r in writer.records if r.type == J.KEEP)
    writer.data[keep.position + 20] ^= 0x40  # a bit rots in its payload
    reply = shard.connect().fetch(offset=0)
    assert reply[0] == P.ERROR and reply[2] == errors.StorageUnavailable.code
    assert len(disk.damage) == 1 and f"position {keep.position}" in disk.damage[0]


def test_a_new_generation_starts_its_subscriptions_at_a_kept_message() -> None:
    """A recovery that starts a new generation (G9, damage) starts each subscription at
    the oldest message held, a kept delayed message below the oldest in line included:
    carried into the new generation, it is delivered there (G12, G7)."""
    shard, disk, _ = _kept_at_the_cursor()
    replay = TopicReplay(TOPIC, shard.core.topics[TOPIC].settings, epoch=0.0, now=shard.now)
    for rec in disk.writer().records:
        replay.feed(rec)
    rebuilt = replay.build(GEN + 1, now=shard.now, reset=True)
    assert (rebuilt.log.lowest, rebuilt.log.oldest) == (0, 3)
    sub = rebuilt.subs["s"]
    assert (sub.start_offset, sub.cursor, len(sub.acked)) == (0, 0, 0)


def test_a_subscribe_that_resets_starts_at_a_kept_message() -> None:
    shard, disk, _ = _keep_one_pending()
    reader = shard.connect()

    def subscribed(sid: int, **opts: Any) -> dict[str, Any]:
        reader.send([P.SUBSCRIBE, reader.rid(), sid, {"topic": TOPIC, **opts}])
        disk.sync()  # (SUBSCRIBED waits for its SUBSCRIPTION record, G9)
        return dict(reader.take(P.SUBSCRIBED)[-1][3])

    reply = subscribed(1, name="late", generation=GEN + 1)  # it knew another generation
    assert reply["reset"] and reply["created"] and reply["start_offset"] == 0
    assert subscribed(2, name="old", read_old=True)["start_offset"] == 0  # (G6)


def test_a_recovery_makes_its_large_dedup_window_at_its_size_once() -> None:
    """A window the replay rebuilds is made compact with one table for every id in it
    (a growing window's tables, several and ever larger, cost each id a probe more),
    and still finds each id's original offset."""
    shard, disk, client = _disk_shard(**{"message.dedup_window": 500.0})
    for k in range(160):  # more than a growing window's first table takes
        _publish(client, *(f"m{k}-{i:05}" for i in range(256)))
        shard.advance(0.1)
    disk.sync()
    replay = TopicReplay(TOPIC, shard.core.topics[TOPIC].settings, epoch=0.0, now=shard.now)
    for rec in disk.writer().records:
        replay.feed(rec)
    pauses = sum(1 for _ in replay.remember_window(4096))  # (a shard's tasks run there)
    assert pauses == 160 * 256 // 4096
    topic = replay.build(GEN, now=shard.now)
    dedup = topic.dedup
    assert dedup.compact and len(dedup) == 160 * 256
    assert dedup._serials is not None and dedup._serials.tables == 1
    assert dedup.get("m0-00000") == 0 and dedup.get("m159-00255") == 160 * 256 - 1
    assert dedup.get("m77-00123") == 77 * 256 + 123 and dedup.get("m160-00000") is None
