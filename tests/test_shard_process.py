"""The shard process's use of the machine: pinning every thread to its CPU once it
serves, and the real disk's read-ahead hint (recovery) that never fails or lingers."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from flux.host import RealDisk

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
