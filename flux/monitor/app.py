"""The monitor's ASGI application (Starlette): routes and their HTTP status codes.

Routes: ``/`` (the dashboard), ``/static/*``, ``/metrics``, ``/healthz`` and
``/api/{overview,shards,topics,subscriptions}``, ``/api/topics/{topic}/messages``.
Every handler reads the gatherer's cache; only the message browser goes to a shard.
"""

from __future__ import annotations

from pathlib import Path

import anyio.to_thread
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from flux import errors
from flux.monitor import api
from flux.monitor.gather import StatsGatherer
from flux.monitor.metrics import MetricsPage

STATIC = Path(__file__).parent / "static"


def _error(status: int, exc: errors.FluxError) -> JSONResponse:
    return JSONResponse({"error": type(exc).__name__, "message": str(exc)}, status_code=status)


def _int_param(request: Request, name: str, default: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise errors.InvalidRequest(f"query parameter {name!r} must be an integer,"
                                    f" got {raw!r}") from None


def build_app(gatherer: StatsGatherer) -> Starlette:
    """The application serving ``gatherer``'s cache."""
    page = MetricsPage(lambda: gatherer.snapshot)
    host = gatherer.host

    async def metrics(request: Request) -> Response:
        # a fresh render of many series takes tens of ms: off the router's event loop
        body = await anyio.to_thread.run_sync(page.render)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    async def healthz(request: Request) -> JSONResponse:
        status, body = api.health(gatherer.directory)
        return JSONResponse(body, status_code=status)

    async def overview(request: Request) -> JSONResponse:
        return JSONResponse(api.overview(gatherer.snapshot, gatherer.history, host.now()))

    async def shards(request: Request) -> JSONResponse:
        return JSONResponse({"shards": api.shards(gatherer.snapshot)})

    async def topics(request: Request) -> JSONResponse:
        return JSONResponse({"topics": api.topics(gatherer.snapshot, gatherer.history)})

    async def subscriptions(request: Request) -> JSONResponse:
        return JSONResponse({"subscriptions": api.subscriptions(gatherer.snapshot,
                                                                gatherer.history)})

    async def messages(request: Request) -> JSONResponse:
        try:
            offset = _int_param(request, "offset", 0)
            limit = _int_param(request, "limit", 50)
            body = await api.messages(gatherer, request.path_params["topic"], offset, limit)
        except errors.InvalidRequest as exc:  # InvalidTopic too
            return _error(400, exc)
        except errors.TopicReset as exc:
            return _error(409, exc)
        except (errors.Busy, errors.ConnectionLost, errors.RequestTimeout,
                errors.ShuttingDown) as exc:
            return _error(503, exc)
        except errors.RemoteError as exc:
            return _error(502, exc)
        return JSONResponse(body)

    async def dashboard(request: Request) -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    return Starlette(routes=[
        Route("/", dashboard),
        Route("/metrics", metrics),
        Route("/healthz", healthz),
        Route("/api/overview", overview),
        Route("/api/shards", shards),
        Route("/api/topics", topics),
        Route("/api/subscriptions", subscriptions),
        Route("/api/topics/{topic}/messages", messages),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ])
