"""ShardCore details that surviving mutants of a fourth sample showed unchecked
(``make mutate``): the texts of the errors for a frame that is no frame, an unknown
kind and a bad subscription name, the event an exhausted subscription reports, a
FETCH from inside a chunk of fifteen messages, a remembered id past its window, and
the log's columns compacted once most of its chunks are trimmed.
"""

from __future__ import annotations

from typing import Any

from test_core_support import TOPIC, Shard, fetched_messages

from flux import errors
from flux import protocol as P
from flux.shard.dedup import EXPIRE_SLICE, DedupWindow
from flux.shard.topic import TopicLog


def test_a_frame_that_is_not_an_array_with_a_kind_is_refused_saying_so() -> None:
    shard = Shard()
    client = shard.connect()
    client.hello()
    [error] = client.send(["publish"])
    assert error[:3] == [P.ERROR, 0, errors.ProtocolError.code]
    assert error[3] == "a frame must be an array whose first element is its kind"


def test_an_unknown_frame_kind_is_refused_naming_the_kind() -> None:
    shard = Shard()
    client = shard.connect()
    client.hello()
    [error] = client.send([99, 5])
    assert error[:3] == [P.ERROR, 5, errors.InvalidRequest.code]
    assert error[3] == "unknown frame kind 99"


def test_a_subscription_name_starting_with_a_tilde_is_refused_with_the_rule() -> None:
    shard = Shard()
    client = shard.connect()
    client.hello()
    error = client.subscribe_frame(1, name="~s")
    assert error[0] == P.ERROR and error[2] == errors.InvalidRequest.code
    assert error[3] == "subscription name must be 1-255 bytes and not start with '~'"


def test_an_exhausted_subscription_is_reported_with_its_key_and_offset() -> None:
    shard = Shard()
    events: list[tuple[Any, ...]] = []
    shard.core.on_event = events.append
    client = shard.connect()
    client.hello()
    client.publish("a")
    client.subscribe(1, name="s", from_offset=0)
    shard.advance(100.0)
    assert [e for e in events if e[0] == "exhausted"] == [("exhausted", TOPIC, "s", 0)]


def test_a_fetch_from_inside_a_chunk_of_fifteen_returns_its_payloads() -> None:
    shard = Shard()
    client = shard.connect()
    client.hello()
    ids = [f"m{i}" for i in range(15)]
    client.publish(*ids)
    messages = fetched_messages(client.fetch(offset=5))
    assert [m[:3] for m in messages] == [[i, f"m{i}", f"m{i}".encode()] for i in range(5, 15)]


def test_a_lookup_does_not_find_an_id_past_its_window_that_is_still_held() -> None:
    dedup = DedupWindow(10.0)
    many = [f"{i:05d}" for i in range(EXPIRE_SLICE + 10)]
    dedup.remember_all(many, 0, 0.0)
    # one lookup forgets at most EXPIRE_SLICE ids: the last ones stay held, past their window
    assert dedup.lookup(many[-1], 20.0) is None


def test_trimming_most_of_many_chunks_compacts_the_columns_behind_them() -> None:
    log = TopicLog()
    for i in range(100):
        log.append(f"m{i}", b"p", float(i))
    assert log.trim(80, 1000.0) == 80
    # 80 of 100 chunks gone: the columns keep only the 20 still held
    assert len(log._first) == 20
    assert log.oldest == 80 and log.get(80) is not None
