"""A per-executor writer process: one process owns the shard writers of every Python worker
of an executor, so a write task moving to another worker does not claim its shards again.

Spark hands successive write tasks to whichever Python worker process is free. Each worker
has its own :data:`~memwal.streaming.worker.WORKER` cache, so a shard written by another
worker than last time is claimed again (the writer epoch rises, its WAL is replayed) and
fences the previous worker's writer (a fenced retry when that one writes next). With
``SinkOptions(writer_process=True)`` the write task instead sends each shard's rows to the
executor's writer process over a local Unix socket, which runs exactly the in-worker write
(:meth:`ShardJob.run <memwal.streaming.worker.ShardJob.run>`) against its own cache.

Invariants, and why they hold:

- **One writer process per socket key.** The key is the user id and a hash of what makes
  writes identical: the Python executable, the memwal package directory and version, and
  the environment memwal and the object stores read (``MEMWAL_*``, failpoints, storage
  credentials, ``SPARK_LOCAL_DIRS``), so different code or environments never share one. A
  client that finds nobody listening starts the server under an exclusive ``fcntl`` lock on
  a file beside the socket and re-checks under it, so two tasks never start two servers.
- **An acknowledged write is durable exactly as an in-worker write:** the response is sent
  only after ``ShardJob.run`` returned, which returns after the shard's WAL write (and the
  WAL is what makes a write durable, in the worker or here).
- **Errors keep their class.** A failed write answers with the pickled exception, raised
  again in the task (a :class:`~memwal.errors.FencedError` stays one), its server-side
  traceback attached as a note.
- **A dead writer process loses nothing acknowledged.** A request whose connection ends
  without an answer fails its task with :class:`~memwal.errors.WriterProcessError`; Spark's
  retry finds nobody listening and starts a new server, whose first write claims the shards
  (fencing whatever the dead one left) and replays their WALs, as after a worker's death.
  Rows the dead process may have written before dying are rewritten by the retried task:
  the sink's writes are idempotent per micro-batch.
- **Idle exit never drops a request.** After ``idle_exit_seconds`` without requests the
  server removes its socket path (new clients then start a new server), answers every
  connection already queued with "closing" (those clients retry, a write not begun), and
  exits. Nothing needs flushing: the WAL is durable and the next writer replays it.

Requests are trusted: they unpickle a :class:`~memwal.streaming.worker.ShardJob`. The socket
lives in a directory only its user can enter (mode 0700, owner checked), so only the user
that runs the executor can reach it.
"""

from __future__ import annotations

import fcntl
import hashlib
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
from dataclasses import dataclass
from pathlib import Path
import pyarrow as pa

from memwal.errors import WriterProcessError
from memwal.sharding import ShardValues
from memwal.streaming.worker import ShardJob

log = logging.getLogger("memwal.streaming.writer_process")

#: Seconds without requests after which a writer process exits.
IDLE_EXIT_SECONDS = 300.0
#: Overrides the idle exit of servers this environment starts (tests).
IDLE_ENV = "MEMWAL_WRITER_PROCESS_IDLE_SECONDS"
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


def _send(sock: socket.socket, *frames: bytes) -> None:
    sock.sendall(b"".join(_LEN.pack(len(f)) + f for f in frames))


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _recv(sock: socket.socket) -> bytes | None:
    head = _recv_exact(sock, _LEN.size)
    if head is None:
        return None
    return _recv_exact(sock, _LEN.unpack(head)[0])


def _ipc(data: pa.Table | pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema) as w:
        w.write(data)
    return sink.getvalue().to_pybytes()


def _from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


# -- the client (in the write task) ------------------------------------------------------


class WriterProcessClient:
    """Sends shard writes to the writer process of ``endpoint``, starting it when nobody listens."""

    def __init__(self, endpoint: Endpoint | None = None, idle_exit_seconds: float | None = None) -> None:
        self.endpoint = endpoint or Endpoint.for_environment()
        self.idle_exit_seconds = idle_exit_seconds

    def write_shard(self, job: ShardJob, shard_id: str, values: ShardValues, rows: pa.Table) -> pa.RecordBatch:
        """``job.run(shard_id, values, rows)``, run by the writer process."""
        request = (pickle.dumps((job, shard_id, values)), _ipc(rows))
        # A server exiting idle answers "closing" to what it had queued: such a request was
        # not begun, so sending it again (to the next server) is the same request once.
        for _ in range(5):
            sock = self._connect()
            try:
                _send(sock, *request)
                status = _recv(sock)
                body = _recv(sock) if status in (_OK, _ERROR) else None
            except OSError as e:
                raise WriterProcessError(f"writer process at {self.endpoint.socket} failed during a write of shard {shard_id}: {e}") from e
            finally:
                sock.close()
            if status == _CLOSING:
                continue
            if status is None or body is None:
                raise WriterProcessError(f"writer process at {self.endpoint.socket} died during a write of shard {shard_id} "
                                         f"(log: {self.endpoint.log_file})")
            if status == _ERROR:
                raise pickle.loads(body)
            return _from_ipc(body).to_batches()[0]
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
        cmd = [sys.executable, "-m", "memwal.streaming.writer_process", "--socket", str(ep.socket)]
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

    def __init__(self, endpoint: Endpoint, idle_exit_seconds: float = IDLE_EXIT_SECONDS) -> None:
        self.endpoint = endpoint
        self.idle_exit_seconds = idle_exit_seconds
        self._active = 0
        self._last = time.monotonic()
        self._lock = threading.Lock()

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
            while not self._idle():
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
            try:
                if ep.pid_file.read_text() == str(os.getpid()):
                    ep.pid_file.unlink()
            except FileNotFoundError:
                pass
            log.info("writer process %d exits after %.0f s idle", os.getpid(), self.idle_exit_seconds)

    def _idle(self) -> bool:
        with self._lock:
            return self._active == 0 and time.monotonic() - self._last >= self.idle_exit_seconds

    def _handle(self, conn: socket.socket) -> None:
        try:
            header, body = _recv(conn), _recv(conn)
            if header is None or body is None:
                return
            try:
                job, shard_id, values = pickle.loads(header)
                summary = job.run(shard_id, values, _from_ipc(body))
                reply = (_OK, _ipc(summary))
            except Exception as e:  # noqa: BLE001 - every error goes back to the task
                log.warning("write failed: %s", "".join(traceback.format_exception(e)).rstrip())
                reply = (_ERROR, _pickled_error(e))
            _send(conn, *reply)
        except OSError as e:  # the task went away (killed, cancelled): its write is retried
            log.warning("connection lost: %s", e)
        finally:
            conn.close()
            with self._lock:
                self._active -= 1
                self._last = time.monotonic()


def _pickled_error(e: Exception) -> bytes:
    e.add_note(f"(raised in writer process {os.getpid()}:\n{''.join(traceback.format_exception(e)).rstrip()})")
    try:
        data = pickle.dumps(e)
        pickle.loads(data)  # some foreign errors pickle but do not unpickle
        return data
    except Exception:  # noqa: BLE001 - a foreign error that does not travel keeps its text
        return pickle.dumps(WriterProcessError(f"{type(e).__name__}: {e}"))


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m memwal.streaming.writer_process", description="memwal's per-executor writer process")
    p.add_argument("--socket", required=True)
    p.add_argument("--idle-exit-seconds", type=float, default=float(os.environ.get(IDLE_ENV, IDLE_EXIT_SECONDS)))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")
    WriterProcessServer(Endpoint(Path(args.socket)), args.idle_exit_seconds).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
