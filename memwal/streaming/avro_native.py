"""Native decoding of flat Avro records: a batch of values read into Arrow columns by Arrow's
Rust Avro decoder (through DataFusion, a memwal dependency) instead of fastavro's Python
objects, ~10x faster on a record with a 64-float vector (docs/bench-log/input-formats.md, "Input formats").

**The record layout is checked first.** Arrow's Avro decoder reads a block byte-driven: a
block whose last record is cut short makes it spin forever (measured with DataFusion 55:
trailing bytes after a record, which Kafka values can carry), and a block of zero bytes
makes no row. So no value reaches it before :func:`record_fits` has walked every record's
encoding from the schema alone, vectorized over the batch (varints, lengths, array blocks; no
value is built), and found that it ends exactly at the value's last byte. A value that does
not fit is left to fastavro, which gives the reason it is a dead letter, so both paths reject
what fastavro rejects.

**Only schemas whose decoding is the same both ways** take this path (:func:`plan`): a record
of fields that are booleans, ints, longs, floats, doubles, strings or bytes, arrays of
booleans, floats or doubles, or a union of null and one of those; no logical types, named
types or schema resolution. The rows are cast to the reader's types as ``Table.from_pylist``
would build them from fastavro's dicts; a test compares the two on generated records.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from memwal.streaming.batches import value_offsets

#: Avro's primitive types the walk can step over, by encoding: fixed width in bytes, a varint,
#: or a varint length then that many bytes.
_FIXED = {"boolean": 1, "float": 4, "double": 8}
_VARINT = {"int", "long"}
_LENGTH = {"string", "bytes"}
#: A varint is at most 10 bytes (64 bits in groups of 7).
_VARINT_MAX = 10


@dataclass(frozen=True)
class Step:
    """How to step over one field's encoding: ``kind`` is "fixed" (``width`` bytes), "varint",
    "length" (a varint length, then that many bytes), "array" (blocks of ``width``-byte items),
    "nullable" (a union branch index, then ``inner`` unless the branch is ``null_branch``) or
    "record" (each of ``fields`` in turn)."""

    kind: str
    width: int = 0
    inner: "Step | None" = None
    null_branch: int = 0
    fields: tuple["Step", ...] = ()


def _primitive(t: object) -> str | None:
    if isinstance(t, dict) and "logicalType" not in t and isinstance(t.get("type"), str):
        t = t["type"]
    return t if isinstance(t, str) and (t in _FIXED or t in _VARINT or t in _LENGTH) else None


def _step(t: object) -> Step | None:
    name = _primitive(t)
    if name in _FIXED:
        return Step("fixed", _FIXED[name])
    if name in _VARINT:
        return Step("varint")
    if name in _LENGTH:
        return Step("length")
    if isinstance(t, dict) and t.get("type") == "array" and "logicalType" not in t and _primitive(t.get("items")) in _FIXED:
        return Step("array", _FIXED[_primitive(t["items"])])
    if isinstance(t, list) and len(t) == 2 and t.count("null") == 1:
        other = t[1 - t.index("null")]
        inner = None if isinstance(other, list) else _step(other)
        return None if inner is None else Step("nullable", inner=inner, null_branch=t.index("null"))
    return None


#: The Arrow type Arrow's Avro decoder gives each primitive the walk takes.
_ARROW = {"boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(), "double": pa.float64(),
          "string": pa.string(), "bytes": pa.binary()}


def _arrow_type(t: object) -> pa.DataType:
    if isinstance(t, list):
        return _arrow_type(t[1 - t.index("null")])
    if isinstance(t, dict) and t.get("type") == "array":
        return pa.list_(_ARROW[_primitive(t["items"])])  # type: ignore[index]
    return _ARROW[_primitive(t)]  # type: ignore[index]


def conformable(schema_json: str, parse_schema: pa.Schema) -> bool:
    """Whether the rows of a plan-able writer schema can be cast to ``parse_schema`` as
    :func:`conform_rows` does (decided from the schemas alone, so a table whose columns the
    native rows cannot take, e.g. a timestamp from a ``long``, never pays for a native read)."""
    fields = {f["name"]: _arrow_type(f["type"]) for f in json.loads(schema_json)["fields"]}
    return all(_castable(fields[f.name], f.type) for f in parse_schema if f.name in fields)


#: How deep named types may nest in a nested plan (a recursive type would never end).
_MAX_DEPTH = 24


def nested_plan(schema_json: str) -> tuple[tuple[Step, ...], str] | None:
    """The steps over a record with nested records (Debezium's change-event envelopes: rows,
    the source block, the transaction block), and the schema Arrow's decoder is given for it;
    None if a field is of a type the walk does not take (maps, arrays of variable-size items,
    unions other than null and one type).

    Logical types and enums are taken by their encoding (the column converters give them their
    meaning), and the decoder's schema has every named type written out where it is used
    (Arrow's decoder does not resolve references to named types: measured with DataFusion 55),
    renamed where it repeats, and no logical types: the same bytes, read as raw values."""
    try:
        schema = json.loads(schema_json)
    except ValueError:
        return None
    named: dict[str, object] = {}
    copies: dict[str, int] = {}

    def full_name(t: dict, ns: str | None) -> str:
        name = str(t.get("name"))
        return name if "." in name or not ns else f"{ns}.{name}"

    def unique(full: str) -> str:
        copies[full] = copies.get(full, 0) + 1
        short = full.rsplit(".", 1)[-1]
        return short if copies[full] == 1 else f"{short}_{copies[full]}"

    def walk(t: object, ns: str | None, depth: int) -> tuple[Step, object] | None:
        if depth > _MAX_DEPTH:
            return None
        if isinstance(t, str):
            if t in _FIXED:
                return Step("fixed", _FIXED[t]), t
            if t in _VARINT:
                return Step("varint"), t
            if t in _LENGTH:
                return Step("length"), t
            ref = named.get(t) or named.get(f"{ns}.{t}")
            return None if ref is None else walk(ref, ns, depth + 1)
        if isinstance(t, list):
            if len(t) != 2 or t.count("null") != 1:
                return None
            at = t.index("null")
            inner = walk(t[1 - at], ns, depth + 1)
            if inner is None:
                return None
            return Step("nullable", inner=inner[0], null_branch=at), ["null", inner[1]] if at == 0 else [inner[1], "null"]
        if not isinstance(t, dict):
            return None
        kind = t.get("type")
        if kind in ("record", "enum", "fixed"):
            full = full_name(t, ns)
            named.setdefault(full, t)
            inner_ns = full.rsplit(".", 1)[0] if "." in full else ns
            if kind == "enum":
                return Step("varint"), {"type": "enum", "name": unique(full), "symbols": t.get("symbols", [])}
            if kind == "fixed":
                return Step("fixed", int(t["size"])), {"type": "fixed", "name": unique(full), "size": int(t["size"])}
            steps, fields = [], []
            for f in t.get("fields", []):
                got = walk(f.get("type"), inner_ns, depth + 1) if isinstance(f, dict) else None
                if got is None:
                    return None
                steps.append(got[0])
                fields.append({"name": f["name"], "type": got[1]})
            return Step("record", fields=tuple(steps)), {"type": "record", "name": unique(full), "fields": fields}
        if kind == "array":
            item = _primitive({k: v for k, v in t.items() if k != "logicalType"} if isinstance(t.get("items"), dict) else t.get("items"))
            if item not in _FIXED:
                return None
            return Step("array", _FIXED[item]), {"type": "array", "items": item}
        if isinstance(kind, (str, list, dict)) and kind != "map":
            return walk(kind, ns, depth + 1)  # a primitive with attributes (logical types), or {"type": <type>}
        return None

    top = walk(schema, schema.get("namespace") if isinstance(schema, dict) else None, 0)
    if top is None or top[0].kind != "record":
        return None
    return top[0].fields, json.dumps(top[1])


def plan(schema_json: str) -> tuple[Step, ...] | None:
    """The steps over a record of this writer schema, one per field; None if any field is of
    a type the native path does not take (then fastavro decodes every record)."""
    try:
        schema = json.loads(schema_json)
    except ValueError:
        return None
    if not isinstance(schema, dict) or schema.get("type") != "record" or not isinstance(schema.get("fields"), list):
        return None
    steps = [_step(f.get("type")) if isinstance(f, dict) else None for f in schema["fields"]]
    return None if any(s is None for s in steps) else tuple(steps)  # type: ignore[return-value]


class _Walk:
    """Positions of every record of a batch in its concatenated bytes, advanced field by field.
    ``bad`` marks a record whose encoding left its value (or was malformed); its position is
    then meaningless and it is never advanced again."""

    def __init__(self, data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        # Padding lets a varint read past the last value's end without an index check; what
        # it reads there only matters to records already out of bounds, hence bad.
        self.buf = np.concatenate([data, np.zeros(_VARINT_MAX, np.uint8)])
        self.pos = starts.astype(np.int64)
        self.end = ends.astype(np.int64)
        self.bad = np.zeros(len(starts), bool)

    def _check(self, idx: np.ndarray) -> np.ndarray:
        self.bad[idx] |= self.pos[idx] > self.end[idx]
        return idx[~self.bad[idx]]

    def varint(self, idx: np.ndarray) -> np.ndarray:
        """Read one zig-zag varint at each record of ``idx`` (all good) and step over it."""
        pos = self.pos[idx]
        value = np.zeros(len(idx), np.uint64)
        length = np.zeros(len(idx), np.int64)
        active = np.ones(len(idx), bool)
        last = len(self.buf) - 1
        for k in range(_VARINT_MAX):
            if not active.any():
                break
            b = self.buf[np.minimum(pos + k, last)].astype(np.uint64)
            value = np.where(active, value | ((b & np.uint64(0x7F)) << np.uint64(7 * k)), value)
            length[active] = k + 1
            active &= (b & np.uint64(0x80)) != 0
        self.bad[idx[active]] = True  # more than 10 bytes: not a varint
        self.pos[idx] = pos + length
        return (value >> np.uint64(1)).astype(np.int64) ^ -(value & np.uint64(1)).astype(np.int64)

    def skip(self, idx: np.ndarray, nbytes: np.ndarray) -> None:
        """Step over ``nbytes`` at each record of ``idx``; a count that is negative or runs past
        the value's end makes the record bad (checked before the sum, which could overflow)."""
        room = self.end[idx] - self.pos[idx]
        wrong = (nbytes < 0) | (nbytes > room)
        self.bad[idx[wrong]] = True
        ok = idx[~wrong]
        self.pos[ok] += nbytes[~wrong]

    def step(self, s: Step, idx: np.ndarray) -> None:
        idx = idx[~self.bad[idx]]
        if not len(idx):
            return
        if s.kind == "fixed":
            self.pos[idx] += s.width
        elif s.kind == "varint":
            self.varint(idx)
        elif s.kind == "length":
            n = self.varint(idx)
            keep = ~self.bad[idx]
            self.skip(idx[keep], n[keep])
        elif s.kind == "array":
            live = idx
            while len(live):
                count = self.varint(live)
                negative = count < 0
                if negative.any():  # a block of -count items, preceded by its size in bytes
                    self.varint(live[negative])
                    count = np.abs(count)
                    self.bad[live[count < 0]] = True  # -2**63 has no positive counterpart
                keep = ~self.bad[live] & (count != 0)
                live, count = live[keep], count[keep]
                # count * width without overflow: a count past the value's end is bad anyway.
                room = (self.end[live] - self.pos[live]) // s.width
                too_many = count > room
                self.bad[live[too_many]] = True
                live, count = live[~too_many], count[~too_many]
                self.pos[live] += count * s.width
                live = self._check(live)
        elif s.kind == "record":
            for f in s.fields:
                self.step(f, idx)
        elif s.kind == "nullable":
            branch = self.varint(idx)
            wrong = (branch != 0) & (branch != 1)
            self.bad[idx[wrong]] = True
            assert s.inner is not None
            self.step(s.inner, idx[~wrong & (branch != s.null_branch)])
        self._check(idx)


def record_fits(steps: tuple[Step, ...], values: pa.BinaryArray) -> np.ndarray:
    """For each (non-null) value, whether it is exactly one record of the plan's schema as far
    as its layout goes: every field's encoding well formed and the last one ending at the
    value's last byte. It does not look inside strings (UTF-8) or at the values themselves."""
    n = len(values)
    if n == 0:
        return np.zeros(0, bool)
    offsets = value_offsets(values)
    data_buf = values.buffers()[2]
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    walk = _Walk(data, offsets[:-1], offsets[1:])
    everyone = np.arange(n, dtype=np.int64)
    for s in steps:
        walk.step(s, everyone)
    return ~walk.bad & (walk.pos == walk.end)


_SHM = "/dev/shm"
_PREFIX = "memwal-avro-"


def _scratch_dir(nbytes: int) -> str:
    """Where a block of ``nbytes`` is written for the decoder to read: memory-backed where
    there is one with room for it twice over (containers often give /dev/shm 64 MiB), else the
    temporary directory."""
    with contextlib.suppress(OSError):
        st = os.statvfs(_SHM)
        if os.access(_SHM, os.W_OK) and st.f_bavail * st.f_frsize > 2 * nbytes:
            return _SHM
    return tempfile.gettempdir()


def _sweep(directory: str) -> None:
    """Remove scratch files left by processes that no longer run (a read task killed while
    its block was on disk): each file's name carries its writer's process id. A file whose
    process runs (``kill`` succeeds, or is refused: another user's) stays."""
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            pid = name[len(_PREFIX):].split("-", 1)[0]
            if not name.startswith(_PREFIX) or not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(directory, name))
            except OSError:
                continue


class NativeReader:
    """Reads a block of records of one writer schema through DataFusion's Avro reader (one
    partition, so rows keep the block's order). Each call writes the container to a scratch
    file: DataFusion reads Avro only from files."""

    _swept: set[str] = set()

    def __init__(self) -> None:
        from datafusion import SessionConfig, SessionContext

        self._ctx = SessionContext(SessionConfig().with_target_partitions(1))

    def read(self, container: bytes) -> pa.Table:
        directory = _scratch_dir(len(container))
        if directory not in NativeReader._swept:  # once per process and directory
            NativeReader._swept.add(directory)
            _sweep(directory)
        fd, path = tempfile.mkstemp(suffix=".avro", prefix=f"{_PREFIX}{os.getpid()}-", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(container)
            return self._ctx.read_avro(path).to_arrow_table()
        finally:
            os.unlink(path)


def _castable(src: pa.DataType, dst: pa.DataType) -> bool:
    """Whether casting ``src`` to ``dst`` gives what ``Table.from_pylist`` makes of fastavro's
    Python values of that Avro type (so the native path accepts exactly what fastavro does)."""
    if pa.types.is_null(src) or src == dst:
        return True
    if pa.types.is_integer(src):
        return pa.types.is_integer(dst) or pa.types.is_floating(dst)
    if pa.types.is_floating(src):
        return pa.types.is_floating(dst)
    if pa.types.is_string(src) or pa.types.is_large_string(src):
        return pa.types.is_string(dst) or pa.types.is_large_string(dst)
    if pa.types.is_binary(src) or pa.types.is_large_binary(src):
        return pa.types.is_binary(dst) or pa.types.is_large_binary(dst)
    if pa.types.is_list(src) or pa.types.is_large_list(src):
        return (pa.types.is_list(dst) or pa.types.is_large_list(dst)) and _castable(src.value_type, dst.value_type)
    return False


def conform_rows(table: pa.Table, parse_schema: pa.Schema) -> pa.Table:
    """The decoded rows in the reader's ``parse_schema`` (its fields missing from the record
    are null, the record's other fields dropped). :func:`conformable` said the casts apply;
    a value one of them cannot take (an overflow) raises."""
    columns = [table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
               for f in parse_schema]
    return pa.table(columns, schema=parse_schema)
