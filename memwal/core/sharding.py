"""Sharding specs: which transform of which primary-key columns decides a row's shard, and
the deterministic mapping from shard values to shard UUIDs.

A shard's UUID is ``uuid5(table_uuid, "<spec_id>|<field>=<value bytes>|...")``. Every
process that knows the table's UUID and spec therefore routes a key to the same shard
without coordination, and a reader can name the shard of a key without listing anything
(that is how point lookups and shard pruning find their shard). The value bytes are the
ones Lance stores in ``ShardManifest.shard_field_entries``; memwal writes them into the
first manifest version of every shard it creates, so the mapping is recorded on disk.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import pyarrow as pa

from memwal.core.errors import InvalidValueError, ShardingSpecError, UnknownColumnError
from memwal.core.transforms import (
    Bucket,
    Identity,
    MultiBucket,
    Transform,
    Unsharded,
    lance_type_name,
    parse_transform_call,
)

#: A shard value tuple, one Python scalar per sharding field (None for null).
ShardValues = tuple[Any, ...]


@dataclass(frozen=True)
class ShardingField:
    """One computed shard field: ``transform(source_columns...)``."""

    field_id: str
    source_columns: tuple[str, ...]
    transform: Transform
    result_type: pa.DataType

    def render(self) -> str:
        return self.transform.render(self.source_columns)


@dataclass(frozen=True)
class ShardingSpec:
    """How rows map to shards. ``lance_native`` specs are the ones Lance records itself
    (one bucket, identity or unsharded field); others use Lance's manual shards."""

    spec_id: int
    fields: tuple[ShardingField, ...]

    @property
    def unsharded(self) -> bool:
        return len(self.fields) == 1 and isinstance(self.fields[0].transform, Unsharded)

    @property
    def lance_native(self) -> bool:
        return len(self.fields) == 1 and self.fields[0].transform.lance_native

    @property
    def source_columns(self) -> tuple[str, ...]:
        """Every column the spec reads, in spec order without duplicates."""
        seen: dict[str, None] = {}
        for f in self.fields:
            for c in f.source_columns:
                seen[c] = None
        return tuple(seen)

    def render(self) -> str:
        """The spec in the syntax :func:`parse_sharding_spec` reads."""
        return ", ".join(f.render() for f in self.fields)

    @property
    def fixed_shard_count(self) -> int | None:
        """How many shards the spec can ever have, if that is fixed (one field: unsharded, or
        a bucket transform); None when shards appear with the data (identity, time, ...).

        A fixed-count spec's only shard value is an int in ``[0, count)``, which is what
        :meth:`partition_of` relies on.
        """
        if len(self.fields) != 1:
            return None
        t = self.fields[0].transform
        if isinstance(t, Unsharded):
            return 1
        if isinstance(t, (Bucket, MultiBucket)):
            return t.num_buckets
        return None

    def partition_of(self, values: ShardValues, shard_id: str, n: int) -> int:
        """The one of ``n`` partitions (e.g. write tasks) that owns the shard with ``values``
        and id ``shard_id``.

        Every shard maps to exactly one partition, so one task writes it. With a fixed shard
        count the shard value itself is the partition modulo ``n``: ``n`` at least the count
        gives each shard a partition of its own. Other specs spread shards by a stable hash
        of their id (CRC-32, the same in every process and Python version).
        """
        if n < 1:
            raise InvalidValueError(f"partition count must be positive, got {n}")
        if self.fixed_shard_count is not None:
            v = values[0]
            return 0 if v is None else int(v) % n
        return zlib.crc32(shard_id.encode()) % n

    def shard_value_arrays(self, data: pa.Table | pa.RecordBatch) -> list[pa.Array]:
        """One array of shard values per field, for every row of ``data``."""
        n = data.num_rows
        out = []
        for f in self.fields:
            if isinstance(f.transform, Unsharded):
                out.append(pa.array([0] * n, pa.int32()) if n else pa.array([], pa.int32()))
                continue
            cols = []
            for c in f.source_columns:
                if c not in data.schema.names:
                    raise UnknownColumnError(f"sharding column {c!r} is missing from the data")
                cols.append(data.column(c))
            out.append(f.transform.apply(cols))
        return out

    def shard_values_of(self, row: Mapping[str, Any], schema: pa.Schema) -> ShardValues:
        """Shard values of one row given as a column -> value mapping."""
        missing = [c for c in self.source_columns if c not in row]
        if missing:
            raise UnknownColumnError(f"sharding column {missing[0]!r} is missing from the data")
        return tuple(f.transform.apply_one([row[c] for c in f.source_columns], [schema.field(c).type for c in f.source_columns])
                     for f in self.fields)

    def to_json(self) -> dict[str, Any]:
        return {"spec_id": self.spec_id, "spec": self.render(), "field_ids": [f.field_id for f in self.fields]}


def parse_sharding_spec(
    text: str,
    schema: pa.Schema,
    *,
    spec_id: int = 1,
    field_ids: Sequence[str] | None = None,
) -> ShardingSpec:
    """Parse ``unsharded``, ``bucket(id, 4)``, ``identity(region)``, ``year(ts)``,
    ``truncate(name, 2)``, ``multi_bucket(a, b, 8)`` or several of them separated by commas,
    and check every column exists and every transform can take its column's type.
    """
    calls = _split_top_level(text)
    if not calls:
        raise ShardingSpecError("empty sharding spec; use 'unsharded' for a single shard")
    fields = []
    for i, call in enumerate(calls):
        transform, columns = parse_transform_call(call)
        if isinstance(transform, Unsharded) and len(calls) > 1:
            raise ShardingSpecError("unsharded cannot be combined with other sharding fields")
        types = []
        for c in columns:
            if c not in schema.names:
                raise UnknownColumnError(
                    f"sharding spec {text!r} names column {c!r}, which is not in the schema "
                    f"(columns: {', '.join(schema.names)})"
                )
            types.append(schema.field(c).type)
        result_type = transform.result_type(types)
        if field_ids is not None:
            fid = field_ids[i]
        elif transform.lance_native:
            fid = "bucket"  # the field id Lance itself gives its single sharding field
        else:
            fid = "_".join([transform.name, *columns])
        fields.append(ShardingField(fid, tuple(columns), transform, result_type))
    ids = [f.field_id for f in fields]
    if len(set(ids)) != len(ids):
        raise ShardingSpecError(f"sharding spec {text!r} repeats a field: {ids}")
    return ShardingSpec(spec_id, tuple(fields))


def _split_top_level(text: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise ShardingSpecError(f"unbalanced parentheses in sharding spec {text!r}")
    tail = "".join(cur).strip()
    if tail:
        parts.append(tail)
    return [p for p in parts if p]


# ---------------------------------------------------------------------------------------
# Shard values <-> bytes <-> UUIDs
# ---------------------------------------------------------------------------------------

_INT_FORMATS = {8: "b", 16: "h", 32: "i", 64: "q"}


def encode_shard_value(value: Any, t: pa.DataType) -> bytes | None:
    """Arrow little-endian scalar bytes of a shard value, as Lance stores them in
    ``ShardFieldEntry.value`` (utf8: the raw bytes). None for a null value."""
    if value is None:
        return None
    if pa.types.is_boolean(t):
        return b"\x01" if value else b"\x00"
    if pa.types.is_integer(t):
        fmt = _INT_FORMATS[t.bit_width]
        return struct.pack("<" + (fmt if pa.types.is_signed_integer(t) else fmt.upper()), value)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return value.encode("utf-8")
    raise ShardingSpecError(f"shard values of type {t} cannot be encoded")


def decode_shard_value(raw: bytes | None, t: pa.DataType) -> Any:
    """Inverse of :func:`encode_shard_value`."""
    if raw is None:
        return None
    if pa.types.is_boolean(t):
        return raw != b"\x00"
    if pa.types.is_integer(t):
        fmt = _INT_FORMATS[t.bit_width]
        return struct.unpack("<" + (fmt if pa.types.is_signed_integer(t) else fmt.upper()), raw)[0]
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return raw.decode("utf-8")
    raise ShardingSpecError(f"shard values of type {t} cannot be decoded")


def field_entries(spec: ShardingSpec, values: ShardValues) -> dict[str, bytes]:
    """The ``shard_field_entries`` of a shard (null values are left out)."""
    out = {}
    for f, v in zip(spec.fields, values, strict=True):
        raw = encode_shard_value(v, f.result_type)
        if raw is not None:
            out[f.field_id] = raw
    return out


def shard_uuid(table_uuid: uuid.UUID, spec: ShardingSpec, values: ShardValues) -> str:
    """The deterministic UUID (string form) of the shard holding ``values``."""
    parts = [str(spec.spec_id)]
    for f, v in zip(spec.fields, values, strict=True):
        raw = encode_shard_value(v, f.result_type)
        parts.append(f"{f.field_id}=" + ("null" if raw is None else raw.hex()))
    return str(uuid.uuid5(table_uuid, "|".join(parts)))


@dataclass
class ShardResolver:
    """Shard UUIDs of shard values for one table, memoized (a clearable cache)."""

    table_uuid: uuid.UUID
    spec: ShardingSpec
    _cache: dict[ShardValues, str] = field(default_factory=dict, repr=False)

    def shard_id(self, values: ShardValues) -> str:
        sid = self._cache.get(values)
        if sid is None:
            sid = self._cache[values] = shard_uuid(self.table_uuid, self.spec, values)
        return sid

    def shard_ids(self, values: Iterable[ShardValues]) -> list[str]:
        return [self.shard_id(v) for v in values]

    def clear(self) -> None:
        self._cache.clear()


def lance_init_kwargs(spec: ShardingSpec) -> dict[str, Any]:
    """Arguments of ``LanceDataset.initialize_mem_wal`` that record ``spec`` in Lance.

    Specs Lance cannot hold (memwal-only transforms, several fields) use manual shards:
    Lance gets no sharding spec, memwal routes by its own.
    """
    if not spec.lance_native:
        return {}
    f = spec.fields[0]
    if isinstance(f.transform, Unsharded):
        return {"unsharded": True}
    if isinstance(f.transform, Bucket):
        return {"bucket_column": f.source_columns[0], "num_buckets": f.transform.num_buckets}
    if isinstance(f.transform, Identity):
        return {"identity_column": f.source_columns[0]}
    raise AssertionError(f"unexpected native transform {f.transform}")


def lance_spec_dict(spec: ShardingSpec, lance_schema_field_ids: Mapping[str, int]) -> dict[str, Any]:
    """The spec in the shape ``lance.mem_wal.evaluate_sharding_spec`` takes."""
    return {
        "spec_id": spec.spec_id,
        "fields": [
            {
                "field_id": f.field_id,
                "source_ids": [lance_schema_field_ids[c] for c in f.source_columns],
                "transform": f.transform.name,
                "expression": None,
                "result_type": lance_type_name(f.result_type),
                "parameters": f.transform.parameters(),
            }
            for f in spec.fields
        ],
    }
