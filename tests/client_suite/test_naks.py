"""nak, term and in_progress (G11) and dead-letter topics, identical in every flavour."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from flux import errors
from flux.hashing import dead_letter_topic

from .flavours import Flavour, take

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
TIMEOUT = 30


async def test_nak_term_and_in_progress_and_the_dead_letter_topic(
        flavour: Flavour, dead_letter_broker: Any, topic: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(dead_letter_broker.url) as client:
            await client.publish_many(topic, [b"again", b"poison", b"slow"],
                                      headers=[None, {"job": "7"}, None])
            async with client.subscribe(topic, name="w", read_old=True) as sub:
                first = await take(sub, 3, ack=False)
                await first[0].nak(0.3)
                await first[1].term("cannot parse")
                await first[2].in_progress()
                [again] = await take(sub, 1)
                await first[2].ack()
            letters = await client.fetch(dead_letter_topic(topic, "w"), 0)
    assert [m.payload for m in first] == [b"again", b"poison", b"slow"]
    assert (again.payload, again.attempt) == (b"again", 2)
    [letter] = letters.messages
    assert letter.payload == b"poison" and letter.id == first[1].id
    assert letter.headers["job"] == "7" and letter.headers["flux-reason"] == "term: cannot parse"
    assert letter.headers["flux-offset"] == str(first[1].offset)
    assert letter.headers["flux-subscription"] == "w"


async def test_bad_naks_and_terms_raise_typed_errors_and_publishing_to_a_dead_letter_topic_too(
        flavour: Flavour, dead_letter_broker: Any, topic: str) -> None:
    with anyio.fail_after(TIMEOUT):
        async with flavour.connect(dead_letter_broker.url) as client:
            await client.publish(topic, b"x")
            async with client.subscribe(topic, name="w", read_old=True) as sub:
                [msg] = await take(sub, 1, ack=False)
                with pytest.raises(errors.InvalidDelay):
                    await msg.nak(-1)
                with pytest.raises(errors.InvalidRequest):
                    await msg.term("r" * 2000)
                await msg.ack()
            with pytest.raises(errors.InvalidTopic):
                await client.publish(dead_letter_topic(topic, "w"), b"no")
