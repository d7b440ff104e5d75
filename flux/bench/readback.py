"""Reading back a disk topic bigger than ``shard.max_memory`` through FETCH (G9 "Space").

``python -m flux.bench.readback [--bytes 512M] [--max-memory 320M] [--cache 16M]
[--readers 1] [--cold] [--dir DIR]``:

1. ``flux serve --shards 1 --data-dir DIR`` with ``shard.max_memory`` and
   ``storage.cache_bytes`` as given (``storage.fsync: interval``: the fill is not
   what is measured) and no dedup window (as if the ids had left it: a replay reads
   old data);
2. one topic filled with ``--bytes`` of 100-byte messages with short ids (a counter
   in hex) through the public client (``publish_many``, many calls in flight); the
   log ends up bigger than the shard's memory budget, which the shard never passes
   (STATS ``memory``). A held message keeps about 60 bytes plus its id in memory
   with its payload evicted, so with 100-byte payloads a log can be only about
   1.5 times the budget;
3. with ``--cold`` the log's pages dropped from the page cache (``posix_fadvise``
   DONTNEED on each segment after a sync; no root needed), ``--readers`` clients
   FETCH the whole topic from its oldest offset, each a share of the offsets, one
   request of up to 10,000 messages (4 MiB) at a time, checking every payload;
4. the figure: messages and bytes read per second of wall time, how many records
   the shard read back from its log (STATS ``payload_cache``), and whether the page
   cache held the log.

Figures for a person; no test asserts a speed.
"""

from __future__ import annotations

import argparse
import glob
import os
import time
from dataclasses import dataclass

import trio

from flux.bench import systems
from flux.bench.recovery import parse_bytes
from flux.client.trio import connect

SIZE = 100
BATCH = 1000
WINDOW = 16                 # publish_many calls in flight while filling
FETCH_MESSAGES = 10_000
FETCH_BYTES = 4 << 20


@dataclass
class ReadbackFigures:
    """One read-back run."""

    bytes: int
    messages: int
    max_memory: int
    cache_bytes: int
    readers: int
    log_bytes: int = 0
    peak_memory: int = 0
    fill_seconds: float = 0.0
    read_seconds: float = 0.0
    records_read: int = 0
    page_cache: str = ""

    def line(self) -> str:
        rate = self.messages / self.read_seconds if self.read_seconds else 0.0
        mib = 1 << 20
        return (f"FETCH read-back of {self.messages:,} x {SIZE} B (log {self.log_bytes / mib:,.0f}"
                f" MiB, shard.max_memory {self.max_memory / mib:,.0f} MiB, shard memory"
                f" {self.peak_memory / mib:,.0f} MiB, cache {self.cache_bytes / mib:,.0f} MiB,"
                f" {self.readers} reader(s), {self.page_cache}): {rate:,.0f} msg/s,"
                f" {self.messages * SIZE / mib / self.read_seconds:,.1f} MiB/s of payload in"
                f" {self.read_seconds:.2f} s; {self.records_read:,} records read back from the"
                f" log (fill took {self.fill_seconds:.1f} s)")


def measure(total_bytes: int, max_memory: int, cache_bytes: int, readers: int = 1,
            cold: bool = False, data_dir: str | None = None) -> ReadbackFigures:
    """Fill, wait, read everything back (see the module docstring)."""
    figures = ReadbackFigures(total_bytes, max(1, total_bytes // SIZE), max_memory, cache_bytes,
                              readers)
    storage = systems.FluxStorage("interval", 0.05, cache_bytes=cache_bytes)
    settings = {"message.ttl": 86400, "message.cleanup_time": 1.0,
                "message.dedup_window": 0, "shard.max_memory": max_memory}
    with systems.start_flux(1, settings, storage=storage, data_dir=data_dir) as broker:
        assert broker.tmpdir is not None
        trio.run(_fill_and_read, broker.url, broker.tmpdir, figures, cold)
    return figures


async def _fill_and_read(url: str, directory: str, figures: ReadbackFigures, cold: bool) -> None:
    topic = f"bench.readback.{os.getpid()}"
    body = os.urandom(SIZE)
    async with connect(url) as client:
        sent = [0]

        async def publisher() -> None:
            while sent[0] < figures.messages:
                start = sent[0]
                n = min(BATCH, figures.messages - start)
                sent[0] += n
                await client.publish_many(topic, [body] * n,
                                          ids=[format(i, "x") for i in range(start, start + n)])
                figures.peak_memory = max(figures.peak_memory, await _memory(client))

        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(WINDOW):
                nursery.start_soon(publisher)
        figures.fill_seconds = time.perf_counter() - started
        stats = (await client.stats())[0]
        figures.log_bytes = int(stats["topics"][topic]["storage"]["log_bytes"])
        figures.peak_memory = max(figures.peak_memory, int(stats["memory"]))
        reads_before = int(stats["payload_cache"]["reads"])
        figures.page_cache = _drop_log_pages(directory) if cold else "page cache held the log"
        first = (await client.fetch(topic, 0, 0)).oldest
        share = -(-figures.messages // figures.readers)

        async def reader(start: int, stop: int) -> None:
            offset = start
            while offset < stop:
                page = await client.fetch(topic, offset, min(FETCH_MESSAGES, stop - offset),
                                          max_bytes=FETCH_BYTES)
                if not page.messages:
                    raise RuntimeError(f"FETCH from {offset} returned nothing")
                for m in page.messages:
                    if m.payload != body:
                        raise RuntimeError(f"offset {m.offset}: payload differs")
                offset = page.messages[-1].offset + 1

        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for i in range(figures.readers):
                a = first + i * share
                nursery.start_soon(reader, a, min(first + figures.messages, a + share))
        figures.read_seconds = time.perf_counter() - started
        stats = (await client.stats())[0]
        figures.records_read = int(stats["payload_cache"]["reads"]) - reads_before
        figures.peak_memory = max(figures.peak_memory, int(stats["memory"]))


async def _memory(client: object) -> int:
    stats = await client.stats()  # type: ignore[attr-defined]
    return int(stats[0]["memory"])


def _drop_log_pages(directory: str) -> str:
    """Sync the log segments and ask the kernel to drop their cached pages."""
    os.sync()
    dropped = 0
    for path in glob.glob(os.path.join(directory, "data", "shard-*", "*", "*.log")):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            dropped += 1
        finally:
            os.close(fd)
    return f"log pages dropped from the page cache ({dropped} segments)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", default="512M", help="payload bytes to fill the topic with")
    parser.add_argument("--max-memory", default="320M", help="shard.max_memory")
    parser.add_argument("--cache", default="16M", help="storage.cache_bytes")
    parser.add_argument("--readers", type=int, default=1, help="clients fetching at once")
    parser.add_argument("--cold", action="store_true",
                        help="drop the log's pages from the page cache before reading")
    parser.add_argument("--dir", default=None, help="where the data directory goes")
    args = parser.parse_args()
    figures = measure(parse_bytes(args.bytes), parse_bytes(args.max_memory),
                      parse_bytes(args.cache), args.readers, args.cold, args.dir)
    print(figures.line(), flush=True)


if __name__ == "__main__":
    main()
