"""Consumers of one pool counting together, each in its own process.

The members of a shared subscription (or a JetStream pull consumer's clients, or a
Redis group's consumers) each take part of the messages, so none of them alone knows
when all have come. The bench makes a small file of counters, one slot per member;
each member writes how many messages it took into its own slot (one writer a slot,
so no lock) and stops once the slots add up to the pool's total. A member's figure
is its count and the time of its last message, not the time it noticed the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import struct
import tempfile
import time
from collections.abc import Awaitable

from flux.bench.worker import Result, Spec, ready_then_go

SLOT = struct.Struct("<q")
POLL = 0.005   # seconds between looks at the other members' counts


def make_tally(members: int) -> str:
    """A new file of ``members`` zeroed counters (in memory where /dev/shm exists)."""
    directory = "/dev/shm" if os.path.isdir("/dev/shm") else None
    fd, path = tempfile.mkstemp(prefix="flux-bench-pool-", dir=directory)
    with os.fdopen(fd, "wb") as f:
        f.write(bytes(SLOT.size * members))
    return path


class PoolCounter:
    """One member's side of the tally: ``spec.count`` is the pool's total, and
    ``spec.options`` give the tally file (``tally``), this member's ``slot`` and the
    number of ``members``."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.result = Result("consumer")
        self.n = 0
        self.finished = False   # the pool has its total: receive loops may return
        self.members = int(spec.options.get("members", 1))
        self._slot = int(spec.options.get("slot", 0)) * SLOT.size
        self._file = open(spec.options["tally"], "r+b")  # noqa: SIM115 (closed by close())
        self._map = mmap.mmap(self._file.fileno(), SLOT.size * self.members)
        self._all = struct.Struct(f"<{self.members}q")

    def go(self) -> None:
        """Report ready, wait for the go line; the start time goes in the result."""
        self.result.start = ready_then_go()

    def took(self, n: int = 1) -> None:
        """``n`` messages taken by this member."""
        if not self.n:
            self.result.first = time.perf_counter()
        self.n += n
        self.result.last = time.perf_counter()
        SLOT.pack_into(self._map, self._slot, self.n)

    def total(self) -> int:
        """What the whole pool has taken so far."""
        return sum(self._all.unpack_from(self._map))

    async def until_done(self, work: Awaitable[object], grace: float = 0.0) -> Result:
        """Run ``work`` (the member's receive loop) until the pool has its total, or
        nothing came for ``spec.idle_timeout``; the member's result. With ``grace``,
        ``work`` is given that long to see :attr:`finished` and return before it is
        cancelled (a client whose blocking read does not take cancelling well)."""
        task = asyncio.ensure_future(work)
        seen, quiet_since = -1, time.perf_counter()
        try:
            while not task.done():
                await asyncio.wait([task], timeout=POLL)
                total = self.total()
                if total >= self.spec.count:
                    break
                now = time.perf_counter()
                if total != seen:
                    seen, quiet_since = total, now
                elif now - quiet_since > self.spec.idle_timeout:
                    self.result.error = (f"the pool received {total} of {self.spec.count}"
                                         f" messages, then nothing for {self.spec.idle_timeout}s")
                    break
        finally:
            self.finished = True
            if grace and not task.done():
                await asyncio.wait([task], timeout=grace)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.result.count = self.n
        return self.result

    def close(self) -> None:
        self._map.close()
        self._file.close()
