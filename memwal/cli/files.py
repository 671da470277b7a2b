"""Reading user files (Parquet, Arrow IPC, CSV, JSON lines) for the CLI, and rows as JSON.

CSV and JSON carry no reliable types, so when a table schema is known the file is parsed
with it: a column that does not parse as its table type is an error naming the column.

CSV values are kept as written: only an empty unquoted field is null (Arrow's default
would also turn the strings "NA", "N/A", "null", "#N/A" and the floats "nan" into nulls),
a quoted empty field is the empty string, and "nan"/"NaN" in a float column is NaN.

A file that cannot be read at all (a directory, an unknown extension, a damaged body) is
an :class:`~memwal.core.errors.InputFileError` naming it.
"""

from __future__ import annotations

import csv
import json
import os
import re
from typing import Iterator

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.ipc as ipc
import pyarrow.json as pajson
import pyarrow.parquet as pq

from memwal.core.errors import InputFileError, MemwalError, SchemaMismatchError

PARQUET = (".parquet", ".pq")
ARROW = (".arrow", ".feather", ".ipc", ".arrows")
CSV = (".csv",)
JSONL = (".json", ".jsonl", ".ndjson")


def _kind(path: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    for kind, exts in (("parquet", PARQUET), ("arrow", ARROW), ("csv", CSV), ("json", JSONL)):
        if ext in exts:
            return kind
    raise InputFileError(
        f"cannot tell the format of {path!r} from its extension; use .parquet, .arrow/.feather, .csv or .jsonl"
    )


def _csv_convert_options(types: dict[str, pa.DataType] | None) -> pacsv.ConvertOptions:
    """Values as written: only an empty unquoted field is null (see the module docstring)."""
    return pacsv.ConvertOptions(
        column_types=types, null_values=[""], strings_can_be_null=True, quoted_strings_can_be_null=False
    )


def _unreadable(path: str, e: Exception) -> InputFileError:
    if os.path.isdir(path):
        return InputFileError(f"{path}: is a directory; give a data file")
    return InputFileError(f"{path}: cannot be read as a {_kind(path)} file ({' '.join(str(e).split())}); is it damaged?")


def _open_ipc(path: str) -> pa.RecordBatchReader:
    # Arrow IPC comes as the file format (Feather v2) or the stream format; accept both.
    try:
        f = ipc.open_file(path)
        return pa.RecordBatchReader.from_batches(f.schema, (f.get_batch(i) for i in range(f.num_record_batches)))
    except pa.ArrowInvalid:
        return ipc.open_stream(path)


def read_schema(path: str) -> pa.Schema:
    """The schema of a data file; no rows are kept (JSON lines: inferred from the file)."""
    kind = _kind(path)
    try:
        if kind == "parquet":
            return pq.read_schema(path)
        if kind == "arrow":
            return _open_ipc(path).schema
        if kind == "csv":
            return pacsv.open_csv(path, convert_options=_csv_convert_options(None)).schema
        return pajson.read_json(path).schema
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException) as e:
        raise _unreadable(path, e) from None


def _csv_header(path: str) -> list[str]:
    with open(path, newline="") as f:
        return next(csv.reader(f), [])


def _parse_error(path: str, e: Exception, schema: pa.Schema | None, kind: str) -> MemwalError:
    msg = str(e)
    types = {f.name: f.type for f in schema or []}
    name = None
    m = re.search(r"CSV column #(\d+)", msg)
    if m and kind == "csv":
        header = _csv_header(path)
        i = int(m.group(1))
        name = header[i] if i < len(header) else None
    else:
        name = next((n for n in types if f"'{n}'" in msg or f'"{n}"' in msg or f"column {n}" in msg), None)
    if name is not None:
        expected = f" as {types[name]}" if name in types else ""
        return SchemaMismatchError(f"{path}: column {name!r} does not parse{expected}: {msg}")
    return SchemaMismatchError(f"{path}: cannot read the file with the table's schema: {msg}")


def iter_batches(path: str, schema: pa.Schema | None = None, batch_rows: int = 65_536) -> Iterator[pa.RecordBatch]:
    """Record batches of a data file. With ``schema``, CSV/JSON columns are parsed as its types
    (columns the file lacks are left out; :func:`memwal.core.schema.conform` decides about them)."""
    kind = _kind(path)
    try:
        if kind == "parquet":
            yield from pq.ParquetFile(path).iter_batches(batch_size=batch_rows)
        elif kind == "arrow":
            yield from _open_ipc(path)
        elif kind == "csv":
            types = {f.name: f.type for f in schema} if schema is not None else None
            reader = pacsv.open_csv(
                path,
                convert_options=_csv_convert_options(types),
                read_options=pacsv.ReadOptions(block_size=1 << 22),
            )
            yield from reader
        else:
            opts = None
            if schema is not None:
                header = _json_columns(path)
                explicit = pa.schema([f for f in schema if f.name in header])
                opts = pajson.ParseOptions(explicit_schema=explicit, unexpected_field_behavior="infer")
            yield from pajson.read_json(path, parse_options=opts).to_batches(max_chunksize=batch_rows)
    except FileNotFoundError:
        raise
    except IsADirectoryError as e:
        raise _unreadable(path, e) from None
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        if kind in ("parquet", "arrow"):
            # typed formats: a parse error is a damaged file, not a value of the wrong type
            raise _unreadable(path, e) from None
        raise _parse_error(path, e, schema, kind) from None
    except (OSError, pa.ArrowException) as e:  # thrift, snappy, page-header errors of a damaged body
        raise _unreadable(path, e) from None


def _json_columns(path: str, sample_lines: int = 1000) -> list[str]:
    seen: dict[str, None] = {}
    with open(path, "rb") as f:
        for i, line in enumerate(f):
            if i >= sample_lines:
                break
            line = line.strip()
            if line:
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise SchemaMismatchError(f"{path}: line {i + 1} is not valid JSON: {e}") from None
                for k in obj:
                    seen[k] = None
    return list(seen)


def read_table(path: str, schema: pa.Schema | None = None) -> pa.Table:
    batches = list(iter_batches(path, schema))
    if not batches:
        return (schema or read_schema(path)).empty_table()
    return pa.Table.from_batches(batches)
