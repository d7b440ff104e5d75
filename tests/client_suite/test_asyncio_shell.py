"""What only the asyncio shell has: a bug in a callback stops the client loudly, and
closing it closes every transport. The shared behaviour is in the other modules."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flux import errors
from flux.client.asyncio import connect

pytestmark = pytest.mark.integration


def test_a_bug_in_a_callback_fails_callers_and_is_raised_at_exit(suite_broker: Any) -> None:
    class Bug(Exception):
        pass

    async def main() -> None:
        async with connect(suite_broker.url, request_timeout=5) as client:
            def broken(*args: object) -> None:
                raise Bug("boom")

            client._core.receive = broken  # type: ignore[method-assign]
            with pytest.raises(errors.ClientClosed):
                await asyncio.wait_for(client.publish("asyncio-shell.bug", b"x"), 10)

    with pytest.raises(Bug, match="boom"):
        asyncio.run(main())


def test_closing_the_client_closes_its_transports(suite_broker: Any) -> None:
    async def main() -> list[Any]:
        async with connect(suite_broker.url) as client:
            await client.publish("asyncio-shell.a", b"x")
            await client.publish("asyncio-shell.b", b"x")
            conns = list(client._shell._conns.values())
            assert conns and all(c.transport is not None for c in conns)
        return conns

    conns = asyncio.run(main())
    assert all(c.done.done() and c.transport.is_closing() for c in conns)


def test_buffered_messages_come_in_streaks_that_let_other_tasks_run(suite_broker: Any) -> None:
    """The iterator returns buffered messages without a loop trip, but yields at least
    every STREAK messages; a cancelled wait for the next message loses none."""
    from flux.client.asyncio import STREAK

    async def main() -> None:
        topic = "asyncio-shell.streak"
        async with connect(suite_broker.url) as client, \
                client.subscribe(topic, name="streak", prefetch=1000) as sub:
            await client.publish_many(topic, [b"%d" % i for i in range(3 * STREAK)])
            ticks = 0

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0)

            first = await sub.__anext__()
            await first.ack()
            while len(sub._state.buffer) < 3 * STREAK - 1:  # all of them buffered
                await asyncio.sleep(0.01)
            task = asyncio.get_running_loop().create_task(ticker())
            await asyncio.sleep(0)
            seen = [first.payload]
            ticks_before = ticks
            for _ in range(2 * STREAK):
                msg = await sub.__anext__()
                await msg.ack()
                seen.append(msg.payload)
            assert 1 <= ticks - ticks_before <= 3  # one loop trip per STREAK, not per message
            task.cancel()
            for _ in range(5):  # cancelled before it runs: it takes no message
                waiting = asyncio.ensure_future(sub.__anext__())
                waiting.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await waiting
            while len(seen) < 3 * STREAK:
                msg = await sub.__anext__()
                await msg.ack()
                seen.append(msg.payload)
            assert seen == [b"%d" % i for i in range(3 * STREAK)]

    asyncio.run(main())
