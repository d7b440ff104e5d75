"""Flux clients, one API in three flavours: :mod:`flux.client.trio`,
:mod:`flux.client.asyncio` (the default loop or uvloop) and the blocking
:mod:`flux.client.sync` (scripts, notebooks); each has ``connect``.

All are thin shells over one sans-IO core (:mod:`flux.client.core`), which holds
every protocol rule; the values they return live in :mod:`flux.client.types`.
"""
