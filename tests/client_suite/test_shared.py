"""Shared subscriptions (G10), identical in every flavour: a pool of members drains one
subscription, each message to one member; a member that leaves hands its messages on;
key order keeps a key on one member; kinds never mix."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from flux import errors

from .flavours import Flavour, next_within, take

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
TIMEOUT = 30


async def test_two_members_share_the_messages_each_once(
        flavour: Flavour, suite_broker: Any, topic: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(suite_broker.url) as client, \
                client.subscribe(topic, "pool", shared=True, max_in_flight=4) as one, \
                client.subscribe(topic, "pool", shared=True, max_in_flight=4) as two:
            await client.publish_many(topic, [b"%d" % i for i in range(40)])
            seen: list[tuple[int, int]] = []
            while len(seen) < 40:
                for member, sub in ((1, one), (2, two)):
                    msg = await next_within(sub, 0.05)
                    if msg is not None:
                        seen.append((member, msg.offset))
                        await msg.ack()
    offsets = sorted(o for _, o in seen)
    assert offsets == list(range(40))  # each once, none twice
    assert {m for m, _ in seen} == {1, 2}  # both members worked


async def test_a_member_that_leaves_hands_its_messages_on(
        flavour: Flavour, suite_broker: Any, topic: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(suite_broker.url) as client, \
                client.subscribe(topic, "pool", shared=True) as stays:
            leaving = client.subscribe(topic, "pool", shared=True, max_in_flight=2)
            await leaving.__aenter__()
            await client.publish_many(topic, [b"a", b"b", b"c", b"d"])
            held = await take(leaving, 1, ack=False)  # (the messages are spread evenly)
            await leaving.unsubscribe()  # its unacked messages go to the other member
            got = await take(stays, 4)
    assert sorted(m.offset for m in got) == [0, 1, 2, 3]
    handed = [m for m in got if m.offset == held[0].offset]
    assert handed and handed[0].attempt == 2  # a hand-off counts as a push


async def test_key_order_keeps_a_keys_messages_in_order_on_one_member(
        flavour: Flavour, suite_broker: Any, topic: str) -> None:
    keys = [f"k{i % 3}" for i in range(30)]
    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(suite_broker.url) as client, \
                client.subscribe(topic, "ordered", shared=True, key_ordered=True,
                                 max_in_flight=2) as one, \
                client.subscribe(topic, "ordered", shared=True, key_ordered=True,
                                 max_in_flight=2) as two:
            await client.publish_many(topic, [b"%d" % i for i in range(30)], keys=keys)
            seen: list[tuple[int, Any]] = []
            while len(seen) < 30:
                for member, sub in ((1, one), (2, two)):
                    msg = await next_within(sub, 0.05)
                    if msg is not None:
                        seen.append((member, msg))
                        await msg.ack()
    assert sorted(m.offset for _, m in seen) == list(range(30))
    for key in ("k0", "k1", "k2"):
        mine = [m.offset for _, m in seen if m.key == key]
        assert mine == sorted(mine)  # first pushes of a key in offset order


async def test_kinds_never_mix_and_bad_options_raise_before_sending(
        flavour: Flavour, suite_broker: Any, topic: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(suite_broker.url) as client:
            async with client.subscribe(topic, "plain"):
                with pytest.raises(errors.SubscriptionKindMismatch):
                    async with client.subscribe(topic, "plain", shared=True):
                        pass
            with pytest.raises(errors.InvalidRequest):
                async with client.subscribe(topic, shared=True):  # no name
                    pass
            with pytest.raises(errors.InvalidRequest):
                async with client.subscribe(topic, "x", key_ordered=True):
                    pass
