"""Publish a few orders with the blocking client (scripts, notebooks).

    make serve                      # in another terminal: flux://127.0.0.1:7070
    python examples/sync_producer.py --count 10

Each ``publish`` blocks until the broker stored the message; ``publish_many``
sends a bulk load in batched frames. Ids make reruns safe (``duplicate=True``).
"""

from __future__ import annotations

import argparse
import json

from flux import errors
from flux.client.sync import connect


def main(url: str, topic: str, count: int) -> None:
    with connect(url) as client:
        for i in range(count):
            body = json.dumps({"order": i, "total": 10 + i}).encode()
            try:
                ack = client.publish(topic, body, id=f"order-{i}")
            except errors.TopicFull:
                print(f"order {i}: the topic is full; try again once consumers catch up")
                continue
            print(f"order {i}: offset {ack.offset} generation {ack.generation:#x}"
                  f"{' (duplicate)' if ack.duplicate else ''}")
        acks = client.publish_many(topic, [b'{"bulk": true}'] * 3,
                                   ids=[f"bulk-{i}" for i in range(3)])
        print(f"bulk load stored at offsets {[a.offset for a in acks]}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="flux://127.0.0.1:7070")
    parser.add_argument("--topic", default="orders.eu")
    parser.add_argument("--count", type=int, default=10)
    args = parser.parse_args()
    main(args.url, args.topic, args.count)
