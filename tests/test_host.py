"""The production host's seams that the simulator cannot show: real sockets."""

from __future__ import annotations

import trio

from flux.host import RealHost


async def test_real_try_send_writes_what_fits_in_order_then_refuses_without_waiting() -> None:
    host = RealHost("test")
    received = bytearray()
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            accepted: list[trio.SocketStream] = []
            nursery.start_soon(lambda: _accept_one(listeners[0], accepted))
            stream = await host.connect("127.0.0.1", port)
            assert host.try_send(stream, b"first,") == 6
            await stream.send_all(b"second,")
            sent = 13
            while (n := host.try_send(stream, b"z" * 65536)) > 0:  # nobody reads: it fills
                sent += n
            assert host.try_send(stream, b"more") == 0
            while not accepted:
                await trio.sleep(0.01)
            while len(received) < sent:
                received += await accepted[0].receive_some()
            assert received[:13] == b"first,second,"
            assert set(received[13:]) == {ord("z")}
            await stream.aclose()
            assert host.try_send(stream, b"closed") == 0  # no error: send_all would say
            await accepted[0].aclose()
            for listener in listeners:
                await listener.aclose()


async def _accept_one(listener: trio.SocketListener, out: list[trio.SocketStream]) -> None:
    out.append(await listener.accept())
