"""Spark finds memwal's data source here: ``spark.read.format("memwal")`` needs no registration.

Spark imports every top-level ``pyspark_*`` module on the Python path of its Python workers
and registers the ``DefaultSource`` each one names (pyspark/sql/worker/lookup_data_sources.py).
"""

from memwal.spark.source import MemwalDataSource as DefaultSource

__all__ = ["DefaultSource"]
