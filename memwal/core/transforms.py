"""Sharding transforms: pure, vectorized functions from source column values to shard values.

``bucket``, ``identity`` and ``unsharded`` are Lance's own transforms: memwal computes them
exactly as ``lance.mem_wal.evaluate_sharding_spec`` does (a property test holds the two
equal), so a table sharded by Lance routes the same whether a row goes through memwal or
through Lance. ``year``, ``month``, ``day``, ``hour``, ``truncate`` and ``multi_bucket`` come
from the older MemWAL spec; Lance 14.0.2 no longer accepts them in a sharding spec, so memwal
evaluates them itself and uses them with manually created shards.

Every transform maps a null input to a null shard value, except ``bucket`` (Lance puts nulls
in bucket 0) and ``multi_bucket`` (null only when every input is null).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal.core.errors import InvalidValueError, ShardingSpecError, TransformTypeError

# ---------------------------------------------------------------------------------------
# Murmur3 x86 32-bit, in the variant Lance uses for bucket sharding.
#
# Integers hash like standard Murmur3 over their little-endian bytes. Byte strings differ
# from the reference algorithm in the tail: every trailing byte (len % 4) is sign-extended
# and mixed as a full block, as Spark's Murmur3_x86_32.hashUnsafeBytes does. That is why
# the mmh3 package cannot be used for strings.
# ---------------------------------------------------------------------------------------

_C1 = np.uint32(0xCC9E2D51)
_C2 = np.uint32(0x1B873593)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _mix_k1(k: np.ndarray) -> np.ndarray:
    return _rotl(k * _C1, 15) * _C2


def _mix_h1(h: np.ndarray, k: np.ndarray) -> np.ndarray:
    return _rotl(h ^ k, 13) * np.uint32(5) + np.uint32(0xE6546B64)


def _fmix(h: np.ndarray, length: np.ndarray | int) -> np.ndarray:
    h = h ^ np.asarray(length, dtype=np.uint32)
    h = (h ^ (h >> np.uint32(16))) * np.uint32(0x85EBCA6B)
    h = (h ^ (h >> np.uint32(13))) * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def _seed_array(seed: np.ndarray | int, n: int) -> np.ndarray:
    return np.broadcast_to(np.asarray(seed, dtype=np.uint32), (n,)).copy()


def murmur3_int32(values: np.ndarray, seed: np.ndarray | int = 0) -> np.ndarray:
    """Murmur3 of 32-bit values (any 4-byte integer dtype), as uint32."""
    with np.errstate(over="ignore"):
        k = values.astype(np.int32, copy=False).view(np.uint32)
        return _fmix(_mix_h1(_seed_array(seed, len(k)), _mix_k1(k)), 4)


def murmur3_int64(values: np.ndarray, seed: np.ndarray | int = 0) -> np.ndarray:
    """Murmur3 of 64-bit values: low 32 bits, then high 32 bits, as uint32."""
    with np.errstate(over="ignore"):
        v = values.astype(np.int64, copy=False).view(np.uint64)
        low = (v & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        high = (v >> np.uint64(32)).astype(np.uint32)
        h = _mix_h1(_seed_array(seed, len(v)), _mix_k1(low))
        return _fmix(_mix_h1(h, _mix_k1(high)), 8)


_M32 = 0xFFFFFFFF


def _mix_one(h: int, k: int) -> int:
    """One block of Murmur3 on Python ints: what ``_mix_h1(h, _mix_k1(k))`` does per element."""
    k = (k * 0xCC9E2D51) & _M32
    k = (((k << 15) | (k >> 17)) * 0x1B873593) & _M32
    h ^= k
    return ((((h << 13) | (h >> 19)) & _M32) * 5 + 0xE6546B64) & _M32


def murmur3_int_one(value: int, bit_width: int, seed: int = 0) -> int:
    """Murmur3 of one integer, as :func:`murmur3_int32` (``bit_width`` <= 32) or
    :func:`murmur3_int64` hash it, without NumPy: a point lookup routes one key, and NumPy's
    per-call cost on one-element arrays was most of the lookup's routing (~0.13 ms)."""
    if bit_width <= 32:
        h, length = _mix_one(seed & _M32, value & _M32), 4
    else:
        bits = value & 0xFFFFFFFFFFFFFFFF
        h, length = _mix_one(_mix_one(seed & _M32, bits & _M32), bits >> 32), 8
    h ^= length
    h = ((h ^ (h >> 16)) * 0x85EBCA6B) & _M32
    h = ((h ^ (h >> 13)) * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def _fits(value: int, t: pa.DataType) -> bool:
    """Whether an integer type holds ``value`` (else the vector path raises Arrow's error)."""
    if pa.types.is_signed_integer(t):
        return -(1 << (t.bit_width - 1)) <= value < 1 << (t.bit_width - 1)
    return 0 <= value < 1 << t.bit_width


def murmur3_binary(arr: pa.Array, seed: np.ndarray | int = 0) -> np.ndarray:
    """Murmur3 of each value of a (large_)string/binary array, as uint32 (nulls hash as empty).

    Vectorized over rows: iteration count is the longest value's length / 4, not the row count.
    """
    if pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type):
        offsets_dtype = np.int64
    else:
        offsets_dtype = np.int32
    arr = arr.fill_null("" if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type) else b"")
    n = len(arr)
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=offsets_dtype)[arr.offset : arr.offset + n + 1].astype(np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    starts, lengths = offsets[:-1], offsets[1:] - offsets[:-1]
    h = _seed_array(seed, n)
    if n == 0:
        return h
    # Pad so that reading 4 bytes past any start stays in bounds.
    padded = np.concatenate([data, np.zeros(4, np.uint8)])
    blocks = lengths // 4
    with np.errstate(over="ignore"):
        for j in range(int(blocks.max(initial=0))):
            rows = np.nonzero(blocks > j)[0]
            pos = starts[rows] + 4 * j
            k = (
                padded[pos].astype(np.uint32)
                | (padded[pos + 1].astype(np.uint32) << np.uint32(8))
                | (padded[pos + 2].astype(np.uint32) << np.uint32(16))
                | (padded[pos + 3].astype(np.uint32) << np.uint32(24))
            )
            h[rows] = _mix_h1(h[rows], _mix_k1(k))
        tail = lengths - blocks * 4
        for j in range(3):
            rows = np.nonzero(tail > j)[0]
            pos = starts[rows] + blocks[rows] * 4 + j
            k = padded[pos].astype(np.int8).astype(np.int32).view(np.uint32)
            h[rows] = _mix_h1(h[rows], _mix_k1(k))
        return _fmix(h, lengths.astype(np.uint32))


def _float_bits(arr: pa.Array, width: int) -> np.ndarray:
    vals = arr.fill_null(0).to_numpy(zero_copy_only=False)
    if width == 32:
        vals = vals.astype(np.float32)
        bits = vals.view(np.int32).copy()
        bits[vals == 0] = 0  # -0.0 and +0.0 hash alike
        bits[np.isnan(vals)] = 0x7FC00000
    else:
        vals = vals.astype(np.float64)
        bits = vals.view(np.int64).copy()
        bits[vals == 0] = 0
        bits[np.isnan(vals)] = 0x7FF8000000000000
    return bits


def murmur3(arr: pa.Array, seed: np.ndarray | int = 0) -> np.ndarray:
    """Lance's bucket hash of every value of ``arr`` as uint32 (nulls get an arbitrary hash).

    Raises :class:`TransformTypeError` for types Lance cannot bucket.
    """
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.cast(t.value_type)
        t = arr.type
    if pa.types.is_boolean(t):
        return murmur3_int32(arr.fill_null(False).to_numpy(zero_copy_only=False).astype(np.int32), seed)
    if pa.types.is_integer(t) and t.bit_width <= 32:
        return murmur3_int32(arr.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64).astype(np.int32), seed)
    if pa.types.is_integer(t):
        return murmur3_int64(arr.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64, copy=False), seed)
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return murmur3_int32(arr.view(pa.int32()).fill_null(0).to_numpy(zero_copy_only=False), seed)
    if pa.types.is_timestamp(t) or pa.types.is_time64(t):
        return murmur3_int64(arr.view(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False), seed)
    if pa.types.is_float32(t):
        return murmur3_int32(_float_bits(arr, 32), seed)
    if pa.types.is_float64(t):
        return murmur3_int64(_float_bits(arr, 64), seed)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return murmur3_binary(arr, seed)
    raise TransformTypeError(f"bucket cannot hash values of type {t}")


def _as_array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    return values


# ---------------------------------------------------------------------------------------
# Transforms
# ---------------------------------------------------------------------------------------


def lance_type_name(t: pa.DataType) -> str:
    """The type name Lance writes in ``ShardingField.result_type`` (e.g. ``utf8``, ``boolean``)."""
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_string(t):
        return "utf8"
    if pa.types.is_large_string(t):
        return "large_utf8"
    return str(t)


class Transform(ABC):
    """A deterministic, stateless function from source column values to a shard value."""

    name: ClassVar[str]
    #: True for the transforms Lance itself evaluates (so a Lance sharding spec can hold them).
    lance_native: ClassVar[bool] = False
    #: Number of source columns the transform takes (None: one or more).
    arity: ClassVar[int | None] = 1

    @abstractmethod
    def result_type(self, source_types: Sequence[pa.DataType]) -> pa.DataType:
        """The shard value type, or :class:`TransformTypeError` if the sources cannot be taken."""

    @abstractmethod
    def apply(self, columns: Sequence[pa.Array]) -> pa.Array:
        """Shard values for every row of the source columns."""

    def apply_one(self, values: Sequence[Any], types: Sequence[pa.DataType]) -> Any:
        """The shard value of one row's source values (of ``types``), as :meth:`apply` gives
        it; transforms with a cheaper scalar form override this."""
        return self.apply([pa.array([v], t) for v, t in zip(values, types)])[0].as_py()

    def parameters(self) -> dict[str, str]:
        """Transform parameters as Lance stores them in ``ShardingField.parameters``."""
        return {}

    @abstractmethod
    def render(self, columns: Sequence[str]) -> str:
        """The spec syntax for this transform over ``columns``, e.g. ``bucket(id, 4)``."""

    def _type_error(self, t: pa.DataType, allowed: str) -> TransformTypeError:
        return TransformTypeError(
            f"transform {self.name} cannot take a column of type {t}; it takes {allowed}. "
            "Choose another transform or column."
        )


@dataclass(frozen=True)
class Unsharded(Transform):
    """Every row goes to the one shard, whose value is int32 0."""

    name: ClassVar[str] = "unsharded"
    lance_native: ClassVar[bool] = True
    arity: ClassVar[int | None] = 0

    def result_type(self, source_types: Sequence[pa.DataType]) -> pa.DataType:
        return pa.int32()

    def apply(self, columns: Sequence[pa.Array]) -> pa.Array:
        raise ShardingSpecError("unsharded has no source columns; use ShardingSpec.shard_values")

    def apply_one(self, values: Sequence[Any], types: Sequence[pa.DataType]) -> Any:
        return 0

    def render(self, columns: Sequence[str]) -> str:
        return "unsharded"


@dataclass(frozen=True)
class Identity(Transform):
    """The source value itself."""

    name: ClassVar[str] = "identity"
    lance_native: ClassVar[bool] = True

    def result_type(self, source_types: Sequence[pa.DataType]) -> pa.DataType:
        (t,) = source_types
        if pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t):
            return t
        raise self._type_error(t, "boolean, integer or string columns")

    def apply(self, columns: Sequence[pa.Array]) -> pa.Array:
        return _as_array(columns[0])

    def render(self, columns: Sequence[str]) -> str:
        return f"identity({columns[0]})"


_BUCKETABLE = "boolean, integer, float, date32, time, timestamp or string columns"


def _bucketable(t: pa.DataType) -> bool:
    return (
        pa.types.is_boolean(t)
        or pa.types.is_integer(t)
        or pa.types.is_floating(t) and not pa.types.is_float16(t)
        or pa.types.is_date32(t)
        or pa.types.is_time(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
    )


@dataclass(frozen=True)
class Bucket(Transform):
    """``(murmur3(value) & 0x7fffffff) % num_buckets``; nulls go to bucket 0 (as in Lance)."""

    num_buckets: int
    name: ClassVar[str] = "bucket"
    lance_native: ClassVar[bool] = True
    MAX_BUCKETS: ClassVar[int] = 1024  # Lance refuses more

    def __post_init__(self) -> None:
        if not 1 <= self.num_buckets <= self.MAX_BUCKETS:
            raise ShardingSpecError(f"bucket count must be in [1, {self.MAX_BUCKETS}], got {self.num_buckets}")

    def result_type(self, source_types: Sequence[pa.DataType]) -> pa.DataType:
        (t,) = source_types
        if not _bucketable(t):
            raise self._type_error(t, _BUCKETABLE)
        return pa.int32()

    def apply(self, columns: Sequence[pa.Array]) -> pa.Array:
        arr = _as_array(columns[0])
        h = murmur3(arr)
        buckets = ((h & np.uint32(0x7FFFFFFF)) % np.uint32(self.num_buckets)).astype(np.int32)
        if arr.null_count:
            buckets[np.asarray(arr.is_null())] = 0
        return pa.array(buckets, pa.int32())

    def apply_one(self, values: Sequence[Any], types: Sequence[pa.DataType]) -> Any:
        (v,), (t,) = values, types
        if v is None:
            return 0
        if pa.types.is_integer(t) and type(v) is int and _fits(v, t):
            return (murmur3_int_one(v, t.bit_width) & 0x7FFFFFFF) % self.num_buckets
        return super().apply_one(values, types)

    def parameters(self) -> dict[str, str]:
        return {"num_buckets": str(self.num_buckets)}

    def render(self, columns: Sequence[str]) -> str:
        return f"bucket({columns[0]}, {self.num_buckets})"


@dataclass(frozen=True)
class MultiBucket(Transform):
    """A bucket over several columns: each non-null value's hash seeds the next one's.

    Nulls are skipped (the seed passes through unchanged); the result is null only when
    every input is null. memwal-only: Lance 14.0.2 has no multi-column transform.
    """

    num_buckets: int
    name: ClassVar[str] = "multi_bucket"
    arity: ClassVar[int | None] = None

    def __post_init__(self) -> None:
        if not 1 <= self.num_buckets <= Bucket.MAX_BUCKETS:
            raise ShardingSpecError(f"bucket count must be in [1, {Bucket.MAX_BUCKETS}], got {self.num_buckets}")

    def result_type(self, source_types: Sequence[pa.DataType]) -> pa.DataType:
        if len(source_types) < 2:
            raise ShardingSpecError("multi_bucket takes two or more columns; use bucket for one")
        for t in source_types:
            if not _bucketable(t):
                raise self._type_error(t, _BUCKETABLE)
        return pa.int32()

    def apply(self, columns: Sequence[pa.Array]) -> pa.Array:
        arrays = [_as_array(c) for c in columns]
        n = len(arrays[0])
        h = np.zeros(n, np.uint32)
        all_null = np.ones(n, bool)
        for arr in arrays:
            valid = ~np.asarray(arr.is_null()) if arr.null_count else np.ones(n, bool)
            h = np.where(valid, murmur3(arr, h), h)
            all_null &= ~valid
        buckets = ((h & np.uint32(0x7FFFFFFF)) % np.uint32(self.num_buckets)).astype(np.int32)
        return pa.array(buckets, pa.int32(), mask=all_null if all_null.any() else None)

    def parameters(self) -> dict[str, str]:
        return {"num_buckets": str(self.num_buckets)}

    def render(self, columns: Sequence[str]) -> str:
        return f"multi_bucket({', '.join(columns)}, {self.num_buckets})"


def parse_iso_datetimes(arr: pa.Array) -> pa.Array:
    """ISO-8601 date/time strings as timestamps; strings with a zone offset are read as UTC.

    Raises :class:`InvalidValueError` naming the first value that does not parse.
    """
    try:
        return arr.cast(pa.timestamp("us"))
    except pa.ArrowInvalid as e:
        if "zone offset" in str(e):
            try:
                return arr.cast(pa.timestamp("us", tz="UTC"))
            except pa.ArrowInvalid as e2:
                e = e2
        raise InvalidValueError(f"not an ISO-8601 date or timestamp: {e}") from None


@dataclass(frozen=True)
class _DatePart(Transform):
    """``date_part(unit, value)`` as int32, in the column's time zone (UTC when it has none).

    Also takes ISO-8601 strings ('2026-01-31', '2026-01-31T10:00:00'): Lance cannot key a
    table on date or timestamp columns, and sharding columns must be key columns, so a
    string date column is how a time-sharded table is keyed in practice.
    """

    part: ClassVar[str]

    def result_type(self, source_types: Sequence[pa.DataType]) -> pa.DataType:
        (t,) = source_types
        ok = (
            pa.types.is_timestamp(t)
            or pa.types.is_string(t)
            or pa.types.is_large_string(t)
            or (self.part != "hour" and pa.types.is_date(t))
        )
        if not ok:
            raise self._type_error(
                t, "timestamp or ISO-8601 string columns" if self.part == "hour" else "date, timestamp or ISO-8601 string columns"
            )
        return pa.int32()

    def apply(self, columns: Sequence[pa.Array]) -> pa.Array:
        arr = _as_array(columns[0])
        if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
            arr = parse_iso_datetimes(arr)
        return getattr(pc, self.part)(arr).cast(pa.int32())

    def render(self, columns: Sequence[str]) -> str:
        return f"{self.name}({columns[0]})"


@dataclass(frozen=True)
class Year(_DatePart):
    name: ClassVar[str] = "year"
    part: ClassVar[str] = "year"


@dataclass(frozen=True)
class Month(_DatePart):
    name: ClassVar[str] = "month"
    part: ClassVar[str] = "month"


@dataclass(frozen=True)
class Day(_DatePart):
    name: ClassVar[str] = "day"
    part: ClassVar[str] = "day"


@dataclass(frozen=True)
class Hour(_DatePart):
    name: ClassVar[str] = "hour"
    part: ClassVar[str] = "hour"


@dataclass(frozen=True)
class Truncate(Transform):
    """Strings: the first ``width`` characters. Integers: ``v - (v % width)`` (SQL remainder,
    which takes the sign of ``v``, so -7 truncates to -5 with width 5)."""

    width: int
    name: ClassVar[str] = "truncate"

    def __post_init__(self) -> None:
        if self.width < 1:
            raise ShardingSpecError(f"truncate width must be positive, got {self.width}")

    def result_type(self, source_types: Sequence[pa.DataType]) -> pa.DataType:
        (t,) = source_types
        if pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t):
            return t
        raise self._type_error(t, "integer or string columns")

    def apply(self, columns: Sequence[pa.Array]) -> pa.Array:
        arr = _as_array(columns[0])
        if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
            return pc.utf8_slice_codeunits(arr, 0, self.width)
        vals = arr.fill_null(0).to_numpy(zero_copy_only=False)
        rem = np.fmod(vals, self.width)  # C remainder: sign of the dividend, like SQL's %
        out = (vals - rem).astype(vals.dtype)
        return pa.array(out, arr.type, mask=np.asarray(arr.is_null()) if arr.null_count else None)

    def parameters(self) -> dict[str, str]:
        return {"width": str(self.width)}

    def render(self, columns: Sequence[str]) -> str:
        return f"truncate({columns[0]}, {self.width})"


TRANSFORM_NAMES = ("unsharded", "identity", "bucket", "multi_bucket", "year", "month", "day", "hour", "truncate")

_CALL_RE = re.compile(r"^\s*(?P<name>[a-z_]+)\s*(?:\((?P<args>.*)\))?\s*$", re.S)


def parse_transform_call(text: str) -> tuple[Transform, list[str]]:
    """Parse one ``name(col, ..., param)`` call into a transform and its source columns.

    >>> parse_transform_call("bucket(id, 4)")
    (Bucket(num_buckets=4), ['id'])
    """
    m = _CALL_RE.match(text)
    if not m:
        raise ShardingSpecError(f"cannot parse sharding transform {text!r}; expected e.g. bucket(id, 4)")
    name = m.group("name")
    args = [a.strip() for a in (m.group("args") or "").split(",") if a.strip()]
    if name == "unsharded":
        if args:
            raise ShardingSpecError("unsharded takes no arguments")
        return Unsharded(), []
    if name not in TRANSFORM_NAMES:
        raise ShardingSpecError(f"unknown sharding transform {name!r}; known: {', '.join(TRANSFORM_NAMES)}")

    def int_param(value: str, what: str) -> int:
        try:
            return int(value)
        except ValueError:
            raise ShardingSpecError(f"{name}: {what} must be an integer, got {value!r}") from None

    if name in ("bucket", "truncate"):
        if len(args) != 2:
            raise ShardingSpecError(f"{name} takes a column and an integer, e.g. {name}(id, 4); got {text!r}")
        n = int_param(args[1], "the second argument")
        return (Bucket(n) if name == "bucket" else Truncate(n)), [args[0]]
    if name == "multi_bucket":
        if len(args) < 3:
            raise ShardingSpecError(f"multi_bucket takes two or more columns and a bucket count; got {text!r}")
        return MultiBucket(int_param(args[-1], "the bucket count")), args[:-1]
    if len(args) != 1:
        raise ShardingSpecError(f"{name} takes exactly one column; got {text!r}")
    return {"identity": Identity, "year": Year, "month": Month, "day": Day, "hour": Hour}[name](), args
