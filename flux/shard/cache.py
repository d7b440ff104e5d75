"""The shard's payload cache for disk topics: more than memory (DESIGN.md G9, "Space").

A disk topic keeps every held message's id, offset and store time in memory, but
a chunk's payloads (one PUBLISH group's) may leave memory once its record is
durable (and a kept delayed message, G12, all but its key once its KEEP record is:
:mod:`flux.shard.kept`, read back through :meth:`TopicPayloads.read_kept`, never
cached): a later read (a delivery, a redelivery, FETCH) reads the record back by
its position (:meth:`flux.shard.journal.TopicJournal.read_payloads`, checksum
verified) and caches it again. :class:`PayloadCache` holds the resident chunks of
every disk topic of the shard in least-recently-used order and evicts past its
budget (``storage.cache_bytes``), or further when a publish needs the room under
``topic.max_bytes`` or ``shard.max_memory`` (which, for disk topics, count only what
is in memory). Chunks whose record is not durable yet are never evicted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from flux.shard.kept import Entry, Resident

if TYPE_CHECKING:
    from flux.shard.journal import TopicJournal
    from flux.shard.state import Topic


class TopicPayloads:
    """One disk topic's side of the cache: the :class:`~flux.shard.topic.ChunkStore` its
    log reads evicted payloads back through."""

    __slots__ = ("cache", "epoch", "journal", "topic")

    def __init__(self, cache: PayloadCache, topic: Topic, journal: TopicJournal,
                 epoch: float = 0.0) -> None:
        self.cache = cache
        self.topic = topic
        self.journal = journal
        self.epoch = epoch  # wall minus monotonic time: a KEEP row's times are wall times

    def read(self, position: int, end: int, first: int) -> bytes:
        self.cache.reads += 1
        data = self.journal.read_payloads(position, end, first)
        self.cache.read_bytes += end - position
        return data

    def read_kept(self, position: int, offsets: Sequence[int]) -> dict[int, Resident]:
        self.cache.reads += 1
        rows, size = self.journal.read_kept(position, offsets)
        self.cache.read_bytes += size
        epoch = self.epoch
        return {row[0]: (Entry(row[1], row[3], row[2] - epoch),
                         (row[4], row[5], None if row[6] is None else row[6] - epoch))
                for row in rows}

    def durable(self) -> int:
        return self.journal.writer.durable

    def add(self, first: int, size: int, read: bool = False) -> None:
        cache = self.cache
        key = (self, first)
        cache.used += size - cache.lru.pop(key, 0)
        cache.lru[key] = size
        if read:  # the publish that stored a chunk counted it; a read-back is counted later
            cache.changed[id(self)] = self

    def touch(self, first: int) -> None:
        lru, key = self.cache.lru, (self, first)
        if key in lru:
            lru.move_to_end(key)

    def drop(self, first: int) -> None:
        cache = self.cache
        size = cache.lru.pop((self, first), None)
        if size is not None:
            cache.used -= size
            cache.changed[id(self)] = self


class PayloadCache:
    """Resident payload chunks of the shard's disk topics, least recently used first."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0      # payload bytes of the chunks in ``lru``
        self.lru: OrderedDict[tuple[TopicPayloads, int], int] = OrderedDict()
        # the topics whose resident bytes changed (read back, evicted, trimmed) since the
        # core last recounted them
        self.changed: dict[int, TopicPayloads] = {}
        self.reads = 0          # records read back from disk
        self.read_bytes = 0
        self.evicted = 0        # chunks evicted

    @property
    def over(self) -> bool:
        """Whether it holds more than its budget."""
        return self.used > self.budget

    def shrink(self, free: int, owner: TopicPayloads | None = None) -> int:
        """Evict least recently used chunks (only ``owner``'s, if given) until ``free``
        bytes are freed or nothing more can go now. Chunks whose record is not durable
        stay; without ``owner`` the first of them ends the pass (it is durable within an
        fsync, and the durable mark's move shrinks the cache again), so a pass costs
        what it evicts, not what is in flight. Returns the bytes freed."""
        lru = self.lru
        freed = 0
        passed = 0  # entries moved to the back: not evictable now, or not ``owner``'s
        while lru and freed < free and passed < len(lru):
            key = next(iter(lru))
            store, first = key
            size = lru[key]
            if owner is not None and store is not owner:
                lru.move_to_end(key)
                passed += 1
            elif store.topic.log.evict(first):
                self.evicted += 1
                freed += size
            elif not store.topic.log.resident(first):  # gone from the log: forget it
                store.drop(first)
            elif owner is None:  # its record is not durable yet: wait for the mark
                break
            else:
                lru.move_to_end(key)
                passed += 1
        return freed

    def stats(self) -> dict[str, int]:
        """What STATS shows of it."""
        return {"bytes": self.used, "max_bytes": self.budget, "chunks": len(self.lru),
                "reads": self.reads, "read_bytes": self.read_bytes, "evicted": self.evicted}
