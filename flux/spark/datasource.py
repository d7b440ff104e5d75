"""The ``flux`` DataSource class: options in, Spark readers and writers out.

Only the wiring lives here: reading in :mod:`flux.spark.source`, writing in
:mod:`flux.spark.sink`, option parsing in :mod:`flux.spark.options`.
"""

from __future__ import annotations

from typing import Any

try:
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceReader,
        DataSourceStreamReader,
        DataSourceStreamWriter,
        DataSourceWriter,
    )
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow  # noqa: F401
    from pyspark.sql.types import StructType
except ImportError as exc:  # pragma: no cover - depends on the environment
    # admission control and Trigger.AvailableNow for Python sources arrived in 4.2
    raise ImportError("flux.spark needs pyspark>=4.2 and pyarrow: pip install 'flux[spark]'"
                      ) from exc

from flux.spark.options import SinkOptions, SourceOptions
from flux.spark.sink import FluxBatchWriter, FluxStreamWriter
from flux.spark.source import SCHEMA as SCHEMA
from flux.spark.source import FluxBatchReader, FluxStreamReader


class FluxDataSource(DataSource):
    """The ``flux`` format. Options are checked when a reader or writer is made
    (ValueError naming the option); see the README's Spark section for the list."""

    @classmethod
    def name(cls) -> str:
        return "flux"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return FluxBatchReader(SourceOptions.parse(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return FluxStreamReader(SourceOptions.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return FluxBatchWriter(SinkOptions.parse(self.options, schema.fieldNames()))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return FluxStreamWriter(SinkOptions.parse(self.options, schema.fieldNames()))


def register(spark: Any) -> None:
    """Register the ``flux`` format with a SparkSession."""
    spark.dataSource.register(FluxDataSource)
