"""Starting a SparkSession that can run the ``flux`` data source.

Spark's Python workers must run this interpreter (where flux and pyarrow are
installed), so :func:`spark_session` points ``PYSPARK_PYTHON`` at it; on a local
master it also binds to loopback and turns the web UI off. Nothing Flux-specific
is decided here beyond registering the ``flux`` format.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any


def prepare_environment(master: str) -> None:
    """Set what Spark reads from the environment before its JVM starts."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def spark_session(master: str = "local[2]", app: str = "flux",
                  settings: dict[str, Any] | None = None) -> Any:
    """A SparkSession (``getOrCreate``) with the ``flux`` format registered;
    ``settings`` are Spark configuration keys and values."""
    from pyspark.sql import SparkSession

    from flux.spark.datasource import FluxDataSource

    prepare_environment(master)
    builder = SparkSession.builder.master(master).appName(app)
    if master.startswith("local"):
        builder = builder.config("spark.ui.enabled", "false")
    for key, value in (settings or {}).items():
        builder = builder.config(key, str(value))
    spark = builder.getOrCreate()
    spark.dataSource.register(FluxDataSource)
    return spark


def stop_session(spark: Any, timeout: float = 30.0) -> None:
    """Stop ``spark`` and the JVM pyspark started for it (not only the SparkContext),
    so that nothing outlives the caller's use of Spark. A later :func:`spark_session`
    starts a fresh JVM."""
    from pyspark import SparkContext

    spark.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    gateway.shutdown()
    SparkContext._gateway = None
    SparkContext._jvm = None
    if proc is not None:
        # the JVM exits when its stdin closes (pyspark's own "parent is gone" signal)
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
