"""The shard core's CPU per message, in-process: no sockets, no client, no clock.

``python -m flux.bench.core --mode single|shared|keyed|singlekeys [--count 200000]
[--group 100] [--through] [--lag L] [--dedup-window S] [--repeat 3]``

A :class:`~flux.shard.core.ShardCore` driven through :mod:`flux.shard.driver`: one
producer publishes ``count`` messages (100-byte payloads) in PUBLISH frames of
``group``; after each frame every consumer takes its DELIVER frames and acks what
they carried (one ACK frame of offsets, or with ``--through`` one ``ack_through``;
with ``--lag L`` each consumer acks what it got ``L`` frames earlier, so ``L``
groups stay in flight). Modes: ``single``, one plain subscription; ``shared``, four
members of a shared subscription; ``keyed``, four members, key-ordered, each message
keyed (1000 keys); ``singlekeys``, one plain subscription of keyed messages. Time
never moves (no timer fires, nothing is cleaned up). Printed: microseconds of process
CPU per message, the best of ``repeat`` runs, the driver's own share (building and
reading frames) included. Figures for a person, never asserted by tests.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any

from flux import protocol as P
from flux.config import Config
from flux.shard.driver import LocalClient, LocalShard, deliver_messages

TOPIC = "bench.core"
PAYLOAD = b"x" * 100
KEYS = 1000
MAX_IN_FLIGHT = 1000
CREDIT = 100_000
MEMBERS = 4
# mode -> (consumers, messages keyed, subscription shared, key-ordered)
MODES: dict[str, tuple[int, bool, bool, bool]] = {
    "single": (1, False, False, False),
    "shared": (MEMBERS, False, True, False),
    "keyed": (MEMBERS, True, True, True),
    "singlekeys": (1, True, False, False),
}


@dataclass
class CoreRun:
    """One run: what it moved, and the process CPU it took."""

    mode: str
    messages: int      # published
    delivered: int     # first pushes the consumers took
    acked: int         # acks they sent (offsets, or covered by an ack_through)
    cpu: float         # seconds of process CPU for the publish-deliver-ack loop

    @property
    def us_per_message(self) -> float:
        return self.cpu / max(1, self.messages) * 1e6


def run(mode: str, count: int, group: int, *, through: bool = False, lag: int = 0,
        dedup_window: float = 5.0) -> CoreRun:
    """Publish ``count`` messages through a fresh core and have them delivered and acked
    as ``mode`` says (see the module's docstring)."""
    consumers, keyed, shared, key_ordered = MODES[mode]
    config = Config().replace(**{"subscriber.max_in_flight": MAX_IN_FLIGHT,
                                 "message.dedup_window": dedup_window})
    shard = LocalShard(config)
    producer = shard.connect()
    subs: list[LocalClient] = []
    for _ in range(consumers):
        client = shard.connect()
        opts: dict[str, Any] = {"topic": TOPIC, "name": "work", "max_in_flight": MAX_IN_FLIGHT,
                                "credit": CREDIT}
        if shared:
            opts.update(shared=True, key_ordered=key_ordered)
        reply = client.request([P.SUBSCRIBE, client.rid(), 1, opts])
        if reply[0] != P.SUBSCRIBED:
            raise RuntimeError(f"SUBSCRIBE refused: {reply}")
        subs.append(client)
    pending: list[list[list[int]]] = [[] for _ in subs]
    delivered = acked = 0
    seq = 0
    started = time.process_time()  # seam-ok: a benchmark's own CPU time
    for _ in range(count // group):
        ids = [f"m{seq + j}" for j in range(group)]
        items: list[Any] = [TOPIC, ids, [PAYLOAD] * group]
        if keyed:
            items.append({"keys": [f"k{(seq + j) % KEYS}" for j in range(group)]})
        seq += group
        reply = producer.request([P.PUBLISH, producer.rid(), [items]])
        if reply[0] != P.PUBLISHED:
            raise RuntimeError(f"PUBLISH refused: {reply}")
        for ci, client in enumerate(subs):
            offsets = [o for f in client.take(P.DELIVER) for o, *_ in deliver_messages(f)]
            delivered += len(offsets)
            if lag:
                pending[ci].append(offsets)
                offsets = pending[ci].pop(0) if len(pending[ci]) > lag else []
            if not offsets:
                continue
            if through and not lag:
                client.send([P.ACK, client.rid(), 1, shard.generation, [], max(offsets)])
            else:
                client.send([P.ACK, client.rid(), 1, shard.generation, offsets, -1])
            acked += len(offsets)
            # the ACKED reply goes; a DELIVER the ack made room for is taken next round
            client.inbox = [r for r in client.inbox if r.frame[0] == P.DELIVER]
    cpu = time.process_time() - started  # seam-ok
    return CoreRun(mode, seq, delivered, acked, cpu)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flux.bench.core", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=list(MODES), default="single")
    parser.add_argument("--count", type=int, default=200_000, help="messages published")
    parser.add_argument("--group", type=int, default=100, help="messages a PUBLISH carries")
    parser.add_argument("--through", action="store_true",
                        help="ack with ack_through (without --lag)")
    parser.add_argument("--lag", type=int, default=0,
                        help="ack what came this many PUBLISH frames earlier")
    parser.add_argument("--dedup-window", type=float, default=5.0,
                        help="message.dedup_window, seconds")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the best is printed")
    args = parser.parse_args(argv)
    runs = [run(args.mode, args.count, args.group, through=args.through, lag=args.lag,
                dedup_window=args.dedup_window) for _ in range(max(1, args.repeat))]
    best = min(runs, key=lambda r: r.cpu)
    how = "ack_through" if args.through and not args.lag else "acks"
    print(f"{args.mode}: {best.us_per_message:.2f} us of process CPU a message (best of"
          f" {len(runs)}; {best.messages} messages in groups of {args.group}, {how},"
          f" lag {args.lag}, dedup window {args.dedup_window:g} s)", flush=True)


if __name__ == "__main__":
    main()
