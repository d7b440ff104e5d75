"""How fast one shard compacts its disk topics' sealed segments (G9 space).

Disk topics that get the same traffic fill their segments together, and each then
compacts one: a dozen at once took both shards' spare CPU and every topic's
deliveries waited. A :class:`CompactionPace` lets one compaction of the shard run
at a time (the others wait their turn, in the order they asked) and holds it to
``storage.compaction_rate`` bytes read a second: after each slice it sleeps, on the
host's clock, until the budget has paid for what the slice read.
"""

from __future__ import annotations

import math

import trio

from flux.host import Host


class CompactionPace:
    """One shard's compactions: one at a time, at most ``rate`` bytes a second (0: no cap)."""

    def __init__(self, host: Host, rate: int) -> None:
        self.host = host
        self.rate = rate
        self.turn = trio.Lock()   # held by the compaction under way (FIFO, so fair)
        self._paid_to = -math.inf  # when the budget will have paid for every byte spent

    def charge(self, spent: int, now: float) -> float:
        """Count ``spent`` bytes read at ``now``; returns when the next slice may start.
        Time left idle earns no credit: a burst is never faster than ``rate``."""
        if self.rate <= 0:
            return now
        self._paid_to = max(self._paid_to, now) + spent / self.rate
        return self._paid_to

    async def spend(self, spent: int) -> None:
        """After a slice that read ``spent`` bytes: wait until the budget allows the next
        (a checkpoint at least)."""
        host = self.host
        await host.sleep_until(self.charge(spent, host.now()))
