"""The SparkSession memwal's entry points run on (``memwal ingest``, the demo, tests, benchmarks).

Whoever launches the driver decides where it runs: a master or any setting given to
``spark-submit`` (``--master``, ``--conf``), through ``PYSPARK_SUBMIT_ARGS``, or in
``spark-defaults.conf`` wins over memwal's defaults; an explicit ``master=`` (``memwal ingest
--master URL``) wins over both; ``local[cores]`` is used only when nothing names a master.
memwal's defaults (no UI, few shuffle partitions, no adaptive execution, a fast-starting
driver JVM) fill only what the launcher left unset.

On a local master (``local``, ``local[N]``, ``local-cluster[...]``) the driver binds and
advertises 127.0.0.1, so it works on a machine whose hostname resolves elsewhere and
listens on no external interface, and the Python workers run this interpreter (they need
memwal, pyarrow and Lance). On a cluster both are the deployment's business (docs/deploy.md).

A Spark Connect session (``SparkSession.builder.remote("sc://host:port")``) has no
``sparkContext``: :func:`is_connect` tells the two apart and :func:`default_parallelism` reads
the parallelism either way.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping
from typing import Final

from memwal import jvm
from memwal.core.runtime import executor_env
from memwal.core.storage import StorageConfig

#: Where a local driver binds and what it advertises to its executors.
LOOPBACK: Final = "127.0.0.1"

#: Settings that shape the driver JVM: they only take effect when it is launched, so they are
#: handed to the launcher (before ``PYSPARK_SUBMIT_ARGS``, which therefore overrides them).
#: C1-only JIT and the serial GC roughly halve the driver JVM's start time.
LAUNCH_DEFAULTS: Final[Mapping[str, str]] = {
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
}

#: The launch settings of a long-running driver (``memwal ingest``, the benchmarks): the full
#: JIT. On a local master the driver JVM also runs the executors' JVM work (Spark's Kafka
#: consumer, rows to Arrow for the Python stages, the shuffle), which C1-only code runs several
#: times slower (``from_json`` of the ingest workload 4-5x, rows to Arrow 1.5-2x, measured
#: loaded: docs/bench-log/ingest.md, "Spark's Kafka connector"); a query running for minutes
#: pays the slower start once.
LONG_RUNNING_LAUNCH: Final[Mapping[str, str]] = {
    "spark.driver.extraJavaOptions": "-XX:+UseSerialGC",
}

#: memwal's defaults for a session, applied to keys the launcher did not set.
SESSION_DEFAULTS: Final[Mapping[str, str]] = {
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    # Adaptive execution re-plans every micro-batch, ~70 ms each here, and has nothing to
    # optimize in a sink's fixed one-task-per-shard shuffle.
    "spark.sql.adaptive.enabled": "false",
    # format("memwal") prunes shards and reads through the key's index from pushed filters.
    "spark.sql.python.filterPushdown.enabled": "true",
}


def is_local_master(master: str) -> bool:
    """True for masters whose executors run on this machine: ``local``, ``local[N]``,
    ``local[N,F]``, ``local[*]`` and ``local-cluster[W,C,M]``."""
    return master == "local" or master.startswith(("local[", "local-cluster["))


#: The master ``spark-submit`` assumes when nothing names one. The launcher reports it as
#: configured, so memwal cannot tell it from one a user named: cores asked of
#: :func:`local_session` (``memwal ingest --cores``, a real-time query's slot per partition) replace it.
SUBMIT_DEFAULT_MASTER: Final = "local[*]"


def resolve_master(explicit: str | None, configured: str | None, cores: int | str | None) -> str:
    """The master to run on: ``explicit`` (``--master``), else what the launcher configured
    (``spark-submit``, ``PYSPARK_SUBMIT_ARGS``, ``spark-defaults.conf``), else ``local[cores]``
    (``local[2]`` for None); cores asked for (not None) also replace the launcher's default
    :data:`SUBMIT_DEFAULT_MASTER`."""
    if explicit:
        return explicit
    if configured and not (configured == SUBMIT_DEFAULT_MASTER and cores is not None):
        return configured
    return f"local[{2 if cores is None else cores}]"


def session_settings(
    master: str,
    configured: Mapping[str, str],
    *,
    memory: str | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The settings memwal adds to a session on ``master`` given what the launcher
    ``configured``: memwal's defaults and ``spark.executorEnv.*`` for ``env`` (default:
    :func:`memwal.core.runtime.executor_env`) where the launcher set nothing, the loopback driver
    address on a local master. ``memory`` (driver memory) only matters when this call
    launches the driver JVM."""
    wanted: dict[str, str] = dict(SESSION_DEFAULTS)
    if memory is not None:
        wanted["spark.driver.memory"] = memory
    for key, value in (executor_env() if env is None else env).items():
        wanted[f"spark.executorEnv.{key}"] = value
    if is_local_master(master):
        wanted["spark.driver.host"] = LOOPBACK
        wanted["spark.driver.bindAddress"] = LOOPBACK

    return {k: v for k, v in wanted.items() if k not in configured}


#: The jar groups (:mod:`memwal.jvm`) a session puts on its classpath when they are fetched:
#: Spark's Kafka connector and S3A. On a local master they join the JVMs' own classpath
#: (``extraClassPath``: nothing is copied, and the 650 MB AWS SDK bundle costs nothing
#: measurable at start-up); on a cluster master they are shipped with ``spark.jars``.
SPARK_JAR_GROUPS: Final = ("spark-kafka", "s3a", "realtime")


def jar_settings(master: str | None, configured: Mapping[str, str], groups: tuple[str, ...] = SPARK_JAR_GROUPS) -> dict[str, str]:
    """The classpath settings for the fetched ``groups`` that the launcher left unset.

    With ``master`` None (not known yet: the driver JVM is being launched) only the driver's
    classpath; it must be set before the JVM starts, so :func:`local_session` passes it to the
    launch. A launcher that set a classpath of its own keeps it (then it names the jars).
    """
    paths = [str(j) for g in groups for j in jvm.jars(g)]
    if not paths:
        return {}
    wanted = {"spark.driver.extraClassPath": os.pathsep.join(paths)}
    if master is not None:
        if is_local_master(master):
            wanted["spark.executor.extraClassPath"] = os.pathsep.join(paths)
        else:
            wanted["spark.jars"] = ",".join(paths)
    return {k: v for k, v in wanted.items() if k not in configured}


def configure_s3a(spark, storage: StorageConfig) -> dict[str, str]:
    """Point ``spark``'s Hadoop S3A file system at ``storage``'s S3 store, for ``s3a://`` (and
    ``s3://``) checkpoints; returns the Hadoop keys set. A classic session changes its Hadoop
    configuration in place; a Spark Connect session sets them as session settings. Needs the
    ``s3a`` jars on the classpath (:mod:`memwal.jvm`)."""
    settings = dict(storage.hadoop_s3a_settings())
    settings["spark.hadoop.fs.s3.impl"] = "org.apache.hadoop.fs.s3a.S3AFileSystem"
    if is_connect(spark):
        for key, value in settings.items():
            spark.conf.set(key, value)
    else:
        hadoop = spark.sparkContext._jsc.hadoopConfiguration()
        for key, value in settings.items():
            hadoop.set(key.removeprefix("spark.hadoop."), value)
    return {k.removeprefix("spark.hadoop."): v for k, v in settings.items()}


def is_connect(spark) -> bool:
    """True when ``spark`` is a Spark Connect client session: it has no ``sparkContext`` and
    whatever runs on the server (``foreachBatch`` functions, ``mapInArrow`` stages) reaches it
    pickled. Decided by the class, so the Connect client packages need not be installed to ask."""
    return type(spark).__module__.startswith("pyspark.sql.connect.")


def make_active(spark) -> None:
    """Make ``spark`` the active session of the JVM thread behind the calling Python thread.

    Spark finds a Python data source by name (``format("memwal")``) only through the JVM's
    active session, which is per thread: from a Python thread other than the one that built
    the session, the lookup fails with DATA_SOURCE_NOT_FOUND. A Spark Connect session has no
    JVM here (its server resolves the name)."""
    if not is_connect(spark):
        spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)


def default_parallelism(spark) -> int:
    """``spark``'s default parallelism (its task slots, unless configured otherwise), at least 1.

    A classic session asks its SparkContext. A Connect session has none: it reads
    ``spark.default.parallelism`` from the server's configuration, else
    ``spark.sql.shuffle.partitions`` (the parallelism the server gives its own shuffles),
    since the slot count itself is not visible to a Connect client.
    """
    if not is_connect(spark):
        return max(1, int(spark.sparkContext.defaultParallelism))
    for key in ("spark.default.parallelism", "spark.sql.shuffle.partitions"):
        value = spark.conf.get(key, None)
        if value:
            return max(1, int(value))
    return 1


def executor_count(spark) -> int:
    """How many executors ``spark`` runs its tasks on (local mode: one; a cluster: those that
    registered, or as many as ``spark.executor.instances`` asks for before they do). Over
    Spark Connect, what the server's configuration says (its master, the instance count)."""
    master = spark.conf.get("spark.master", "") or ""
    if master.startswith("local-cluster["):  # local-cluster[N, cores, memory]
        return max(1, int(master[len("local-cluster["):].split(",")[0]))
    if is_local_master(master):
        return 1
    if not is_connect(spark):
        status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus()
        registered = max(0, int(status.size()) - 1)  # the driver's block manager is listed too
        if registered:
            return registered
    instances = spark.conf.get("spark.executor.instances", None)
    return max(1, int(instances)) if instances else 2


def launcher_conf(launch: Mapping[str, str] | None = None) -> dict[str, str]:
    """The Spark properties the driver was launched with (``spark-submit`` arguments,
    ``PYSPARK_SUBMIT_ARGS``, ``spark-defaults.conf``).

    Starts the driver JVM if this process has none yet, with ``launch`` settings that the
    launcher's own arguments override; under ``spark-submit`` the JVM exists already and
    ``launch`` is ignored. Reading the properties needs the JVM because only the launcher
    (``spark-submit``) knows the merged result of its flags and files.
    """
    from pyspark import SparkConf, SparkContext

    conf = SparkConf(loadDefaults=False)
    for key, value in (launch or {}).items():
        conf.set(key, value)
    # PySpark's own entry point for "launch or join the gateway"; SparkContext() calls it too.
    SparkContext._ensure_initialized(conf=conf)
    return dict(SparkConf(loadDefaults=True).getAll())


def local_session(app: str = "memwal", cores: int | str | None = None, memory: str = "1g", master: str | None = None,
                  *, fast_start: bool = True):
    """A SparkSession for memwal: on ``master`` if given, else on the launcher's master, else
    on ``local[cores]`` (see the module docstring for what wins).

    ``fast_start``: launch the driver JVM for a quick start (:data:`LAUNCH_DEFAULTS`: tests, the
    demo, short commands); False for a long-running query (:data:`LONG_RUNNING_LAUNCH`, the full
    JIT). Only a launch takes it: a driver JVM that exists already keeps its settings."""
    from pyspark.sql import SparkSession

    # Lance warns on any fork after it is imported; PySpark forks only to exec the JVM.
    warnings.filterwarnings("ignore", message="lance is not fork-safe")
    env = executor_env()  # also this process's own setup (Lance's log filter)
    if master is not None and is_local_master(master):
        # The address local-cluster workers and executors bind and advertise (read when the
        # JVM starts, so only a master known before the launch can set it).
        os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    # The Python the JVM starts on the driver (a data source's lookup, planning and commit
    # workers) is named by the JVM's environment, fixed when it launches: this interpreter.
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    launch = LAUNCH_DEFAULTS if fast_start else LONG_RUNNING_LAUNCH
    configured = launcher_conf({**launch, "spark.driver.memory": memory, **jar_settings(None, {})})
    chosen = resolve_master(master, configured.get("spark.master"), cores)
    if is_local_master(chosen):
        # Local executors run this interpreter (read when the SparkContext is created). On a
        # cluster its path means nothing on other machines: the deployment names the Python.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master(chosen).appName(configured.get("spark.app.name", app))
    settings = session_settings(chosen, configured, env=env)
    # The driver's classpath was given to the launch above: configured now, unless the JVM
    # existed already (then only executors and later sessions can still get the jars).
    settings.update({k: v for k, v in jar_settings(chosen, configured).items() if k != "spark.driver.extraClassPath"})
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
