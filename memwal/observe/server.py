"""The metrics endpoint: Prometheus' text exposition of one registry over HTTP."""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, start_http_server

log = logging.getLogger(__name__)

#: Metrics are served on the loopback interface only: put a scraper (or a proxy with
#: authentication) beside the process rather than exposing its internals to the network.
HOST = "127.0.0.1"


class MetricsServer:
    """``http://127.0.0.1:PORT/metrics`` serving ``registry`` from a daemon thread.

    Port 0 picks a free port (:attr:`port` says which)."""

    def __init__(self, registry: CollectorRegistry, port: int, host: str = HOST) -> None:
        self.registry = registry
        self._httpd, self._thread = start_http_server(port, addr=host, registry=registry)
        self.host = host
        self.port: int = self._httpd.server_port
        log.info("metrics on %s", self.url)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

    def __enter__(self) -> "MetricsServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
