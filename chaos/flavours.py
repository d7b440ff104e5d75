"""The asyncio flavour of a chaos worker: the real asyncio client, its wire tapped.

The asyncio client opens its connections with ``loop.create_connection``; a
:class:`TappingLoop` wraps each protocol (and its transport) so that the
simulator's wire tap sees every byte both ways, unchanged. Nothing else of the
client is touched.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from flux.sim.tap import Recorder, WireTap

if TYPE_CHECKING:
    from chaos.worker import WorkerSpec


class _TapTransport:
    """A transport proxy that shows every write to the tap first."""

    def __init__(self, inner: asyncio.Transport, tap: WireTap) -> None:
        self._inner = inner
        self._tap = tap

    def write(self, data: bytes | bytearray | memoryview) -> None:
        # recorded before it leaves, as the trio tap does
        self._tap.outgoing(bytes(data))
        self._inner.write(data)

    def writelines(self, chunks: Any) -> None:
        for chunk in chunks:
            self.write(chunk)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _TapProtocol(asyncio.Protocol):
    def __init__(self, inner: asyncio.Protocol, tap: WireTap) -> None:
        self._inner = inner
        self._tap = tap

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._inner.connection_made(_TapTransport(transport, self._tap))  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        self._tap.incoming(data)
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        self._tap.closed("lost")   # the other side closed it
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        # after an EOF the tap has already ended; otherwise an error means the connection
        # broke, and no error means this client closed (or aborted) it
        self._tap.closed("lost" if exc is not None else "closed")
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class TappingLoop(asyncio.SelectorEventLoop):
    """An event loop whose TCP connections are tapped while ``recorder`` is set."""

    recorder: Recorder | None = None
    client_name = "client"

    async def create_connection(  # type: ignore[override]
            self, protocol_factory: Callable[[], asyncio.BaseProtocol], host: Any = None,
            port: Any = None, **kwargs: Any) -> tuple[asyncio.Transport, asyncio.BaseProtocol]:
        recorder = self.recorder
        if recorder is None:
            return await super().create_connection(protocol_factory, host, port, **kwargs)
        name = self.client_name

        def tapped() -> asyncio.BaseProtocol:
            inner = protocol_factory()
            assert isinstance(inner, asyncio.Protocol)
            return _TapProtocol(inner, WireTap(recorder, name))

        return await super().create_connection(tapped, host, port, **kwargs)


@asynccontextmanager
async def asyncio_client(spec: WorkerSpec, recorder: Recorder) -> AsyncIterator[Any]:
    """``flux.client.asyncio.connect`` for ``spec``, on a :class:`TappingLoop`."""
    from flux.client.asyncio import connect

    loop = asyncio.get_running_loop()
    if not isinstance(loop, TappingLoop):
        raise RuntimeError("the asyncio worker must run on a TappingLoop")
    loop.recorder, loop.client_name = recorder, spec.name
    async with connect(spec.url, request_timeout=spec.request_timeout,
                       retry_deadline=spec.retry_deadline) as client:
        yield client
