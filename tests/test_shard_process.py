"""The shard process's use of the machine: pinning every thread to its CPU once it
serves, and the real disk's read-ahead hint (recovery) that never fails or lingers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import trio
from test_output_backpressure import SECRET, LockstepHost

from flux import config as config_mod
from flux.host import RealDisk, ShardSpec
from flux.shard.disk import FORMAT_VERSION, OWNER
from flux.shard.server import ShardServer, run_shard
from flux.sim.disk import SimDisk
from flux.storage.record import encode
from flux.storage.segment import SegmentHeader, encode_header

PIN_CHILD = """
import os, threading
from flux.shard.__main__ import pin_to_cpu
started, stop = threading.Event(), threading.Event()
def idle():
    started.set()
    stop.wait()
t = threading.Thread(target=idle)
t.start()
started.wait()
pin_to_cpu(1)   # after a thread exists, as the shard pins once it serves
allowed = {tuple(sorted(os.sched_getaffinity(int(tid)))) for tid in os.listdir("/proc/self/task")}
stop.set()
t.join()
print(sorted(allowed))
"""


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or not os.path.isdir("/proc/self/task"),
                    reason="needs Linux affinity calls and procfs")
def test_pinning_once_serving_pins_the_threads_already_running_too() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    out = subprocess.run([sys.executable, "-c", PIN_CHILD], capture_output=True, text=True,
                         timeout=60, check=True).stdout.strip()
    assert out == str([(allowed[1 % len(allowed)],)])


def _read_ahead_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "flux-read-ahead"]


def test_read_ahead_reads_a_file_through_and_ends_and_ignores_a_missing_one(
        tmp_path: Path) -> None:
    path = tmp_path / "segment.log"
    path.write_bytes(os.urandom(9 << 20))  # more than two of its reads
    disk = RealDisk()
    disk.read_ahead(str(path))
    disk.read_ahead(str(tmp_path / "missing.log"))  # never raises
    deadline = time.monotonic() + 30
    while _read_ahead_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _read_ahead_threads(), "a read-ahead thread did not end"


@pytest.mark.parametrize("disk", [False, True])
async def test_once_serving_comes_after_the_disk_topics_are_recovered(disk: bool) -> None:
    """The shard process pins itself and imports ahead in ``on_serving``: never while
    its disk topics recover (the read-ahead thread needs the other CPU), and also
    without any."""
    keys: dict[str, object] = {"shards": 1, "shard.orphan_timeout": 60.0}
    if disk:
        keys.update({"storage.dir": "/data", "storage.kind": "disk"})
    config = config_mod.Config().replace(**keys)
    spec = ShardSpec(index=0, shard_count=1, port=0, control="127.0.0.1:1", advertise=None,
                     config=config.to_dict(), secret=SECRET)
    host = LockstepHost()
    host.disk = SimDisk(seed=1)
    if disk:  # one disk topic's log: an empty snapshot
        host.disk.makedirs("/data/shard-0/orders")
        host.disk.open("/data/flux-data.json", create=True).append(
            json.dumps({"format": FORMAT_VERSION, "shards": 1}).encode())
        header = SegmentHeader(f"{OWNER}orders", 5, 0, "boot")
        host.disk.open("/data/shard-0/orders/00000000000000000000.log", create=True).append(
            encode_header(header) + encode(6, b"\x93\x00\x00\x90"))
    servers: list[ShardServer] = []
    seen: list[object] = []
    stop = trio.Event()

    def serving() -> None:
        core = servers[0].core
        seen.append(core.recovering)
        if disk:
            assert servers[0].storage is not None
            seen.append([r.topic for r in servers[0].storage.recovered])
        stop.set()

    with trio.fail_after(30):
        await run_shard(host, spec, pid=1, stop=stop, on_start=servers.append,
                        on_serving=serving)
    assert seen == ([None, ["orders"]] if disk else [None])


def test_a_new_shard_process_imports_neither_numpy_nor_yaml() -> None:
    """A restarted shard serves sooner without them (numpy is imported once it serves,
    or when a dedup window first turns compact; a shard's config comes as a dict)."""
    code = ("import sys, flux.shard.__main__\n"
            "print(sorted(m for m in ('numpy', 'yaml') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.strip()
    assert out == "[]"
