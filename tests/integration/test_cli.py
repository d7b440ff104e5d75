"""The ``flux`` command against a running broker: pub, sub and stats, as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.conftest import Broker

pytestmark = pytest.mark.integration
TIMEOUT = 30


def flux(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``flux ARGS`` in a child process (bounded in time) and return what it printed."""
    out = subprocess.run([sys.executable, "-m", "flux", *args], input=stdin,
                         capture_output=True, timeout=TIMEOUT)
    return subprocess.CompletedProcess(out.args, out.returncode, out.stdout.decode(),
                                       out.stderr.decode())


def stats(broker: Broker, *args: str) -> dict[str, Any]:
    done = flux("stats", "--url", broker.url, "--json", *args)
    assert done.returncode == 0, done.stderr
    shards: list[dict[str, Any]] = json.loads(done.stdout)["shards"]
    topics = {name: topic for shard in shards for name, topic in shard["topics"].items()}
    return {"shards": shards, "topics": topics}


def test_pub_sub_and_stats_through_the_command_line(broker: Broker) -> None:
    done = flux("pub", "--url", broker.url, "cli.orders", "first", "--id", "order-1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("cli.orders offset=0 generation=0x")
    again = flux("pub", "--url", broker.url, "cli.orders", "first", "--id", "order-1")
    assert again.stdout.strip() == done.stdout.strip() + " (duplicate)"  # G3
    lines = flux("pub", "--url", broker.url, "cli.orders", "--lines", stdin=b"second\nthird\n")
    assert [line.split()[1] for line in lines.stdout.splitlines()] == ["offset=1", "offset=2"]

    got = flux("sub", "--url", broker.url, "cli.orders", "--name", "billing", "--read-old",
               "--count", "2")
    assert got.returncode == 0, got.stderr
    assert [line.split(" ", 2)[::2] for line in got.stdout.splitlines()] == [
        ["cli.orders@0", "first"], ["cli.orders@1", "second"]]
    assert got.stdout.splitlines()[0].split()[1] == "id=order-1"

    seen = stats(broker)
    assert len(seen["shards"]) == broker.shard_count
    topic = seen["topics"]["cli.orders"]
    assert (topic["oldest"], topic["next_offset"], topic["held"]) == (0, 3, 3)
    billing = topic["subscriptions"]["billing"]
    # both printed messages were acked before the command exited
    assert (billing["mode"], billing["cursor"], billing["active"]) == ("push", 2, False)

    flux("pub", "--url", broker.url, "cli.other", "x")
    assert set(stats(broker, "cli.o*")["topics"]) == {"cli.orders", "cli.other"}
    assert set(stats(broker, "cli.other")["topics"]) == {"cli.other"}

    table = flux("stats", "--url", broker.url)
    assert table.returncode == 0, table.stderr
    for text in ("Shards", "Topics", "cli.orders", "billing", "Subscriptions"):
        assert text in table.stdout
    none = flux("stats", "--url", broker.url, "no.such.*")
    assert "no topics match 'no.such.*'" in none.stdout


def test_commands_report_a_broker_they_cannot_reach_in_one_line() -> None:
    import socket

    with socket.socket() as sock:  # a free port that nothing listens on
        sock.bind(("127.0.0.1", 0))
        url = f"flux://127.0.0.1:{sock.getsockname()[1]}"
    for args in (("pub", "--url", url, "t", "x"), ("stats", "--url", url)):
        done = flux(*args)
        assert done.returncode == 1
        assert "Traceback" not in done.stderr
        assert done.stderr.startswith("Error: "), done.stderr


def test_pub_sends_a_payload_argument_that_is_not_utf8_as_its_bytes(broker: Broker) -> None:
    raw = b"caf\xe9"  # Latin-1, not UTF-8: the shell hands these bytes over as they are
    out = subprocess.run([sys.executable, "-m", "flux", "pub", "--url", broker.url, "cli.raw",
                          os.fsdecode(raw)], capture_output=True, timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    fetched = subprocess.run([sys.executable, "-c", (
        "import trio, sys\n"
        "from flux.client.trio import connect\n"
        "async def main():\n"
        f"    async with connect({broker.url!r}) as c:\n"
        "        page = await c.fetch('cli.raw', 0)\n"
        "        sys.stdout.buffer.write(page.messages[0].payload)\n"
        "trio.run(main)\n")], capture_output=True, timeout=TIMEOUT)
    assert fetched.stdout == raw, fetched.stderr.decode(errors="replace")


def test_pub_refuses_a_bad_topic_with_a_typed_error(broker: Broker) -> None:
    done = flux("pub", "--url", broker.url, "bad topic", "x")
    assert done.returncode == 1
    assert done.stderr.startswith("Error: InvalidTopic"), done.stderr


def test_pub_with_a_key_headers_and_a_delay_and_sub_shows_them(broker: Broker) -> None:
    late = flux("pub", "--url", broker.url, "cli.later", "late", "--key", "k1",
                "--header", "trace=ab", "--delay", "4")
    assert late.returncode == 0, late.stderr
    assert " due=" in late.stdout
    now = flux("pub", "--url", broker.url, "cli.later", "now")
    assert " due=" not in now.stdout
    got = flux("sub", "--url", broker.url, "cli.later", "--read-old", "--count", "2")
    assert got.returncode == 0, got.stderr
    first, second = got.stdout.splitlines()
    assert first.startswith("cli.later@1 ") and first.endswith(" now")
    assert second.startswith("cli.later@0 ") and " key=k1 trace=ab late" in second
    bad = flux("pub", "--url", broker.url, "cli.later", "x", "--delay", "-1")
    assert bad.returncode == 1 and bad.stderr.startswith("Error: InvalidDelay"), bad.stderr


def test_sub_shared_takes_turns_with_another_worker_and_stats_shows_the_pool(
        broker: Broker) -> None:
    for i in range(4):
        flux("pub", "--url", broker.url, "cli.jobs", f"job{i}")
    first = flux("sub", "--url", broker.url, "cli.jobs", "--name", "pool", "--shared",
                 "--read-old", "--count", "2")
    assert first.returncode == 0, first.stderr
    second = flux("sub", "--url", broker.url, "cli.jobs", "--name", "pool", "--shared",
                  "--count", "2")
    assert second.returncode == 0, second.stderr
    lines = first.stdout.splitlines() + second.stdout.splitlines()
    assert sorted(line.split()[-1] for line in lines) == ["job0", "job1", "job2", "job3"]
    pool = stats(broker)["topics"]["cli.jobs"]["subscriptions"]["pool"]
    assert pool["shared"] is True and pool["cursor"] == 4 and pool["members"] == []
    plain = flux("sub", "--url", broker.url, "cli.jobs", "--name", "pool", "--count", "1")
    assert plain.returncode == 1
    assert plain.stderr.startswith("Error: SubscriptionKindMismatch"), plain.stderr
    bad = flux("sub", "--url", broker.url, "cli.jobs", "--key-ordered", "--count", "1")
    assert bad.returncode == 1 and bad.stderr.startswith("Error: InvalidRequest"), bad.stderr
