"""Flux for Spark: the ``flux`` data source (PySpark's Python Data Source API).

``spark.dataSource.register(FluxDataSource)``, then ``format("flux")`` reads topics
as a replayable stream or a batch, and writes DataFrames with deterministic ids.
Needs the ``spark`` extra (pyspark, pyarrow), imported only when a Spark name is
first used, so the pure modules (:mod:`~flux.spark.offsets`, :mod:`~flux.spark.ids`)
import without it. Simulation sweeps live in :mod:`flux.spark.sweep`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flux.spark.datasource import SCHEMA, FluxDataSource, register
    from flux.spark.offsets import DataLoss

__all__ = ["SCHEMA", "DataLoss", "FluxDataSource", "register"]


def __getattr__(name: str) -> Any:
    if name == "DataLoss":
        from flux.spark.offsets import DataLoss

        return DataLoss
    if name in ("SCHEMA", "FluxDataSource", "register"):
        from flux.spark import datasource

        return getattr(datasource, name)
    raise AttributeError(f"module 'flux.spark' has no attribute {name!r}")
