"""Chaos: the fault proxy and schedule on their own, and a short real chaos run.

The smoke run is ``python -m chaos`` itself (a few faults on real processes, with
memory and disk topics, checked by the shared checker and the disk accounting);
``make chaos`` runs the long default schedule.
"""

from __future__ import annotations

import functools
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import trio

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # chaos/ is a tool beside the package, not installed
    sys.path.insert(0, str(ROOT))

from chaos.accounting import Tally, by_storage, failed  # noqa: E402
from chaos.faults import FaultRecord  # noqa: E402
from chaos.proxy import ShardProxy  # noqa: E402
from chaos.runner import RunOutput, pick_topics, remove_data_dir  # noqa: E402
from chaos.schedule import KINDS, PlannedFault, draw_schedule, parse_mix  # noqa: E402
from chaos.settings import ChaosSettings, from_env  # noqa: E402
from flux import config as config_mod  # noqa: E402
from flux.hashing import shard_for  # noqa: E402
from flux.sim import checker  # noqa: E402
from flux.sim import history as h  # noqa: E402

SMOKE_TIMEOUT = 150


def test_schedule_is_drawn_from_the_seed_and_spreads_every_fault() -> None:
    mix = parse_mix(",".join(f"{k}=1" for k in KINDS))
    one = draw_schedule(random.Random(7), mix, 60, 60.0, 3)
    two = draw_schedule(random.Random(7), mix, 60, 60.0, 3)
    assert one == two
    assert len(one) == 60
    assert {f.kind for f in one} == set(KINDS)
    assert all(0 <= f.at < 60.0 for f in one)
    # a target is never given a second fault while its first one lasts
    for a in one:
        for b in one:
            same = a.target == b.target and (a.kind in ("latency", "stall", "reset", "blackhole")) \
                == (b.kind in ("latency", "stall", "reset", "blackhole"))
            if a is not b and same and a.at < b.at:
                assert b.at >= a.at + a.duration


def test_mix_refuses_unknown_kinds_and_all_zero() -> None:
    with pytest.raises(ValueError, match="unknown fault kind"):
        parse_mix("meteor=1")
    with pytest.raises(ValueError, match="weight 0"):
        parse_mix("reset=0")
    assert parse_mix("reset=2")["reset"] == 2.0 and parse_mix("reset=2")["stall"] == 0.0


@pytest.mark.parametrize(("storage", "disk"), [("memory", 0), ("disk", 4), ("mixed", 2)])
def test_topics_spread_over_shards_and_storage(storage: str, disk: int, tmp_path: Path) -> None:
    """Every shard owns a topic; mixed puts half on disk, and the broker's config (the
    overrides, as the checker reads them) resolves each topic to the kind it was named for."""
    topics = pick_topics(4, 3, storage)
    assert sorted(shard_for(t, 3) for t in topics) == [0, 0, 1, 2]
    assert sum(kind == "disk" for kind in topics.values()) == disk
    if storage == "mixed":   # six topics: a disk and a memory topic on every shard
        six = pick_topics(6, 3, storage)
        assert sorted((shard_for(t, 3), kind) for t, kind in six.items()) == [
            (i, kind) for i in range(3) for kind in ("disk", "memory")]
    s = ChaosSettings(storage=storage, fsync="interval")
    config = config_mod.load(overrides=[*s.settings, *s.storage_overrides(tmp_path)], shards=3)
    for topic, kind in topics.items():
        assert config.settings_for(topic).storage == kind
    if storage != "memory":
        assert config.storage.dir == str(tmp_path) and config.storage.fsync == "interval"
    assert from_env({"CHAOS_STORAGE": "disk", "CHAOS_FSYNC": "never"}).fsync == "never"
    with pytest.raises(ValueError, match="CHAOS_STORAGE"):
        from_env({"CHAOS_STORAGE": "tape"})


def test_data_dir_is_removed_only_inside_the_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "data" / "shard-0").mkdir(parents=True)
    remove_data_dir(run / "data", run)
    assert not (run / "data").exists() and run.exists()
    with pytest.raises(RuntimeError, match="refusing"):
        remove_data_dir(tmp_path / "elsewhere", run)


def _storage_history(disk_generation_after: int) -> tuple[RunOutput, h.History]:
    """A disk and a memory topic on one shard, killed once: shard generation 1 -> 2."""
    disk, mem = "chaos.disk.t", "chaos.mem.u"
    shard = shard_for(disk, 3)
    assert shard_for(mem, 3) == shard
    events: list[h.Event] = [h.ShardHello(0.0, "c", shard, 1)]
    for i in range(3):   # three messages each, acked in the first incarnation
        events += [h.PublishAcked(1.0 + i, "p", i, disk, f"d{i}", 0xD, i, False),
                   h.PublishAcked(1.0 + i, "p", i, mem, f"m{i}", 1, i, False)]
    events += [h.Consumed(4.0, "s", disk, 0xD, 0, "d0", 1),
               h.Consumed(4.0, "s", mem, 1, 0, "m0", 1),
               h.ShardHello(6.0, "c", shard, 2),    # the kill's new incarnation
               h.PublishAcked(7.0, "p", 9, disk, "d3", disk_generation_after, 3, False),
               h.Consumed(8.0, "s", disk, disk_generation_after, 1, "d1", 1),
               h.Consumed(8.0, "s", disk, disk_generation_after, 3, "d3", 1)]
    history = h.History(meta={"liveness": [{"subscriber": "s", "topic": disk},
                                           {"subscriber": "s", "topic": mem}]}, events=events)
    kill = FaultRecord(PlannedFault(5.0, "shard-kill", shard), began=5.0, ended=6.0)
    out = RunOutput(ChaosSettings(), Path("."), [disk, mem], [], [], [kill], h.History(),
                    storage={disk: "disk", mem: "memory"})
    return out, history


def test_storage_accounting_explains_memory_losses_only() -> None:
    out, history = _storage_history(0xD)
    kinds = by_storage(out, history)
    disk, memory = kinds["disk"], kinds["memory"]
    assert (disk.acked, disk.delivered, disk.kills) == (4, 3, 1)
    assert disk.lost_unexplained == 1 and disk.lost_ids == ["s never got chaos.disk.t id=d2"]
    assert disk.generation_changes == 0 and disk.broken()
    assert (memory.acked, memory.lost_explained, memory.lost_unexplained) == (3, 2, 0)
    assert not memory.broken()
    assert failed(checker.Report(), [], Tally(storage=kinds))
    assert not failed(checker.Report(), [], Tally(storage={"memory": memory}))


def test_storage_accounting_sees_a_disk_generation_change() -> None:
    out, history = _storage_history(0xE)
    disk = by_storage(out, history)["disk"]
    assert disk.generation_changes == 1 and disk.changed == ["chaos.disk.t: 0xd -> 0xe"]
    out, history = _storage_history(2)   # a shard incarnation's generation: not on disk
    assert by_storage(out, history)["disk"].shard_generation == 1


async def _echo(stream: trio.SocketStream) -> None:
    async with stream:
        try:
            while data := await stream.receive_some(65536):
                await stream.send_all(data)
        except trio.BrokenResourceError:  # the proxy resets connections on purpose
            pass


async def _roundtrip(stream: trio.SocketStream, data: bytes) -> bytes:
    await stream.send_all(data)
    got = b""
    while len(got) < len(data):
        chunk = await stream.receive_some(65536)
        if not chunk:
            break
        got += chunk
    return got


async def test_proxy_forwards_stalls_and_resets() -> None:
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(functools.partial(trio.serve_tcp, _echo, 0,
                                                              host="127.0.0.1"))
            target = listeners[0].socket.getsockname()[1]
            probe = trio.socket.socket()
            await probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
            probe.close()
            proxy = ShardProxy(0, port, target)
            await nursery.start(proxy.run)
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            assert await _roundtrip(stream, b"hello") == b"hello"

            proxy.stall()
            await stream.send_all(b"held")
            with trio.move_on_after(0.3) as waited:
                await stream.receive_some(100)
            assert waited.cancelled_caught  # nothing passes while stalled
            proxy.unstall()
            assert await stream.receive_some(100) == b"held"  # ... and nothing was lost

            assert proxy.reset() == 1
            with pytest.raises(trio.BrokenResourceError):
                for _ in range(50):
                    if not await stream.receive_some(100):
                        raise trio.BrokenResourceError("closed")

            fresh = await trio.open_tcp_stream("127.0.0.1", port)
            proxy.blackhole()
            await fresh.send_all(b"dropped")
            await trio.sleep(0.2)
            assert proxy.unblackhole() == 1  # the broken connection is reset
            assert proxy.stats.dropped >= len(b"dropped")
            nursery.cancel_scope.cancel()


_PLANT_PROBE = """
import json, sys
if sys.argv[1]:
    from chaos.planted import plant
    plant(sys.argv[1])
from flux import protocol as P
from flux.config import Config
from flux.shard.core import ShardCore
core = ShardCore(Config().replace(shards=1), index=0, shard_count=1, generation=7, now=0.0)
c = core.connect(0.0)
core.receive(c, [P.PUBLISH, 1, [["t", ["a"], [b"x"]]]], 0.0)
core.receive(c, [P.PUBLISH, 2, [["t", ["a"], [b"x"]]]], 0.0)  # a retry: same id
core.receive(c, [P.SUBSCRIBE, 3, 1, {"topic": "t", "name": "s", "read_old": True}], 0.0)
core.tick(0.0)
core.receive(c, [P.SUBSCRIBE, 4, 2, {"topic": "t", "name": "s"}], 0.0)  # takes it over
frames = [f for _, fs, _ in core.take_output() for f in fs]
offsets, duplicates, _ = next(f for f in frames if f[0] == P.PUBLISHED and f[1] == 2)[3][0]
cursor = next(f for f in frames if f[0] == P.SUBSCRIBED and f[1] == 4)[3]["cursor"]
print(json.dumps({"retry": [P.offsets_of(offsets, 1)[0], 0 in duplicates], "cursor": cursor}))
"""


@pytest.mark.parametrize(("plant", "retry", "cursor"), [
    ("", [0, True], 0),                          # the real shard: dedup, cursor waits for acks
    ("skip-dedup", [1, False], 0),               # the retry is stored again
    ("cursor-before-ack", [0, True], 1),         # the unacked push moved the cursor
])
def test_planted_bugs_change_what_the_shard_does(plant: str, retry: list[object],
                                                 cursor: int) -> None:
    """Each plant still hooks into the shard (so a plant run that passes is the checker's
    fault, not a plant that no longer applies)."""
    done = subprocess.run([sys.executable, "-c", _PLANT_PROBE, plant], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"retry": retry, "cursor": cursor}


_DISK_PLANT_PROBE = """
import json, sys, tempfile, types
import trio
if sys.argv[1]:
    from chaos.planted import plant
    plant(sys.argv[1])
from flux.host import RealDisk
from flux.shard.disk import ShardStorage
from flux.storage.table import SegmentTable
from flux.storage.writer import LogWriter

async def main():
    disk = RealDisk()
    with tempfile.TemporaryDirectory() as d:
        writer = LogWriter(disk, SegmentTable(d, start=0), owner="topic t", generation=7,
                           boot_id=disk.boot_id())
        end = writer.append(1, b"record").end
        early = writer.durable >= end and writer.written < end   # durable, never written
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            await writer.close()
    me = types.SimpleNamespace(disk=disk, config=types.SimpleNamespace(
        storage=types.SimpleNamespace(fsync="always")))
    report = types.SimpleNamespace(boot_id=disk.boot_id())
    print(json.dumps({"early": early, "new_generation": ShardStorage._boot_changed(me, report)}))

trio.run(main)
"""


@pytest.mark.parametrize(("plant", "early", "new_generation"), [
    ("", False, False),                     # the real log and recovery
    ("disk-ack-before-write", True, False),  # durable before write(2)
    ("disk-new-generation", False, True),    # a recovery in the same boot draws a new one
])
def test_disk_plants_change_what_the_shard_does(plant: str, early: bool,
                                                new_generation: bool) -> None:
    done = subprocess.run([sys.executable, "-c", _DISK_PLANT_PROBE, plant], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"early": early, "new_generation": new_generation}


@pytest.mark.integration
def test_short_chaos_run_passes_the_checker(tmp_path: Path) -> None:
    """A few faults of every process kind on real processes, memory and disk topics: no
    violation, nothing acked on a disk topic lost, no disk generation changed, a full
    report, and the data directory gone."""
    args = [sys.executable, "-m", "chaos", "--seed", "3", "--duration", "12", "--faults", "8",
            "--liveness", "6", "--rate", "4", "--no-png", "--out", str(tmp_path),
            "--storage", "mixed", "--topics", "6",
            "--mix", "shard-kill=1,shard-pause=1,router-kill=1,reset=1,stall=1,blackhole=1,latency=1"]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=SMOKE_TIMEOUT)
    output = done.stdout[-4000:] + done.stderr[-4000:]
    assert done.returncode == 0, output
    [report_path] = tmp_path.glob("*/report.json")
    report = json.loads(report_path.read_text())
    assert report["ok"], output
    assert report["faults"]["injected"] >= 6, report["faults"]
    messages = report["messages"]
    assert messages["acked"] > 100, messages
    assert messages["lost_unexplained"] == 0
    assert {w["flavour"] for w in report["workers"]} >= {"trio"}
    storage = report["storage"]
    assert storage["mode"] == "mixed" and not storage["disk_broken"]
    disk, memory = storage["by_kind"]["disk"], storage["by_kind"]["memory"]
    assert disk["acked"] > 50 and memory["acked"] > 50, storage
    assert disk["kills"] >= 1, storage   # every shard holds a disk topic
    assert disk["lost_unexplained"] == disk["generation_changes"] == 0, storage
    assert disk["shard_generation"] == 0, storage
    assert "recovered topic 'chaos.disk." in (report_path.parent / "broker.log").read_text()
    assert not Path(storage["data_dir"]).exists()
