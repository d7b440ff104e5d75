"""Chaos runs (``python -m chaos``, ``make chaos``): real Flux processes under injected faults.

The runner (:mod:`chaos.runner`) starts ``flux serve`` behind a fault proxy
(:mod:`chaos.proxy`), client processes (:mod:`chaos.worker`) that record what they
saw, and a seeded fault schedule (:mod:`chaos.schedule`, :mod:`chaos.faults`); the
histories are checked by the simulator's checker (:mod:`chaos.accounting`). Topics
live in memory, on disk or both (``--storage``); the report counts each kind apart,
and a disk topic may lose nothing acked and keep its generation across kills (G9).
"""
