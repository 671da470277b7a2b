"""A local SparkSession tuned for memwal on a small machine (tests, the demo, ``memwal ingest``)."""

from __future__ import annotations

import os
import sys
import warnings


def local_session(app: str = "memwal", cores: int | str = 2, memory: str = "1g"):
    """``local[cores]`` with Python workers running this interpreter (they need memwal,
    pyarrow and Lance), no UI, few shuffle partitions, and a fast-starting driver JVM."""
    from pyspark.sql import SparkSession

    # Lance warns on any fork after it is imported; PySpark forks only to exec the JVM.
    warnings.filterwarnings("ignore", message="lance is not fork-safe")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("LANCE_LOG", "error,lance::index=off")
    spark = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(app)
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        # Adaptive execution re-plans every micro-batch, ~70 ms each here, and has nothing
        # to optimize in a sink's fixed one-task-per-shard shuffle.
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.driver.memory", memory)
        # C1-only JIT and the serial GC roughly halve the driver JVM's start time.
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .config("spark.executorEnv.LANCE_LOG", os.environ["LANCE_LOG"])
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    return spark
