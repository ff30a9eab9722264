"""PySpark data source ``sparkmq`` (Spark 4.x Python data source API).

``register(spark)`` registers it on a session and enables Python filter
pushdown (``spark.sql.python.filterPushdown.enabled``), which the batch
reader needs. Then::

    spark.read.format("sparkmq").option("topic", "T").load(url)
    spark.readStream.format("sparkmq").option("topic", "T").load(url)
    spark.read.format("sparkmq").load([url_a, url_b])     # one query across brokers
    df.write.format("sparkmq").option("topic", "T").save(url)
"""
from __future__ import annotations

from .source import SparkMQDataSource

__all__ = ["SparkMQDataSource", "register"]


def register(spark) -> None:
    """Register the ``sparkmq`` format on ``spark`` (idempotent)."""
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(SparkMQDataSource)
