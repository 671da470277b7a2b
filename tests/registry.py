"""A schema registry's read API over real HTTP on 127.0.0.1, for the Avro tests."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Registry:
    """A schema registry's read API (``GET /schemas/ids/{id}``) over real HTTP on 127.0.0.1:
    what a registry client asks to decode Confluent-framed values."""

    def __init__(self, schemas: dict[int, dict]) -> None:
        self.schemas = schemas
        self.requests: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                outer.requests.append(self.path)
                parts = self.path.strip("/").split("/")
                if len(parts) == 3 and parts[:2] == ["schemas", "ids"] and parts[2].isdigit() and int(parts[2]) in outer.schemas:
                    body = json.dumps({"schema": json.dumps(outer.schemas[int(parts[2])])}).encode()
                    self.send_response(200)
                else:
                    body = json.dumps({"error_code": 40403, "message": "Schema not found"}).encode()
                    self.send_response(404)
                self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
