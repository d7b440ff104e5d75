"""A pool of workers draining one shared subscription with the asyncio client.

    make serve                          # in another terminal: flux://127.0.0.1:7070
    python examples/asyncio_worker_pool.py --workers 4 --jobs 40

A producer publishes jobs keyed by customer; ``--workers`` members join the
shared, key-ordered subscription ``jobs-pool`` (DESIGN.md G10): each job goes to
one worker, a customer's jobs stay on one worker while it has any unacked, and a
worker that stops hands its unacked jobs to the others. Each worker prints what
it did; the pool stops once every job is done.
"""

from __future__ import annotations

import argparse
import asyncio

from flux.client.asyncio import connect


async def worker(url: str, topic: str, n: int, done: set[str], total: int) -> None:
    async with connect(url) as client, \
            client.subscribe(topic, "jobs-pool", shared=True, key_ordered=True,
                             read_old=True, max_in_flight=4) as jobs:
        async for job in jobs:
            await asyncio.sleep(0.01)  # the work
            print(f"worker {n}: {job.payload.decode()} (customer {job.key},"
                  f" attempt {job.attempt})")
            await job.ack()
            done.add(job.id)
            if len(done) >= total:
                return


async def main(url: str, topic: str, workers: int, count: int) -> None:
    async with connect(url) as client:
        await client.publish_many(topic, [f"job {i}".encode() for i in range(count)],
                                  keys=[f"customer-{i % 7}" for i in range(count)])
    done: set[str] = set()
    pool = [asyncio.create_task(worker(url, topic, n, done, count)) for n in range(workers)]
    await asyncio.wait(pool, return_when=asyncio.FIRST_COMPLETED)
    for task in pool:
        task.cancel()
    await asyncio.gather(*pool, return_exceptions=True)
    print(f"{len(done)} jobs done by {workers} workers")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="flux://127.0.0.1:7070")
    parser.add_argument("--topic", default="jobs.eu")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=40)
    args = parser.parse_args()
    asyncio.run(main(args.url, args.topic, args.workers, args.jobs))
