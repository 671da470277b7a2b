"""A Kafka-protocol broker on 127.0.0.1 for demos and local development (noida-db).

noida-db is a single-binary Kafka-protocol server from PyPI (``pip install noida-db==0.2.3``,
also in memwal's ``test`` extra);
it starts in well under a second and needs no Java. It is not a production broker.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import confluent_kafka
from confluent_kafka.admin import AdminClient, NewTopic

from memwal.errors import MemwalError


def noida_executable() -> Path:
    """The noida-db server binary of the installed ``noida-db`` package."""
    try:
        import noida_db  # type: ignore[import-not-found]
    except ImportError:
        raise MemwalError("noida-db is not installed: pip install noida-db==0.2.3 (or memwal's test extra: pip install 'memwal[test]')") from None
    exe = Path(noida_db.__file__).parent / "noida-db"
    if not exe.is_file():
        raise MemwalError(f"the noida-db package has no server binary at {exe}")
    exe.chmod(0o755)
    return exe


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LocalBroker:
    """A running noida-db process; use :func:`start_local_broker`."""

    bootstrap: str
    workdir: Path
    process: subprocess.Popen = field(repr=False)

    def create_topic(self, name: str, partitions: int, timeout: float = 30.0) -> None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for f in admin.create_topics([NewTopic(name, partitions, replication_factor=1)]).values():
            f.result(timeout)

    def produce(self, topic: str, records: Iterable[tuple[bytes | None, bytes | None, int | None]]) -> int:
        """Produce (key, value, partition) records; returns how many were delivered."""
        producer = confluent_kafka.Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5})
        failed: list[str] = []
        n = 0

        def on_delivery(err, _msg) -> None:
            if err is not None:
                failed.append(str(err))

        for key, value, partition in records:
            kwargs = {"partition": partition} if partition is not None else {}
            while True:
                try:
                    producer.produce(topic, value=value, key=key, on_delivery=on_delivery, **kwargs)
                    break
                except BufferError:
                    producer.poll(0.1)
            n += 1
        producer.flush(60)
        if failed:
            raise MemwalError(f"{len(failed)} record(s) were not delivered, first: {failed[0]}")
        return n

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def __enter__(self) -> "LocalBroker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_local_broker(workdir: str | None = None, timeout: float = 30.0) -> LocalBroker:
    """Start noida-db on a free port of 127.0.0.1 and wait until it answers metadata requests."""
    wd = Path(workdir or tempfile.mkdtemp(prefix="memwal-broker-"))
    (wd / "data").mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = open(wd / "noida.log", "ab")
    proc = subprocess.Popen(
        [str(noida_executable()), "start", "--data-dir", str(wd / "data"), "--host", "127.0.0.1",
         "--only", "kafka", "--kafka-port", str(port)],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    broker = LocalBroker(f"127.0.0.1:{port}", wd, proc)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise MemwalError(f"noida-db exited with {proc.returncode}; see {wd / 'noida.log'}")
        try:
            AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=1)
            return broker
        except confluent_kafka.KafkaException:
            if time.monotonic() > deadline:
                broker.stop()
                raise MemwalError(f"noida-db did not answer on {broker.bootstrap} within {timeout}s") from None
            time.sleep(0.1)
