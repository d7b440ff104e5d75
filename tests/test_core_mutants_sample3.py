"""ShardCore details that surviving mutants of a third sample showed unchecked
(``make mutate``): the text of a refused CREDIT, the events the core reports when
a subscription is created and a topic is retired, and blanking an id accepted
again once the forgotten marks were compacted away.
"""

from __future__ import annotations

from typing import Any

from test_core_support import TOPIC, Shard

from flux import errors
from flux.shard.dedup import EXPIRE_SLICE, DedupWindow


def test_a_negative_credit_is_refused_naming_what_credit_must_be() -> None:
    shard = Shard()
    client = shard.connect()
    client.hello()
    client.subscribe(1, name="s")
    client.credit(1, -1)
    [error] = client.errors()
    assert error[2] == errors.InvalidRequest.code
    assert error[3] == "CREDIT n must be a non-negative integer"


def test_a_new_subscription_is_reported_with_its_key_and_start() -> None:
    shard = Shard()
    events: list[tuple[Any, ...]] = []
    shard.core.on_event = events.append
    client = shard.connect()
    client.hello()
    client.publish("a", "b")
    client.subscribe(1, name="s")
    assert [e for e in events if e[0] == "created"] == [("created", TOPIC, "s", 2)]


def test_a_retired_topic_is_reported_with_its_next_offset() -> None:
    shard = Shard()
    events: list[tuple[Any, ...]] = []
    shard.core.on_event = events.append
    client = shard.connect()
    client.publish("a", "b")
    shard.advance(50.0)  # ttl 20 s, dedup window 50 s: nothing is left at this pass
    assert TOPIC not in shard.core.topics
    assert [e for e in events if e[0] == "retired"] == [("retired", TOPIC, 2)]


def test_an_id_accepted_again_after_the_marks_before_it_were_compacted_is_found() -> None:
    dedup = DedupWindow(10.0)
    dedup.remember("old", 0, 0.0)
    dedup.expire(10.0)  # every mark forgotten: the columns start again from mark 1
    many = [f"{i:05d}" for i in range(EXPIRE_SLICE)]
    dedup.remember_all(many, 1, 20.0)
    dedup.remember("again", 2000, 21.0)
    # one call forgets EXPIRE_SLICE ids: "again" is past its window and still held
    dedup.remember("again", 3000, 40.0)
    assert dedup.lookup("again", 41.0) == 3000
    assert dedup.live_bytes(41.0) == len("again")
