"""Read and ack orders with the blocking client (scripts, notebooks).

    make serve                      # in another terminal: flux://127.0.0.1:7070
    python examples/sync_consumer.py

``for msg in sub`` blocks for each message; ``sub.next(timeout=...)`` returns
None when nothing came in time, which is how this stops after ``--idle`` quiet
seconds. The named subscription resumes where it left off on the next run.
"""

from __future__ import annotations

import argparse

from flux.client.sync import connect


def main(url: str, topic: str, name: str, idle: float) -> None:
    with connect(url) as client, \
            client.subscribe(topic, name=name, read_old=True, prefetch=100) as sub:
        print(f"subscribed: created={sub.created} start_offset={sub.start_offset}")
        while (msg := sub.next(timeout=idle)) is not None:
            print(f"{msg.topic}@{msg.offset} id={msg.id} {msg.payload.decode()}"
                  f"{f' (attempt {msg.attempt})' if msg.attempt > 1 else ''}")
            msg.ack()
        print(f"nothing for {idle:g}s; bye")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="flux://127.0.0.1:7070")
    parser.add_argument("--topic", default="orders.eu")
    parser.add_argument("--name", default="billing")
    parser.add_argument("--idle", type=float, default=3.0)
    args = parser.parse_args()
    main(args.url, args.topic, args.name, args.idle)
