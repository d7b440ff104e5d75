"""A shard's output back-pressure without the kernel in the way: the real shard shell
over lockstep memory streams (a send returns only once the peer took every byte).

A client that does not read its replies makes the shard stop reading it (past a
quarter of ``limits.max_output_bytes``), and not call it silent meanwhile; once it
reads, every request is answered, in order, none dropped. The same over real sockets
(bounded, with the kernel's buffers) is in tests/integration/test_limits.py.
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from flux import config as config_mod
from flux import protocol as P
from flux.host import RealHost, ShardSpec
from flux.shard.server import run_shard

SECRET = "ab" * 32
BATCH = 500  # STATS requests per send


class LockstepHost(RealHost):
    """RealHost's clock, with lockstep memory streams for the shard's client port."""

    def __init__(self) -> None:
        super().__init__("lockstep", seed=1)
        self.nursery: trio.Nursery | None = None
        self.handler: Any = None

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        raise OSError("no router in this test")

    async def serve(self, host: str, port: int, handler: Any, *,
                    task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            if self.handler is None:  # the client port (the control listener comes next)
                self.nursery, self.handler = nursery, handler
            task_status.started(1234)
            await trio.sleep_forever()

    def open(self) -> trio.abc.Stream:
        client, server = trio.testing.lockstep_stream_pair()
        assert self.nursery is not None
        self.nursery.start_soon(self.handler, server)
        return client


async def test_a_client_that_stops_reading_is_paused_then_answered_in_full() -> None:
    config = config_mod.Config().replace(**{
        "shards": 1, "max_frame_bytes": 65536, "limits.max_output_bytes": 131072,
        "subscriber.heartbeat": 0.1, "shard.orphan_timeout": 60.0})
    spec = ShardSpec(index=0, shard_count=1, port=0, control="127.0.0.1:1", advertise=None,
                     config=config.to_dict(), secret=SECRET)
    host = LockstepHost()
    batch = P.encode_many([[P.STATS, i + 1] for i in range(BATCH)])
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: run_shard(host, spec, pid=1,
                                                              task_status=task_status))
            client = host.open()
            decoder = P.FrameDecoder(1 << 30)
            await client.send_all(P.encode([P.HELLO, 1, {"version": P.VERSION}]))
            assert decoder.feed(await client.receive_some())[0][0] == P.HELLO_OK
            sent = [0]

            async def flood() -> None:
                for _ in range(40):
                    await client.send_all(batch)
                    sent[0] += 1

            nursery.start_soon(flood)
            # four silent heartbeat periods: the shard stops reading, and keeps the session
            await trio.sleep(0.4)
            stalled_at = sent[0]
            await trio.sleep(0.2)
            assert sent[0] == stalled_at < 10  # 40 batches of STATS replies would be MBs
            answered = 0
            while answered < 40 * BATCH:
                data = await client.receive_some(1 << 20)
                assert data, f"closed after {answered} replies"
                for frame in decoder.feed(data):
                    assert frame[:2] == [P.STATS_OK, answered % BATCH + 1], frame
                    answered += 1
            assert sent[0] == 40
            nursery.cancel_scope.cancel()
