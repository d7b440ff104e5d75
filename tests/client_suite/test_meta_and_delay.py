"""Keys, headers and delayed delivery (G12), identical in every flavour."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from flux import errors

from .flavours import Flavour, take

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
TIMEOUT = 30


async def test_keys_and_headers_reach_subscribers_and_fetch(
        flavour: Flavour, suite_broker: Any, topic: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(suite_broker.url) as client:
            await client.publish(topic, b"a", key="user-1", headers={"trace": "t1"})
            await client.publish_many(topic, [b"b", b"c"], keys=["user-2", None],
                                      headers=[None, {"x": "y"}])
            await client.publish(topic, b"d")
            async with client.subscribe(topic, read_old=True) as sub:
                got = await take(sub, 4)
            fetched = await client.fetch(topic, 0)
    assert [(m.key, m.headers) for m in got] == [
        ("user-1", {"trace": "t1"}), ("user-2", {}), (None, {"x": "y"}), (None, {})]
    assert [(m.key, m.headers) for m in fetched.messages] == [(m.key, m.headers) for m in got]


async def test_a_delayed_message_is_acked_at_once_and_delivered_after_the_next_one(
        flavour: Flavour, suite_broker: Any, topic: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(suite_broker.url) as client, client.subscribe(topic) as sub:
            ack = await client.publish(topic, b"later", delay=1.0)
            now = await client.publish(topic, b"now")
            got = await take(sub, 2)
    assert ack.due is not None and now.due is None and ack.offset < now.offset
    assert [m.payload for m in got] == [b"now", b"later"]
    assert got[1].due == ack.due and got[1].timestamp < ack.due


async def test_bad_keys_headers_and_delays_raise_typed_errors_before_sending(
        flavour: Flavour, suite_broker: Any, topic: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(suite_broker.url) as client:
            with pytest.raises(errors.InvalidKey):
                await client.publish(topic, b"x", key="k" * 256)
            with pytest.raises(errors.InvalidHeaders):
                await client.publish(topic, b"x", headers={"flux-offset": "1"})
            with pytest.raises(errors.InvalidDelay):
                await client.publish(topic, b"x", delay=-1)
            with pytest.raises(errors.InvalidDelay):
                await client.publish(topic, b"x", delay=10 ** 9)  # over message.max_delay
            ack = await client.publish(topic, b"ok")
    assert ack.offset == 0
