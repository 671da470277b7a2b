"""UDFs for the view tests: importable by name in every process, counting their calls."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.compute as pc

#: When set, every call appends "<rows>\n" to this file (counts across processes).
CALLS_FILE = "MEMWAL_TEST_UDF_CALLS"


def _count(n: int) -> None:
    path = os.environ.get(CALLS_FILE)
    if path:
        with open(path, "a") as f:
            f.write(f"{n}\n")


def label(batch: pa.RecordBatch) -> pa.Array:
    """Upper-cased name with its doubled score: 'ADA:84'."""
    _count(batch.num_rows)
    return pc.binary_join_element_wise(pc.utf8_upper(batch.column(0)), pc.cast(batch.column(1), pa.string()), ":")


def label_v2(batch: pa.RecordBatch) -> pa.Array:
    _count(batch.num_rows)
    return pc.binary_join_element_wise(pc.utf8_lower(batch.column(0)), pc.cast(batch.column(1), pa.string()), "/")


def calls(path: str) -> list[int]:
    try:
        return [int(x) for x in open(path).read().split()]
    except FileNotFoundError:
        return []
