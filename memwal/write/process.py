"""A per-executor writer process: one process owns the shard writers of every Python worker
of an executor, so a write task moving to another worker does not claim its shards again.

Spark hands successive write tasks to whichever Python worker process is free. Each worker
has its own :data:`~memwal.write.worker.WORKER` cache, so a shard written by another
worker than last time is claimed again (the writer epoch rises, its WAL is replayed) and
fences the previous worker's writer (a fenced retry when that one writes next), and two tasks
running at once in two workers would fence each other on every write. Instead a task sends
its shards' records to the executor's writer process over a local Unix socket, which runs
exactly the in-process write (:meth:`WriteRequest.run <memwal.write.worker.WriteRequest.run>`)
against its own cache: the executor's shard writers are resident there, shared by its tasks.

Invariants, and why they hold:

- **One writer process per socket key.** The key is the user id and a hash of what makes
  writes identical: the Python executable, the memwal package directory and version, and
  the environment memwal and the object stores read (``MEMWAL_*``, failpoints, storage
  credentials, ``SPARK_LOCAL_DIRS``), so different code or environments never share one. A
  client that finds nobody listening starts the server under an exclusive ``fcntl`` lock on
  a file beside the socket and re-checks under it, so two tasks never start two servers.
- **An acknowledged write is durable exactly as an in-worker write:** the response is sent
  only after ``WriteRequest.run`` returned, which returns after the shards' WAL writes (and the
  WAL is what makes a write durable, in the worker or here).
- **Errors keep their class.** A failed write answers with the pickled exception, raised
  again in the task (a :class:`~memwal.core.errors.FencedError` stays one), its server-side
  traceback attached as a note.
- **A dead writer process loses nothing acknowledged.** A request whose connection ends
  without an answer fails its task with :class:`~memwal.core.errors.WriterProcessError`; Spark's
  retry finds nobody listening and starts a new server, whose first write claims the shards
  (fencing whatever the dead one left) and replays their WALs, as after a worker's death.
  Rows the dead process may have written before dying are rewritten by the retried task:
  the sink's writes are idempotent per micro-batch.
- **Idle exit never drops a request.** After ``idle_exit_seconds`` without requests the
  server removes its socket path (new clients then start a new server), answers every
  connection already queued with "closing" (those clients retry, a write not begun), flushes
  its writers (so eventual readers see the last writes) and exits.
- **It does not outlive its clients.** Every wait is bounded: a handler gives a silent client
  ``REQUEST_READ_SECONDS``, and when every running request's client process has been gone for
  ``orphan_exit_seconds`` the process exits at once (nothing it could still do reaches
  anyone; what it acknowledged is in the WAL). So a request stuck behind a killed test's
  failpoint or a dead store cannot keep it alive, and its idle exit follows.
- **MemTables seal on time without writes.** A sweeper thread flushes a shard whose timed seal
  is overdue (:meth:`ShardWriterPool.seal_overdue`: its writes stopped before a write could
  seal it), so eventual readers see every write within a few seal intervals.

Requests are trusted: they unpickle a :class:`~memwal.write.worker.WriteRequest`. The socket
lives in a directory only its user can enter (mode 0700, owner checked), so only the user
that runs the executor can reach it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import pickle
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from memwal.core.errors import WriterProcessError
from memwal.core.storage import StorageConfig
from memwal.write.messages import FULL, ShardWriteResult, WriteMode
from memwal.write.protocol import ShardRecords
from memwal.write.wire import records_from_payload, records_payload
from memwal.write.worker import WORKER, WriteRequest

log = logging.getLogger("memwal.write.process")

#: Seconds without requests after which a writer process exits.
IDLE_EXIT_SECONDS = 300.0
#: Overrides the idle exit of servers this environment starts (tests).
IDLE_ENV = "MEMWAL_WRITER_PROCESS_IDLE_SECONDS"
#: A running request whose client has been gone this long ends the process (see
#: :meth:`WriterProcessServer._orphaned`).
ORPHAN_EXIT_SECONDS = 30.0
#: Overrides it for servers this environment starts (tests).
ORPHAN_ENV = "MEMWAL_WRITER_PROCESS_ORPHAN_SECONDS"
#: How long a handler waits for the request of a client that connected.
REQUEST_READ_SECONDS = 60.0
#: Overrides the directory of the sockets (default: a per-user directory in the temporary directory).
DIR_ENV = "MEMWAL_WRITER_PROCESS_DIR"
#: How long a client waits for a server it started to listen (it imports Lance first: slow
#: on a loaded machine).
START_SECONDS = 60.0

#: Environment variables whose values change what a write does or where it goes.
_KEY_PREFIXES = ("MEMWAL_", "AWS_", "AZURE_", "GOOGLE_", "LANCE_", "OBJECT_STORE_")
_KEY_NAMES = ("SPARK_LOCAL_DIRS", "SPARK_EXECUTOR_ID", "PYSPARK_PYTHON")

_OK, _ERROR, _CLOSING = b"O", b"E", b"C"
_LEN = struct.Struct("!Q")


@dataclass(frozen=True)
class Endpoint:
    """Where one writer process listens: ``socket``, with its start lock, pid file and log beside it."""

    socket: Path

    @property
    def lock(self) -> Path:
        return self.socket.with_suffix(".lock")

    @property
    def pid_file(self) -> Path:
        return self.socket.with_suffix(".pid")

    @property
    def log_file(self) -> Path:
        return self.socket.with_suffix(".log")

    @classmethod
    def for_environment(cls, directory: str | os.PathLike[str] | None = None, environ: dict[str, str] | None = None) -> "Endpoint":
        """This process's endpoint: in ``directory`` (default: a per-user directory in the
        temporary directory), named by the hash of this code and environment."""
        import memwal

        env = os.environ if environ is None else environ
        parts = [sys.executable, str(Path(memwal.__file__).resolve().parent), memwal.__version__]
        parts += sorted(f"{k}={v}" for k, v in env.items() if k.startswith(_KEY_PREFIXES) or k in _KEY_NAMES)
        digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
        # Short: a Unix socket path is limited to ~107 bytes.
        directory = directory if directory is not None else env.get(DIR_ENV)
        base = Path(directory) if directory else Path(tempfile.gettempdir()) / f"memwal-wp-{os.getuid()}"
        return cls(_private_dir(base) / f"{digest}.sock")


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise WriterProcessError(f"{path} must belong to this user and be private (mode 0700) to hold writer process sockets")
    return path


# -- wire format: length-prefixed frames -------------------------------------------------


def _send(sock: socket.socket, *frames: bytes | pa.Buffer) -> None:
    """Length-prefixed frames, each sent from its own memory (a payload is not copied)."""
    for frame in frames:
        view = memoryview(frame)
        sock.sendall(_LEN.pack(view.nbytes))
        if view.nbytes:
            sock.sendall(view)


def _recv_exact(sock: socket.socket, n: int) -> pa.Buffer | None:
    # Into a buffer Arrow allocated (64-byte aligned): the IPC frames are read from it without a
    # copy, and Lance refuses arrays whose memory is not aligned for their type (a bytearray's is not).
    buf = pa.allocate_buffer(n)
    view = memoryview(buf).cast("B")
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], min(n - got, 1 << 22))
        if not k:
            return None
        got += k
    return buf


def _recv(sock: socket.socket) -> pa.Buffer | None:
    head = _recv_exact(sock, _LEN.size)
    if head is None:
        return None
    return _recv_exact(sock, _LEN.unpack(head)[0])


# -- the client (in the write task) ------------------------------------------------------


class WriterProcessClient:
    """Sends shard writes to the writer process of ``endpoint``, starting it when nobody listens."""

    def __init__(self, endpoint: Endpoint | None = None, idle_exit_seconds: float | None = None) -> None:
        self.endpoint = endpoint or Endpoint.for_environment()
        self.idle_exit_seconds = idle_exit_seconds

    def write(self, request: WriteRequest, records: Sequence[ShardRecords]) -> list[ShardWriteResult]:
        """``request.run(records)``, run by the writer process (the shards in parallel there).
        Each shard's records travel as one Arrow IPC frame, sent from the buffer they were
        written into."""
        if not records:
            return []
        shards = [(r.shard_id, r.values) for r in records]
        frames = [records_payload(r) for r in records]
        return self._call(("write", request, shards), frames, f"a write of shard(s) {', '.join(r.shard_id for r in records)}")

    def flush(self, request: WriteRequest, shard_ids: Sequence[str] | None = None) -> None:
        """``request.flush(shard_ids)`` in the writer process: its open writers of the table flush."""
        self._call(("flush", request, None if shard_ids is None else list(shard_ids)), [], "a flush")

    def warm(self, request: WriteRequest) -> None:
        """Start the writer process if nobody listens, and have it load the table: a task does
        this while it reads its first records, so its first write does not wait for either."""
        self._call(("warm", request, None), [], "a warm-up")

    def _call(self, header: tuple[Any, ...], frames: list[pa.Buffer], what: str) -> Any:
        request = (pickle.dumps(header), *frames)
        # A server exiting idle answers "closing" to what it had queued: such a request was
        # not begun, so sending it again (to the next server) is the same request once.
        for _ in range(5):
            sock = self._connect()
            try:
                _send(sock, *request)
                status = _recv(sock)
                reply = _recv(sock) if status in (_OK, _ERROR) else None
            except OSError as e:
                raise WriterProcessError(f"writer process at {self.endpoint.socket} failed during {what}: {e}") from e
            finally:
                sock.close()
            if status == _CLOSING:
                continue
            if status is None or reply is None:
                raise WriterProcessError(f"writer process at {self.endpoint.socket} died during {what} (log: {self.endpoint.log_file})")
            if status == _ERROR:
                raise pickle.loads(reply)
            return pickle.loads(reply)
        raise WriterProcessError(f"writer process at {self.endpoint.socket} kept closing")

    def _try_connect(self) -> socket.socket | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(self.endpoint.socket))
            return sock
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            return None

    def _connect(self) -> socket.socket:
        sock = self._try_connect()
        if sock is not None:
            return sock
        ep = self.endpoint
        with open(ep.lock, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                sock = self._try_connect()  # another task may have started it meanwhile
                if sock is not None:
                    return sock
                return self._start()
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _start(self) -> socket.socket:
        """Start the server (under the lock) and connect to it once it listens."""
        ep = self.endpoint
        ep.socket.unlink(missing_ok=True)  # a dead server's, nobody listens on it
        env = dict(os.environ)
        # The server imports this very memwal, wherever the worker found it.
        pkg_parent = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join([pkg_parent, *filter(None, [env.get("PYTHONPATH")])])
        cmd = [sys.executable, "-m", "memwal.write.process", "--socket", str(ep.socket)]
        if self.idle_exit_seconds is not None:
            cmd += ["--idle-exit-seconds", str(self.idle_exit_seconds)]
        with open(ep.log_file, "ab") as out:
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    start_new_session=True, close_fds=True)
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            sock = self._try_connect()
            if sock is not None:
                return sock
            if proc.poll() is not None:
                raise WriterProcessError(f"writer process exited with {proc.returncode} before listening (log: {ep.log_file})")
            time.sleep(0.02)
        raise WriterProcessError(f"writer process did not listen within {START_SECONDS:.0f} s (log: {ep.log_file})")


@dataclass(frozen=True)
class ProcessShards:
    """Shard writes run by the executor's writer process (a
    :class:`~memwal.write.api.ShardWrites`): what a Spark task writes through."""

    uri: str
    #: None: the writer process's own environment.
    storage: StorageConfig | None = None
    durability: str | None = None
    seal_interval_seconds: float | None = None
    #: Seconds without writes after which a writer process this starts exits (None: its default).
    idle_exit_seconds: float | None = None

    def write(self, records: Sequence[ShardRecords], mode: WriteMode = FULL, *, label: str = "") -> list[ShardWriteResult]:
        request = WriteRequest(self.uri, self.storage, mode, self.durability, self.seal_interval_seconds, label)
        return client(self.idle_exit_seconds).write(request, records)

    def flush(self, shard_ids: list[str] | None = None) -> None:
        client(self.idle_exit_seconds).flush(WriteRequest(self.uri, self.storage), shard_ids)

    def warm(self) -> None:
        client(self.idle_exit_seconds).warm(WriteRequest(self.uri, self.storage))


_clients: dict[tuple[Endpoint, float | None], WriterProcessClient] = {}


def client(idle_exit_seconds: float | None = None) -> WriterProcessClient:
    """This worker's client of its executor's writer process."""
    ep = Endpoint.for_environment()
    key = (ep, idle_exit_seconds)
    c = _clients.get(key)
    if c is None:
        c = _clients[key] = WriterProcessClient(ep, idle_exit_seconds)
    return c


# -- the server ----------------------------------------------------------------------------


class WriterProcessServer:
    """Serves shard writes on ``endpoint``'s socket, one thread per connection (Lance releases
    the GIL while it writes), until ``idle_exit_seconds`` pass without a request."""

    def __init__(self, endpoint: Endpoint, idle_exit_seconds: float = IDLE_EXIT_SECONDS,
                 orphan_exit_seconds: float = ORPHAN_EXIT_SECONDS) -> None:
        self.endpoint = endpoint
        self.idle_exit_seconds = idle_exit_seconds
        self.orphan_exit_seconds = orphan_exit_seconds
        self._active = 0
        self._last = time.monotonic()
        self._lock = threading.Lock()
        #: Handler thread -> (the pid of its client, when its request began).
        self._peers: dict[int, tuple[int | None, float]] = {}
        #: Since when every running request's client has been gone (None: not so).
        self._orphaned_since: float | None = None
        self._stopping = threading.Event()

    def serve(self) -> None:
        ep = self.endpoint
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(ep.socket))
        inode = ep.socket.stat().st_ino
        listener.listen(64)
        ep.pid_file.write_text(str(os.getpid()))
        log.info("writer process %d listening on %s (idle exit %.0f s)", os.getpid(), ep.socket, self.idle_exit_seconds)
        listener.settimeout(0.5)
        try:
            threading.Thread(target=self._sweep, name="memwal-sweep", daemon=True).start()
            while not self._idle():
                if self._orphaned():
                    os._exit(0)
                try:
                    conn, _ = listener.accept()
                except socket.timeout:
                    continue
                conn.settimeout(None)
                with self._lock:
                    self._active += 1
                threading.Thread(target=self._handle, args=(conn,), daemon=True).start()
        finally:
            # Remove the path first (new clients start a new server), then answer what was
            # already queued: no connection is left without an answer.
            try:
                if ep.socket.stat().st_ino == inode:
                    ep.socket.unlink()
            except FileNotFoundError:
                pass
            listener.setblocking(False)
            while True:
                try:
                    conn, _ = listener.accept()
                except (BlockingIOError, OSError):
                    break
                try:
                    conn.setblocking(True)
                    _send(conn, _CLOSING)
                finally:
                    conn.close()
            listener.close()
            self._stopping.set()
            WORKER.clear(reopen_fenced=False)  # flush: eventual readers see the last writes
            try:
                if ep.pid_file.read_text() == str(os.getpid()):
                    ep.pid_file.unlink()
            except FileNotFoundError:
                pass
            log.info("writer process %d exits after %.0f s idle", os.getpid(), self.idle_exit_seconds)

    def _sweep(self) -> None:
        """Flush the shards whose timed seal is overdue, about every second."""
        while not self._stopping.wait(1.0):
            try:
                WORKER.flush_overdue()
            except Exception:  # noqa: BLE001 - a failed flush is retried next time; writes report their own errors
                log.exception("flushing overdue shards failed")

    def _idle(self) -> bool:
        with self._lock:
            return self._active == 0 and time.monotonic() - self._last >= self.idle_exit_seconds

    def _orphaned(self) -> bool:
        """Whether every running request has lost its client for ``orphan_exit_seconds``.

        Such a request can deliver nothing (its task is gone and Spark runs it again), and a
        thread cannot be stopped from outside: one that waits on something that never comes
        (a stalled store, a failpoint a killed test armed) would keep the process alive, its
        idle exit never due. Exiting then is the crash the writer's design already survives:
        every acknowledged write is in the WAL, and the next writer replays it."""
        now = time.monotonic()
        with self._lock:
            peers = list(self._peers.values())
        if not peers or any(pid is None or _alive(pid) for pid, _ in peers):
            self._orphaned_since = None
            return False
        if self._orphaned_since is None:
            self._orphaned_since = now
        if now - self._orphaned_since < self.orphan_exit_seconds:
            return False
        log.warning("writer process %d: the clients of its %d running request(s) are gone; exiting", os.getpid(), len(peers))
        return True

    def _handle(self, conn: socket.socket) -> None:
        try:
            # A client sends its request right after connecting: one that stays silent this long
            # is gone (killed between connect and send), and its handler must not wait forever.
            conn.settimeout(REQUEST_READ_SECONDS)
            header = _recv(conn)
            if header is None:
                return
            kind, request, arg = pickle.loads(header)
            # A write carries a frame per shard; a JVM client's Kafka records, one.
            count = len(arg) if kind == "write" else 1 if kind == "kafka" else 0
            frames = [_recv(conn) for _ in range(count)]
            if any(f is None for f in frames):
                return
            conn.settimeout(None)
            with self._lock:
                self._peers[threading.get_ident()] = (_peer_pid(conn), time.monotonic())
            try:
                if kind == "write":
                    result: Any = request.run([records_from_payload(sid, tuple(values), frame)
                                               for (sid, values), frame in zip(arg, frames)])
                elif kind == "flush":
                    result = request.flush(arg)
                elif kind == "warm":
                    result = WORKER.table(request.uri, request.storage) and None
                elif kind == "kafka":  # a JVM client (memwal.streaming.realtime): answers in text
                    result = request.run(frames[0])
                else:
                    raise WriterProcessError(f"unknown request {kind!r}")
                reply = (_OK, json.dumps(result).encode() if kind == "kafka" else pickle.dumps(result))
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as e:  # noqa: BLE001 - every error goes back to the task; a panic in Lance's Rust code is a BaseException (pyo3's)
                log.warning("%s failed: %s", "request", "".join(traceback.format_exception(e)).rstrip())
                reply = (_ERROR, f"{type(e).__name__}: {e}".encode() if kind == "kafka" else _pickled_error(e))
            _send(conn, *reply)
        except OSError as e:  # the task went away (killed, cancelled): its write is retried
            log.warning("connection lost: %s", e)
        finally:
            conn.close()
            with self._lock:
                self._peers.pop(threading.get_ident(), None)
                self._active -= 1
                self._last = time.monotonic()


def _peer_pid(conn: socket.socket) -> int | None:
    """The pid of the process at the other end of a Unix socket (Linux), or None."""
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return struct.unpack("3i", creds)[0] or None
    except (OSError, AttributeError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pickled_error(e: BaseException) -> bytes:
    e.add_note(f"(raised in writer process {os.getpid()}:\n{''.join(traceback.format_exception(e)).rstrip()})")
    try:
        data = pickle.dumps(e)
        pickle.loads(data)  # some foreign errors pickle but do not unpickle
        return data
    except Exception:  # noqa: BLE001 - a foreign error that does not travel keeps its text
        return pickle.dumps(WriterProcessError(f"{type(e).__name__}: {e}"))


def ensure_command(endpoint: Endpoint) -> list[str]:
    """A command that starts ``endpoint``'s writer process unless one listens, and returns once
    one does (for clients that are not Python: the JVM's real-time writer)."""
    return [sys.executable, "-m", "memwal.write.process", "--socket", str(endpoint.socket), "--ensure"]


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m memwal.write.process", description="memwal's per-executor writer process")
    p.add_argument("--socket", required=True)
    p.add_argument("--idle-exit-seconds", type=float, default=float(os.environ.get(IDLE_ENV, IDLE_EXIT_SECONDS)))
    p.add_argument("--ensure", action="store_true", help="start the process unless one listens on --socket, then exit")
    args = p.parse_args(argv)
    if args.ensure:
        _private_dir(Path(args.socket).parent)
        WriterProcessClient(Endpoint(Path(args.socket)))._connect().close()
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")
    orphan = float(os.environ.get(ORPHAN_ENV, ORPHAN_EXIT_SECONDS))
    WriterProcessServer(Endpoint(Path(args.socket)), args.idle_exit_seconds, orphan).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
