"""Publish a few orders with the trio client.

    make serve                      # in another terminal: flux://127.0.0.1:7070
    python examples/trio_producer.py --count 10

Each order has its own id, so running this twice stores nothing twice: the
second run's acks say ``duplicate=True`` (within the broker's dedup window).
"""

from __future__ import annotations

import argparse
import json

import trio

from flux import errors
from flux.client.trio import Client, connect


async def main(url: str, topic: str, count: int) -> None:
    async with connect(url) as client:
        async with trio.open_nursery() as nursery:  # concurrent publishes share frames
            for i in range(count):
                nursery.start_soon(publish_order, client, topic, i)
        acks = await client.publish_many(topic, [b'{"bulk": true}'] * 3,
                                         ids=[f"bulk-{i}" for i in range(3)])
        print(f"bulk load stored at offsets {[a.offset for a in acks]}")


async def publish_order(client: Client, topic: str, i: int) -> None:
    body = json.dumps({"order": i, "total": 10 + i}).encode()
    try:
        ack = await client.publish(topic, body, id=f"order-{i}")
    except errors.TopicFull:
        print(f"order {i}: the topic is full; try again once consumers catch up")
        return
    print(f"order {i}: offset {ack.offset} generation {ack.generation:#x}"
          f"{' (duplicate)' if ack.duplicate else ''}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="flux://127.0.0.1:7070")
    parser.add_argument("--topic", default="orders.eu")
    parser.add_argument("--count", type=int, default=10)
    args = parser.parse_args()
    trio.run(main, args.url, args.topic, args.count)
