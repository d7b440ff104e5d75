"""Seeing the broker: Prometheus metrics, health, a JSON API, the web dashboard, ``flux top``.

Layering: :mod:`.shardlink` (a request connection to one shard) under
:mod:`.gather` (periodic STATS into a cache, rates) under :mod:`.metrics` and
:mod:`.api` (what is shown) under :mod:`.app` (Starlette routes) under
:mod:`.server` (Hypercorn's trio worker inside the router process). :mod:`.top`
is the terminal view. Nothing here is public API beyond the HTTP endpoints.
"""
