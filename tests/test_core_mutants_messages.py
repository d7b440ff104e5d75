"""ShardCore details that surviving mutants of a second sample showed unchecked
(``make mutate``): the text of request errors and refused items, the counters and
fields STATS starts from, and the key a takeover event names.
"""

from __future__ import annotations

from typing import Any

from test_core_support import OK, Shard

from flux import errors
from flux import protocol as P

GROUP_SHAPE = ("a PUBLISH group is [topic, [id, ...], [payload, ...](, options)] with as"
               " many ids as payloads")


def _ready(overrides: dict[str, Any] | None = None) -> tuple[Shard, Any]:
    shard = Shard(overrides)
    client = shard.connect()
    client.hello()
    return shard, client


def test_publish_groups_that_are_not_an_array_are_named_in_the_error() -> None:
    _, client = _ready()
    reply = client.publish_frame("not an array")
    assert reply[0] == P.ERROR and reply[2] == errors.InvalidRequest.code
    assert reply[3] == "PUBLISH groups must be an array"


def test_a_group_whose_payloads_are_not_an_array_is_refused_with_its_shape() -> None:
    _, client = _ready()
    # one id and a one-character string: as many "payloads" as ids, but not an array
    reply = client.publish_frame([["orders.eu", ["a"], "x"]])
    assert reply[0] == P.ERROR and reply[2] == errors.InvalidRequest.code
    assert reply[3] == GROUP_SHAPE


def test_a_payload_too_large_for_one_frame_is_refused_with_the_largest_it_could_be() -> None:
    _, client = _ready({"max_frame_bytes": 1024})
    [[code, message, _]] = client.publish("a", payload=b"x" * 2000)
    assert code == errors.MessageTooLarge.code
    assert message.startswith("a 2000-byte payload cannot be delivered in one frame; at most ")
    assert message.endswith(" bytes with this id")


def test_publishes_past_the_topic_buffer_are_told_to_retry_with_the_same_id() -> None:
    _, client = _ready({"topic.buffer": 1})
    rows = client.publish("a", "b")
    assert rows[0][0] == OK
    assert rows[1][0] == errors.Busy.code
    assert rows[1][1] == ("more than topic.buffer=1 publishes of 'orders.eu' in one frame;"
                          " retry with the same id")


def test_an_ack_of_a_non_integer_offset_is_refused_as_not_an_integer() -> None:
    _, client = _ready()
    client.subscribe(1, name="s")
    reply = client.ack_frame(1, ["zero"])
    assert reply[0] == P.ACKED
    assert reply[4] == [["zero", errors.InvalidRequest.code, "offset must be an integer"]]


def test_a_max_in_flight_below_one_is_named_in_the_error() -> None:
    _, client = _ready()
    reply = client.subscribe_frame(1, name="s", max_in_flight=0)
    assert reply[0] == P.ERROR and reply[2] == errors.InvalidRequest.code
    assert reply[3] == "max_in_flight must be at least 1"


def test_a_sid_already_in_use_on_the_connection_is_named_in_the_error() -> None:
    _, client = _ready()
    client.subscribe(1, name="s")
    reply = client.subscribe_frame(1, name="t")
    assert reply[0] == P.ERROR and reply[2] == errors.InvalidRequest.code
    assert reply[3] == "sid 1 is already in use on this connection"


def test_a_takeover_event_names_the_subscription_key_and_the_session_it_ended() -> None:
    shard = Shard()
    events: list[tuple[Any, ...]] = []
    shard.core.on_event = events.append
    first, second = shard.connect(), shard.connect()
    first.hello()
    second.hello()
    first.subscribe(1, name="s")
    second.subscribe(1, name="s")
    [event] = [e for e in events if e[0] == "taken_over"]
    assert event == ("taken_over", "orders.eu", "s", (first.conn, 1))


def test_stats_of_a_new_shard_count_nothing_and_name_the_shard_count() -> None:
    shard = Shard(shard_count=1)
    stats = shard.stats()
    assert stats["shard_count"] == 1
    assert stats["counters"] == {"published": 0, "duplicates": 0, "delivered": 0,
                                 "redelivered": 0, "acked": 0, "trimmed": 0,
                                 "bytes_in": 0, "dead_lettered": 0,
                                 "dead_letter_refused": 0}
