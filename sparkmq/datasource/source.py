"""The ``sparkmq`` PySpark data source: a store (any fsspec URL) read and written as a table.

``SparkMQDataSource`` is what Spark instantiates (on the driver's planner
worker, then pickled with its options): ``schema()`` is fixed
(:data:`sparkmq.datasource.reader.SPARK_SCHEMA`, or with option ``columns=kafka``
Spark's Kafka source schema, :mod:`sparkmq.datasource.kafka`); a schema the user
declares (``.schema("body binary, queue_offset long")``) must be a subset of it and
makes reads return (and read) only those columns. ``reader``/``streamReader``
build the read side, ``writer``/``streamWriter`` the write side (imported
lazily from :mod:`sparkmq.datasource.writer`).
"""
from __future__ import annotations

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from .kafka import kafka_schema
from .options import columns_option
from .reader import SPARK_SCHEMA, SparkMQBatchReader
from .stream import SparkMQStreamReader


class SparkMQDataSource(DataSource):
    """Short name ``sparkmq``; path = the store's URL (``.load(url)`` or option ``path``);
    a read takes several stores too (``.load([a, b])``, ``stores``, ``namesrv``:
    :mod:`sparkmq.datasource.stores`); a write goes to one."""

    @classmethod
    def name(cls) -> str:
        return "sparkmq"

    def schema(self):
        kafka, headers = columns_option(self.options)     # columns=kafka: kafka.py
        return kafka_schema(headers) if kafka else SPARK_SCHEMA

    def reader(self, schema: StructType):
        _refuse_memory(self.options)
        return SparkMQBatchReader(self.options, schema)

    def streamReader(self, schema: StructType):
        _refuse_memory(self.options)
        from .prefetch import stream_reader
        return stream_reader(SparkMQStreamReader(self.options, schema))

    def writer(self, schema: StructType, overwrite: bool):
        from .writer import SparkMQBatchWriter
        return SparkMQBatchWriter(dict(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool):
        from .writer import SparkMQStreamWriter
        return SparkMQStreamWriter(dict(self.options), schema, overwrite)


def _refuse_memory(options) -> None:
    """A memory:// store lives in one process; Spark reads on others (its executors)."""
    options = {str(k).lower(): v for k, v in dict(options).items()}
    text = " ".join(str(options.get(k) or "") for k in ("path", "paths", "stores"))
    url = next((u.strip('[]", ') for u in text.replace(",", " ").split()
                if u.strip('[]", ').startswith("memory://")), "")
    if url:
        from ..errors import UserError
        raise UserError(f"{url}: a memory:// store lives in one process, and Spark reads and "
                        "writes from other processes (its executors); use a local path or an "
                        "object store URL")
