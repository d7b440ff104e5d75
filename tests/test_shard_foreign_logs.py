"""A shard's topic directories that hold what is not their topic's log (G9): each is
refused alone, left untouched and never written, while the shard's other topics
recover; a flipped bit in a first segment header's magic is damage, not foreign."""

from __future__ import annotations

import trio
import trio.testing
from test_core_support import Shard

from flux import errors
from flux.shard.disk import HASHED, OWNER, ShardStorage, directory_of_topic
from flux.sim.network import Network
from flux.sim.simhost import SimHost
from flux.storage.record import encode
from flux.storage.segment import SegmentHeader, encode_header

SHARD = "/data/shard-0"
FIRST = "00000000000000000000.log"


def _log(topic: str, generation: int, version: int = 1) -> bytes:
    header = SegmentHeader(f"{OWNER}{topic}", generation, 0, "boot", version=version)
    return encode_header(header) + encode(6, b"\x93\x00\x00\x90")   # an empty SNAPSHOT


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
        shard = Shard({"storage.dir": "/data", "storage.kind": "disk"})
        host = SimHost(Network(1), "shard-0", seed=1)
        disk = host.disk
        storage = ShardStorage(host, shard.config, 0, 1, lambda: 0x77)
        await storage.check()
        for entry, data in {**planted, "flipped": bytes(flipped), "fine": _log("fine", 5)}.items():
            disk.makedirs(f"{SHARD}/{entry}")
            disk.open(f"{SHARD}/{entry}/{FIRST}", create=True).append(data)
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
