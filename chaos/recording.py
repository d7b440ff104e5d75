"""How a chaos client process records its client-visible history to a file.

The events are the simulator's (:mod:`flux.sim.history`), recorded by the
simulator's own wire tap (:mod:`flux.sim.tap`) around real TCP streams, and
streamed to a JSON-lines file as they happen. Every process stamps events with
the machine's monotonic clock, so the runner can merge the files in time order.
"""

from __future__ import annotations

import itertools
import json
import ssl
import time
from typing import IO, Any, cast

import trio

from flux.host import RealHost
from flux.sim import history as h
from flux.sim.tap import Recorder, TapStream

SESSION_STRIDE = 1_000_000   # session ids of process k start at (k + 1) * SESSION_STRIDE


def monotonic() -> float:
    """The clock every chaos process stamps events with (system-wide on Linux)."""
    return time.monotonic()


class MonotonicClock(trio.abc.Clock):
    """trio's clock reading :func:`monotonic` itself, so that the runner's deadlines and
    the events it stamps are on one clock."""

    def start_clock(self) -> None:
        pass

    def current_time(self) -> float:
        return monotonic()

    def deadline_to_sleep_time(self, deadline: float) -> float:
        return deadline - monotonic()


class EventLog(h.History):
    """A :class:`~flux.sim.history.History` that appends each event to a file as it comes.

    Events are not kept in memory. Call :meth:`flush` now and then and :meth:`close`
    at the end; a process killed in between loses at most the unflushed tail.
    """

    def __init__(self, path: str, meta: dict[str, Any]) -> None:
        super().__init__(meta=meta)
        self._file: IO[str] | None = open(path, "w", encoding="utf-8")  # noqa: SIM115
        self._file.write(json.dumps({"kind": "meta", **meta}) + "\n")
        self.count = 0

    def add(self, event: h.Event) -> None:
        if self._file is not None:
            self._file.write(json.dumps(event.to_dict()) + "\n")
            self.count += 1

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def make_recorder(log: EventLog, process_index: int) -> Recorder:
    """A tap recorder whose session ids cannot collide with another process's."""
    recorder = Recorder(log, clock=monotonic)
    recorder.sessions = itertools.count((process_index + 1) * SESSION_STRIDE)
    return recorder


class TappedRealHost(RealHost):
    """A real (TCP) client host whose every connection goes through the simulator's tap."""

    def __init__(self, name: str, recorder: Recorder, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(name)
        self.recorder = recorder
        self.tls = tls  # TLS under the tap: the tap sees the plain frames

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        stream: trio.abc.Stream = await super().connect(host, port)
        if self.tls is not None:
            secured = trio.SSLStream(stream, self.tls, server_hostname=host)
            try:
                await secured.do_handshake()
            except trio.BrokenResourceError as exc:
                await trio.aclose_forcefully(secured)
                raise OSError(f"TLS handshake with {host}:{port} failed: {exc.__cause__}") from exc
            stream = secured
        # TapStream only forwards calls to its inner stream; a socket stream serves as well
        return TapStream(cast(Any, stream), self.recorder, self.name)
