"""A fault-injecting HTTP proxy on 127.0.0.1 in front of an S3 API (moto in the tests).

Clients (Lance's object_store, memwal's obstore FileIO) are pointed at the proxy's endpoint
instead of moto's; the proxy forwards each request to moto and, when a rule matches, injects
a fault instead of (or after) forwarding it:

- ``status``: an S3 error response, e.g. 503 ``SlowDown`` or 500 ``InternalError``, without
  forwarding (the store did nothing), as S3 answers when it sheds load;
- ``conflict``: 409 ``ConditionalRequestConflict``, what real S3 answers a conditional PUT
  while another conditional write of the same key is in flight (moto never does);
- ``reset``: the connection is reset (RST) instead of answering; with ``after_forward`` the
  request is applied by the store first and only its answer is lost, the ambiguous case;
- ``delay``: a latency spike of ``seconds`` before forwarding;
- ``hang``: no answer for ``seconds`` (longer than the client's timeout), then a reset.

Rules match by method, a regular expression on the URL path, and whether the request is a
conditional write (``If-None-Match``/``If-Match``); each fires with a probability, after
``skip`` matches, at most ``times`` times. Everything the proxy did is counted
(:attr:`FaultProxy.stats`), so a test can assert that a fault really happened and how often
the client came back (its retries).

Plain threads and sockets, no dependencies: one thread per client connection, one kept-alive
upstream connection per client connection.
"""

from __future__ import annotations

import http.client
import random
import re
import socket
import socketserver
import struct
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

FaultKind = Literal["status", "conflict", "reset", "delay", "hang"]

_REASONS = {409: "Conflict", 412: "Precondition Failed", 500: "Internal Server Error", 503: "Service Unavailable"}
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


@dataclass(frozen=True)
class Fault:
    """What to do to a matching request (see the module docstring)."""

    kind: FaultKind
    status: int = 503
    code: str = "SlowDown"
    seconds: float = 0.0
    #: Forward the request to the store first, then fail its answer (``reset`` and ``status``).
    after_forward: bool = False

    @classmethod
    def slow_down(cls) -> "Fault":
        return cls("status", 503, "SlowDown")

    @classmethod
    def internal_error(cls) -> "Fault":
        return cls("status", 500, "InternalError")

    @classmethod
    def conflict(cls) -> "Fault":
        return cls("conflict", 409, "ConditionalRequestConflict")

    @classmethod
    def reset(cls, *, after_forward: bool = False) -> "Fault":
        return cls("reset", after_forward=after_forward)

    @classmethod
    def delay(cls, seconds: float) -> "Fault":
        return cls("delay", seconds=seconds)

    @classmethod
    def hang(cls, seconds: float) -> "Fault":
        return cls("hang", seconds=seconds)

    @property
    def name(self) -> str:
        if self.kind in ("status", "conflict"):
            return f"{self.status} {self.code}" + (" after" if self.after_forward else "")
        if self.kind == "reset":
            return "reset after forward" if self.after_forward else "reset"
        return f"{self.kind} {self.seconds:g}s"


@dataclass
class Rule:
    """When to inject ``fault``. Thread-safe counting through the proxy's lock."""

    fault: Fault
    methods: frozenset[str] | None = None
    #: Searched in the URL path (``/bucket/key``), e.g. ``r"/_versions/"``.
    path: str | None = None
    #: True: only conditional writes (``If-None-Match``/``If-Match``); False: only others.
    conditional: bool | None = None
    probability: float = 1.0
    #: Let this many matching requests through before injecting.
    skip: int = 0
    #: Inject at most this many times (None: unlimited).
    times: int | None = None
    matched: int = 0
    fired: int = 0

    def __post_init__(self) -> None:
        self._path = re.compile(self.path) if self.path else None

    def matches(self, method: str, path: str, conditional: bool) -> bool:
        return (
            (self.methods is None or method in self.methods)
            and (self._path is None or self._path.search(path) is not None)
            and (self.conditional is None or self.conditional == conditional)
        )


def rule(fault: Fault, *methods: str, **kwargs) -> Rule:
    """``Rule(fault, methods=frozenset(methods) or None, ...)``."""
    return Rule(fault, frozenset(m.upper() for m in methods) or None, **kwargs)


@dataclass
class ProxyStats:
    """What the proxy saw and did: requests by method, faults injected by name, requests
    forwarded, and retries: requests for a (method, path) that a fault failed before (among the
    last :data:`RECENT` such), i.e. a client sending a failed request again."""

    requests: Counter = field(default_factory=Counter)
    injected: Counter = field(default_factory=Counter)
    forwarded: int = 0
    retried: int = 0
    _failed: OrderedDict = field(default_factory=OrderedDict, repr=False)

    @property
    def total_injected(self) -> int:
        return sum(self.injected.values())

    def saw(self, method: str, path: str) -> None:
        self.requests[method] += 1
        if self._failed.pop((method, path), False):
            self.retried += 1

    def failed(self, method: str, path: str) -> None:
        self._failed[(method, path)] = True
        if len(self._failed) > RECENT:
            self._failed.popitem(last=False)


#: How many failed requests :class:`ProxyStats` remembers to recognise their retries (bounded:
#: a soak fails thousands of distinct requests).
RECENT = 20_000


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    proxy: "FaultProxy"


class _Handler(socketserver.BaseRequestHandler):
    """One client connection: requests in turn (HTTP/1.1 keep-alive), forwarded upstream."""

    def handle(self) -> None:
        proxy: FaultProxy = self.server.proxy  # type: ignore[attr-defined]
        sock: socket.socket = self.request
        reader = sock.makefile("rb")
        upstream: http.client.HTTPConnection | None = None
        try:
            while True:
                request = _read_request(reader)
                if request is None:
                    return
                method, target, headers, body = request
                path = urlsplit(target).path
                conditional = any(h.lower() in ("if-none-match", "if-match") for h, _ in headers)
                fault = proxy._decide(method, path, conditional)
                if fault is not None and fault.kind == "delay":
                    time.sleep(fault.seconds)
                    fault = None
                if fault is not None and fault.kind == "hang":
                    time.sleep(fault.seconds)
                    _reset(sock)
                    return
                if fault is not None and not fault.after_forward:
                    if fault.kind == "reset":
                        _reset(sock)
                        return
                    sock.sendall(_error_response(fault, path))
                    continue
                if upstream is None:
                    upstream = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=120)
                try:
                    status, reason, resp_headers, resp_body = _forward(upstream, method, target, headers, body)
                except (OSError, http.client.HTTPException):
                    upstream.close()
                    upstream = None
                    _reset(sock)
                    return
                with proxy._lock:
                    proxy.stats.forwarded += 1
                if fault is not None:  # applied by the store; its answer is lost
                    if fault.kind == "reset":
                        _reset(sock)
                        return
                    sock.sendall(_error_response(fault, path))
                    continue
                sock.sendall(_response(method, status, reason, resp_headers, resp_body))
        except (ConnectionError, TimeoutError, OSError):
            return
        finally:
            if upstream is not None:
                upstream.close()


def _read_request(reader) -> tuple[str, str, list[tuple[str, str]], bytes] | None:
    line = reader.readline(65537)
    while line in (b"\r\n", b"\n"):
        line = reader.readline(65537)
    if not line:
        return None
    method, target, _version = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
    headers: list[tuple[str, str]] = []
    while True:
        h = reader.readline(65537)
        if h in (b"\r\n", b"\n", b""):
            break
        name, _, value = h.decode("latin-1").partition(":")
        headers.append((name.strip(), value.strip()))
    lower = {k.lower(): v for k, v in headers}
    if lower.get("transfer-encoding", "").lower() == "chunked":
        chunks = []
        while True:
            size = int(reader.readline().split(b";")[0].strip(), 16)
            if size == 0:
                while reader.readline() not in (b"\r\n", b"\n", b""):
                    pass
                break
            chunks.append(reader.read(size))
            reader.readline()
        body = b"".join(chunks)
        headers = [(k, v) for k, v in headers if k.lower() != "transfer-encoding"] + [("Content-Length", str(len(body)))]
    else:
        body = reader.read(int(lower.get("content-length", "0") or 0))
    return method.upper(), target, headers, body


def _forward(conn: http.client.HTTPConnection, method: str, target: str, headers, body: bytes):
    conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
    for k, v in headers:
        if k.lower() not in _HOP_BY_HOP:
            conn.putheader(k, v)
    conn.endheaders(body if body or method in ("PUT", "POST") else None)
    resp = conn.getresponse()
    data = resp.read()
    return resp.status, resp.reason, resp.getheaders(), data


def _response(method: str, status: int, reason: str, headers, body: bytes) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}"]
    has_length = False
    for k, v in headers:
        if k.lower() in _HOP_BY_HOP:
            continue
        if k.lower() == "content-length":
            has_length = True
            if method != "HEAD":
                v = str(len(body))
        lines.append(f"{k}: {v}")
    if not has_length:
        lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if method == "HEAD" else head + body


def _error_response(fault: Fault, path: str) -> bytes:
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{fault.code}</Code><Message>injected by the fault proxy</Message>"
        f"<Resource>{path}</Resource><RequestId>faultproxy</RequestId></Error>"
    ).encode()
    reason = _REASONS.get(fault.status, "Error")
    head = f"HTTP/1.1 {fault.status} {reason}\r\nContent-Type: application/xml\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode("latin-1") + body


def _reset(sock: socket.socket) -> None:
    """Close with a TCP RST (SO_LINGER 0), as a load balancer dropping the connection does."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    except OSError:
        pass


class FaultProxy:
    """The proxy: ``endpoint`` replaces the store's; rules can change while it runs."""

    def __init__(self, upstream: str, *, seed: int = 0) -> None:
        parts = urlsplit(upstream)
        self.upstream_host = parts.hostname or "127.0.0.1"
        self.upstream_port = parts.port or 80
        self.rules: list[Rule] = []
        self.stats = ProxyStats()
        self._lock = threading.Lock()
        self._random = random.Random(seed)
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.proxy = self
        self._thread = threading.Thread(target=self._server.serve_forever, name="faultproxy", daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "FaultProxy":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def set_rules(self, *rules: Rule) -> None:
        with self._lock:
            self.rules = list(rules)

    def clear(self) -> None:
        self.set_rules()

    @contextmanager
    def faults(self, *rules: Rule) -> Iterator[list[Rule]]:
        """Inject ``rules`` inside the block only."""
        self.set_rules(*rules)
        try:
            yield list(rules)
        finally:
            self.clear()

    def reset_stats(self) -> ProxyStats:
        with self._lock:
            old, self.stats = self.stats, ProxyStats()
        return old

    def _decide(self, method: str, path: str, conditional: bool) -> Fault | None:
        with self._lock:
            self.stats.saw(method, path)
            for r in self.rules:
                if not r.matches(method, path, conditional):
                    continue
                r.matched += 1
                if r.matched <= r.skip or (r.times is not None and r.fired >= r.times):
                    continue
                if r.probability < 1.0 and self._random.random() >= r.probability:
                    continue
                r.fired += 1
                self.stats.injected[r.fault.name] += 1
                if r.fault.kind != "delay":
                    self.stats.failed(method, path)
                return r.fault
        return None


@contextmanager
def start_proxy(upstream: str, *, seed: int = 0) -> Iterator[FaultProxy]:
    proxy = FaultProxy(upstream, seed=seed).start()
    try:
        yield proxy
    finally:
        proxy.stop()


#: The mix a soak injects at its ``--faults`` rate: what S3 answers under load, mostly, and the
#: rarer dropped connections and conflicts. Latency spikes stay short: the soak measures lookups.
SOAK_MIX: tuple[tuple[Fault, float], ...] = (
    (Fault.slow_down(), 0.4),
    (Fault.internal_error(), 0.15),
    (Fault.reset(), 0.15),
    (Fault.reset(after_forward=True), 0.1),
    (Fault.conflict(), 0.1),
    (Fault.delay(0.5), 0.1),
)


def soak_rules(rate: float) -> list[Rule]:
    """Rules injecting :data:`SOAK_MIX` into ``rate`` of all requests (409s into conditional
    writes only). The rules are tried in turn, each firing with its share of ``rate`` (given
    that the ones before it did not)."""
    rules, left = [], 1.0
    for fault, share in SOAK_MIX:
        p = rate * share / max(left, 1e-9)
        rules.append(Rule(fault, conditional=True if fault.kind == "conflict" else None, probability=min(p, 1.0)))
        left -= rate * share
    return rules


def main(argv: list[str] | None = None) -> None:
    """Run a proxy as a process of its own (the soak's), printing its endpoint, and rewriting
    ``--stats`` (JSON: requests, faults injected by kind, requests forwarded, failed requests retried)
    every second until killed."""
    import argparse
    import json
    import os
    import signal
    import sys

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--upstream", required=True, help="the store's endpoint, e.g. http://127.0.0.1:5000")
    p.add_argument("--rate", type=float, default=0.0, help="share of requests failed with SOAK_MIX (0.01 = 1%%)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stats", help="a JSON file rewritten every second")
    args = p.parse_args(argv)
    proxy = FaultProxy(args.upstream, seed=args.seed).start()
    proxy.set_rules(*soak_rules(args.rate))
    print(proxy.endpoint, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            if args.stats:
                with proxy._lock:
                    s = proxy.stats
                    data = {"requests": dict(s.requests), "injected": dict(s.injected), "forwarded": s.forwarded,
                            "retried": s.retried}
                tmp = f"{args.stats}.tmp"
                with open(tmp, "w") as f:
                    json.dump(data, f)
                os.replace(tmp, args.stats)
            time.sleep(1.0)
    finally:
        proxy.stop()


if __name__ == "__main__":
    main()
