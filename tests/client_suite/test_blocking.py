"""What only the blocking client has: plain ``with``/``for``, ``next(timeout=)``, its
background thread (stopped on close, or by the finalizer), and use from inside a
running asyncio loop, as in a notebook. The shared behaviour is in the other modules."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from typing import Any

import pytest

from flux import errors
from flux.client.sync import Client, Message, connect

from .flavours import unused_port

pytestmark = pytest.mark.integration
OPTIONS = {"request_timeout": 5.0, "retry_deadline": 20.0}


def client_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "flux-client"]


def wait_until(check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_with_blocks_publish_and_a_for_loop_consumes(suite_broker: Any) -> None:
    topic = "blocking.plain"
    with connect(suite_broker.url, **OPTIONS) as client:
        acks = [client.publish(topic, b"%d" % i, id=f"p{i}") for i in range(3)]
        acks += client.publish_many(topic, [b"3", b"4"])
        got: list[Message] = []
        with client.subscribe(topic, name="reader", read_old=True) as sub:
            for msg in sub:
                msg.ack()
                got.append(msg)
                if len(got) == 5:
                    break
    assert [a.offset for a in acks] == [0, 1, 2, 3, 4]
    assert [(m.offset, m.payload) for m in got] == [(i, b"%d" % i) for i in range(5)]
    assert got[0].id == "p0" and got[0].attempt == 1 and got[0].topic == topic
    assert not client_threads()


def test_next_with_a_timeout_returns_none_until_a_message_comes(suite_broker: Any) -> None:
    with connect(suite_broker.url, **OPTIONS) as client, \
            client.subscribe("blocking.timeout") as sub:
        started = time.monotonic()
        assert sub.next(timeout=0.2) is None
        assert time.monotonic() - started >= 0.2
        client.publish("blocking.timeout", b"late")
        msg = sub.next(timeout=10)
        assert msg is not None and msg.payload == b"late"
        msg.ack()
        sub.unsubscribe()
        assert list(sub) == []
        with pytest.raises(errors.ClientClosed):
            sub.next(timeout=1)


def test_works_inside_a_running_asyncio_loop_like_a_notebook(suite_broker: Any) -> None:
    async def cell() -> list[int]:  # a notebook cell runs blocking code on the loop's thread
        with connect(suite_broker.url, **OPTIONS) as client:
            client.publish_many("blocking.notebook", [b"a", b"b"])
            with client.subscribe("blocking.notebook", read_old=True) as sub:
                offsets = []
                while (msg := sub.next(timeout=0.5)) is not None:
                    msg.ack()
                    offsets.append(msg.offset)
                return offsets

    assert asyncio.run(cell()) == [0, 1]


def test_close_stops_the_thread_and_ends_iteration_in_other_threads(suite_broker: Any) -> None:
    client = connect(suite_broker.url, **OPTIONS)
    sub = client.subscribe("blocking.close")
    sub.__enter__()
    ended = threading.Event()

    def consume() -> None:
        assert list(sub) == []  # waits until the client closes
        ended.set()

    consumer = threading.Thread(target=consume)
    consumer.start()
    time.sleep(0.2)
    client.close()
    consumer.join(10)
    assert ended.is_set() and not client_threads()
    client.close()  # idempotent
    with pytest.raises(errors.ClientClosed):
        client.publish("blocking.close", b"late")


def test_threads_share_one_client(suite_broker: Any) -> None:
    offsets: list[int] = []
    with connect(suite_broker.url, **OPTIONS) as client:
        def produce(n: int) -> None:
            for i in range(25):
                offsets.append(client.publish("blocking.threads", b"%d-%d" % (n, i)).offset)

        producers = [threading.Thread(target=produce, args=(n,)) for n in range(8)]
        for thread in producers:
            thread.start()
        for thread in producers:
            thread.join(30)
    assert sorted(offsets) == list(range(200))


def test_a_dropped_client_is_closed_by_its_finalizer(suite_broker: Any) -> None:
    client: Client | None = connect(suite_broker.url, **OPTIONS)
    assert client is not None
    client.publish("blocking.dropped", b"x")
    assert client_threads()
    client = None
    gc.collect()
    wait_until(lambda: not client_threads())


def test_unreachable_router_raises_and_leaves_no_thread() -> None:
    with pytest.raises(errors.ConnectionLost):
        connect(f"flux://127.0.0.1:{unused_port()}", request_timeout=2)
    assert not client_threads()


def test_a_blocking_call_from_the_clients_own_loop_is_refused(suite_broker: Any) -> None:
    with connect(suite_broker.url, **OPTIONS) as client:
        async def inside() -> None:
            client.publish("blocking.loop", b"x")

        with pytest.raises(RuntimeError, match="own client's loop"):
            client._portal.run(inside())
