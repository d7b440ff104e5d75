"""Benchmarks of Flux beside peer brokers (NATS core, JetStream, Redis Streams).

``flux bench`` (:mod:`flux.bench.command`) runs the workloads of :mod:`flux.bench.runner`
against brokers started by :mod:`flux.bench.systems`, with producers and consumers in
worker processes (:mod:`flux.bench.worker`), and reports with :mod:`flux.bench.report`.
Nothing here is imported by the broker or the client.
"""
