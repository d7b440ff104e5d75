"""Simulation sweeps on Spark: ``flux sim --seeds A:B --spark [MASTER]``.

:func:`run_on_spark` maps jobs over an RDD; each executor calls the simulator's
single-seed entry point, named by ``"module:function"`` (by default
``flux.sim.command:run_one``), so only that string and the jobs travel to the
executors, and the results come back as partitions finish. How a seed runs,
what counts as a failure and how it is reported belong to ``flux.sim``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import Any

DEFAULT_ENTRY = "flux.sim.command:run_one"
DEFAULT_MASTER = "local[*]"


def resolve(entry: str) -> Callable[[Any], Any]:
    """The function ``"package.module:name"`` names; raises ValueError if there is none."""
    module_name, _, attr = entry.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"no simulator entry point {entry!r}: {exc}") from None
    if not callable(fn):
        raise ValueError(f"simulator entry point {entry!r} is not callable")
    return fn  # type: ignore[no-any-return]


def run_jobs(entry: str, jobs: Iterable[Any]) -> Iterator[Any]:
    """Executor side: the entry point's result for each job of one partition."""
    run = resolve(entry)
    for job in jobs:
        yield run(job)


def run_on_spark(jobs: Sequence[Any], *, master: str = DEFAULT_MASTER,
                 entry: str = DEFAULT_ENTRY, wave: int | None = None,
                 spark: Any = None) -> Iterator[Any]:
    """Run ``entry(job)`` for every job on Spark and yield the results in job order
    (``master``: ``local[*]`` or any cluster URL).

    Jobs go out in waves of ``wave`` (default: 32 per core of the cluster), each one
    Spark job spread over every core, so results (and a caller's progress bar) arrive
    wave by wave. Jobs and results must pickle; the executors need flux installed.
    Uses ``spark`` if given, else starts a session and stops it (and its JVM) at the
    end. Raises ValueError if ``entry`` names no function (checked before Spark starts).
    """
    from flux.spark.session import spark_session, stop_session

    resolve(entry)
    session = spark if spark is not None else spark_session(
        master, app="flux-sim-sweep", settings={"spark.ui.showConsoleProgress": "false"})
    try:
        sc = session.sparkContext
        if spark is None:
            sc.setLogLevel("ERROR")
        cores = max(1, sc.defaultParallelism)
        size = wave or cores * 32
        work = partial(run_jobs, entry)
        for i in range(0, len(jobs), size):
            chunk = list(jobs[i:i + size])
            # one job per slice: a slow seed holds up only itself
            yield from sc.parallelize(chunk, len(chunk)).mapPartitions(work).collect()
    finally:
        if spark is None:
            stop_session(session)
