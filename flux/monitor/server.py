"""Run the monitor inside the router process: Hypercorn's trio worker serving the app.

:func:`serve_monitor` binds ``http.host:http.port`` (so a bad port fails before
any shard starts), then gathers STATS and serves HTTP until cancelled.
:class:`RouterDirectory` is the one place that reads the router's shard slots.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve

from flux import protocol
from flux.config import Config
from flux.errors import first_of
from flux.host import Host
from flux.monitor.access import AdminOnly
from flux.monitor.app import build_app
from flux.monitor.gather import ShardEntry, StatsGatherer
from flux.shard.server import format_address

if TYPE_CHECKING:
    from flux.router.router import Router

WILDCARD_HOSTS = ("", "0.0.0.0", "::")
log = logging.getLogger("flux.monitor")


class RouterDirectory:
    """The router's shard slots as :class:`~flux.monitor.gather.ShardEntry` values."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.shard_count = router.shard_count

    def entries(self) -> list[ShardEntry]:
        out: list[ShardEntry] = []
        for slot in self.router.slots:
            info = slot.info
            if info is None:
                out.append(ShardEntry(slot.index, False, slot.proc.pid if slot.proc else None,
                                      restarts=slot.restarts))
                continue
            host, port = protocol.parse_address(info.address)
            if host in WILDCARD_HOSTS:  # listening everywhere: loopback reaches it
                host = "::1" if host == "::" else "127.0.0.1"
            out.append(ShardEntry(slot.index, True, info.pid, info.generation,
                                  format_address(host, port), slot.restarts, info.recovering))
        return out

    def stopping(self) -> bool:
        return self.router.stop_requested


def http_url(host: str, port: int) -> str:
    """The endpoint's base URL."""
    return f"http://{format_address(host, port)}/"


async def serve_monitor(host: Host, config: Config, router: Router, *,
                        task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``/metrics``, ``/healthz``, ``/api/`` and the dashboard until cancelled.

    Reports the base URL (``http://host:port/``) through ``task_status`` once the
    port is bound; raises OSError if it cannot be.
    """
    gatherer = StatsGatherer(host, RouterDirectory(router), config.http.stats_interval,
                             hello=router.broker_hello, tls=lambda: router.internal_tls)
    hyper = HypercornConfig()
    hyper.bind = [format_address(config.http.host, config.http_port)]
    hyper.accesslog = None
    hyper.errorlog = logging.getLogger("flux.monitor.http")
    hyper.graceful_timeout = 1.0
    started = False
    try:
        async with trio.open_nursery() as nursery:
            try:
                app = AdminOnly(build_app(gatherer), lambda: router.config.auth, router.logins,
                                lambda: router.secret)
                binds: list[str] = await nursery.start(serve, app, hyper)
            except (OSError, BaseExceptionGroup) as exc:
                error = first_of(exc, OSError)
                if error is None:
                    raise
                raise OSError(error.errno, f"http.port {hyper.bind[0]}: {error.strerror}") from exc
            port = int(binds[0].rsplit(":", 1)[1])  # "http://127.0.0.1:8070": the bound port
            nursery.start_soon(gatherer.run)
            task_status.started(http_url(config.http.host, port))
            started = True
    except Exception:
        if not started:
            raise
        # monitoring is not worth the broker: the router goes on serving without it
        log.exception("the HTTP endpoint failed; the broker goes on without it")
