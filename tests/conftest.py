"""Shared fixtures. Tests use real Lance tables in temporary directories."""

from __future__ import annotations

import os

# Lance logs a spurious ERROR on every base table update of a MemWAL table; keep test output
# readable. Must happen before Lance is imported.
os.environ.setdefault("LANCE_LOG", "error,lance::index=off")

import pyarrow as pa  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "memwal",
    deadline=None,  # Lance I/O makes per-example time noisy on a shared 2-core machine
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile("memwal")


@pytest.fixture
def table_uri(tmp_path) -> str:
    return str(tmp_path / "table")
