"""Table schemas: the primary key as Lance records it, and conforming incoming data.

Lance marks primary-key columns with field metadata; a composite key's order is given by
a 1-based position. memwal writes both keys so any Lance reader agrees on the key order.
"""

from __future__ import annotations

import re
from typing import Sequence

import pyarrow as pa

from memwal.errors import InvalidArgumentError, PrimaryKeyError, SchemaMismatchError, UnknownColumnError

PK_KEY = b"lance-schema:unenforced-primary-key"
PK_POSITION_KEY = b"lance-schema:unenforced-primary-key:position"
TOMBSTONE = "_tombstone"


def _pk_type_ok(t: pa.DataType) -> bool:
    # What Lance 14.0.2 can hash and index as a MemWAL primary key.
    return (
        pa.types.is_integer(t)
        or pa.types.is_boolean(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
    )


def with_primary_key(schema: pa.Schema, primary_key: Sequence[str]) -> pa.Schema:
    """``schema`` with ``primary_key`` marked as Lance's unenforced primary key (non-nullable)."""
    if not primary_key:
        raise PrimaryKeyError(
            "a memwal table needs a primary key: upserts and deletes are matched by it. "
            "Pass primary_key=[...] (CLI: --primary-key COL)"
        )
    if len(set(primary_key)) != len(primary_key):
        raise PrimaryKeyError(f"primary key repeats a column: {list(primary_key)}")
    fields = list(schema)
    names = schema.names
    for pos, col in enumerate(primary_key, start=1):
        if col not in names:
            raise UnknownColumnError(
                f"primary key column {col!r} is not in the schema (columns: {', '.join(names)})"
            )
        i = names.index(col)
        f = fields[i]
        if not _pk_type_ok(f.type):
            raise PrimaryKeyError(
                f"primary key column {col!r} has type {f.type}; Lance's MemWAL keys must be "
                "integer, boolean, string or binary columns"
            )
        meta = dict(f.metadata or {})
        meta[PK_KEY] = b"true"
        meta[PK_POSITION_KEY] = str(pos).encode()
        fields[i] = f.with_nullable(False).with_metadata(meta)
    return pa.schema(fields, metadata=schema.metadata)


def primary_key_of(schema: pa.Schema) -> tuple[str, ...]:
    """The primary-key columns recorded in ``schema``, in key order."""
    keyed = []
    for i, f in enumerate(schema):
        meta = f.metadata or {}
        if meta.get(PK_KEY, b"").lower() in (b"true", b"1", b"yes"):
            pos = meta.get(PK_POSITION_KEY)
            # Lance: explicit positions first, in position order; the rest in field order.
            keyed.append((0 if pos is not None else 1, int(pos) if pos is not None else i, f.name))
    return tuple(name for *_, name in sorted(keyed))


def user_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` without memwal/Lance internal columns (``_tombstone``, ``_rowaddr``, ...)."""
    return pa.schema([f for f in schema if not f.name.startswith("_")], metadata=schema.metadata)


def conform(data: pa.Table, schema: pa.Schema, *, what: str = "data") -> pa.Table:
    """``data`` with exactly ``schema``'s columns, order and types, or :class:`SchemaMismatchError`.

    Columns may come in any order; a missing nullable column is filled with nulls; types are
    cast only where the cast is lossless (e.g. int32 -> int64), never silently truncated.
    """
    names = set(data.schema.names)
    extra = [c for c in data.schema.names if c not in schema.names]
    if extra:
        raise SchemaMismatchError(
            f"{what} has column(s) {', '.join(map(repr, extra))} that the table does not have "
            f"(table columns: {', '.join(schema.names)}); drop them or add them to the table"
        )
    columns = []
    for f in schema:
        if f.name not in names:
            if not f.nullable:
                raise SchemaMismatchError(f"{what} lacks the required column {f.name!r} ({f.type})")
            columns.append(pa.nulls(data.num_rows, f.type))
            continue
        col = data.column(f.name)
        if not col.type.equals(f.type):
            try:
                col = col.cast(f.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise SchemaMismatchError(
                    f"{what}: column {f.name!r} has type {col.type}, the table expects {f.type} "
                    f"and the values cannot be converted safely ({e})"
                ) from None
        if not f.nullable and col.null_count:
            kind = "primary key column" if (f.metadata or {}).get(PK_KEY) else "non-nullable column"
            raise SchemaMismatchError(f"{what}: {kind} {f.name!r} has {col.null_count} null value(s)")
        columns.append(col)
    return pa.Table.from_arrays(columns, schema=schema)


def stored_schema(write_schema: pa.Schema) -> pa.Schema:
    """The columns of an SSTable or WAL entry written under ``write_schema``: its columns and
    ``_tombstone`` (true: a delete of the key)."""
    return write_schema.append(pa.field(TOMBSTONE, pa.bool_()))


def as_evolved(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """Rows stored under an earlier schema of the table (an SSTable, a WAL entry, a writer's put
    decided before a change) as ``schema``'s columns: a column added since is null, a column
    dropped since is left out. ``data`` itself when it already has them.

    The invariant it rests on: a column keeps its name and type for its whole life (Lance
    14.0.2 refuses type changes on a MemWAL table), so stored data only ever lacks columns
    added after it or carries columns dropped after it."""
    if data.schema.names == schema.names:
        return data
    have = set(data.schema.names)
    columns = [data.column(f.name) if f.name in have else pa.nulls(data.num_rows, f.type) for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)


def parse_type(text: str) -> pa.DataType:
    """An Arrow type from its name: ``int64``, ``float32``, ``string``, ``date32``,
    ``timestamp[us]``, ``decimal(12,2)``, ``list<float32>[4]``..."""
    text = text.strip()
    m = re.fullmatch(r"list<(.+)>\[(\d+)\]", text)
    if m:
        return pa.list_(parse_type(m.group(1)), int(m.group(2)))
    m = re.fullmatch(r"list<(.+)>", text)
    if m:
        return pa.list_(parse_type(m.group(1)))
    m = re.fullmatch(r"decimal(?:128)?\(\s*(\d+)\s*,\s*(\d+)\s*\)", text)
    if m:
        return pa.decimal128(int(m.group(1)), int(m.group(2)))
    aliases = {"string": pa.string(), "utf8": pa.string(), "float": pa.float32(), "double": pa.float64(), "bool": pa.bool_()}
    if text in aliases:
        return aliases[text]
    try:
        return pa.type_for_alias(text)
    except ValueError:
        raise InvalidArgumentError(f"unknown type {text!r} (e.g. int64, string, date32, timestamp[us], decimal(12,2))") from None


def key_schema(schema: pa.Schema, primary_key: Sequence[str]) -> pa.Schema:
    """The schema of a delete: just the primary-key columns."""
    return pa.schema([schema.field(c) for c in primary_key])


def as_table(data: object, schema: pa.Schema | None = None) -> pa.Table:
    """Any Arrow-compatible input (Table, RecordBatch, reader, list of dicts) as a Table."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, pa.RecordBatchReader):
        return data.read_all()
    if isinstance(data, list):
        return pa.Table.from_pylist(data, schema=schema) if schema is not None else pa.Table.from_pylist(data)
    if isinstance(data, dict):
        return pa.table(data)
    try:
        import pandas as pd  # optional: only if the caller passes a DataFrame

        if isinstance(data, pd.DataFrame):
            return pa.Table.from_pandas(data, preserve_index=False)
    except ImportError:
        pass
    raise TypeError(f"cannot write {type(data).__name__}; pass a pyarrow Table, RecordBatch or list of dicts")
