"""Topic policies through a real ``flux serve --config FILE``: the shards get the
policies, topics use their policy's values, STATS and ``flux stats`` show them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

from flux import errors
from flux.client.trio import connect

from .test_cli import flux

if TYPE_CHECKING:
    from tests.conftest import BrokerFactory

pytestmark = pytest.mark.integration
TIMEOUT = 40

# the broker's own --set items (conftest) make the global timeout 2 s, retry_interval 0.2 s
CONFIG = """\
message:
  ttl: 60
subscriber:
  retry_count: 5
topics:
  - match: quick.>
    subscriber:
      retry_count: 0
      timeout: 0.5
  - match: tiny.*
    topic:
      max_bytes: 100
  - match: tiny.>
    message:
      ttl: 5
"""


async def test_topics_use_their_policy_and_stats_show_it(broker_factory: BrokerFactory) -> None:
    broker = broker_factory(config=CONFIG)
    with trio.fail_after(TIMEOUT):
        async with connect(broker.url) as client:
            # tiny.*: at most 100 bytes held; another topic takes the same publish
            with pytest.raises(errors.TopicFull):
                await client.publish("tiny.box", b"x" * 120, id="big")
            await client.publish("plain.box", b"x" * 120, id="big")
            await client.publish("tiny.box.deep", b"y", id="y")

            # quick.>: one push, 0.5 s for its ack, then the subscription is inactive
            async with client.subscribe("quick.jobs", name="worker", read_old=True) as sub:
                await client.publish("quick.jobs", b"job", id="job-1")
                started = trio.current_time()
                with pytest.raises(errors.SubscriptionInactive):
                    async for msg in sub:
                        assert (msg.offset, msg.attempt) == (0, 1)
                # well before the global schedule's second push (2.2 s)
                assert trio.current_time() - started < 2.0

            stats = await client.stats()
    topics = {name: topic for reply in stats.values() for name, topic in reply["topics"].items()}
    assert topics["tiny.box"]["policy"]["match"] == "tiny.*"
    assert topics["tiny.box"]["policy"]["topic.max_bytes"] == 100
    assert topics["tiny.box"]["policy"]["message.ttl"] == 60.0  # inherited, first match wins
    assert topics["tiny.box.deep"]["policy"]["match"] == "tiny.>"
    assert topics["tiny.box.deep"]["policy"]["message.ttl"] == 5.0
    assert topics["quick.jobs"]["policy"]["subscriber.retry_count"] == 0
    assert topics["quick.jobs"]["policy"]["subscriber.timeout"] == 0.5
    plain = topics["plain.box"]["policy"]
    assert plain["match"] is None
    assert (plain["subscriber.timeout"], plain["subscriber.retry_count"]) == (2.0, 5)

    table = flux("stats", "--url", broker.url)
    assert table.returncode == 0, table.stderr
    assert "Topic policies" in table.stdout
    quick = next(line for line in table.stdout.splitlines() if "quick.jobs" in line
                 and "quick.>" in line)
    assert "0x(0.5s+0.2s)" in quick


def test_serve_refuses_a_bad_policy_with_its_path(tmp_path: Path) -> None:
    path = tmp_path / "flux.yaml"
    path.write_text("topics:\n  - match: ok.*\n  - match: orders.>\n    message:\n"
                    "      ttl: -5\n")
    done = subprocess.run([sys.executable, "-m", "flux", "serve", "--config", str(path),
                           "--port", "0"], capture_output=True, text=True, timeout=30)
    assert done.returncode != 0
    assert "topics[1].message.ttl" in done.stderr
    path.write_text("topics:\n  - match: orders.>\n    dead_letter: maybe\n")
    done = subprocess.run([sys.executable, "-m", "flux", "serve", "--config", str(path),
                           "--port", "0"], capture_output=True, text=True, timeout=30)
    assert done.returncode != 0
    assert "topics[0].dead_letter.enabled" in done.stderr and "true or false" in done.stderr
