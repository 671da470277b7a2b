"""memwal as a Spark table format: ``format("memwal")`` reads, writes and streams (Spark's
Python Data Source API). :mod:`memwal.spark.source` is the data source; the package
``pyspark_memwal`` makes Spark find it by name."""
