"""The shard core's per-session limits: the HELLO deadline, subscriptions per session,
and a paused session (its output unread) that is not called silent."""

from __future__ import annotations

from test_core_support import Shard

from flux import errors
from flux import protocol as P


def test_a_session_without_hello_is_closed_at_hello_timeout_with_a_typed_error() -> None:
    shard = Shard({"limits.hello_timeout": 2.0, "subscriber.heartbeat": 100.0})
    silent, greeted = shard.connect(), shard.connect()
    greeted.hello()
    shard.after(1.9)
    assert not silent.closed
    assert silent.ping()[0] == P.PONG  # answered, but it is no HELLO
    shard.after(0.1)
    assert silent.closed
    error = silent.take(P.ERROR)
    assert [e[:3] for e in error] == [[P.ERROR, 0, errors.HelloTimeout.code]]
    assert "limits.hello_timeout" in error[0][3]
    shard.after(50.0)
    assert not greeted.closed


def test_the_hello_deadline_wakes_the_shard_even_with_long_heartbeats() -> None:
    shard = Shard({"limits.hello_timeout": 0.5, "subscriber.heartbeat": 100.0})
    shard.after(10.0)
    late = shard.connect()
    assert shard.core.next_deadline() <= shard.now + 0.5
    shard.after(0.5)
    assert late.closed


def test_a_wrong_version_hello_does_not_count_as_hello() -> None:
    shard = Shard({"limits.hello_timeout": 1.0})
    client = shard.connect()
    reply = client.request([P.HELLO, client.rid(), {"version": 999}])
    assert reply[:3] == [P.ERROR, reply[1], errors.UnsupportedVersion.code]
    assert client.closed


def test_a_session_holds_at_most_max_subscriptions_push_attachments() -> None:
    shard = Shard({"limits.max_subscriptions": 2})
    client, other = shard.connect(), shard.connect()
    client.subscribe(1, name="a")
    client.subscribe(2)
    refused = client.subscribe_frame(3, name="c")
    assert refused[:3] == [P.ERROR, refused[1], errors.TooManySubscriptions.code]
    assert "c" not in shard.topic_stats()["subscriptions"]  # nothing was made
    # a sid whose subscription another session took over no longer counts
    other.subscribe(9, name="a")
    client.subscribe(3, name="c")
    # the limit is per session: unsubscribing makes room, pull subscriptions are not counted
    client.unsubscribe(2)
    client.subscribe(4, name="d")
    assert client.subscribe_frame(5)[2] == errors.TooManySubscriptions.code
    assert client.subscribe(6, name="p", mode="pull")["created"]


def test_a_paused_session_is_not_silent_and_its_silence_counts_from_resuming() -> None:
    shard = Shard({"subscriber.heartbeat": 1.0})
    client = shard.connect()
    client.hello()
    shard.core.pause(client.conn, True, shard.now)
    shard.after(10.0)
    assert not client.closed
    shard.core.pause(client.conn, False, shard.now)
    shard.after(1.9)
    assert not client.closed
    shard.after(0.2)
    assert client.closed
    assert client.take(P.ERROR)[0][:3] == [P.ERROR, 0, errors.ProtocolError.code]
