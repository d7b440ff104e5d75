"""Flux: an in-memory event streaming broker on trio.

Public API: the clients :mod:`flux.client.trio`, :mod:`flux.client.asyncio` and
:mod:`flux.client.sync`, :mod:`flux.errors`, and the ``flux`` command. Everything
else is internal.
"""

__version__ = "0.1.0"
