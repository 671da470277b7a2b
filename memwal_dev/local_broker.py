"""A single-node Apache Kafka 4 broker on 127.0.0.1, for the demo, tests and benchmarks.

The broker is the real one (``kafka.Kafka`` from Maven's ``org.apache.kafka:kafka_2.13``,
fetched by ``python -m memwal.jvm fetch`` into the project's jars folder): one JVM in KRaft
mode, broker and controller together, its storage formatted in a work directory, listening on
free ports of 127.0.0.1 only. Topics are made through the admin API. It is stopped by its PID
(its process group), and :meth:`LocalBroker.restart` starts it again on the same ports and
data, as a broker restart in production would.

Not a production deployment: one replica, no security, small heap.
"""

from __future__ import annotations

import atexit
import base64
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import confluent_kafka
from confluent_kafka.admin import AdminClient, NewTopic

from memwal import jvm
from memwal.core.errors import MemwalError

#: JVM settings for a fixture broker: a small heap; C1 only and the serial GC start it about
#: twice as fast on 2 cores. Benchmarks pass ``fast_start=False`` for the full JIT.
FAST_START_OPTS: tuple[str, ...] = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
HEAP_OPTS: tuple[str, ...] = ("-Xms128m", "-Xmx768m")

#: One (key, value, partition) record; see :meth:`LocalBroker.produce` for headers and timestamps.
Record = tuple[bytes | None, bytes | None, int | None]


class BrokerError(MemwalError):
    """The broker could not be started, driven or stopped (its log's tail in the message)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    exe = Path(home, "bin", "java") if home else None
    if exe is not None and exe.is_file():
        return str(exe)
    found = shutil.which("java")
    if found is None:
        raise BrokerError("Java is needed for the Kafka broker (Debian: apt-get install openjdk-17-jre-headless)")
    return found


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_bytes()[-32768:].decode("utf-8", "replace")
    except OSError as e:
        return f"<no log at {path}: {e}>"
    return "\n".join(text.splitlines()[-lines:])


def _server_properties(data: Path, port: int, controller_port: int) -> str:
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(data),
        "num.partitions": "1",
        # one node: every internal topic has one replica
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        # topics are made explicitly, so a typo fails instead of making a topic
        "auto.create.topics.enable": "false",
    }
    return "".join(f"{k}={v}\n" for k, v in settings.items())


_live: set["LocalBroker"] = set()
_live_lock = threading.Lock()


@atexit.register
def _stop_leftovers() -> None:
    """No broker JVM outlives the interpreter that started it."""
    for broker in list(_live):
        broker.stop(grace=2.0)


@dataclass(eq=False)
class LocalBroker:
    """A running Apache Kafka broker; use :func:`start_local_broker`."""

    bootstrap: str
    workdir: Path
    port: int
    controller_port: int
    jvm_opts: tuple[str, ...]
    process: subprocess.Popen | None = field(default=None, repr=False)
    #: Seconds from launching the JVM to the broker answering metadata requests (last start).
    start_seconds: float = 0.0
    kind: str = "kafka4"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def log(self) -> Path:
        return self.workdir / "broker.log"

    def log_tail(self, lines: int = 30) -> str:
        return _tail(self.log, lines)

    def rss_bytes(self) -> int:
        """The broker JVM's resident memory now (0 when stopped)."""
        if self.pid is None or self.process.poll() is not None:
            return 0
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return 0
        return 0

    def client_config(self, **extra: object) -> dict[str, object]:
        """librdkafka settings for this broker."""
        return {"bootstrap.servers": self.bootstrap, **extra}

    # -- topics -----------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int = 1, timeout: float = 60.0, config: dict[str, str] | None = None) -> None:
        """Create ``name`` through the admin API and wait until every partition answers
        offset requests (what producers and sources need next)."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        new = NewTopic(name, num_partitions=partitions, replication_factor=1, config=dict(config or {}))
        try:
            admin.create_topics([new], operation_timeout=timeout, request_timeout=timeout)[name].result(timeout)
        except confluent_kafka.KafkaException as e:
            raise BrokerError(f"creating topic {name!r} on {self.bootstrap}: {e}\n{self.log_tail()}") from e
        self._wait_topic(name, partitions, time.monotonic() + timeout)

    def _wait_topic(self, name: str, partitions: int, deadline: float) -> None:
        consumer = confluent_kafka.Consumer({"bootstrap.servers": self.bootstrap, "group.id": "memwal-probe", "enable.auto.commit": False})
        last = "no metadata yet"
        try:
            while time.monotonic() < deadline:
                try:
                    t = consumer.list_topics(name, timeout=5).topics.get(name)
                    if t is None or t.error is not None or len(t.partitions) != partitions:
                        last = f"metadata: {t.error if t is not None else 'absent'}"
                    elif any(p.leader < 0 or p.error is not None for p in t.partitions.values()):
                        last = "a partition has no leader"
                    else:
                        for p in range(partitions):  # a leader in metadata may not serve yet
                            consumer.get_watermark_offsets(confluent_kafka.TopicPartition(name, p), timeout=5, cached=False)
                        return
                except confluent_kafka.KafkaException as e:
                    last = str(e)
                time.sleep(0.05)
        finally:
            consumer.close()
        raise BrokerError(f"topic {name!r} not ready on {self.bootstrap}: {last}\n{self.log_tail()}")

    # -- producing --------------------------------------------------------------------

    def produce(
        self,
        topic: str,
        records: Iterable[Record],
        *,
        headers: Sequence[list[tuple[str, bytes]] | None] | None = None,
        timestamps_ms: Sequence[int | None] | None = None,
        timeout: float = 60.0,
        **config: object,
    ) -> list[tuple[int, int]]:
        """Produce ``records`` in order and return each one's (partition, offset).

        ``headers[i]`` and ``timestamps_ms[i]`` (CreateTime) go with record ``i`` when given.
        Records of one partition keep their order (one request in flight, idempotent producer).
        """
        conf: dict[str, object] = {
            "bootstrap.servers": self.bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "enable.idempotence": True,
            "message.timeout.ms": int(timeout * 1000),
        }
        conf.update(config)
        producer = confluent_kafka.Producer(conf)
        placed: list[tuple[int, int] | None] = []
        errors: list[str] = []

        def on_delivery(index: int):
            def cb(err, msg) -> None:
                if err is not None:
                    errors.append(f"record #{index}: {err}")
                else:
                    placed[index] = (msg.partition(), msg.offset())

            return cb

        for i, (key, value, partition) in enumerate(records):
            placed.append(None)
            kwargs: dict[str, object] = {"key": key, "value": value, "on_delivery": on_delivery(i)}
            if partition is not None:
                kwargs["partition"] = partition
            if headers is not None and headers[i] is not None:
                kwargs["headers"] = headers[i]
            if timestamps_ms is not None and timestamps_ms[i] is not None:
                kwargs["timestamp"] = timestamps_ms[i]
            while True:
                try:
                    producer.produce(topic, **kwargs)
                    break
                except BufferError:  # the local queue is full: let deliveries drain
                    producer.poll(0.1)
            producer.poll(0)
        left = producer.flush(timeout)
        if left:
            errors.append(f"{left} record(s) undelivered after {timeout:.0f}s")
        if errors:
            raise BrokerError(f"producing to {topic!r} on {self.bootstrap}: " + "; ".join(errors[:5]))
        return [p for p in placed if p is not None]

    # -- lifecycle --------------------------------------------------------------------

    def _launch(self, timeout: float) -> None:
        classpath = jvm.classpath("kafka-broker")
        if not classpath:
            raise BrokerError("the Kafka broker's jars are not fetched: run `python -m memwal.jvm fetch kafka-broker` (make test/demo do)")
        t0 = time.monotonic()
        log = open(self.log, "ab")
        self.process = subprocess.Popen(
            [_java(), *HEAP_OPTS, *self.jvm_opts, "-Djava.awt.headless=true",
             "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-Dorg.slf4j.simpleLogger.showDateTime=true",
             "-cp", classpath, "kafka.Kafka", str(self.workdir / "server.properties")],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        log.close()
        with _live_lock:
            _live.add(self)
        deadline = t0 + timeout
        while True:
            if self.process.poll() is not None:
                raise BrokerError(f"the Kafka broker exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                # A TCP connect first: a Kafka client logs every refused connection to stderr.
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=5)
                self.start_seconds = time.monotonic() - t0
                return
            except (OSError, confluent_kafka.KafkaException):
                if time.monotonic() > deadline:
                    self.stop()
                    raise BrokerError(f"the Kafka broker did not answer on {self.bootstrap} within {timeout:.0f}s:\n{self.log_tail()}") from None
                time.sleep(0.1)

    def stop(self, grace: float = 10.0) -> None:
        """Stop the broker: SIGTERM (a controlled shutdown), SIGKILL after ``grace`` seconds."""
        proc = self.process
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            except ProcessLookupError:
                pass
        with _live_lock:
            _live.discard(self)

    def kill(self) -> None:
        """SIGKILL the broker (a crash, not a shutdown)."""
        proc = self.process
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        with _live_lock:
            _live.discard(self)

    def restart(self, timeout: float = 120.0, down_seconds: float = 0.0) -> None:
        """Stop the broker and start it again on the same ports and data."""
        self.stop()
        time.sleep(down_seconds)
        self._launch(timeout)

    def __enter__(self) -> "LocalBroker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(grace=5.0)


def start_local_broker(workdir: str | os.PathLike[str] | None = None, timeout: float = 120.0, *, fast_start: bool = True) -> LocalBroker:
    """Format KRaft storage in ``workdir`` (default: a new temporary directory) and start a
    broker on free ports of 127.0.0.1; returns once it answers metadata requests."""
    wd = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="memwal-kafka-"))
    wd.mkdir(parents=True, exist_ok=True)
    data = wd / "data"
    classpath = jvm.classpath("kafka-broker")
    if not classpath:
        raise BrokerError("the Kafka broker's jars are not fetched: run `python -m memwal.jvm fetch kafka-broker` (make test/demo do)")
    last: BrokerError | None = None
    for _attempt in range(3):  # a port taken between choosing and binding: choose again
        port, controller_port = free_port(), free_port()
        if port == controller_port:
            continue
        shutil.rmtree(data, ignore_errors=True)
        (wd / "server.properties").write_text(_server_properties(data, port, controller_port))
        # Kafka's cluster id: a UUID in URL-safe base64 (one starting with '-' would read as a flag)
        cluster_id = "m" + base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")[1:]
        fmt = subprocess.run(
            [_java(), *FAST_START_OPTS, "-cp", classpath, "kafka.tools.StorageTool", "format",
             "-t", cluster_id, "-c", str(wd / "server.properties")],
            capture_output=True, text=True, timeout=timeout,
        )
        if fmt.returncode != 0:
            raise BrokerError(f"formatting the broker's storage failed:\n{(fmt.stdout + fmt.stderr)[-3000:]}")
        broker = LocalBroker(f"127.0.0.1:{port}", wd, port, controller_port, FAST_START_OPTS if fast_start else ())
        try:
            broker._launch(timeout)
            return broker
        except BrokerError as e:
            last = e
            if "Address already in use" not in broker.log_tail(200):
                raise
    assert last is not None
    raise last
