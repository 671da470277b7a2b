"""Table schemas: the primary key as Lance records it, and conforming incoming data.

Lance marks primary-key columns with field metadata; a composite key's order is given by
a 1-based position. memwal writes both keys so any Lance reader agrees on the key order.
"""

from __future__ import annotations

import re
from typing import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from memwal.core.errors import InvalidArgumentError, PrimaryKeyError, SchemaMismatchError, UnknownColumnError

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


#: What a widened column's older, narrower self is renamed to: ``_widened_<version>_<name>``
#: (:mod:`memwal.maintain.evolve`). Stored data whose writer replayed WAL entries of before the widening
#: holds their values there: Lance matches replayed columns by field id, and the narrow field
#: kept its id under the hidden name.
WIDENED_PREFIX = "_widened_"
_WIDENED = re.compile(r"_widened_(\d+)_(.+)")


def widened_sources(names: Sequence[str]) -> dict[str, list[str]]:
    """Column -> the hidden narrower columns among ``names`` that hold some of its older values,
    newest widening first."""
    found: dict[str, list[tuple[int, str]]] = {}
    for n in names:
        m = _WIDENED.fullmatch(n)
        if m:
            found.setdefault(m.group(2), []).append((int(m.group(1)), n))
    return {col: [n for _, n in sorted(hidden, reverse=True)] for col, hidden in found.items()}


def stored_columns(stored: Sequence[str], wanted: Sequence[str]) -> list[str]:
    """The columns to read from stored data (an SSTable, a WAL entry, an older base version)
    whose columns are ``stored``, for :func:`as_evolved` to give ``wanted``: those of ``wanted``
    it has, and the hidden narrower columns of a widened one."""
    have = set(stored)
    sources = widened_sources(stored)
    out = [c for c in wanted if c in have]
    out += [h for c in wanted for h in sources.get(c, ()) if h not in wanted]
    return out


def needs_evolving(stored: pa.Schema, wanted: pa.Schema) -> bool:
    """Whether data stored as ``stored`` lacks some of ``wanted``'s columns or holds one in a
    narrower type (a column added or widened since): then :func:`as_evolved` must read it.
    (Whether a widened column's hidden older self holds values is the data's to say: only
    rows a writer replayed from before the widening put any there.)"""
    have = {f.name: f.type for f in stored}
    return any(have.get(f.name) is None or not have[f.name].equals(f.type) for f in wanted)


def as_evolved(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """Rows stored under an earlier schema of the table (an SSTable, a WAL entry, a writer's put
    decided before a change) as ``schema``'s columns: a column added since is null, a column
    dropped since is left out, a column widened since is cast to its wider type. ``data`` itself
    when it already has them.

    The invariant it rests on: a column keeps its name for its whole life and its type only
    widens (Lance 14.0.2 refuses type changes on a MemWAL table; memwal widens by a new column
    that takes the name, :mod:`memwal.maintain.evolve`), so stored data only ever lacks columns added
    after it, carries columns dropped after it, or holds a column in a narrower type. A row
    stored by a writer that replayed WAL entries of before a widening holds the value in the
    hidden narrower column (:data:`WIDENED_PREFIX`) and null in the wide one: the wide column
    is the first non-null of the two."""
    if (data.schema.names == schema.names and all(a.type.equals(b.type) for a, b in zip(data.schema, schema))
            and not any(n.startswith(WIDENED_PREFIX) and data.column(n).null_count < data.num_rows for n in schema.names)):
        return data
    have = set(data.schema.names)
    sources = widened_sources(data.schema.names)
    columns = []
    for f in schema:
        col = data.column(f.name) if f.name in have else pa.nulls(data.num_rows, f.type)
        if not col.type.equals(f.type):
            col = col.cast(f.type)
        for hidden in sources.get(f.name, ()):
            older = data.column(hidden)
            if older.null_count < len(older):
                col = pc.coalesce(col, older.cast(f.type))
        columns.append(col)
    return pa.Table.from_arrays(columns, schema=schema)


def takes(schema: pa.Schema, rows: pa.Schema) -> bool:
    """Whether a writer (or a table state) of ``schema`` takes rows of ``rows``' columns: none
    added or widened since it was made (rows of a column narrower than its, conformed before a
    widening, it takes: :func:`as_evolved` casts them)."""
    for f in rows:
        i = schema.get_field_index(f.name)
        if i < 0:
            return False
        t = schema.field(i).type
        if not t.equals(f.type) and not is_widening(f.type, t):
            return False
    return True


def is_widening(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether every ``old`` value converts to ``new`` exactly: a wider integer of the same
    signedness (or a signed one wider than an unsigned), float32 -> float64, an integer to
    float64 within 53 bits, a decimal with no fewer integer and fraction digits, string or
    binary to their large kinds."""
    t = pa.types
    if old.equals(new):
        return False
    if t.is_integer(old) and t.is_integer(new):
        if t.is_signed_integer(old) == t.is_signed_integer(new):
            return new.bit_width > old.bit_width
        return t.is_signed_integer(new) and new.bit_width > old.bit_width
    if t.is_floating(old) and t.is_floating(new):
        return new.bit_width > old.bit_width
    if t.is_integer(old) and t.is_float64(new):
        return old.bit_width <= 32
    if t.is_decimal(old) and t.is_decimal(new):
        return new.scale >= old.scale and new.precision - new.scale >= old.precision - old.scale
    return (t.is_string(old) and t.is_large_string(new)) or (t.is_binary(old) and t.is_large_binary(new))


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
