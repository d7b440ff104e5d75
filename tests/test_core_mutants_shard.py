"""ShardCore behaviours that surviving mutants showed no test checked (``make mutate``):
STATS counters over several passes, short dedup windows, what errors and SUB_ENDED
say, credit for several subscriptions at once, and packed chunks of
more than 65535 payloads.
"""

from __future__ import annotations

from test_core_support import OK, TOPIC, Shard

from flux import errors
from flux import protocol as P
from flux.shard.topic import TopicLog


def test_trimmed_counter_adds_up_over_cleanup_passes() -> None:
    shard = Shard()
    client = shard.connect()
    client.hello()
    client.publish("a", "b")
    shard.advance(25.0)  # ttl 20, a pass every 5 s
    assert shard.stats()["counters"]["trimmed"] == 2
    client.publish("c")
    shard.advance(50.0)
    assert shard.stats()["counters"]["trimmed"] == 3


def test_acked_counter_adds_up_over_acks() -> None:
    shard = Shard()
    client = shard.connect()
    client.hello()
    client.subscribe(1, name="s")
    client.publish("a", "b", "c")
    client.ack(1, 0)
    client.ack(1, 1, 2)
    assert shard.stats()["counters"]["acked"] == 3


def test_a_one_second_dedup_window_still_catches_a_retry_within_it() -> None:
    shard = Shard({"message.dedup_window": 1.0})
    client = shard.connect()
    client.hello()
    assert client.publish("a") == [[OK, 0, False]]
    shard.advance(0.5)
    assert client.publish("a") == [[OK, 0, True]]


def test_sub_ended_for_exhausted_pushes_says_how_to_resume() -> None:
    shard = Shard()
    client = shard.connect()
    client.hello()
    client.subscribe(1, name="s")
    client.publish("a")
    shard.advance(100.0)
    [ended] = client.take(P.SUB_ENDED)
    assert ended[2] == errors.SubscriptionInactive.code
    assert ended[3] == "offset 0 was pushed 3 times without an ack; subscribe again to resume"


def test_a_field_that_must_be_a_map_is_named_in_the_error() -> None:
    shard = Shard()
    client = shard.connect()
    client.hello()
    reply = client.request([P.FETCH, client.rid(), "not a map"])
    assert reply[0] == P.ERROR and reply[2] == errors.InvalidRequest.code
    assert reply[3] == "field 2 of the frame must be a map"


def test_from_offset_errors_say_what_was_wrong() -> None:
    shard = Shard()
    client = shard.connect()
    client.hello()
    client.publish("a")
    negative = client.subscribe_frame(1, name="s", from_offset=-1)
    assert negative[0] == P.ERROR and negative[3] == "from_offset must be >= 0"
    past = client.subscribe_frame(2, name="t", from_offset=5)
    assert past[0] == P.ERROR and past[3] == "from_offset 5 is past the next offset 1"


def test_an_ack_of_another_generation_reports_the_generation_it_carried() -> None:
    shard = Shard()
    client = shard.connect()
    client.hello()
    client.subscribe(1, name="s")
    client.publish("a")
    for carried, old in ((12345, 12345), ("x", None)):
        reply = client.ack_frame(1, [0], generation=carried)
        assert reply[0] == P.ERROR and reply[2] == errors.TopicReset.code
        exc = P.error_from_frame(reply)
        assert isinstance(exc, errors.TopicReset) and exc.old == old and exc.new == shard.generation


def test_credit_for_two_subscriptions_in_one_read_pushes_to_both() -> None:
    shard = Shard()
    client = shard.connect()
    client.hello()
    client.subscribe(1, name="a", credit=0)
    client.subscribe(2, name="b", credit=0)
    client.publish("m")
    shard.core.receive_many(client.conn, [[P.CREDIT, 1, 5], [P.CREDIT, 2, 5]], shard.now)
    shard.collect()
    assert client.deliveries(1) == [(0, 1)] and client.deliveries(2) == [(0, 1)]


def test_spans_of_packed_chunks_of_65535_and_65536_payloads_read_back_exactly() -> None:
    for count in (0xFFFF, 0x10000):
        log = TopicLog()
        payloads = [bytes([i % 251]) for i in range(count)]
        log.extend([f"m{i}" for i in range(count)], payloads, 0.0)
        for start, stop in ((1, 4), (count - 3, count)):
            _, packed, _ = log.span(start, stop)
            assert packed == payloads[start:stop]
        entry = log.get(count - 2)
        assert entry is not None and entry.payload == payloads[count - 2]


def test_deliver_frames_are_filled_up_to_half_of_max_frame_bytes() -> None:
    shard = Shard({"max_frame_bytes": 4096})  # each DELIVER holds at most 2048 bytes of items
    client = shard.connect()
    client.hello()
    client.subscribe(1, name="s", credit=0)
    payload = b"x" * (512 - 40 - len("m0"))  # an item counts its payload, id and 40 bytes
    client.publish_frame([[TOPIC, [f"m{i}" for i in range(8)], [payload] * 8]])
    client.take()
    client.credit(1, 8)
    sizes = [len(f[5]) for f in client.take(P.DELIVER)]
    assert sizes == [4, 4]
