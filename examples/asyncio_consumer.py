"""Read and ack orders with the asyncio client (the default loop, or uvloop).

    make serve                      # in another terminal: flux://127.0.0.1:7070
    python examples/asyncio_consumer.py [--uvloop]

The subscription is named, so the broker keeps its cursor: run it again and it
resumes after the last order it acked. It stops after ``--idle`` quiet seconds.
"""

from __future__ import annotations

import argparse
import asyncio

from flux.client.asyncio import connect


async def main(url: str, topic: str, name: str, idle: float) -> None:
    loop = asyncio.get_running_loop()
    async with connect(url) as client, \
            client.subscribe(topic, name=name, read_old=True, prefetch=100) as sub:
        print(f"subscribed: created={sub.created} start_offset={sub.start_offset}")
        try:
            async with asyncio.timeout(idle) as quiet:
                async for msg in sub:
                    print(f"{msg.topic}@{msg.offset} id={msg.id} {msg.payload.decode()}"
                          f"{f' (attempt {msg.attempt})' if msg.attempt > 1 else ''}")
                    await msg.ack()
                    quiet.reschedule(loop.time() + idle)
        except TimeoutError:
            print(f"nothing for {idle:g}s; bye")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="flux://127.0.0.1:7070")
    parser.add_argument("--topic", default="orders.eu")
    parser.add_argument("--name", default="billing")
    parser.add_argument("--idle", type=float, default=3.0)
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop (if installed)")
    args = parser.parse_args()
    if args.uvloop:
        import uvloop

        uvloop.run(main(args.url, args.topic, args.name, args.idle))
    else:
        asyncio.run(main(args.url, args.topic, args.name, args.idle))
