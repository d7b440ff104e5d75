"""A simulated host: the Host seam (flux.host) over the fake clock and network.

Each simulated process (router, shard incarnation, client) gets a :class:`SimHost`
with a name (its network identity), randomness derived from the run seed, and a
pause :class:`Gate` that its network and ``sleep_until`` pass through (SIGSTOP).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from typing import Any, TypeVar

import trio

from flux.host import Disk, StreamHandler
from flux.sim.disk import SimDisk
from flux.sim.network import Network, SimStream

T = TypeVar("T")
EPOCH = 1_700_000_000.0  # wall time of simulated time 0
RUNTIME_DIR = "/run/flux"   # a simulated machine's runtime directory (SimHost.runtime_dir)


def derive_seed(*parts: object) -> int:
    """A 64-bit seed from the run seed and names, stable across processes."""
    text = ":".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big")


class Gate:
    """Open, or closed while its process is paused; waiting at it is cancellable."""

    def __init__(self) -> None:
        self.closed = False
        self._lot = trio.lowlevel.ParkingLot()

    def close(self) -> None:
        self.closed = True

    def open(self) -> None:
        self.closed = False
        self._lot.unpark_all()

    async def passage(self) -> None:
        """Return at once when open; otherwise wait until it opens."""
        while self.closed:
            await self._lot.park()


class SimHost:
    """The Host protocol for one simulated process."""

    def __init__(self, network: Network, name: str, *, seed: int, incarnation: int = 0,
                 disk: Disk | None = None) -> None:
        self.name = name
        # the machine's disk, which outlives the process (a fresh one if none is given)
        self.disk: Disk = disk if disk is not None else SimDisk(derive_seed(seed, name, "disk"))
        self.runtime_dir = RUNTIME_DIR   # on the same disk here, under its own faults
        self.network = network
        self.incarnation = incarnation
        self.random = random.Random(derive_seed(seed, name, incarnation))
        self.gate = Gate()
        self.uid = network.register(self)

    def __repr__(self) -> str:
        return f"<SimHost {self.name}#{self.incarnation}>"

    def now(self) -> float:
        return trio.current_time()

    def wall_time(self) -> float:
        return EPOCH + trio.current_time()

    def token_bytes(self, n: int) -> bytes:
        return self.random.randbytes(n)

    async def sleep_until(self, deadline: float) -> None:
        await self.gate.passage()
        await trio.sleep_until(deadline)
        await self.gate.passage()

    async def run_slow(self, fn: Callable[..., T], *args: Any) -> T:
        await self.gate.passage()
        return fn(*args)

    async def connect(self, host: str, port: int) -> SimStream:
        return await self.network.connect(self, port)

    def try_send(self, stream: trio.abc.Stream, data: bytes) -> int:
        try_send = getattr(stream, "try_send", None)
        return 0 if try_send is None else int(try_send(data))

    async def serve(self, host: str, port: int, handler: StreamHandler, *,
                    task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        listener = self.network.listen(self, port, handler)  # OSError if the port is taken
        try:
            async with trio.open_nursery() as nursery:
                listener.nursery = nursery
                task_status.started(listener.port)
                await trio.sleep_forever()
        finally:
            self.network.unlisten(listener)
