"""Disk topics against real ``flux serve`` processes (G9): a SIGKILL of a shard
mid-stream loses no acked message, keeps the topic's generation, its offsets, its
subscription cursors and its dedup window; a data directory that is not the
broker's is refused at start, one an older Flux wrote (data format 1) is served."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import msgpack
import pytest
import trio

from flux.client.trio import connect
from flux.errors import FluxError, RetryDeadlineExceeded, StorageUnavailable
from flux.host import RealDisk
from flux.router.launcher import pid_alive
from flux.shard import journal as J
from flux.storage import FsyncMode, LogWriter, recover

from .wire import owned_topic

if TYPE_CHECKING:
    from tests.conftest import BrokerFactory

pytestmark = pytest.mark.integration
T = TypeVar("T")


async def _cursor(client: object, shard: int, topic: str, name: str) -> int:
    stats = await client.stats()  # type: ignore[attr-defined]
    return int(stats[shard]["topics"][topic]["subscriptions"][name]["cursor"])


async def _ack(sub: object, count: int) -> None:
    """Ack the next ``count`` messages of ``sub``."""
    n = 0
    async for msg in sub:  # type: ignore[attr-defined]
        await msg.ack()
        n += 1
        if n == count:
            return


async def test_a_kill_9_mid_stream_loses_nothing_acked_on_a_disk_topic(
        broker_factory: BrokerFactory, tmp_path: Path) -> None:
    broker = broker_factory(f"storage.dir={tmp_path / 'data'}", "storage.kind=disk")
    victim = 1
    topic = owned_topic(victim, prefix="disk")
    old_pid = broker.shards[victim].pid
    acked: dict[str, tuple[int, int, bytes]] = {}   # id -> (generation, offset, payload)
    with trio.fail_after(60):
        async with connect(broker.url, retry_deadline=30) as client:
            # a named subscription acks the first 50 messages; the cursor is confirmed
            # durable once a later publish of the same topic is acked (one log, in order)
            for i in range(60):
                ack = await client.publish(topic, f"p{i}".encode(), id=f"m{i}")
                acked[f"m{i}"] = (ack.generation, ack.offset, f"p{i}".encode())
            generation = acked["m0"][0]
            async with client.subscribe(topic, name="billing", read_old=True) as sub:
                await _ack(sub, 50)
                with trio.fail_after(10):
                    while await _cursor(client, victim, topic, "billing") < 50:
                        await trio.sleep(0.02)
            i = 60

            async def publish(upto: int) -> None:
                nonlocal i
                while i < upto:
                    batch = [f"p{j}".encode() for j in range(i, i + 20)]
                    ids = [f"m{j}" for j in range(i, i + 20)]
                    acks = await client.publish_many(topic, batch, ids=ids)
                    for message_id, payload, a in zip(ids, batch, acks, strict=True):
                        acked[message_id] = (a.generation, a.offset, payload)
                    i += 20

            await publish(400)
            os.kill(old_pid, signal.SIGKILL)  # mid-stream: the next publishes retry
            await publish(800)

            broker.note_pids()
            assert not pid_alive(old_pid)
            # the same generation, offsets continuing, every acked message held
            assert {g for g, _, _ in acked.values()} == {generation}
            offsets = sorted(o for _, o, _ in acked.values())
            assert offsets == list(range(800))
            stored: dict[int, tuple[str, bytes]] = {}
            offset = 0
            while offset < 800:
                page = await client.fetch(topic, offset, max_messages=500)
                for m in page.messages:
                    stored[m.offset] = (m.id, m.payload)
                offset = page.next if not page.messages else page.messages[-1].offset + 1
            for message_id, (_, o, payload) in acked.items():
                assert stored[o] == (message_id, payload)
            # the dedup window: a retry of an id acked before the kill is a duplicate
            again = await client.publish(topic, b"p7", id="m7")
            assert again.duplicate and again.offset == acked["m7"][1]
            assert again.generation == generation
            # the cursor: the subscription resumes where its confirmed acks left it
            async with client.subscribe(topic, name="billing") as sub:
                assert sub.info is not None
                assert not sub.info.created and sub.info.cursor == 50
                first = await sub.__anext__()
                assert first.offset == 50 and first.generation == generation
    routed = {s["index"]: s for s in broker.stats()["shards"]}[victim]
    assert routed["pid"] != old_pid


def _serve_over(data: Path) -> subprocess.CompletedProcess[str]:
    """``flux serve --data-dir data`` (one shard), expected to refuse to start."""
    return subprocess.run([sys.executable, "-m", "flux", "serve", "--port", "0", "--shards", "1",
                           "--data-dir", str(data)], capture_output=True, text=True, timeout=30)


def test_a_data_directory_that_is_not_the_brokers_is_refused_at_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "photos.txt").write_text("not flux")
    done = _serve_over(data)
    assert done.returncode == 2
    assert str(data) in done.stderr and "not a Flux data directory" in done.stderr
    assert (data / "photos.txt").read_text() == "not flux"  # nothing wiped


def test_a_data_directory_of_another_shard_count_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "flux-data.json").write_text('{"format": 1, "shards": 3}')
    done = _serve_over(data)
    assert done.returncode == 2
    assert "written by 3 shards" in done.stderr and "--shards 3" in done.stderr


async def test_a_disk_topic_bigger_than_shard_memory_is_read_back_by_fetch(
        broker_factory: BrokerFactory, tmp_path: Path) -> None:
    """G9 "Space": with a 4 MB shard.max_memory and a 1 MB payload cache, 16 MB of
    payloads are published to a disk topic (a memory topic would be refused at 4 MB),
    FETCH reads every message back intact from the log, and so does a SIGKILLed shard's
    recovery, which keeps payloads on disk until they are read."""
    max_memory = 4 << 20
    broker = broker_factory("shard.max_memory=4194304", "storage.cache_bytes=1048576",
                            "message.ttl=600", shards=1,
                            args=("--data-dir", str(tmp_path / "data")))
    topic = "big.replay"
    count, size = 16_000, 1000

    def payload(i: int) -> bytes:
        return (b"%08d" % i) * (size // 8)

    async def read_all(client: object) -> int:
        offset = 0
        while offset < count:
            page = await client.fetch(topic, offset, max_messages=1000)  # type: ignore[attr-defined]
            assert page.messages, (offset, page)
            for m in page.messages:
                assert (m.offset, m.id, m.payload) == (offset, f"m{offset}", payload(offset))
                offset += 1
        return offset

    with trio.fail_after(120):
        async with connect(broker.url, retry_deadline=30) as client:
            for start in range(0, count, 500):
                acks = await client.publish_many(
                    topic, [payload(i) for i in range(start, start + 500)],
                    ids=[f"m{i}" for i in range(start, start + 500)])
                assert [a.offset for a in acks] == list(range(start, start + 500))
            shard = (await client.stats())[0]
            assert shard["memory"] <= max_memory
            assert shard["topics"][topic]["held"] == count
            assert shard["payload_cache"]["evicted"] > 0
            assert await read_all(client) == count
            shard = (await client.stats())[0]
            assert shard["payload_cache"]["reads"] > 0 and shard["memory"] <= max_memory

            old_pid = broker.shards[0].pid
            os.kill(old_pid, signal.SIGKILL)
            assert await read_all(client) == count  # after recovery, read back lazily
            broker.note_pids()
            shard = (await client.stats())[0]
            assert shard["memory"] <= max_memory
            assert shard["topics"][topic]["storage"]["recovered_records"] > 0


async def test_a_record_damaged_on_disk_is_never_delivered_and_only_its_topic_recovers(
        broker_factory: BrokerFactory, tmp_path: Path) -> None:
    """G9 "Corruption": with no payload cache every read goes to the log; a bit flipped
    in a record on disk is refused (StorageUnavailable, which the client retries) and
    that topic's log is recovered alone: the damage set aside, a new generation (acked
    messages were cut), reported in the log and STATS. The shard keeps running and its
    other topic takes publishes and serves reads throughout. Nothing FETCH returns,
    before or after, differs from what was published."""
    data = tmp_path / "data"
    broker = broker_factory("storage.cache_bytes=0", "message.ttl=600", shards=1,
                            args=("--data-dir", str(data)))
    topic, spared = "damaged.log", "spared.log"
    sent: dict[str, bytes] = {}
    with trio.fail_after(90):
        async with connect(broker.url, retry_deadline=30) as client:
            for group in range(10):
                ids = [f"g{group}m{i}" for i in range(100)]
                payloads = [(b"%s|" % i.encode()) * 50 for i in ids]
                acks = await client.publish_many(topic, payloads, ids=ids)
                sent.update(zip(ids, payloads, strict=True))
            generation = acks[0].generation
            spared_generation = (await client.publish(spared, b"before", id="s0")).generation
            [segment] = sorted((data / "shard-0" / topic).glob("*.log"))
            raw = bytearray(segment.read_bytes())
            middle = len(raw.rstrip(b"\0")) // 2  # (zeros written ahead follow the records)
            raw[middle] ^= 0x04  # a payload byte of a group in the middle
            with open(segment, "r+b") as f:
                f.seek(middle)
                f.write(raw[middle:middle + 1])
            pid = broker.shards[0].pid
            got: dict[str, bytes] = {}
            offset, page_generation = 0, generation
            while True:
                page = await client.fetch(topic, offset, max_messages=100)
                if page.generation != page_generation:  # the recovered topic: read it anew
                    page_generation, offset, got = page.generation, page.oldest, {}
                    continue
                if not page.messages:
                    break
                for m in page.messages:
                    got[m.id] = m.payload
                offset = page.messages[-1].offset + 1
            assert page_generation != generation  # damage lost acked messages: new generation
            assert got and all(sent[i] == p for i, p in got.items())  # nothing wrong delivered
            assert len(got) < len(sent)  # what followed the damage was set aside
            after = await client.publish(spared, b"after", id="s1")
            assert after.generation == spared_generation and after.offset == 1
            assert [m.payload for m in (await client.fetch(spared, 0)).messages] == \
                [b"before", b"after"]
            assert pid_alive(pid) and broker.shards[0].pid == pid  # the shard never stopped
            storage = (await client.stats())[0]["topics"][topic]["storage"]
            assert "damage" in storage["new_generation"], storage
            assert "reading position" in storage["damage_read_back"], storage
            assert storage["damage"]["kind"] == "corrupt" and storage["damage"]["set_aside"]
            assert list((data / "shard-0" / topic).glob("*.damaged"))
    text = broker.router.log_text()
    assert "not delivered" in text and "other topics serve on" in text


async def _fill(client: Any, topics: tuple[str, ...], groups: int) -> dict[str, int]:
    """Publish ``groups`` groups of 100 messages (payload: the id 20 times) to each
    topic; returns each topic's generation."""
    for topic in topics:
        for group in range(groups):
            ids = [f"{topic}-g{group}m{i}" for i in range(100)]
            await client.publish_many(topic, [i.encode() * 20 for i in ids], ids=ids)
    return {t: (await client.fetch(t, 0, max_messages=0)).generation for t in topics}


async def _killed(pid: int) -> None:
    """SIGKILL shard ``pid`` and wait until it is gone (the router restarts it)."""
    os.kill(pid, signal.SIGKILL)
    while pid_alive(pid):
        await trio.sleep(0.01)


def _restarts(broker: object) -> int:
    return int(broker.stats()["shards"][0]["restarts"])  # type: ignore[attr-defined]


@pytest.mark.parametrize("flip", ["record", "magic"])
async def test_damage_found_at_recovery_starts_a_new_generation_for_its_topic_alone(
        broker_factory: BrokerFactory, tmp_path: Path, flip: str) -> None:
    """G9 "Corruption" at recovery: a byte flipped in the middle of one topic's segment
    while its shard is down. The restart cuts that log at the damaged record (setting
    it and what follows aside) and gives that topic a new generation, with the messages
    before the damage at their offsets; the other topic of the shard keeps its
    generation and every message. A bit flipped in the segment header's magic is damage
    too, not another program's file: the segment is set aside whole, and the shard
    starts once (no restart loop)."""
    data = tmp_path / "data"
    broker = broker_factory("message.ttl=600", shards=1, args=("--data-dir", str(data)))
    damaged, spared = "damaged.log", "spared.log"
    with trio.fail_after(90):
        async with connect(broker.url, retry_deadline=30) as client:
            generations = await _fill(client, (damaged, spared), 10)
            await _killed(broker.shards[0].pid)
            [segment] = sorted((data / "shard-0" / damaged).glob("*.log"))
            raw = bytearray(segment.read_bytes())
            middle = len(raw.rstrip(b"\0")) // 2   # (zeros written ahead follow the records)
            raw[middle if flip == "record" else 3] ^= 0x04   # magic "FLUX" -> "FLU\\"
            segment.write_bytes(bytes(raw))
            kept = await client.fetch(spared, 0, max_messages=1000)
            assert kept.generation == generations[spared] and len(kept.messages) == 1000
            assert all(m.payload == m.id.encode() * 20 for m in kept.messages)
            page = await client.fetch(damaged, 0, max_messages=1000)
            assert page.generation != generations[damaged]
            if flip == "record":
                assert 0 < len(page.messages) < 1000 and page.messages[0].offset == 0
            else:
                assert page.messages == []
            assert all(m.payload == m.id.encode() * 20 for m in page.messages)
            storage = (await client.stats())[0]["topics"][damaged]["storage"]
            assert "damage" in storage["new_generation"] and storage["damage_read_back"] is None
            assert storage["damage"]["kind"] == "corrupt"
            assert Path(f"{segment}.damaged").read_bytes() == bytes(raw)   # kept, not wiped
            ack = await client.publish(damaged, b"again", id="again")
            assert (ack.generation, ack.offset) == (page.generation, page.next)
            await trio.sleep(1)
    assert _restarts(broker) == 1   # the kill's; recovery never stopped the shard


async def test_a_dead_letter_topic_too_long_for_a_file_name_is_kept_and_recovered(
        broker_factory: BrokerFactory, tmp_path: Path) -> None:
    """A dead-letter topic TOPIC~SUBSCRIPTION longer than a file name may be (here 8 +
    250 bytes) keeps its log in a directory named by hash; a restart finds its topic
    in the log's headers."""
    data = tmp_path / "data"
    broker = broker_factory(f"storage.dir={data}", "storage.kind=disk",
                            config="topics:\n  - match: 'disk.>'\n    dead_letter: true\n")
    victim = 0
    topic = owned_topic(victim, prefix="disk")
    worker = "w" * 250
    dead_letters = f"{topic}~{worker}"
    with trio.fail_after(60):
        async with connect(broker.url, retry_deadline=30) as client:
            await client.publish(topic, b"job", id="j1")
            async with client.subscribe(topic, name=worker, read_old=True) as sub:
                msg = await sub.__anext__()
                await msg.term("no good")
            while not (await client.fetch(dead_letters, 0)).messages:
                await trio.sleep(0.05)
            hashed = [p.name for p in data.rglob("~*") if p.is_dir()]
            assert len(hashed) == 1 and len(hashed[0]) == 65
            old_pid = broker.shards[victim].pid
            os.kill(old_pid, signal.SIGKILL)
            page = await client.fetch(dead_letters, 0)  # retried until the shard is back
            assert [m.payload for m in page.messages] == [b"job"]
            assert page.messages[0].headers["flux-reason"] == "term: no good"
    broker.note_pids()
    assert {s["index"]: s for s in broker.stats()["shards"]}[victim]["pid"] != old_pid


async def test_a_topic_directory_holding_a_foreign_file_is_refused_and_left_untouched(
        broker_factory: BrokerFactory, tmp_path: Path) -> None:
    """G9: a topic directory holding what is not Flux's log (here an SQLite file planted
    as its first segment) is never wiped, written or ignored silently: the shard logs
    it once, serves its other topics, refuses that topic's requests with
    StorageUnavailable and shows it in STATS; the file is the same bytes after. Once the
    operator has moved the directory away, the topic serves again without a restart
    (a request has its directory looked at again)."""
    data = tmp_path / "data"
    broker = broker_factory("message.ttl=600", shards=1, args=("--data-dir", str(data)))
    foreign, spared = "foreign.log", "spared.log"
    planted = data / "shard-0" / foreign / "00000000000000000000.log"
    content = b"SQLite format 3\x00" + bytes(range(256)) * 16
    with trio.fail_after(90):
        async with connect(broker.url, retry_deadline=30) as client:
            await client.publish(spared, b"before", id="s0")
            generation = (await client.fetch(spared, 0)).generation
            await _killed(broker.shards[0].pid)
            planted.parent.mkdir()
            planted.write_bytes(content)
            page = await client.fetch(spared, 0)   # retried until the shard serves again
            assert page.generation == generation and [m.payload for m in page.messages] == \
                [b"before"]
            async with connect(broker.url, retry_deadline=1.5) as quick:
                for request in (quick.publish(foreign, b"x", id="f1"), quick.fetch(foreign, 0)):
                    with pytest.raises(RetryDeadlineExceeded) as info:
                        await request
                    cause = info.value.__cause__
                    assert isinstance(cause, StorageUnavailable), cause
                    assert str(planted) in str(cause) and "move it away" in str(cause)
            stats = (await client.stats())[0]
            assert foreign not in stats["topics"]
            assert str(planted) in stats["topics_refused"][foreign]
            await client.publish(spared, b"after", id="s1")
            await trio.sleep(1)
            assert planted.read_bytes() == content
            moved = tmp_path / "moved"
            planted.parent.rename(moved)   # the operator moves the directory away
            again = await client.publish(foreign, b"now", id="f2")   # retried: looked at again
            assert again.offset == 0 and not again.duplicate
            assert foreign not in (await client.stats())[0]["topics_refused"]
    assert _restarts(broker) == 1   # served again without a restart
    assert broker.stop() == 0
    assert (moved / planted.name).read_bytes() == content
    assert sorted(p.name for p in moved.iterdir()) == [planted.name]
    text = broker.router.log_text()
    assert text.count("is refused and its directory left untouched") == 1, text
    assert "is empty or gone now" in text, text

async def _topic_stats(client: object, shard: int, topic: str) -> dict[str, object]:
    stats = await client.stats()  # type: ignore[attr-defined]
    return dict(stats[shard]["topics"][topic])


async def _once_back(ask: Callable[[], Awaitable[T]]) -> T:
    """``ask()``'s answer once the restarted shard gives one (busy or reconnecting
    meanwhile)."""
    with trio.fail_after(30):
        while True:
            try:
                return await ask()
            except (FluxError, OSError):
                await trio.sleep(0.2)


async def test_a_pending_delayed_message_holds_back_no_cleanup_and_survives_a_kill_9(
        broker_factory: BrokerFactory, tmp_path: Path) -> None:
    """G12 on a disk topic: a subscription acks everything after a pending delayed
    message; cleanup deletes those and the log's old segments go, the pending one kept
    whole in a KEEP record; after a SIGKILL it is still held and delivered when due,
    and once it is acked and ttl old it goes for good (it is not back after another)."""
    broker = broker_factory(f"storage.dir={tmp_path / 'data'}", "storage.kind=disk",
                            "message.ttl=0.5", "message.cleanup_time=0.2",
                            "message.dedup_window=1", "storage.segment_bytes=4096")
    victim = 0
    topic = owned_topic(victim, prefix="keep")
    with trio.fail_after(90):
        async with connect(broker.url, retry_deadline=30) as client:
            async with client.subscribe(topic, name="billing") as sub:
                pending = await client.publish(topic, b"later", id="pending", delay=12)
                payloads = [b"x" * 200] * 20
                for i in range(10):  # about 50 KB: the log rolls many segments
                    await client.publish_many(topic, payloads,
                                              ids=[f"m{i}-{j}" for j in range(20)])
                await _ack(sub, 200)
                # everything after the pending message goes, and so do old segments
                with trio.fail_after(20):
                    while True:
                        stats = await _topic_stats(client, victim, topic)
                        log_bytes = stats["storage"]["log_bytes"]  # type: ignore[index]
                        if stats["held"] == 1 and log_bytes < 20_000:
                            break
                        await trio.sleep(0.1)
                assert stats["oldest"] == 201
            old_pid = broker.shards[victim].pid
            os.kill(old_pid, signal.SIGKILL)
            page = await _once_back(lambda: client.fetch(topic, 0))
            broker.note_pids()
            assert [(m.offset, m.id, m.payload) for m in page.messages] == [
                (pending.offset, "pending", b"later")]
            assert page.messages[0].due == pending.due
            async with client.subscribe(topic, name="billing") as sub:
                msg = await sub.__anext__()  # when it is due
                assert (msg.offset, msg.payload) == (pending.offset, b"later")
                await msg.ack()
                with trio.fail_after(20):
                    while (await _topic_stats(client, victim, topic))["held"] != 0:
                        await trio.sleep(0.1)
            old_pid = {s["index"]: s for s in broker.stats()["shards"]}[victim]["pid"]
            os.kill(old_pid, signal.SIGKILL)
            stats = await _once_back(lambda: _topic_stats(client, victim, topic))
            broker.note_pids()
            assert stats["held"] == 0 and stats["next_offset"] == 201


async def _format_1_log(directory: Path, topic: str, generation: int) -> None:
    """A topic's log as data format 1 wrote it (acks as offsets): ten messages, and
    subscription "s" at cursor 2 with 4, 5 and 7 acked above it."""
    disk = RealDisk()
    owner = f"topic {topic}"
    table, _ = await recover(disk, str(directory), owner=owner)
    writer = LogWriter(disk, table, owner=owner, generation=generation,
                       boot_id=disk.boot_id(), fsync=FsyncMode.ALWAYS)
    wall = time.time()
    ids = [f"m{i}" for i in range(10)]
    records = [(J.SNAPSHOT_V1, [0, 0, []]),
               (J.PUBLISH, [0, wall, ids, [i.encode() for i in ids]]),
               (J.SUBSCRIPTION, ["s", "push", 0, wall]),
               (J.CURSOR_V1, ["s", 2, [4, 5, 7]])]
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for rtype, body in records:
            writer.append(rtype, msgpack.packb(body, use_bin_type=True))
        await writer.close()


async def test_a_log_of_data_format_1_recovers_and_its_directory_moves_to_format_2(
        broker_factory: BrokerFactory, tmp_path: Path) -> None:
    """A data directory an older Flux wrote (format 1: acks as offsets) is served: the
    topic keeps its generation and messages, the subscription resumes at its cursor
    without what was acked above it, and the marker says format 2 from then on."""
    data, topic, generation = tmp_path / "data", "orders.old", 0x1234_5678_9ABC
    data.mkdir()
    (data / "flux-data.json").write_text('{"format": 1, "shards": 1}')
    await _format_1_log(data / "shard-0" / topic, topic, generation)
    broker = broker_factory("message.ttl=600", shards=1, args=("--data-dir", str(data)))
    assert '"format": 2' in (data / "flux-data.json").read_text()
    with trio.fail_after(60):
        async with connect(broker.url, retry_deadline=30) as client:
            page = await client.fetch(topic, 0, max_messages=100)
            assert page.generation == generation
            assert [(m.offset, m.payload) for m in page.messages] == [
                (i, f"m{i}".encode()) for i in range(10)]
            got: list[int] = []
            async with client.subscribe(topic, name="s") as sub:
                async for msg in sub:
                    got.append(msg.offset)
                    await msg.ack()
                    if len(got) == 5:
                        break
            assert got == [2, 3, 6, 8, 9]
            while await _cursor(client, 0, topic, "s") < 10:
                await trio.sleep(0.02)
