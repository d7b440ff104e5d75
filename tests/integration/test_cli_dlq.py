"""``flux dlq list`` and ``flux dlq redrive`` against a running broker (G11)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
import trio

from flux.client.trio import connect

from .test_cli import flux, stats

if TYPE_CHECKING:
    from tests.conftest import Broker, BrokerFactory

pytestmark = pytest.mark.integration
TOPIC = "jobs.eu"


async def _dead_letter_two(url: str) -> None:
    """Publish three jobs; the "w" worker terms two of them and acks the third."""
    async with connect(url) as client:
        await client.publish_many(TOPIC, [b"j0", b"j1", b"j2"], ids=["a", "b", "c"],
                                  keys=["k0", None, None], headers=[{"n": "0"}, None, None])
        async with client.subscribe(TOPIC, name="w", read_old=True) as sub:
            seen = 0
            async for msg in sub:
                if msg.payload == b"j1":
                    await msg.ack()
                else:
                    await msg.term(f"bad {msg.payload.decode()}")
                seen += 1
                if seen == 3:
                    break


async def _read(url: str, name: str, count: int) -> list[Any]:
    async with connect(url) as client, client.subscribe(TOPIC, name=name,
                                                        read_old=True) as sub:
        out = []
        with trio.fail_after(20):
            async for msg in sub:
                out.append(msg)
                await msg.ack()
                if len(out) == count:
                    break
        return out


@pytest.fixture
def dead_letter_broker(broker_factory: BrokerFactory) -> Broker:
    return broker_factory(config="topics:\n  - match: 'jobs.*'\n    dead_letter: true\n")


def test_dlq_list_shows_each_dead_letter_and_why(dead_letter_broker: Broker) -> None:
    url = dead_letter_broker.url
    trio.run(_dead_letter_two, url)
    done = flux("dlq", "list", TOPIC, "--url", url, "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["dead_letters"]
    assert [(r["subscription"], r["offset"], r["id"], r["reason"], r["pushes"], r["key"],
             r["headers"], r["redriven"]) for r in rows] == [
        ("w", 0, "a", "term: bad j0", 1, "k0", {"n": "0"}, False),
        ("w", 2, "c", "term: bad j2", 1, None, {}, False)]
    table = flux("dlq", "list", TOPIC, "--url", url)
    assert table.returncode == 0, table.stderr
    assert "term: bad j0" in table.stdout and "Dead letters of jobs.eu" in table.stdout
    seen = stats(dead_letter_broker)["topics"]
    assert seen[TOPIC]["subscriptions"]["w"]["dead_lettered"] == 2
    assert seen[TOPIC]["dead_letter_held"] == 2
    assert seen["jobs.eu~w"]["dead_letter_of"] == TOPIC
    shown = flux("stats", "--url", url)
    assert "Dead letters" in shown.stdout


def test_dlq_redrive_publishes_again_once_and_marks_them_redriven(
        dead_letter_broker: Broker) -> None:
    url = dead_letter_broker.url
    trio.run(_dead_letter_two, url)
    done = flux("dlq", "redrive", TOPIC, "--subscription", "w", "--url", url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("redrove 2 dead letters")
    again = flux("dlq", "redrive", TOPIC, "--subscription", "w", "--url", url)
    assert again.stdout.startswith("redrove 0 dead letters")  # committed: nothing twice
    seen = stats(dead_letter_broker)["topics"][TOPIC]
    assert seen["next_offset"] == 5  # three jobs and the two redriven, once each
    # a new subscription reading from the start sees the redriven jobs with their meta
    got = trio.run(_read, url, "audit", 5)
    assert [(m.payload, m.key, m.headers) for m in got[3:]] == [
        (b"j0", "k0", {"n": "0"}), (b"j2", None, {})]
    assert all(m.id.startswith("redrive-") for m in got[3:])
    rows = json.loads(flux("dlq", "list", TOPIC, "--url", url, "--json").stdout)
    assert [r["redriven"] for r in rows["dead_letters"]] == [True, True]


def test_dlq_list_of_a_topic_without_dead_letters_says_so(broker: Broker) -> None:
    done = flux("dlq", "list", "nothing.here", "--url", broker.url)
    assert done.returncode == 0, done.stderr
    assert "no dead letters" in done.stdout


def test_a_redrive_cut_before_its_commit_stores_nothing_twice_when_run_again(
        dead_letter_broker: Broker) -> None:
    from flux import dead_letter_tool as tool

    url = dead_letter_broker.url
    trio.run(_dead_letter_two, url)

    async def cut_then_again() -> tuple[int, int]:
        async with connect(url) as client:
            original = client.commit

            async def lost(*args: Any, **kwargs: Any) -> int:
                raise ConnectionError("the redrive died before its commit")

            client.commit = lost  # type: ignore[method-assign]
            with pytest.raises(ConnectionError):
                await tool.redrive(client, TOPIC, "w")
            client.commit = original  # type: ignore[method-assign]
            return await tool.redrive(client, TOPIC, "w")

    assert trio.run(cut_then_again) == (2, 2)  # both published again: duplicates (G3)
    assert stats(dead_letter_broker)["topics"][TOPIC]["next_offset"] == 5
