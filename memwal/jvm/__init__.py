"""The JVM artifacts memwal runs with, fetched by Maven into one project-local folder.

Three groups, each a Maven project in this package (``<group>.pom.xml``) whose runtime
dependencies Maven copies into ``<jars dir>/<group>/``:

``spark-kafka``
    Spark's own Kafka connector (``spark-sql-kafka-0-10_2.13``) at exactly the installed
    pyspark's version, with the token provider, ``kafka-clients`` and ``commons-pool2``.
    :func:`memwal.streaming.session.local_session` puts it on the classpath, which makes
    ``format("kafka")`` and ``memwal ingest --kafka-source spark`` work.
``kafka-broker``
    Apache Kafka 4 (broker and KRaft controller), for the demo, the tests and the
    benchmarks (:mod:`memwal_dev.local_broker`).
``s3a``
    ``hadoop-aws`` at the Hadoop version pyspark bundles, for ``s3a://`` checkpoints.

One more group is built here rather than fetched: ``realtime``, memwal's own Real-Time Mode
writer (``realtime/*.java``, :mod:`memwal.streaming.realtime`), compiled by the JDK's ``javac``
against the installed pyspark's jars into ``<jars dir>/realtime/``.

The folder is ``$MEMWAL_JARS`` if set, else ``.jars/`` beside the ``memwal`` package folder
(the repository root for a checkout); Maven's own cache goes to ``<jars dir>/m2``, so
nothing lands outside it. ``python -m memwal.jvm fetch`` (run by ``make demo``/``make test``)
fetches every group; a group is fetched again only when its pom or the versions it is
fetched at change. Nothing is fetched at run time: a session without the jars says so
and memwal falls back to its own Python Kafka source.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

#: The groups, in the order ``fetch`` takes them.
GROUPS: Final = ("spark-kafka", "kafka-broker", "s3a", "realtime")

#: The groups compiled from this package's Java sources (``<group>/*.java``), not fetched.
BUILT: Final = ("realtime",)

#: Maven's dependency plugin, pinned so a fetch does the same thing on every machine.
DEPENDENCY_PLUGIN: Final = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

#: Written last into a group's folder: what it was fetched from (the pom's digest and the
#: versions), so a changed pin fetches again and a half-done fetch is never taken as done.
STAMP: Final = ".fetched"


class JarsError(RuntimeError):
    """A group's jars could not be fetched (Maven's own error in the message)."""


def jars_dir() -> Path:
    """The project-local folder holding every group (see the module docstring)."""
    env = os.environ.get("MEMWAL_JARS")
    if env:
        return Path(env).expanduser().resolve()
    return Path(__file__).resolve().parent.parent.parent / ".jars"


def pom(group: str) -> Path:
    if group not in GROUPS or group in BUILT:
        raise ValueError(f"unknown fetched jar group {group!r}; one of {', '.join(g for g in GROUPS if g not in BUILT)}")
    return Path(__file__).resolve().parent / f"{group}.pom.xml"


def sources(group: str) -> list[Path]:
    """A built group's Java sources."""
    if group not in BUILT:
        raise ValueError(f"unknown built jar group {group!r}; one of {', '.join(BUILT)}")
    return sorted((Path(__file__).resolve().parent / group).glob("*.java"))


def spark_version() -> str:
    """The installed pyspark's version: the connector must match it exactly."""
    import pyspark

    return pyspark.__version__


def pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def hadoop_version() -> str:
    """The Hadoop version pyspark bundles (its ``hadoop-client-api`` jar's)."""
    for jar in sorted(pyspark_jars().glob("hadoop-client-api-*.jar")):
        return jar.name.removeprefix("hadoop-client-api-").removesuffix(".jar")
    raise JarsError(f"pyspark bundles no hadoop-client-api jar in {pyspark_jars()}")


def _properties(group: str) -> dict[str, str]:
    if group == "spark-kafka":
        return {"memwal.spark.version": spark_version()}
    if group == "s3a":
        return {"memwal.hadoop.version": hadoop_version()}
    return {}


def _stamp_text(group: str) -> str:
    if group in BUILT:
        digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources(group))).hexdigest()[:16]
        return f"sources={digest} spark={spark_version()}\n"
    digest = hashlib.sha256(pom(group).read_bytes()).hexdigest()[:16]
    props = " ".join(f"{k}={v}" for k, v in sorted(_properties(group).items()))
    return f"pom={digest} {props}".strip() + "\n"


def group_dir(group: str, root: Path | None = None) -> Path:
    if group not in GROUPS:
        raise ValueError(f"unknown jar group {group!r}; one of {', '.join(GROUPS)}")
    return (root or jars_dir()) / group


def is_fetched(group: str, root: Path | None = None) -> bool:
    """True when ``group``'s jars are in place for the current pom and versions."""
    stamp = group_dir(group, root) / STAMP
    try:
        return stamp.read_text() == _stamp_text(group)
    except OSError:
        return False


def jars(group: str, root: Path | None = None) -> list[Path]:
    """``group``'s jar files, or an empty list when it is not fetched (or fetched for
    other versions: a connector of another Spark version must never be loaded)."""
    if not is_fetched(group, root):
        return []
    return sorted(group_dir(group, root).glob("*.jar"))


def classpath(group: str, root: Path | None = None) -> str:
    """``group``'s jars joined for a Java classpath ('' when not fetched)."""
    return os.pathsep.join(str(j) for j in jars(group, root))


@dataclass(frozen=True)
class FetchResult:
    group: str
    jars: int
    fetched: bool  # False: already in place


def fetch(group: str, root: Path | None = None, *, force: bool = False, quiet: bool = True) -> FetchResult:
    """Copy ``group``'s runtime dependencies into its folder with Maven (``mvn`` on PATH)."""
    root = root or jars_dir()
    target = group_dir(group, root)
    if not force and is_fetched(group, root):
        return FetchResult(group, len(jars(group, root)), False)
    if group in BUILT:
        return _build(group, root)
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarsError("Maven (mvn) is not on PATH: install it (Debian: apt-get install maven)")
    staging = root / f".{group}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    argv = [
        mvn, "-B", "-f", str(pom(group)),
        f"-Dmaven.repo.local={root / 'm2'}",
        *(f"-D{k}={v}" for k, v in _properties(group).items()),
        f"{DEPENDENCY_PLUGIN}:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={staging}",
    ]
    if quiet:
        argv.insert(2, "-q")
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "ERROR" in line]
        raise JarsError(f"mvn could not fetch the {group} jars ({' '.join(f'{k}={v}' for k, v in _properties(group).items()) or 'pinned'}):\n"
                        + "\n".join(errors[:10] or (proc.stdout + proc.stderr).splitlines()[-20:]))
    (staging / STAMP).write_text(_stamp_text(group))
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return FetchResult(group, len(jars(group, root)), True)


def _jdk_tool(name: str) -> str:
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / name) if home and (Path(home) / "bin" / name).exists() else shutil.which(name)
    if found is None:
        raise JarsError(f"the JDK's {name} is not on PATH (nor in $JAVA_HOME/bin): install a JDK 17+ (Debian: apt-get install openjdk-17-jdk-headless)")
    return found


def _build(group: str, root: Path) -> FetchResult:
    """Compile a built group against the installed pyspark's jars into its folder."""
    staging = root / f".{group}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    classes = staging / "classes"
    classes.mkdir(parents=True)
    javac = [_jdk_tool("javac"), "--release", "17", "-nowarn", "-cp", str(pyspark_jars() / "*"), "-d", str(classes), *map(str, sources(group))]
    for argv in (javac, [_jdk_tool("jar"), "--create", "--file", str(staging / f"memwal-{group}.jar"), "-C", str(classes), "."]):
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            raise JarsError(f"could not build the {group} jar ({Path(argv[0]).name}):\n" + (proc.stdout + proc.stderr)[-3000:])
    shutil.rmtree(classes)
    (staging / STAMP).write_text(_stamp_text(group))
    target = group_dir(group, root)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return FetchResult(group, 1, True)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m memwal.jvm", description="Fetch memwal's JVM artifacts with Maven into a project-local folder.")
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fetch", help="fetch jar groups (default: all)")
    f.add_argument("groups", nargs="*", metavar="GROUP", help=f"of {', '.join(GROUPS)}")
    f.add_argument("--force", action="store_true", help="fetch even when in place")
    sub.add_parser("where", help="print the jars folder")
    args = p.parse_args(argv)
    if args.command == "where":
        print(jars_dir())
        return 0
    unknown = [g for g in args.groups if g not in GROUPS]
    if unknown:
        p.error(f"unknown group(s) {', '.join(unknown)}; of {', '.join(GROUPS)}")
    for group in args.groups or GROUPS:
        try:
            r = fetch(group, force=args.force)
        except JarsError as e:
            print(f"memwal.jvm: {e}", file=sys.stderr)
            return 1
        print(f"{group}: {r.jars} jar(s) in {group_dir(group)}" + ("" if r.fetched else " (already in place)"))
    return 0
