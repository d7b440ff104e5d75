"""A shard's topic directories that hold what is not their topic's log (G9): each is
refused alone, left untouched and never written, while the shard's other topics
recover; a flipped bit in a first segment header's magic is damage, not foreign."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from test_core_support import Shard, item_rows

from flux import errors
from flux import protocol as P
from flux.shard.disk import HASHED, OWNER, RECHECK, ShardStorage, directory_of_topic
from flux.sim.network import Network
from flux.sim.simhost import SimHost
from flux.storage.record import encode
from flux.storage.segment import SegmentHeader, encode_header

SHARD = "/data/shard-0"
FIRST = "00000000000000000000.log"


def _log(topic: str, generation: int, version: int = 1) -> bytes:
    header = SegmentHeader(f"{OWNER}{topic}", generation, 0, "boot", version=version)
    return encode_header(header) + encode(6, b"\x93\x00\x00\x90")   # an empty SNAPSHOT


async def _shard_with(files: dict[str, bytes]) -> tuple[Shard, SimHost, ShardStorage]:
    """A disk shard on a simulated disk whose topic directories hold ``files`` (directory
    -> its first segment's bytes), not recovered yet."""
    shard = Shard({"storage.dir": "/data", "storage.kind": "disk"})
    host = SimHost(Network(1), "shard-0", seed=1)
    storage = ShardStorage(host, shard.config, 0, 1, lambda: 0x77)
    await storage.check()
    for entry, data in files.items():
        host.disk.makedirs(f"{SHARD}/{entry}")
        host.disk.open(f"{SHARD}/{entry}/{FIRST}", create=True).append(data)
    return shard, host, storage


def test_foreign_directories_are_refused_alone_and_never_written() -> None:
    long_dead_letters = "orders~" + "w" * 250
    hashed = directory_of_topic(long_dead_letters)
    assert hashed.startswith(HASHED)
    planted = {
        "sqlite": b"SQLite format 3\x00" + bytes(200),
        "newer": _log("newer", 5, version=2),
        "theirs": _log("payments", 5),
        hashed: b"PK\x03\x04 not a log" + bytes(100),
    }
    flipped = bytearray(_log("flipped", 5))
    flipped[2] ^= 0x01

    async def main() -> None:
        shard, host, storage = await _shard_with({**planted, "flipped": bytes(flipped),
                                                  "fine": _log("fine", 5)})
        disk = host.disk
        await storage.recover(shard.core)
        assert sorted(storage.refused) == sorted(planted)
        refused = shard.core.refused
        assert sorted(refused) == sorted(["sqlite", "newer", "theirs", f"{SHARD}/{hashed}"])
        assert "format version 2" in refused["newer"] and "'topic payments'" in refused["theirs"]
        assert all("move it away" in why for why in refused.values())
        recovered = {r.topic: r for r in storage.recovered}
        assert sorted(recovered) == ["fine", "flipped"]
        assert recovered["fine"].generation == 5 and recovered["fine"].new_generation is None
        assert recovered["flipped"].generation == 0x77
        assert "magic or version damaged" in str(recovered["flipped"].new_generation)
        assert disk.listdir(f"{SHARD}/flipped") == [FIRST + ".damaged"]
        try:   # a topic whose directory was refused is never made, not even by hash
            shard.core.open_journal(long_dead_letters, 0)  # type: ignore[misc]
        except errors.StorageUnavailable as exc:
            assert hashed in str(exc)
        else:
            raise AssertionError("a journal opened in a refused directory")
        for entry, data in planted.items():
            assert disk.listdir(f"{SHARD}/{entry}") == [FIRST]
            assert disk.contents(f"{SHARD}/{entry}/{FIRST}") == data
        await storage.close()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_refused_topic_is_looked_at_again_and_serves_once_its_files_are_moved_away() -> None:
    """A request naming a refused topic makes the shard look at its directory again
    through the disk seam, at most every RECHECK seconds, by recovery's own rules: while
    the foreign file is there the topic stays refused and the file untouched; once an
    operator has moved it away (or put the topic's own log back, which is recovered),
    the topic serves again without a restart. So does a dead-letter topic whose
    hashed directory held another program's file."""
    long_dead_letters = "orders~" + "w" * 250
    hashed = directory_of_topic(long_dead_letters)
    sqlite = b"SQLite format 3\x00" + bytes(200)

    async def main() -> None:
        shard, host, storage = await _shard_with({"orders": sqlite,
                                                  "payments": _log("theirs", 5),
                                                  hashed: sqlite})
        disk = host.disk
        await storage.recover(shard.core)
        client = shard.connect()

        async def settle() -> None:   # a look again, and a log's fsyncs, run meanwhile
            await trio.sleep(0.5)
            shard.now = host.now()
            shard.collect()

        async def publish(topic: str, message_id: str) -> list[Any]:
            """One publish; its reply waits for the log (G9): the per-item row's status."""
            shard.now = host.now()
            groups = [[topic, [message_id], [b"x"]]]
            rid = client.rid()
            client.send([P.PUBLISH, rid, groups])
            await settle()
            [reply] = [r.frame for r in client.inbox if r.frame[1] == rid]
            return [row[0] for row in item_rows(groups, reply)]

        async with trio.open_nursery() as nursery:
            await nursery.start(storage.run, shard.collect)
            shard.core.recovering = None   # it serves (as the shell says once it is ready)
            code = errors.StorageUnavailable.code
            assert await publish("orders", "a") == [code]   # looked at when recovery refused it
            await trio.sleep(RECHECK)
            assert await publish("orders", "b") == [code]   # looked at again: still foreign
            await settle()
            assert "orders" in shard.core.refused
            assert disk.listdir(f"{SHARD}/orders") == [FIRST]
            assert disk.contents(f"{SHARD}/orders/{FIRST}") == sqlite
            disk.makedirs("/moved")
            for entry in ("orders", "payments", hashed):   # the operator moves them away
                disk.rename(f"{SHARD}/{entry}/{FIRST}", f"/moved/{entry[:20]}.log")
            # and puts payments' own log back where another topic's was
            disk.open(f"{SHARD}/payments/{FIRST}", create=True).append(_log("payments", 9))
            assert await publish("orders", "c") == [code]   # not before RECHECK has passed
            await trio.sleep(RECHECK)
            assert await publish("orders", "d") == [code]   # this one has it looked at again
            await settle()
            assert "orders" not in shard.core.refused and "orders" not in storage.refused
            assert await publish("orders", "e") == [0]
            await settle()
            assert shard.core.topics["orders"].log.next_offset == 1
            assert "payments" in shard.core.refused   # no request named it: not looked at
            assert await publish("payments", "f") == [code]
            await settle()
            assert await publish("payments", "g") == [0]
            assert shard.core.topics["payments"].generation == 9   # recovered, not made anew
            with pytest.raises(errors.StorageUnavailable):
                shard.core.open_journal(long_dead_letters, 0)  # type: ignore[misc]
            await settle()
            assert hashed not in storage.refused
            assert f"{SHARD}/{hashed}" not in shard.core.refused
            assert disk.contents("/moved/orders.log") == sqlite
            nursery.cancel_scope.cancel()
        await storage.close()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
