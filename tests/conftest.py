"""Shared fixtures. Tests use real Lance tables in temporary directories."""

from __future__ import annotations

from memwal.core.runtime import configure_process

configure_process()  # Lance's log filter, before Lance is imported

import os  # noqa: E402

import pytest  # noqa: E402
from helpers import submit_args  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# Child processes that launch a driver JVM launch it for a short run (helpers.SHORT_RUN_JAVA_OPTIONS).
os.environ.setdefault("PYSPARK_SUBMIT_ARGS", submit_args())

settings.register_profile(
    "memwal",
    deadline=None,  # Lance I/O makes per-example time noisy on a shared 2-core machine
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile("memwal")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The Spark Connect tests run first: PySpark refuses to start a Connect client in a
    process that already runs a classic SparkSession (SESSION_ALREADY_EXIST), and the classic
    session (the ``spark`` fixture) lives until the whole test session ends."""
    items.sort(key=lambda item: 0 if item.path.name == "test_connect.py" else 1)


@pytest.fixture
def table_uri(tmp_path) -> str:
    return str(tmp_path / "table")


@pytest.fixture(scope="session")
def spark():
    """One local[2] SparkSession for the whole test session (starting one takes seconds)."""
    from memwal.streaming import local_session

    session = local_session(app="memwal-tests")
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def kafka(tmp_path_factory):
    """An Apache Kafka 4 broker on 127.0.0.1 for the whole test session (tests/brokers.py)."""
    from brokers import start_broker

    with start_broker(tmp_path_factory.mktemp("kafka")) as broker:
        yield broker


@pytest.fixture(params=["spark", "python"])
def kafka_source(request) -> str:
    """Each Kafka source memwal reads with: Spark's own connector and memwal's Python source
    (``kafka_stream``/``ingest``'s ``kafka_source``). Tests taking it run once per source, so
    both behave alike under one test matrix."""
    return request.param


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server on 127.0.0.1 with one bucket, for the whole test session (see tests/s3.py)."""
    from s3 import start_s3

    with start_s3() as server:
        yield server


@pytest.fixture
def s3_uri(s3_server) -> str:
    """A table URI on the session's S3 server under a prefix of its own."""
    return s3_server.fresh_uri("table")


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """The standard AWS_* variables point at the session's S3 server (and no other storage variable is set)."""
    from memwal.core.storage import ENVIRONMENT_VARIABLES

    for var, _key in ENVIRONMENT_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    for var, value in s3_server.env().items():
        monkeypatch.setenv(var, value)
    return s3_server
