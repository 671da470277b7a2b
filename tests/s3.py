"""An S3 API on 127.0.0.1 for tests: moto's server, in this process.

moto 5 in server mode speaks the S3 REST protocol, including conditional PUTs (``If-None-Match: *``
answered with 412 when the object exists), which Lance commits and memwal's shard manifests rely on.
It starts in ~0.01 s (importing it takes ~2.5 s, paid once per session), so one server serves the
whole test session and each test works under its own prefix of one bucket.

Typical use::

    with start_s3() as s3:
        uri = s3.uri("some-test", "table")          # s3://memwal-test/some-test/table
        lance.write_dataset(data, uri, storage_options=s3.storage_options())
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

ACCESS_KEY_ID = "memwal-test-key"
SECRET_ACCESS_KEY = "memwal-test-secret"
REGION = "us-east-1"
BUCKET = "memwal-test"  # S3 bucket names need at least 3 characters


@dataclass(frozen=True)
class S3Server:
    """Where a running moto server is and how to reach it."""

    endpoint: str
    access_key_id: str
    secret_access_key: str
    region: str
    bucket: str

    def uri(self, *parts: str) -> str:
        """``s3://{bucket}/{parts...}``."""
        return "/".join([f"s3://{self.bucket}", *(p.strip("/") for p in parts)])

    def fresh_uri(self, name: str = "t") -> str:
        """A URI under a prefix no other test uses (the bucket is shared by the session)."""
        return self.uri(uuid.uuid4().hex[:12], name)

    def storage_options(self) -> dict[str, str]:
        """Lance ``storage_options`` (Lance's key spelling) for this server."""
        return {
            "aws_access_key_id": self.access_key_id,
            "aws_secret_access_key": self.secret_access_key,
            "aws_region": self.region,
            "aws_endpoint": self.endpoint,
            "allow_http": "true",
        }

    def env(self) -> dict[str, str]:
        """The standard ``AWS_*`` environment variables for this server."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_REGION": self.region,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
        }


@contextmanager
def start_s3(bucket: str = BUCKET) -> Iterator[S3Server]:
    """Start moto's S3 server on 127.0.0.1 (a free port), create ``bucket``, stop the server on exit."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        s3 = S3Server(
            endpoint=f"http://{host}:{port}",
            access_key_id=ACCESS_KEY_ID,
            secret_access_key=SECRET_ACCESS_KEY,
            region=REGION,
            bucket=bucket,
        )
        client = boto3.client(
            "s3",
            endpoint_url=s3.endpoint,
            aws_access_key_id=s3.access_key_id,
            aws_secret_access_key=s3.secret_access_key,
            region_name=s3.region,
        )
        client.create_bucket(Bucket=bucket)
        yield s3
    finally:
        server.stop()
