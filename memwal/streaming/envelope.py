"""Debezium's change-event envelope, whichever converter wrote it: which row a change event
upserts or deletes, its columns converted by their Connect types, and its source position.

An envelope is ``{"before": row, "after": row, "op": "c"|"r"|"u"|"d", "source": {...,
"lsn": n, "ts_ms": t}, "ts_ms": t, ...}``. Creates (``c``), snapshot reads (``r``) and
updates (``u``) upsert ``after``; deletes (``d``) delete the key of ``before``. Key columns a
row lacks (a delete's ``before`` is null, or holds only some columns, depending on the
source's replica identity) come from the Kafka key. The source position (``source.lsn``,
else ``source.ts_ms``, else the envelope's ``ts_ms``) becomes the sequence column when the
sink has one.

The JSON decoder (:mod:`~memwal.streaming.debezium`) and the Avro decoder
(:mod:`~memwal.streaming.avro`) read envelopes into Arrow columns; :func:`change_rows` turns
them into the table's rows, the same for both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal.core.errors import InvalidArgumentError
from memwal.core.schema import is_widening
from memwal.streaming.connect import ConnectSchema, arrow_type, convert, parse_type

#: The column of decoded rows holding the operation (not a table column: those may not start with "_").
OP = "__memwal_debezium_op"
#: Debezium's row operations: create, read (snapshot), update, delete.
UPSERT_OPS = ("c", "r", "u")
DELETE_OP = "d"


class Columns:
    """How the table's columns are read from one writer schema's rows: each column's Connect
    schema (None where the schema does not name the column, or there is no schema: the column is
    then read as its own type), and the Arrow type a reader reads it as."""

    def __init__(self, table: pa.Schema, targets: Mapping[str, pa.DataType], fields: Mapping[str, ConnectSchema | None],
                 bytes_type: pa.DataType, names: Sequence[str] | None = None) -> None:
        self.names = list(names if names is not None else table.names)
        self.targets = {c: targets[c] for c in self.names}
        self.fields = {c: fields.get(c) for c in self.names}
        self.parse = pa.struct([pa.field(c, parse_type(self.fields[c], self.targets[c], bytes_type)) for c in self.names])

    @classmethod
    def of_struct(cls, table: pa.Schema, targets: Mapping[str, pa.DataType], struct: ConnectSchema | None, bytes_type: pa.DataType,
                  names: Sequence[str] | None = None) -> "Columns":
        """The columns of a row whose Connect schema is ``struct`` (None: no schema)."""
        return cls(table, targets, dict(struct.fields) if struct is not None else {}, bytes_type, names)

    def convert(self, raw: Mapping[str, pa.Array], errors: dict[int, str]) -> dict[str, pa.Array]:
        """Each column of ``raw`` (read as :attr:`parse` says) as the column's type; the rows of
        values that do not fit are added to ``errors``."""
        out = {}
        for c in self.names:
            got = convert(raw[c], self.fields[c], self.targets[c], c)
            for j, why in got.errors.items():
                errors.setdefault(j, why)
            out[c] = got.array
        return out


@dataclass(frozen=True)
class EventSchema:
    """The table a topic of change events fills: the Arrow schema of its rows and, when the
    event's key came with it, the primary key (the key's fields, in order)."""

    schema: pa.Schema
    primary_key: tuple[str, ...] | None


def event_schema(row: ConnectSchema, key: ConnectSchema | None) -> EventSchema:
    """The table of change events whose rows have the Connect schema ``row`` (and keys ``key``):
    each column of the natural Arrow type of its Connect type, nullable as it is optional."""
    fields = []
    for name, f in row.fields:
        try:
            fields.append(pa.field(name, arrow_type(f), nullable=f.optional))
        except ValueError as e:
            raise InvalidArgumentError(f"column {name!r}: {e}") from None
    return EventSchema(pa.schema(fields), tuple(n for n, _ in key.fields) if key is not None and key.fields else None)


def changed_columns(table: pa.Schema, row: ConnectSchema | None, skip: Collection[str | None] = ()
                    ) -> tuple[dict[str, pa.Field], dict[str, pa.Field]]:
    """Of a source's row fields (their Connect schema ``row``, but those in ``skip``), those
    ``table`` lacks and those whose type is wider than their column's
    (:func:`memwal.core.schema.is_widening`), as nullable fields of their Connect types
    (``SinkOptions.evolve``). A field whose type has no column type, or whose name memwal
    reserves (``_...``), is neither: its values stay unread, or are converted to the column's
    type, as before."""
    new: dict[str, pa.Field] = {}
    wider: dict[str, pa.Field] = {}
    for name, f in (row.fields if row is not None else ()):
        if not name or name.startswith("_") or name in skip:
            continue
        try:
            type_ = arrow_type(f)
        except ValueError:
            continue
        i = table.get_field_index(name)
        if i < 0:
            new[name] = pa.field(name, type_, nullable=True)
        elif is_widening(table.field(i).type, type_):
            wider[name] = pa.field(name, type_, nullable=True)
    return new, wider


def row_schema(value: ConnectSchema | None) -> ConnectSchema | None:
    """The Connect schema of an envelope's rows (its ``after``, else its ``before``)."""
    if value is None:
        return None
    return value.field("after") or value.field("before")


def change_rows(env: Mapping[str, pa.Array], columns: Columns, primary_key: Sequence[str], sequence_field: str | None,
                key_columns: Callable[[], Mapping[str, pa.Array]]) -> tuple[pa.Table, dict[int, str]]:
    """Table rows (plus :data:`OP` and the sequence) of envelopes, and the positions of the
    malformed ones and of those whose values do not fit, with the reason.

    ``env`` holds the envelopes' ``before`` and ``after`` (structs of :attr:`Columns.parse`),
    ``op``, ``ts_ms`` and ``source`` (a struct with ``lsn`` and ``ts_ms``); ``key_columns()``
    gives the primary-key columns of the records' Kafka keys (asked only when a row lacks one)."""
    op = env["op"]
    is_delete = pc.fill_null(pc.equal(op, DELETE_OP), False)
    is_upsert = pc.fill_null(pc.is_in(op, pa.array(UPSERT_OPS)), False)
    errors: dict[int, str] = {}
    for j in np.flatnonzero(~np.asarray(is_delete) & ~np.asarray(is_upsert)):
        o = op[int(j)].as_py()
        errors[int(j)] = ("not a Debezium change event: no 'op' field" if o is None
                          else f"Debezium operation {o!r} is not a row change (expected one of c, r, u, d)")
    after_missing = np.asarray(pc.and_(is_upsert, env["after"].is_null()))
    for j in np.flatnonzero(after_missing):
        errors.setdefault(int(j), f"Debezium {op[int(j)].as_py()!r} event without an 'after' row")
    raw = {c: pc.if_else(is_delete, pc.struct_field(env["before"], c), pc.struct_field(env["after"], c)) for c in columns.names}
    converted = columns.convert(raw, errors)
    names = list(columns.names)
    cols = [converted[c] for c in names]
    if any(converted[c].null_count for c in primary_key):
        keyed = key_columns()  # the key when the value lacks it
        for c in primary_key:
            cols[names.index(c)] = pc.coalesce(cols[names.index(c)], keyed[c])
    if sequence_field:
        source = env["source"]
        position = pc.coalesce(pc.struct_field(source, "lsn"), pc.struct_field(source, "ts_ms"), env["ts_ms"])
        for j in np.flatnonzero(np.asarray(position.is_null())):
            errors.setdefault(int(j), "the Debezium event has no source position (source.lsn, source.ts_ms or ts_ms)")
        cols[names.index(sequence_field)] = position
    return pa.Table.from_arrays(cols + [op], names=names + [OP]), errors


def envelope_type(row: pa.DataType) -> pa.StructType:
    """The Arrow struct a reader reads an envelope of rows of ``row`` as (the fields
    :func:`change_rows` uses; a reader ignores the others)."""
    source = pa.struct([pa.field("lsn", pa.int64()), pa.field("ts_ms", pa.int64())])
    return pa.struct([pa.field("before", row), pa.field("after", row), pa.field("op", pa.string()),
                      pa.field("ts_ms", pa.int64()), pa.field("source", source)])
