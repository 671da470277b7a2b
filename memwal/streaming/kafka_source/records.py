"""The Kafka source's read side: the records ``[start, end)`` of one topic-partition as
Arrow record batches, through consumers kept per worker process.

Part of :mod:`memwal.streaming.kafka_source`, which ships alone (standard library and
third-party packages only, no other memwal module).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

# confluent_kafka's classes claim to live in a module "cimpl" that can not be
# imported, so cloudpickle can not pickle a reference to them.  When register()
# ships this package by value its globals are pickled too; referring to the classes
# through the (importable) confluent_kafka module keeps them out of the pickle.
import confluent_kafka
import numpy as np
import pyarrow as pa

from .settings import KAFKA_ARROW_SCHEMA, SHORT_NAME, Settings

# Java client ids for timestampType; librdkafka numbers them differently.
_TS_TYPE = {
    confluent_kafka.TIMESTAMP_CREATE_TIME: 0,
    confluent_kafka.TIMESTAMP_LOG_APPEND_TIME: 1,
}
_NO_TIMESTAMP_TYPE = -1

_ROWS_PER_ARROW_BATCH = 10_000


class KafkaReceiveError(RuntimeError):
    """A read task's consumer can not receive the broker's responses (librdkafka's
    ``_BAD_MSG``, e.g. a fetch response larger than ``receive.message.max.bytes``).

    Raised at the first such error rather than after ``kafkaConsumer.pollTimeoutMs``:
    librdkafka reconnects and repeats the same fetch, which gets the same response, so
    waiting can not help.
    """


class _ConsumerPool:
    """Consumers kept per worker process between read tasks.

    Creating a consumer (client, broker connections) costs tens of milliseconds, a large
    share of a small micro-batch. Idle consumers are closed after a while: they hold
    connections, and would keep retrying (and logging) forever once the broker is gone.
    Only effective when this package is imported on the workers (``register(...,
    ship_by_value=False)``): a copy shipped by value is unpickled afresh for every task.
    """

    IDLE_S = 3.0
    MAX_IDLE_PER_CONF = 4

    def __init__(self) -> None:
        self._idle: Dict[str, List[Tuple[float, Any, List[Any]]]] = {}
        self._lock = threading.Lock()
        self._reaper: Optional[threading.Thread] = None

    def __reduce__(self) -> Tuple[Any, Tuple[()]]:
        # A copy of this package shipped by value carries the module's globals, this pool among
        # them once the driver process has read (tests do): its lock, thread and consumers can
        # not be pickled, and the copy needs none of them. It gets an empty pool.
        return (_ConsumerPool, ())

    @staticmethod
    def _key(conf: Mapping[str, Any]) -> str:
        return json.dumps(conf, sort_keys=True, default=str)

    def take(self, conf: Dict[str, Any]) -> Tuple[Any, List[Any]]:
        """An idle consumer for ``conf`` (or a new one) and the list its ``error_cb``
        appends librdkafka's client errors to, emptied: errors of an earlier task are not
        this task's."""
        with self._lock:
            idle = self._idle.get(self._key(conf))
            if idle:
                _, consumer, errors = idle.pop()
                errors.clear()
                return consumer, errors
        errors: List[Any] = []
        # Without an error_cb librdkafka only logs connection-level errors; the read task
        # needs to see them to fail fast on those that retrying can not cure.
        return confluent_kafka.Consumer({**conf, "error_cb": errors.append}), errors

    def give_back(self, conf: Dict[str, Any], consumer: Any, errors: List[Any]) -> None:
        with self._lock:
            if self._reaper is None:
                self._reaper = threading.Thread(target=self._reap, name="memwal-kafka-reaper", daemon=True)
                self._reaper.start()
            idle = self._idle.setdefault(self._key(conf), [])
            if len(idle) < self.MAX_IDLE_PER_CONF:
                idle.append((time.monotonic(), consumer, errors))
                return
        consumer.close()

    def _reap(self) -> None:
        while True:
            time.sleep(self.IDLE_S / 2)
            expired = []
            with self._lock:
                now = time.monotonic()
                for key, idle in self._idle.items():
                    expired += [c for t, c, _ in idle if now - t >= self.IDLE_S]
                    self._idle[key] = [e for e in idle if now - e[0] < self.IDLE_S]
            for c in expired:
                c.close()


# Created on first use, in the worker: a module shipped by value must not carry a lock.
_POOL: Optional[_ConsumerPool] = None


def pool() -> _ConsumerPool:
    global _POOL
    if _POOL is None:
        _POOL = _ConsumerPool()
    return _POOL


#: Times a read task re-seeks an offset the broker called out of range while its log still
#: holds it (see read_range), before calling it data loss.
_OFFSET_RESET_RETRIES = 5


def read_range(s: Settings, topic: str, part: int, start: int, end: int
                ) -> Iterator[pa.RecordBatch]:
    conf = s.consumer_conf()
    consumer, errors = pool().take(conf)
    reusable = False
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, part, start)])
        rows = _Rows(topic, part)
        next_offset = start
        last_progress = time.monotonic()
        resets = 0
        while next_offset < end:
            msgs = consumer.consume(num_messages=min(end - next_offset, 5_000), timeout=1.0)
            _raise_receive_failure(errors, s, topic, part, next_offset)
            if not msgs:
                if time.monotonic() - last_progress > s.poll_timeout_s:
                    last = f"; last client error: {errors[-1].str()}" if errors else ""
                    raise TimeoutError(
                        f"{SHORT_NAME}: nothing received from {topic}:{part} at offset "
                        f"{next_offset} for {s.poll_timeout_s:.0f}s (range end {end}){last}")
                continue
            last_progress = time.monotonic()
            taken = rows.take_all(msgs, next_offset, end)
            if taken is not None:
                next_offset = taken
                msgs = ()  # all records, in order, inside the range: no per-record checks left
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                        # At the high watermark.  Short of the planned end only if the
                        # log was truncated after planning.
                        eof_at = msg.offset()
                        if eof_at is not None and eof_at < end and s.fail_on_data_loss:
                            raise RuntimeError(
                                f"{SHORT_NAME}: {topic}:{part} ends at {eof_at}, before "
                                f"the planned end {end}; data was lost")
                        next_offset = end
                        break
                    if err.code() == confluent_kafka.KafkaError._AUTO_OFFSET_RESET:
                        # A partition just created or just elected answers "out of range" for
                        # a while; the data is lost only if the offset is outside the log now.
                        low, high = consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, part), timeout=10, cached=False)
                        if low <= next_offset < high and resets < _OFFSET_RESET_RETRIES:
                            resets += 1
                            time.sleep(0.2 * resets)
                            consumer.seek(confluent_kafka.TopicPartition(topic, part, next_offset))
                            break
                        raise RuntimeError(
                            f"{SHORT_NAME}: offset {next_offset} of {topic}:{part} is no longer "
                            f"available ({err.str()}); data was lost. Set failOnDataLoss=false "
                            "to skip to the earliest available offset.")
                    if err.code() == confluent_kafka.KafkaError._BAD_MSG:
                        # The same failure, seen by a request (FindCoordinator, Fetch) on the
                        # dropped connection, may come before the error_cb's report of it.
                        errors.append(err)
                        _raise_receive_failure(errors, s, topic, part, next_offset)
                    raise confluent_kafka.KafkaException(err)
                off = msg.offset()
                if off is None:  # only error events lack an offset
                    continue
                if off >= end:
                    # Past the range (compaction or transaction markers can leave the
                    # last planned offset without a record).
                    next_offset = end
                    break
                if off < next_offset:
                    continue  # never emit a record twice
                rows.add(msg)
                next_offset = off + 1
            if len(rows) >= _ROWS_PER_ARROW_BATCH:
                yield rows.flush()
        if len(rows):
            yield rows.flush()
        reusable = True
    finally:
        if reusable:
            # unassign() drops anything prefetched, so the next task starts clean.
            consumer.unassign()
            pool().give_back(conf, consumer, errors)
        else:
            consumer.close()


def _raise_receive_failure(errors: List[Any], s: Settings, topic: str, part: int, offset: int) -> None:
    """Raise :class:`KafkaReceiveError` if the consumer reported a response it could not
    receive. Other client errors (a broker down, a refused connection) are transient:
    librdkafka retries them, and the poll timeout bounds the wait."""
    bad = next((e for e in errors if e.code() == confluent_kafka.KafkaError._BAD_MSG), None)
    if bad is None:
        return
    limit = s.kafka_conf.get("receive.message.max.bytes", "100000000 (librdkafka's default)")
    raise KafkaReceiveError(
        f"{SHORT_NAME}: can not receive {topic}:{part} from offset {offset}: {bad.str()}. "
        f"The broker answered a fetch with more than receive.message.max.bytes = {limit}; a broker "
        "that ignores fetch sizes (noida-db) sends everything from the offset to the end of the log. "
        "Raise the option kafka.receive.message.max.bytes (at most 2147483647) or use a broker that "
        "honours fetch.max.bytes.")


class _Rows:
    """Column buffers for one topic-partition, turned into Arrow record batches.

    Only the messages are kept until :meth:`flush`, which reads each attribute of all of them
    with one list comprehension and converts whole columns at once: per record, a handful of
    C calls instead of a Python method call, a dict look-up and five appends (the source's
    share of a catch-up micro-batch, bench/decode.py)."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self._clear()

    def _clear(self) -> None:
        self.msgs: List[Any] = []
        self.offsets: List[int] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, msg: Any) -> None:
        self.msgs.append(msg)
        self.offsets.append(msg.offset())

    def take_all(self, msgs: List[Any], next_offset: int, end: int) -> Optional[int]:
        """Add every one of ``msgs`` and return the next offset, if they are all records
        (no error events) with increasing offsets from ``next_offset`` on and below ``end``
        (the common case: a consume() inside the range); else add nothing and return None,
        and the caller checks them one by one."""
        if not msgs:
            return None
        # `is not None`, not list.count(None): KafkaError's == against None raises inside C
        if any(m.error() is not None for m in msgs):
            return None
        offs = [m.offset() for m in msgs]
        if offs[0] < next_offset or offs[-1] >= end:
            return None
        if len(offs) > 1 and not bool((np.diff(np.asarray(offs, dtype=np.int64)) > 0).all()):
            return None
        self.msgs.extend(msgs)
        self.offsets.extend(offs)
        return offs[-1] + 1

    def flush(self) -> pa.RecordBatch:
        msgs, n = self.msgs, len(self.offsets)
        stamps = [m.timestamp() for m in msgs]
        types = np.array([t for t, _ in stamps], dtype=np.int64)
        kinds = np.full(n, _NO_TIMESTAMP_TYPE, dtype=np.int32)
        for librdkafka_type, kind in _TS_TYPE.items():
            kinds[types == librdkafka_type] = kind
        ms = np.zeros(n, dtype=np.int64)
        known = kinds != _NO_TIMESTAMP_TYPE
        if known.any():
            ms[known] = np.array([v for _, v in stamps], dtype=np.int64)[known]
        # TIMESTAMP_NOT_AVAILABLE (pre-0.10 message format): a null timestamp
        timestamps = pa.array(ms * 1000, pa.timestamp("us", tz="UTC"), mask=kinds == _NO_TIMESTAMP_TYPE)
        topic = self.topic.encode()
        batch = pa.RecordBatch.from_arrays([
            pa.array([m.key() for m in msgs], pa.binary()),
            pa.array([m.value() for m in msgs], pa.binary()),
            # n copies of the topic, built as one buffer rather than n Python strings
            pa.StringArray.from_buffers(n, pa.py_buffer(np.arange(n + 1, dtype=np.int32) * len(topic)), pa.py_buffer(topic * n)),
            pa.array(np.full(n, self.partition, dtype=np.int32), pa.int32()),
            pa.array(np.asarray(self.offsets, dtype=np.int64), pa.int64()),
            timestamps,
            pa.array(kinds, pa.int32()),
        ], schema=KAFKA_ARROW_SCHEMA)
        self._clear()
        return batch
