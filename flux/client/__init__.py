"""Flux clients. Use :mod:`flux.client.trio` (``connect``); an asyncio flavour will follow.

Both flavours are thin shells over one sans-IO core (:mod:`flux.client.core`),
which holds every protocol rule; the values they return live in
:mod:`flux.client.types`.
"""
