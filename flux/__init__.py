"""Flux: an in-memory event streaming broker on trio.

Public API: :mod:`flux.client.trio` (and ``flux.client.asyncio`` later),
:mod:`flux.errors`, and the ``flux`` command. Everything else is internal.
"""

__version__ = "0.1.0"
