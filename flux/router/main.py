"""``flux serve``: run the router and its shard processes until SIGINT or SIGTERM.

Stdout is a stable, line-oriented format (scripts and tests parse it); each line
is flushed as soon as it is printed::

    flux: router listening on 127.0.0.1:7070 with 2 shards
    flux: control listening on 127.0.0.1:40123
    flux: shard 0 listening on 127.0.0.1:40124 (pid 4242, generation 0x9f3a...)
    flux: shard 1 listening on 127.0.0.1:40125 (pid 4243, generation 0x11c0...)
    flux: http listening on http://127.0.0.1:8070/
    flux: stopped

A shard line may end with ``advertised as HOST:PORT`` when ``shard.advertise`` is
set, or read ``flux: shard 1 not registered yet``. The http line (the monitoring
endpoint, :mod:`flux.monitor`) is left out with ``http.enabled: false``. Logs go to stderr.
Exit status: 0 after a clean stop, 1 if a listener could not be bound.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
from collections.abc import AsyncIterator, Callable

import trio

from flux import process_log
from flux.config import Config
from flux.errors import ConfigError, first_of
from flux.host import RealHost
from flux.router.launcher import ProcessLauncher
from flux.router.router import Router, RouterInfo
from flux.router.state import FileStateStore, StateStore


def serve_forever(config: Config, reload: Callable[[], Config] | None = None) -> int:
    """Run a broker until SIGINT/SIGTERM, then drain every shard; returns the exit status.

    On SIGHUP, ``reload()`` reads the configuration again and its ``auth`` section and
    ``tls`` certificates are put in force (nothing else is reloaded); a config that
    fails to load is logged and the running one kept."""
    process_log.configure("flux router")
    if config.storage.dir is not None:
        from flux.host import RealDisk
        from flux.shard.disk import check_data_dir
        try:  # a data directory that is not this broker's is refused before anything starts
            trio.run(check_data_dir, RealDisk(), config.storage.dir, config.shard_count)
        except ConfigError as exc:
            print(f"flux: {exc}", file=sys.stderr)
            return 2
    try:
        trio.run(_serve, config, reload)
    except (OSError, ExceptionGroup) as exc:
        error = first_of(exc, OSError)
        if error is None:
            raise
        print(f"flux: cannot serve on {config.host}:{config.port}: {error}", file=sys.stderr)
        return 1
    return 0


def describe(info: RouterInfo, shard_count: int) -> list[str]:
    """The stdout lines announcing a running broker (the format in the module docstring)."""
    lines = [f"flux: router listening on {info.address} with {shard_count} shards",
             f"flux: control listening on {info.control}"]
    for index, shard in enumerate(info.shards):
        if shard is None:
            lines.append(f"flux: shard {index} not registered yet")
            continue
        line = (f"flux: shard {index} listening on {shard.address}"
                f" (pid {shard.pid}, generation {shard.generation:#x})")
        if shard.advertise != shard.address:
            line += f" advertised as {shard.advertise}"
        lines.append(line)
    return lines


async def _serve(config: Config, reload: Callable[[], Config] | None) -> None:
    host = RealHost("router")
    stop = trio.Event()

    def state(port: int) -> StateStore:
        return FileStateStore(config.host, port)

    async def on_signal(signals: AsyncIterator[int]) -> None:
        async for signum in signals:
            if signum == signal.SIGHUP:
                await _reload_auth(broker, reload)
            else:
                stop.set()

    # the receiver is open before anything starts, so an early Ctrl-C also drains
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:

            broker = Router(host, config, ProcessLauncher(host), state)

            async def router(task_status: trio.TaskStatus[RouterInfo]) -> None:
                await broker.run(stop, task_status)
                nursery.cancel_scope.cancel()  # drained: stop watching signals

            nursery.start_soon(on_signal, signals)
            url = None
            if config.http.enabled:  # bound first: a taken port fails before any shard starts
                from flux.monitor.server import serve_monitor

                url = await nursery.start(serve_monitor, host, config, broker)
            info = await nursery.start(router)
            for line in describe(info, config.shard_count):
                _say(line)
            if url is not None:
                _say(f"flux: http listening on {url}")
    _say("flux: stopped")


async def _reload_auth(broker: Router, reload: Callable[[], Config] | None) -> None:
    """SIGHUP: read the config again and put its ``auth`` section and the certificates
    of its ``tls`` section in force."""
    log = logging.getLogger("flux.router")
    if reload is None:
        log.warning("SIGHUP: this broker was started without a reloadable config; ignored")
        return
    try:
        fresh = reload()
    except ConfigError as exc:
        log.error("SIGHUP: the config does not load, keeping the running auth and TLS: %s",
                  exc)
        return
    await broker.reload_auth(fresh.auth, fresh.tls)


def _say(line: str) -> None:
    # a closed stdout (``flux serve | head -1``) must not stop the broker
    with contextlib.suppress(OSError, ValueError):
        print(line, flush=True)
