"""A shard whose disk topic's log fails (G9: an fsync error is never retried) stops
with one line that says what failed, where, and what happens next; the shard process
prints that line, not a traceback, and exits with status 3 (the router restarts it)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import trio
from test_output_backpressure import SECRET, LockstepHost

from flux import config as config_mod
from flux import protocol as P
from flux.host import ShardSpec
from flux.shard.server import StorageFailed, run_shard
from flux.sim.disk import SimDisk

TOPIC = "orders.eu"


async def test_a_failed_fsync_stops_the_shard_saying_which_log_and_what_comes_next() -> None:
    config = config_mod.Config().replace(**{
        "shards": 1, "storage.dir": "/data", "storage.kind": "disk",
        "shard.orphan_timeout": 60.0})
    spec = ShardSpec(index=0, shard_count=1, port=0, control="127.0.0.1:1", advertise=None,
                     config=config.to_dict(), secret=SECRET)
    host = LockstepHost()
    disk = host.disk = SimDisk(seed=1)
    expected = pytest.RaisesExc(
        StorageFailed, match=r"^shard 0: the log of topic 'orders\.eu' in /data/shard-0/orders\.eu"
                             r" failed \(.* /data/shard-0/orders\.eu/\S+ failed: .*\); the"
                             r" shard exits, and the router restarts it: its recovery reads")
    with trio.fail_after(30), pytest.RaisesGroup(expected, flatten_subgroups=True):
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: run_shard(host, spec, pid=1,
                                                              task_status=task_status))
            client = host.open()
            decoder = P.FrameDecoder(1 << 20)
            while True:  # Busy until its (empty) recovery is over
                await client.send_all(P.encode([P.HELLO, 1, {"version": P.VERSION}]))
                if decoder.feed(await client.receive_some())[0][0] == P.HELLO_OK:
                    break
                await trio.sleep(0.01)
            disk.fail_next_syncs(1)
            await client.send_all(P.encode([P.PUBLISH, 2, [[TOPIC, ["a"], [b"a"]]]]))
            await trio.sleep_forever()  # the shard's exit ends the nursery


SHARD_EXITS = """
import sys, trio
import flux.shard.__main__ as shard
from flux.shard.server import StorageFailed

async def serve(spec):
    async with trio.open_nursery():
        raise StorageFailed("shard 0: the log of topic 't' in /d/shard-0/t failed (fsync of"
                            " /d/shard-0/t/0.log failed: EIO); the shard exits, and the router"
                            " restarts it: its recovery reads every disk topic's log back")

shard.serve = serve
sys.exit(shard.main(["--spec", sys.argv[1]]))
"""


def test_the_shard_process_exits_3_with_one_line_and_no_traceback() -> None:
    spec = {"index": 0, "shard_count": 1, "port": 0, "control": "127.0.0.1:1",
            "advertise": None, "config": {}}
    done = subprocess.run([sys.executable, "-c", SHARD_EXITS, json.dumps(spec)],
                          input="secret\n", capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} flux shard 0 \[ERROR\] shard 0:"
                    r" the log of topic 't'", lines[0]), lines[0]
    assert "the router restarts it" in lines[0]
