"""A disk topic's acks above a held message go to its log as runs (data format 2): the
SNAPSHOT and CURSOR records stay small however many offsets are acked, recovery
rebuilds exactly the same Acks, and a log written by data format 1 (acks as offsets)
still recovers; its data directory's marker moves to format 2 before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import pytest
import trio
from test_core_disk import _disk_shard
from test_core_support import GEN, TOPIC

from flux import protocol as P
from flux.acks import Acks
from flux.errors import ConfigError
from flux.host import RealDisk
from flux.shard import journal as J
from flux.shard.disk import FORMAT_VERSION, MARKER, check_data_dir
from flux.shard.replay import TopicReplay
from flux.shard.subscription import Subscription
from flux.storage import Record

MILLION = 1_000_000


def _replayed(records: list[Record], now: float = 0.0) -> dict[str, Subscription]:
    replay = TopicReplay(TOPIC, _disk_shard()[0].config.settings_for(TOPIC), epoch=0.0)
    for rec in records:
        replay.feed(rec)
    return dict(replay.build(GEN, now=now).subs)


def test_a_million_acks_above_a_held_message_are_recorded_as_two_runs() -> None:
    shard, disk, client = _disk_shard()
    client.send([P.PUBLISH, client.rid(), [[TOPIC, ["held"], [b"held"]]]])
    client.send([P.SUBSCRIBE, client.rid(), 1, {"topic": TOPIC, "name": "s",
                                               "read_old": True}])
    disk.sync()
    topic = shard.core.topics[TOPIC]
    sub = topic.subs["s"]
    # offset 0 stays unacked (a poison message): every ack lands above the cursor
    sub.mark_acked_all(range(1, MILLION // 2 + 1))
    sub.mark_acked_all(range(MILLION // 2 + 2, MILLION + 2))
    assert (sub.cursor, len(sub.acked), sub.acked.runs) == (0, MILLION, 2)

    shard.core._journal_cursor(topic, sub)  # its first CURSOR record: every ack above
    first = disk.writer().records[-1]
    assert first.type == J.CURSOR
    assert msgpack.unpackb(first.body) == ["s", 0, [1, MILLION // 2, MILLION // 2 + 2,
                                                    MILLION // 2]]
    rtype, snapshot = shard.core._snapshot(topic)
    assert rtype == J.SNAPSHOT
    # format 1 wrote every offset: ~5 bytes each, 5 MB a record
    as_offsets = len(msgpack.packb(list(sub.acked)))
    assert as_offsets > 4 * MILLION
    assert len(first.body) < 40 and len(snapshot) < 80

    for records in (disk.writer().records, [Record(0, rtype, snapshot)]):
        rebuilt = _replayed(records)["s"]
        assert rebuilt.cursor == 0 and rebuilt.acked == sub.acked

    # later records carry the acks added since, as runs too
    sub.mark_acked_all(range(MILLION + 3, 2 * MILLION + 3))
    shard.core._journal_cursor(topic, sub)
    assert msgpack.unpackb(disk.writer().records[-1].body) == ["s", 0, [MILLION + 3, MILLION]]
    rebuilt = _replayed(disk.writer().records)["s"]
    assert rebuilt.acked == sub.acked and rebuilt.acked.runs == 3


def test_scattered_acks_between_records_travel_as_runs_of_one() -> None:
    """A shared subscription's members ack out of order: what a record carries is still
    the runs added since the last one, and the acks the cursor passed are left out."""
    shard, disk, client = _disk_shard(**{"subscriber.max_in_flight": 50})
    ids = [f"m{i}" for i in range(20)]
    client.send([P.PUBLISH, client.rid(), [[TOPIC, ids, [i.encode() for i in ids]]]])
    client.send([P.SUBSCRIBE, client.rid(), 1, {"topic": TOPIC, "name": "s",
                                               "read_old": True, "credit": 50}])
    disk.sync()
    client.send([P.ACK, client.rid(), 1, GEN, [9, 3, 4, 12], -1])
    client.send([P.ACK, client.rid(), 1, GEN, [1, 0, 7], -1])   # the cursor moves to 2
    disk.sync()
    cursors = [msgpack.unpackb(r.body) for r in disk.writer().records if r.type == J.CURSOR]
    assert cursors == [["s", 0, [3, 2, 9, 1, 12, 1]], ["s", 2, [7, 1]]]
    rebuilt = _replayed(disk.writer().records)["s"]
    held = shard.core.topics[TOPIC].subs["s"]
    assert rebuilt.cursor == held.cursor == 2
    assert rebuilt.acked == held.acked == {3, 4, 7, 9, 12}


def test_a_log_written_by_data_format_1_still_recovers() -> None:
    """Format 1 wrote acks as offsets (CURSOR_V1 = 4, SNAPSHOT_V1 = 6); a log continued
    by format 2 holds both kinds, in order."""
    def record(rtype: int, body: list[object]) -> Record:
        return Record(0, rtype, msgpack.packb(body))

    records = [
        record(J.SNAPSHOT_V1, [10, 0, [["s", "push", 0, 1.0, 2, [4, 5, 7]],
                                       ["d", "shared", 0, 1.0, 0, [1], [3, 2, 6, 1]]]]),
        record(J.CURSOR_V1, ["s", 2, [8, 9]]),
        record(J.SUBSCRIPTION, ["p", "pull", 0, 2.0]),
        record(J.CURSOR_V1, ["p", 3, [2, 5]]),            # 2: below the cursor, dropped
        record(J.CURSOR, ["s", 2, [11, 2]]),              # written after the upgrade
    ]
    subs = _replayed(records)
    s, p, d = subs["s"], subs["p"], subs["d"]
    assert (s.cursor, s.acked) == (2, {4, 5, 7, 8, 9, 11, 12})
    assert (p.cursor, p.acked, p.mode) == (3, {5}, "pull")
    assert (d.cursor, d.acked, d.push_counts) == (0, {1}, {3: 2, 6: 1})
    assert d.shared
    assert all(isinstance(sub.acked, Acks) for sub in subs.values())

    journal = _disk_shard()[1].open(TOPIC, 0)   # compaction drops either kind of CURSOR
    assert journal.judge(records[1]) is False and journal.judge(records[4]) is False
    assert journal.judge(records[0]) is True


def _marker(directory: Path) -> dict[str, int]:
    return dict(json.loads((directory / MARKER).read_text()))


def test_a_data_directory_of_format_1_is_moved_to_format_2_and_others_are_refused(
        tmp_path: Path) -> None:
    assert FORMAT_VERSION == 2
    old = tmp_path / "old"
    old.mkdir()
    (old / MARKER).write_text('{"format": 1, "shards": 2}')
    (old / "shard-0").mkdir()
    trio.run(check_data_dir, RealDisk(), str(old), 2)
    assert _marker(old) == {"format": 2, "shards": 2}
    assert sorted(p.name for p in old.iterdir()) == [MARKER, "shard-0"]  # no file left over
    trio.run(check_data_dir, RealDisk(), str(old), 2)   # format 2 is taken as it is

    wrong = tmp_path / "wrong-shards"
    wrong.mkdir()
    (wrong / MARKER).write_text('{"format": 1, "shards": 3}')
    with pytest.raises(ConfigError, match="written by 3 shards"):
        trio.run(check_data_dir, RealDisk(), str(wrong), 2)
    assert _marker(wrong)["format"] == 1   # a refused directory is left as it was

    newer = tmp_path / "newer"
    newer.mkdir()
    (newer / MARKER).write_text('{"format": 3, "shards": 2}')
    with pytest.raises(ConfigError, match="data format 3"):
        trio.run(check_data_dir, RealDisk(), str(newer), 2)
    assert _marker(newer)["format"] == 3


def test_compaction_keeps_a_publish_records_ids_byte_for_byte_in_its_ids_record() -> None:
    """The verdict on a PUBLISH record of ids still in the dedup window is an IDS record
    holding the PUBLISH body's first three fields as they are: the ids are skipped, not
    unpacked and packed again (a third of compaction's CPU), so even ids another packer
    wrote with longer headers stay exactly as they were."""
    journal = _disk_shard()[1].open(TOPIC, 0)
    journal.held_from, journal.forgotten_before = 1000, 5.0
    ids = [f"id-{i}" for i in range(40)]
    packed_ids = P.array_header(40) + b"".join(b"\xd9" + bytes([len(i)]) + i.encode()
                                               for i in ids)   # str8 where fixstr would do
    fields = [msgpack.packb(7), msgpack.packb(10.0), packed_ids, msgpack.packb([b"p"] * 40)]
    for meta in ([], [msgpack.packb({"keys": ["k"] * 40})]):
        body = P.array_header(len(fields) + len(meta)) + b"".join(fields + meta)
        verdict = journal.judge(Record(0, J.PUBLISH, body))
        assert verdict == (J.IDS, P.array_header(3) + b"".join(fields[:3]))
        assert isinstance(verdict, tuple) and msgpack.unpackb(verdict[1]) == [7, 10.0, ids]
        assert journal.judge(Record(0, J.IDS, verdict[1])) is True
    journal.forgotten_before = 11.0   # the ids left the window: the record goes
    assert journal.judge(Record(0, J.PUBLISH, body)) is False
    journal.held_from = 40            # a message still held: kept as it is
    assert journal.judge(Record(0, J.PUBLISH, body)) is True
