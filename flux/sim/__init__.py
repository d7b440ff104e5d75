"""The deterministic simulator: the real router, shards and clients in one trio run.

Layers, bottom up: ``determinism`` (scheduler seed, SimClock), ``network`` and
``simhost`` (the Host seam over a fake network with a pause gate), ``tap``
(client-visible history), ``world`` and ``faults`` (processes and fault plans),
``workload``/``scenarios`` (what clients do), ``runner`` (one seed), ``checker``
(G1-G7 over a history, shared with chaos runs), ``shrink`` and ``command`` (``flux sim``).
"""
