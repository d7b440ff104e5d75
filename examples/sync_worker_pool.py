"""A pool of worker threads draining one shared subscription with the blocking client.

    make serve                          # in another terminal: flux://127.0.0.1:7070
    python examples/sync_worker_pool.py --workers 4 --jobs 40

The same pool as ``asyncio_worker_pool.py``, one thread per worker, each with its
own connection: jobs keyed by customer, members of the shared, key-ordered
subscription ``jobs-pool`` (DESIGN.md G10).
"""

from __future__ import annotations

import argparse
import threading
import time

from flux.client.sync import connect


def worker(url: str, topic: str, n: int, done: set[str], total: int,
           lock: threading.Lock) -> None:
    with connect(url) as client, \
            client.subscribe(topic, "jobs-pool", shared=True, key_ordered=True,
                             read_old=True, max_in_flight=4) as jobs:
        while True:
            with lock:
                if len(done) >= total:
                    return
            job = jobs.next(timeout=0.5)
            if job is None:
                continue
            time.sleep(0.01)  # the work
            print(f"worker {n}: {job.payload.decode()} (customer {job.key},"
                  f" attempt {job.attempt})")
            job.ack()
            with lock:
                done.add(job.id)


def main(url: str, topic: str, workers: int, count: int) -> None:
    with connect(url) as client:
        client.publish_many(topic, [f"job {i}".encode() for i in range(count)],
                            keys=[f"customer-{i % 7}" for i in range(count)])
    done: set[str] = set()
    lock = threading.Lock()
    pool = [threading.Thread(target=worker, args=(url, topic, n, done, count, lock))
            for n in range(workers)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    print(f"{len(done)} jobs done by {workers} workers")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="flux://127.0.0.1:7070")
    parser.add_argument("--topic", default="jobs.eu")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=40)
    args = parser.parse_args()
    main(args.url, args.topic, args.workers, args.jobs)
