"""A pool of workers draining one shared subscription with the trio client.

    make serve                          # in another terminal: flux://127.0.0.1:7070
    python examples/trio_worker_pool.py --workers 4 --jobs 40

The same pool as ``asyncio_worker_pool.py``: jobs keyed by customer, ``--workers``
members of the shared, key-ordered subscription ``jobs-pool`` (DESIGN.md G10).
"""

from __future__ import annotations

import argparse

import trio

from flux.client.trio import connect


async def worker(url: str, topic: str, n: int, done: set[str], total: int,
                 finished: trio.Event) -> None:
    async with connect(url) as client, \
            client.subscribe(topic, "jobs-pool", shared=True, key_ordered=True,
                             read_old=True, max_in_flight=4) as jobs:
        async for job in jobs:
            await trio.sleep(0.01)  # the work
            print(f"worker {n}: {job.payload.decode()} (customer {job.key},"
                  f" attempt {job.attempt})")
            await job.ack()
            done.add(job.id)
            if len(done) >= total:
                finished.set()
                return


async def main(url: str, topic: str, workers: int, count: int) -> None:
    async with connect(url) as client:
        await client.publish_many(topic, [f"job {i}".encode() for i in range(count)],
                                  keys=[f"customer-{i % 7}" for i in range(count)])
    done: set[str] = set()
    finished = trio.Event()
    async with trio.open_nursery() as pool:
        for n in range(workers):
            pool.start_soon(worker, url, topic, n, done, count, finished)
        await finished.wait()
        pool.cancel_scope.cancel()
    print(f"{len(done)} jobs done by {workers} workers")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="flux://127.0.0.1:7070")
    parser.add_argument("--topic", default="jobs.eu")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=40)
    args = parser.parse_args()
    trio.run(main, args.url, args.topic, args.workers, args.jobs)
