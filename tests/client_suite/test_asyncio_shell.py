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
