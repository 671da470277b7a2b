"""Kafka Connect and Debezium semantic types: what a field of a change event means, and its
values turned into a table's Arrow column, vectorized and exact.

A Connect schema gives each field a literal type (``int32``, ``int64``, ``string``,
``bytes``, ``struct``...) and, for many, a semantic name (``org.apache.kafka.connect.data.Decimal``,
``io.debezium.time.MicroTimestamp``...) with parameters (a decimal's ``scale``). Kafka
Connect's JSON converter writes the literal value (a decimal as its unscaled big-endian
two's-complement bytes in base64, a timestamp as a number), and so does the Avro converter
(raw bytes, longs; it adds Avro logical types for Connect's own decimal, date, time and
timestamp). :class:`ConnectSchema` reads a field's schema from either; :func:`parse_type`
says what Arrow type a reader should read the literal as, and :func:`convert` turns a column
of literals into the table column's type.

**Exactly or not at all.** A value that cannot be stored exactly in the column (a decimal
with more digits than the column's precision or scale, a nanosecond timestamp with a
sub-microsecond part in a microsecond column, a date outside the column's range, a string
that is not an ISO instant) is not rounded or clipped: its row is reported with a reason
naming the column and the semantic type, and becomes a dead letter. Decimals go into float
columns (approximately) only when the table's column is a float: the table's type is the ask.

**Vectorized.** Every conversion works on whole columns (:mod:`memwal.streaming.literals`
decodes Connect's literal encodings); Python runs per distinct schema, per distinct scale of
a ``VariableScaleDecimal`` column, and per bad row (for its reason), never per good row.

**Time zones.** Debezium's ``Timestamp``/``MicroTimestamp``/``NanoTimestamp`` (and Connect's
``Timestamp``) carry a ``TIMESTAMP WITHOUT TIME ZONE`` as the epoch value of its wall-clock
time read as UTC; a naive timestamp column keeps that wall-clock time, and a column with a
time zone holds the same epoch value (the wall-clock time taken as UTC). ``ZonedTimestamp``
is an ISO string with an offset: it is converted to its UTC instant, which is what every
Arrow timestamp column stores (a naive column then holds UTC wall-clock time).
``ZonedTime`` becomes its time of day in UTC.

The schemas and names live in :mod:`memwal.streaming.connect_types` and the decoding of
literals in :mod:`memwal.streaming.literals`; this module converts, and is where the rest of
memwal takes all of it from (its ``__all__``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Every name of the Connect types, as this module's (the rest of memwal takes them from here).
from memwal.streaming.connect_types import (  # noqa: F401
    AVRO_LOGICAL,
    BITS,
    CONNECT_DATE,
    CONNECT_TIME,
    CONNECT_TIMESTAMP,
    ConnectSchema,
    DATE,
    DATES,
    DECIMAL,
    DURATIONS,
    ENUM,
    ENUM_SET,
    INSTANTS,
    ISO_DATE,
    ISO_TIME,
    ISO_TIMESTAMP,
    JSON,
    MICRO_DURATION,
    MICRO_TIME,
    MICRO_TIMESTAMP,
    NANO_DURATION,
    NANO_TIME,
    NANO_TIMESTAMP,
    PER_SECOND,
    SECONDS_PER_DAY,
    TEXTS,
    TIME,
    TIMES,
    TIMESTAMP,
    UUID,
    VARIABLE_SCALE_DECIMAL,
    XML,
    ZONED_TIME,
    ZONED_TIMESTAMP,
    arrow_type,
    parse_type,
    semantic,
)
from memwal.streaming.literals import (
    HEX_DIGITS,
    ISO_DATE_RE,
    ISO_INSTANT_RE,
    ISO_TIME_RE,
    UUID_RE,
    abs_below,
    base64_segments,
    beyond,
    days_from_civil,
    decimal_array,
    decimal_text,
    decimal_type,
    offset_seconds,
    same_width,
    segments_to_binary,
    storage_type,
    twos_complement_words,
    words_of,
)


_INT64_MAX = np.iinfo(np.int64).max


# -- conversion ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Converted:
    """A converted column: values of the target type (null where the row is bad) and, per bad row, why."""

    array: pa.Array
    errors: dict[int, str]


def convert(parsed: pa.Array | pa.ChunkedArray, s: ConnectSchema | None, target: pa.DataType, column: str) -> Converted:
    """``parsed`` (read as :func:`parse_type` says) as a column of ``target``; rows whose value
    cannot be stored exactly are null with their reason (naming ``column`` and the semantic type)."""
    arr = parsed.combine_chunks() if isinstance(parsed, pa.ChunkedArray) else parsed
    if not semantic(s):
        return Converted(arr, {})
    assert s is not None
    c = _Conversion(arr, s, target, column)
    return c.run()


class _Conversion:
    """One column's conversion: the values, their validity and the bad rows found so far."""

    def __init__(self, arr: pa.Array, s: ConnectSchema, target: pa.DataType, column: str) -> None:
        self.arr = arr
        self.s = s
        self.target = target
        self.column = column
        self.n = len(arr)
        self.valid = np.asarray(arr.is_valid(), bool) if arr.null_count else np.ones(self.n, bool)
        self.errors: dict[int, str] = {}

    def bad(self, mask: np.ndarray, why: str | Iterable[str]) -> None:
        """Mark the valid rows of ``mask`` bad (``why``: one reason, or one per marked row)."""
        rows = np.flatnonzero(mask & self.valid)
        whys = [why] * len(rows) if isinstance(why, str) else list(why)
        for i, w in zip(rows, whys):
            self.errors.setdefault(int(i), f"column {self.column!r} ({self.s.describe()}): {w}")
        self.valid = self.valid & ~mask

    def unsupported(self) -> Converted:
        self.bad(np.ones(self.n, bool), f"a value of this type cannot be stored in a {self.target} column")
        return Converted(pa.nulls(self.n, self.target), self.errors)

    def run(self) -> Converted:
        s, name = self.s, self.s.name
        if s.type == "array":
            return self.array()
        if name == DECIMAL:
            return self.decimal()
        if name == VARIABLE_SCALE_DECIMAL:
            return self.variable_scale_decimal()
        if name in INSTANTS:
            return self.epoch(INSTANTS[name], "instant")
        if name in TIMES:
            return self.epoch(TIMES[name], "time")
        if name in DATES:
            return self.days(self.ints())
        if name in DURATIONS:
            return self.epoch(DURATIONS[name], "duration")
        if name in (ZONED_TIMESTAMP, ISO_TIMESTAMP):
            return self.iso_instant()
        if name in (ZONED_TIME, ISO_TIME):
            return self.iso_time()
        if name == ISO_DATE:
            return self.iso_date()
        if name == UUID and (pa.types.is_fixed_size_binary(self.target) or pa.types.is_binary(self.target)
                             or isinstance(self.target, pa.UuidType)):
            return self.uuid_bytes()
        if name in TEXTS:
            return self.text()
        if s.type == "bytes":  # Bits and plain bytes
            return self.bytes()
        return Converted(self.arr, {})

    # -- results

    def done(self, values: np.ndarray | pa.Array, arrow_type: pa.DataType | None = None) -> Converted:
        """The column from numpy values (of ``arrow_type``, the target's storage by default) or
        an Arrow array, with the bad and null rows null."""
        mask = ~self.valid
        if isinstance(values, np.ndarray):
            out = pa.array(values, type=arrow_type or storage_type(self.target), mask=mask if mask.any() else None)
            if out.type != self.target:
                out = out.view(self.target) if same_width(out.type, self.target) else out.cast(self.target)
            return Converted(out, self.errors)
        out = values
        if mask.any() and out.null_count < mask.sum():
            out = pc.if_else(pa.array(self.valid), out, pa.nulls(self.n, out.type))
        return Converted(out if out.type == self.target else out.cast(self.target), self.errors)

    def ints(self) -> np.ndarray:
        """The column's integers as int64 (0 where null)."""
        return np.asarray(self.arr.cast(pa.int64()).fill_null(0), np.int64)

    # -- decimals

    def decimal(self) -> Converted:
        flat, starts, lengths = self.byte_segments(self.arr)
        return self.decimal_from_bytes(flat, starts, lengths, int(self.s.param("scale") or 0))

    def decimal_from_bytes(self, flat: np.ndarray, starts: np.ndarray, lengths: np.ndarray, scale: int) -> Converted:
        """Unscaled big-endian two's-complement integers of ``scale`` into the target: a decimal
        column (exactly: no digit dropped, none beyond its precision), an integer column (the
        same, at scale 0), or a float or text column (the value as it is, then cast)."""
        t = self.target
        if pa.types.is_decimal(t):
            width = 32 if isinstance(t, pa.Decimal256Type) else 16
            precision, target_scale = t.precision, t.scale
        elif pa.types.is_integer(t):
            width, precision, target_scale = 16, 38, 0
        elif pa.types.is_floating(t) or pa.types.is_string(t) or pa.types.is_large_string(t):
            width, precision, target_scale = 32, 76, None
        else:
            return self.unsupported()
        self.bad(lengths == 0, "no bytes (a decimal's unscaled value needs at least one)")
        words = self.twos_complement(flat, starts, lengths, width)
        words[~self.valid] = 0
        if target_scale is None:  # a float or text column takes the value as it is
            source = decimal_array(words, scale, self.valid)
            return self.done(source.cast(pa.float64()).cast(t) if pa.types.is_floating(t) else source.cast(pa.string()).cast(t))
        shift = target_scale - scale
        before_point = f"digit(s) before the point (the column is {t})"
        if shift >= 0:  # more fractional digits in the column: exact if the digits fit
            big = ~abs_below(words, 10 ** max(precision - shift, 0))
            self.bad(big, (f"{decimal_text(words[i], scale)} has more than {precision - target_scale} {before_point}"
                           for i in np.flatnonzero(big & self.valid)))
            words[~self.valid] = 0
            source = decimal_array(words, scale, self.valid)
            scaled = source.cast(decimal_type(width, target_scale), safe=True) if shift else source
        else:  # fewer: exact only if the digits dropped are zeros
            source = decimal_array(words, scale, self.valid)
            scaled = source.cast(decimal_type(width, target_scale), safe=False)
            lost = ~np.asarray(pc.equal(scaled.cast(source.type, safe=False), source).fill_null(True), bool)
            self.bad(lost, (f"{decimal_text(words[i], scale)} has more than {target_scale} digit(s) after the point (the column is {t})"
                            for i in np.flatnonzero(lost & self.valid)))
            big = ~abs_below(words_of(scaled, width), 10 ** precision)
            self.bad(big, (f"{decimal_text(words[i], scale)} has more than {precision - target_scale} {before_point}"
                           for i in np.flatnonzero(big & self.valid)))
        out_words = words_of(scaled, width)
        out_words[~self.valid] = 0
        if pa.types.is_integer(t):
            return self.decimal_to_int(out_words)
        result = decimal_array(out_words, target_scale, self.valid, precision)
        return self.done(result if result.type == t else result.cast(t))

    def decimal_to_int(self, words: np.ndarray) -> Converted:
        """128-bit integers (two words per row) into the integer target, if they fit."""
        t = self.target
        lo, hi = words[:, 0], words[:, 1]
        info = np.iinfo(t.to_pandas_dtype())
        if info.min == 0:
            fits = (hi == 0) & (lo <= np.uint64(info.max))
            values = lo
        else:
            fits = ((hi == 0) & (lo < np.uint64(1 << 63))) | ((hi == np.uint64(2**64 - 1)) & (lo >= np.uint64(1 << 63)))
            values = lo.view(np.int64)
            fits &= (values >= info.min) & (values <= info.max)
        self.bad(~fits, f"does not fit a {t} column")
        return self.done(np.where(self.valid, values, 0).astype(t.to_pandas_dtype()), t)

    def variable_scale_decimal(self) -> Converted:
        arr = self.arr
        scales = arr.field("scale")
        values = arr.field("value")
        self.bad(np.asarray(scales.is_null(), bool) | np.asarray(values.is_null(), bool), "no 'scale' or 'value'")
        scale = np.asarray(scales.fill_null(0), np.int64)
        parts: list[tuple[np.ndarray, pa.Array]] = []
        for sc in np.unique(scale[self.valid]):
            rows = np.flatnonzero(self.valid & (scale == sc))
            sub = _Conversion(values.take(pa.array(rows, pa.int64())), self.s, self.target, self.column)
            flat, starts, lengths = sub.byte_segments(sub.arr)
            got = sub.decimal_from_bytes(flat, starts, lengths, int(sc))
            for j, why in got.errors.items():
                self.errors.setdefault(int(rows[j]), why.replace(f"({self.s.describe()})", f"({self.s.describe()}, scale {sc})"))
            parts.append((rows, got.array))
        self.valid &= ~np.isin(np.arange(self.n), np.fromiter(self.errors, np.int64, len(self.errors)))
        if not parts:
            return self.done(pa.nulls(self.n, self.target))
        order = np.concatenate([r for r, _ in parts])
        joined = pa.concat_arrays([a for _, a in parts] + [pa.nulls(1, self.target)])
        at = np.full(self.n, len(order), np.int64)  # the trailing null
        at[order] = np.arange(len(order))
        return self.done(joined.take(pa.array(at, pa.int64())))

    # -- bytes

    def byte_segments(self, arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The bytes of each row as (flat bytes, start, length): raw for binary columns (Avro),
        decoded from base64 for strings (the JSON converter); rows that are not base64 are bad."""
        if pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type) or pa.types.is_fixed_size_binary(arr.type):
            arr = arr.cast(pa.binary()) if not pa.types.is_binary(arr.type) else arr
            offsets = np.frombuffer(arr.buffers()[1], np.int32, len(arr) + 1, arr.offset * 4).astype(np.int64)
            data = arr.buffers()[2]
            flat = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
            lengths = np.where(self.valid, np.diff(offsets), 0)
            return flat, offsets[:-1], lengths
        flat, starts, lengths, wrong = base64_segments(arr, self.valid)
        self.bad(wrong, "not base64")
        return flat, starts, np.where(self.valid, lengths, 0)

    def twos_complement(self, flat: np.ndarray, starts: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
        """Each row's big-endian two's-complement bytes as ``width // 8`` little-endian uint64 words;
        a row of more bytes than ``width`` is bad unless the extra bytes only extend the sign."""
        words, too_long = twos_complement_words(flat, starts, np.where(self.valid, lengths, 0), width)
        self.bad(too_long, f"more than {width * 8} bits")
        return words

    def bytes(self) -> Converted:
        t = self.target
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            if pa.types.is_string(self.arr.type):  # plain bytes into a text column: the base64 text, as before
                return self.done(self.arr)
            return self.unsupported()
        flat, starts, lengths = self.byte_segments(self.arr)
        if pa.types.is_integer(t) and self.s.name == BITS:
            width = t.bit_width // 8
            self.bad(lengths > width, f"more bits than a {t} column holds")
            padded = np.zeros((self.n, 8), np.uint8)
            k = np.where(self.valid, lengths, 0)
            rows = np.repeat(np.arange(self.n), k)
            j = np.arange(int(k.sum())) - np.repeat(np.cumsum(k) - k, k)
            padded[rows, j] = flat[np.repeat(starts, k) + j]  # little-endian: the BitSet's byte order
            values = padded.view(np.uint64).ravel()
            if not pa.types.is_unsigned_integer(t):
                self.bad(values > np.uint64(np.iinfo(t.to_pandas_dtype()).max), f"more bits than a {t} column holds")
            return self.done(np.where(self.valid, values, 0).astype(t.to_pandas_dtype()), t)
        if pa.types.is_fixed_size_binary(t):
            self.bad(lengths != t.byte_width, f"not {t.byte_width} bytes")
        elif not (pa.types.is_binary(t) or pa.types.is_large_binary(t)):
            return self.unsupported()
        return self.done(segments_to_binary(flat, starts, np.where(self.valid, lengths, 0), self.valid).cast(t))

    def uuid_bytes(self) -> Converted:
        """A UUID's text as its 16 bytes (a binary, fixed-size binary or ``pa.uuid()`` column)."""
        text = self.arr.cast(pa.string())
        ok = np.asarray(pc.match_substring_regex(text, UUID_RE).fill_null(False), bool)
        self.bad(~ok, "not a UUID")
        hexes = pc.replace_substring(pc.if_else(pa.array(self.valid), text, "0" * 36), "-", "")
        start = int(np.frombuffer(hexes.buffers()[1], np.int32, 1, hexes.offset)[0]) if self.n else 0
        raw = np.frombuffer(hexes.buffers()[2], np.uint8, self.n * 32, start).reshape(self.n, 32) if self.n else np.zeros((0, 32), np.uint8)
        nibbles = HEX_DIGITS[raw]
        data = (nibbles[:, 0::2] << 4 | nibbles[:, 1::2]).astype(np.uint8)
        mask = None if self.valid.all() else pa.py_buffer(np.packbits(self.valid, bitorder="little").tobytes())
        fixed = pa.Array.from_buffers(pa.binary(16), self.n, [mask, pa.py_buffer(data.tobytes())])
        if isinstance(self.target, pa.UuidType):
            return Converted(pa.ExtensionArray.from_storage(self.target, fixed), self.errors)
        return self.done(fixed)

    def text(self) -> Converted:
        t = self.target
        if isinstance(t, pa.ExtensionType) and pa.types.is_string(t.storage_type):
            return self.done(pa.ExtensionArray.from_storage(t, self.arr.cast(t.storage_type)))
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t) or pa.types.is_binary(t):
            return self.done(self.arr.cast(t))
        return self.unsupported()

    # -- times

    def epoch(self, unit: str, kind: str) -> Converted:
        """Integers counting ``unit`` since the epoch (``instant``), since midnight (``time``) or
        not anchored (``duration``), into the target column."""
        t = self.target
        values = self.ints()
        per_day = PER_SECOND[unit] * SECONDS_PER_DAY
        if kind == "time" and not pa.types.is_integer(t):
            self.bad((values < 0) | (values >= per_day), "is not a time of day (from 00:00 up to 24:00)")
        if pa.types.is_integer(t):  # the number as it is (epoch numbers in integer columns)
            info = np.iinfo(t.to_pandas_dtype())
            self.bad((values < info.min) | (values > info.max), f"does not fit a {t} column")
            return self.done(np.where(self.valid, values, 0).astype(t.to_pandas_dtype()), t)
        if kind == "instant" and pa.types.is_timestamp(t):
            return self.done(self.rescale(values, unit, t.unit), pa.int64())
        if kind == "instant" and pa.types.is_date(t):
            self.bad(values % per_day != 0, "is not at midnight (the column is a date)")
            return self.days(values // per_day)
        if kind == "time" and pa.types.is_time(t):
            out = self.rescale(values, unit, t.unit)
            return self.done(out.astype(np.int32) if pa.types.is_time32(t) else out, storage_type(t))
        if kind == "duration" and pa.types.is_duration(t):
            return self.done(self.rescale(values, unit, t.unit), pa.int64())
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            natural = {"instant": pa.timestamp(unit), "duration": pa.duration(unit),
                       "time": pa.time32(unit) if unit in ("s", "ms") else pa.time64(unit)}[kind]
            raw = pa.array(np.where(self.valid, values, 0), pa.int64()).cast(storage_type(natural)).view(natural)
            return self.done(raw.cast(pa.string()))
        return self.unsupported()

    def rescale(self, values: np.ndarray, unit: str, to: str) -> np.ndarray:
        """``values`` in ``unit`` as ``to``: exact (a finer part that does not divide is a bad row)
        and in range (a coarser value that overflows int64 in the finer unit is a bad row)."""
        a, b = PER_SECOND[unit], PER_SECOND[to]
        if a == b:
            return values
        if b > a:
            factor = b // a
            self.bad(beyond(values, _INT64_MAX // factor), f"is out of the range of the column's unit ({to})")
            return np.where(self.valid, values, 0) * factor
        factor = a // b
        self.bad(values % factor != 0, f"has a part finer than the column's unit ({to})")
        return values // factor

    def days(self, days: np.ndarray) -> Converted:
        t = self.target
        if pa.types.is_date32(t):
            self.bad((days < -(2**31)) | (days >= 2**31), "is out of the range of a date32 column")
            return self.done(np.where(self.valid, days, 0).astype(np.int32), pa.int32())
        if pa.types.is_date64(t):
            return self.done(self.rescale_days(days, "ms"), pa.int64())
        if pa.types.is_timestamp(t):
            return self.done(self.rescale_days(days, t.unit), pa.int64())
        if pa.types.is_integer(t):
            info = np.iinfo(t.to_pandas_dtype())
            self.bad((days < info.min) | (days > info.max), f"does not fit a {t} column")
            return self.done(days.astype(t.to_pandas_dtype()), t)
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            self.bad((days < -(2**31)) | (days >= 2**31), "is out of the range of a date")
            return self.done(pa.array(np.where(self.valid, days, 0).astype(np.int32), mask=~self.valid).cast(pa.date32()).cast(pa.string()).cast(t))
        return self.unsupported()

    def rescale_days(self, days: np.ndarray, unit: str) -> np.ndarray:
        per_day = PER_SECOND[unit] * SECONDS_PER_DAY
        self.bad(beyond(days, _INT64_MAX // per_day), f"is out of the range of the column's unit ({unit})")
        return np.where(self.valid, days, 0) * per_day

    def iso_parts(self, pattern: str) -> dict[str, np.ndarray | pa.Array]:
        text = self.arr.cast(pa.string())
        parts = pc.extract_regex(text, pattern)
        self.bad(~np.asarray(parts.is_valid(), bool), (f"{text[int(i)].as_py()!r} is not an ISO 8601 value of this type"
                                                       for i in np.flatnonzero(~np.asarray(parts.is_valid(), bool) & self.valid)))
        out: dict[str, np.ndarray | pa.Array] = {}
        for f in parts.type:
            col = pc.struct_field(parts, f.name)
            if f.name == "f":
                out[f.name] = np.asarray(pc.cast(pc.utf8_rpad(pc.if_else(pc.equal(col, ""), "0", col), 9, "0"), pa.int64()).fill_null(0), np.int64)
            elif f.name == "z":
                out[f.name] = offset_seconds(col)
            else:
                digits = pc.utf8_ltrim(pc.if_else(pc.equal(col, ""), "0", col), "+")  # Java writes years past 9999 as +10000
                out[f.name] = np.asarray(pc.cast(digits, pa.int64()).fill_null(0), np.int64)
        return out

    def iso_instant(self) -> Converted:
        t = self.target
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return self.text()
        if not pa.types.is_timestamp(t):
            return self.unsupported()
        try:  # Arrow's ISO 8601 cast takes what Debezium writes (an offset, up to the unit's digits), all or nothing
            parsed = self.arr.cast(pa.string()).cast(pa.timestamp(t.unit, "UTC"))
            return self.done(parsed.view(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False), pa.int64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass  # a value it cannot take: each row's reason from the parts
        p = self.iso_parts(ISO_INSTANT_RE)
        days, ok_date = days_from_civil(p["y"], p["m"], p["d"])
        ok = ok_date & (p["H"] < 24) & (p["M"] < 60) & (p["S"] < 60)
        self.bad(~ok, "is not a valid date and time")
        seconds = days * SECONDS_PER_DAY + p["H"] * 3600 + p["M"] * 60 + p["S"] - p["z"]
        return self.done(self.from_seconds(seconds, p["f"], t.unit), pa.int64())

    def from_seconds(self, seconds: np.ndarray, nanos: np.ndarray, unit: str) -> np.ndarray:
        per = PER_SECOND[unit]
        step = 1_000_000_000 // per
        self.bad(nanos % step != 0, f"has a part finer than the column's unit ({unit})")
        sub = nanos // step  # 0 <= sub < per
        top_s, top_sub = divmod(_INT64_MAX, per)
        low_s, low_sub = divmod(-_INT64_MAX - 1, per)
        fits = ((seconds < top_s) | ((seconds == top_s) & (sub <= top_sub))) & ((seconds > low_s) | ((seconds == low_s) & (sub >= low_sub)))
        self.bad(~fits, f"is out of the range of the column's unit ({unit})")
        seconds = np.where(self.valid, seconds, 0)
        return seconds * per + np.where(self.valid, sub, 0)

    def iso_time(self) -> Converted:
        t = self.target
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return self.text()
        if not pa.types.is_time(t):
            return self.unsupported()
        p = self.iso_parts(ISO_TIME_RE)
        self.bad(~((p["H"] < 24) & (p["M"] < 60) & (p["S"] < 60)), "is not a valid time of day")
        seconds = (p["H"] * 3600 + p["M"] * 60 + p["S"] - p["z"]) % SECONDS_PER_DAY
        out = self.from_seconds(seconds, p["f"], t.unit)
        return self.done(out.astype(np.int32) if pa.types.is_time32(t) else out, storage_type(t))

    def iso_date(self) -> Converted:
        t = self.target
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return self.text()
        p = self.iso_parts(ISO_DATE_RE)
        days, ok = days_from_civil(p["y"], p["m"], p["d"])
        self.bad(~ok, "is not a valid date")
        return self.days(days)

    # -- arrays

    def array(self) -> Converted:
        t = self.target
        arr = self.arr
        if not (pa.types.is_list(t) or pa.types.is_large_list(t)) or not pa.types.is_list(arr.type):
            return self.unsupported()
        assert self.s.items is not None
        items = convert(arr.flatten(), self.s.items, t.value_type, self.column)
        parents = np.asarray(pc.list_parent_indices(arr), np.int64)
        for j, why in items.errors.items():
            self.errors.setdefault(int(parents[j]), why.replace(f"column {self.column!r}", f"an item of column {self.column!r}", 1))
        lengths = np.asarray(arr.value_lengths().fill_null(0), np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        bad = np.zeros(self.n, bool)
        bad[list(self.errors)] = True
        self.valid &= ~bad
        mask = pa.array(~self.valid)
        out = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), items.array, type=pa.list_(t.value_type), mask=mask)
        return Converted(out if out.type == t else out.cast(t), self.errors)


__all__ = ["ConnectSchema", "Converted", "arrow_type", "convert", "parse_type", "semantic"]
