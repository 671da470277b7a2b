"""Reading input files: CSV values as written, unreadable files as InputFileError naming them."""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memwal.cli import files as formats
from memwal.core.errors import InputFileError

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())])


def test_csv_keeps_strings_as_written_and_reads_nan(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text('id,name,score\n1,NA,nan\n2,N/A,NaN\n3,null,1.5\n4,NULL,\n5,#N/A,2\n6,"",3\n7,,4\n')
    rows = formats.read_table(str(path), SCHEMA).to_pylist()
    assert [r["name"] for r in rows] == ["NA", "N/A", "null", "NULL", "#N/A", "", None]
    scores = [r["score"] for r in rows]
    assert math.isnan(scores[0]) and math.isnan(scores[1])
    assert scores[2:] == [1.5, None, 2.0, 3.0, 4.0]


def test_csv_without_a_schema_infers_na_as_a_string(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("id,name\n1,NA\n2,null\n")
    assert formats.read_schema(str(path)).field("name").type == pa.string()
    assert formats.read_table(str(path)).column("name").to_pylist() == ["NA", "null"]


def test_an_int_column_still_refuses_na(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("id,name,score\nNA,a,1\n")
    with pytest.raises(Exception, match="'id'"):
        formats.read_table(str(path), SCHEMA)


def damaged_parquet(tmp_path) -> str:
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"id": list(range(1000)), "name": [f"n{i}" for i in range(1000)]}), path, compression="snappy")
    data = bytearray(path.read_bytes())
    for i in range(8, len(data) // 2, 7):  # the body, not the footer: the schema still reads
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
    return str(path)


@pytest.mark.parametrize("make", ["directory", "damaged", "extension", "garbage-arrow"])
def test_unreadable_inputs_are_input_errors_naming_the_file(tmp_path, make):
    if make == "directory":
        path = tmp_path / "dir.parquet"
        path.mkdir()
        path = str(path)
    elif make == "damaged":
        path = damaged_parquet(tmp_path)
    elif make == "extension":
        path = str(tmp_path / "rows.xlsx")
        open(path, "w").close()
    else:
        path = str(tmp_path / "rows.arrow")
        with open(path, "wb") as f:
            f.write(b"not arrow at all" * 10)
    with pytest.raises(InputFileError) as e:
        formats.read_table(path, SCHEMA)
    assert path in str(e.value)
    assert "\n" not in str(e.value)
