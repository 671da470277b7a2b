"""Kafka Connect's literal encodings, decoded over whole columns: base64 and two's-complement
decimals, their digits, and ISO dates, times and instants split by one regular-expression kernel
and assembled with integer arithmetic. What :mod:`memwal.streaming.connect`'s conversions are
built from.

**Vectorized.** Every conversion works on whole columns with numpy and Arrow compute:
base64 and two's complement are decoded over the column's data buffer, ISO strings are split
by one regular-expression kernel and assembled with integer arithmetic; Python runs per
distinct schema, per distinct scale of a ``VariableScaleDecimal`` column, and per bad row
(for its reason), never per good row.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


_B64 = np.full(256, 255, np.uint8)
for _i, _c in enumerate(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"):
    _B64[_c] = _i
_PAD = ord("=")
_B64[_PAD] = 64
HEX_DIGITS = np.full(256, 0, np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    HEX_DIGITS[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    HEX_DIGITS[_c] = 10 + _i
UUID_RE = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"


def base64_segments(arr: pa.Array, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Base64 text (standard alphabet, padded, as Java's encoder writes it) of each valid row,
    decoded over the whole column at once: (decoded bytes, each row's start in them, its
    length, rows that are not base64)."""
    text = arr.cast(pa.string()) if not pa.types.is_string(arr.type) else arr
    n = len(text)
    lengths = np.asarray(pc.binary_length(text).fill_null(0), np.int64)
    wrong = valid & (lengths % 4 != 0)
    if wrong.any() or (~valid & (lengths > 0)).any():
        # every row a whole number of 4-character groups from the data's start: the others empty
        text = pc.if_else(pa.array(valid & ~wrong), text, pa.scalar("", pa.string()))
        lengths = np.asarray(pc.binary_length(text).fill_null(0), np.int64)
    offsets = np.frombuffer(text.buffers()[1], np.int32, n + 1, text.offset * 4).astype(np.int64)
    data = text.buffers()[2]
    raw = np.frombuffer(data, np.uint8)[offsets[0]:offsets[-1]] if data is not None else np.zeros(0, np.uint8)
    starts = offsets[:-1] - offsets[0]
    sextets = _B64[raw]
    # characters outside the alphabet, and padding anywhere but a row's last two characters
    odd = np.flatnonzero(sextets >= 64)
    if len(odd):
        row_of = np.searchsorted(starts, odd, side="right") - 1
        at = odd - starts[row_of]
        end = lengths[row_of]
        pad = sextets[odd] == 64
        ok = pad & ((at == end - 1) | ((at == end - 2) & (raw[np.minimum(odd + 1, len(raw) - 1)] == _PAD)))
        wrong[row_of[~ok]] = True
    pads = np.zeros(n, np.int64)
    has = lengths > 0
    last = starts[has] + lengths[has] - 1
    pads[has] = (raw[last] == _PAD).astype(np.int64) + (raw[last - 1] == _PAD).astype(np.int64)
    q = np.where(sextets >= 64, 0, sextets).astype(np.uint8).reshape(-1, 4)
    out = np.empty((len(q), 3), np.uint8)
    out[:, 0] = (q[:, 0] << 2) | (q[:, 1] >> 4)
    out[:, 1] = ((q[:, 1] & 15) << 4) | (q[:, 2] >> 2)
    out[:, 2] = ((q[:, 2] & 3) << 6) | q[:, 3]
    return out.ravel(), starts // 4 * 3, lengths // 4 * 3 - pads, wrong


def segments_to_binary(flat: np.ndarray, starts: np.ndarray, lengths: np.ndarray, valid: np.ndarray) -> pa.BinaryArray:
    """Rows given as (start, length) in ``flat`` as one binary array (a gather of their bytes)."""
    lengths = np.where(valid, lengths, 0)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    total = int(offsets[-1])
    idx = np.repeat(starts - offsets[:-1], lengths) + np.arange(total)
    data = flat[idx] if total else np.zeros(0, np.uint8)
    mask = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little").tobytes())
    return pa.BinaryArray.from_buffers(pa.binary(), len(lengths), [mask, pa.py_buffer(offsets.astype(np.int32).tobytes()),
                                                                    pa.py_buffer(data.tobytes())])


def twos_complement_words(flat: np.ndarray, starts: np.ndarray, lengths: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Big-endian two's-complement integers of ``lengths`` bytes at ``starts`` in ``flat`` as
    ``width``-byte little-endian integers (``width // 8`` uint64 words per row), sign-extended;
    and the rows longer than ``width`` whose extra leading bytes are more than sign extension."""
    n = len(starts)
    out = np.zeros((n, width), np.uint8)
    has = lengths > 0
    negative = np.zeros(n, bool)
    negative[has] = flat[starts[has]] >= 0x80
    out[negative] = 0xFF
    k = np.minimum(lengths, width)
    rows = np.repeat(np.arange(n), k)
    j = np.arange(int(k.sum())) - np.repeat(np.cumsum(k) - k, k)
    out[rows, j] = flat[np.repeat(starts + lengths - 1, k) - j]
    too_long = np.zeros(n, bool)
    long_rows = np.flatnonzero(lengths > width)
    for i in long_rows:  # rare: Java's BigInteger writes the fewest bytes
        extra = flat[starts[i]: starts[i] + lengths[i] - width]
        sign = 0xFF if negative[i] else 0x00
        top_ok = (flat[starts[i] + lengths[i] - width] >= 0x80) == bool(negative[i])
        too_long[i] = not (np.all(extra == sign) and top_ok)
    return out.view(np.uint64).reshape(n, width // 8).copy(), too_long


def _negate(words: np.ndarray) -> np.ndarray:
    """Two's complement negation of multiword little-endian integers."""
    inv = ~words
    out = inv.copy()
    carry = np.ones(len(words), bool)
    for w in range(words.shape[1]):
        out[:, w] = inv[:, w] + carry.astype(np.uint64)
        carry = carry & (out[:, w] == 0)
    return out


def abs_below(words: np.ndarray, bound: int) -> np.ndarray:
    """Per row, whether |value| < ``bound`` (multiword little-endian two's complement)."""
    nwords = words.shape[1]
    negative = (words[:, -1] >> np.uint64(63)).astype(bool)
    mag = words.copy()
    if negative.any():
        mag[negative] = _negate(words[negative])
    if bound >= 1 << (64 * nwords - 1):
        return np.ones(len(words), bool)
    limbs = [np.uint64((bound >> (64 * w)) & ((1 << 64) - 1)) for w in range(nwords)]
    less = np.zeros(len(words), bool)
    equal = np.ones(len(words), bool)
    for w in reversed(range(nwords)):
        less |= equal & (mag[:, w] < limbs[w])
        equal &= mag[:, w] == limbs[w]
    # -2**(64n-1) negates to itself: its magnitude reads negative; it is never below a smaller bound
    return less & ~(negative & (mag[:, -1] >> np.uint64(63)).astype(bool))


def decimal_type(width: int, scale: int, precision: int | None = None) -> pa.DataType:
    if width == 16:
        return pa.decimal128(precision or 38, scale)
    return pa.decimal256(precision or 76, scale)


def decimal_array(words: np.ndarray, scale: int, valid: np.ndarray, precision: int | None = None) -> pa.Array:
    t = decimal_type(words.shape[1] * 8, scale, precision)
    mask = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little").tobytes())
    return pa.Array.from_buffers(t, len(words), [mask, pa.py_buffer(np.ascontiguousarray(words).tobytes())])


def words_of(arr: pa.Array, width: int) -> np.ndarray:
    data = arr.buffers()[1]
    return np.frombuffer(data, np.uint64, len(arr) * width // 8, arr.offset * width).reshape(len(arr), width // 8).copy()


def decimal_text(words: np.ndarray, scale: int) -> str:
    """One row's value as text, for a reason."""
    v = int.from_bytes(np.ascontiguousarray(words).tobytes(), "little", signed=True)
    sign, digits = ("-" if v < 0 else ""), str(abs(v))
    if scale <= 0:
        return sign + digits + "0" * -scale
    digits = digits.rjust(scale + 1, "0")
    return f"{sign}{digits[:-scale]}.{digits[-scale:]}"


def beyond(values: np.ndarray, limit: int) -> np.ndarray:
    """|values| > limit, without numpy's overflow of abs(-2**63)."""
    return (values > limit) | (values < -limit)


def storage_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_date64(t) or pa.types.is_time64(t):
        return pa.int64()
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return pa.int32()
    return t


def same_width(a: pa.DataType, b: pa.DataType) -> bool:
    return getattr(a, "bit_width", None) == getattr(b, "bit_width", None)


DATE_RE = r"(?P<y>[+-]?\d{4,9})-(?P<m>\d{2})-(?P<d>\d{2})"
CLOCK_RE = r"(?P<H>\d{2}):(?P<M>\d{2})(?::(?P<S>\d{2})(?:\.(?P<f>\d{1,9}))?)?"
ZONE_RE = r"(?P<z>Z|[+-]\d{2}:\d{2}(?::\d{2})?)"
ISO_INSTANT_RE = rf"^{DATE_RE}T{CLOCK_RE}{ZONE_RE}$"
ISO_TIME_RE = rf"^{CLOCK_RE}{ZONE_RE}$"
ISO_DATE_RE = rf"^{DATE_RE}(?P<z>Z|[+-]\d{{2}}:\d{{2}})?$"


def offset_seconds(zone: pa.Array) -> np.ndarray:
    """``Z`` or ``±HH:MM[:SS]`` as seconds east of UTC (0 where empty or null)."""
    z = pc.if_else(pc.or_(pc.equal(zone, "Z"), pc.equal(zone, "")), "+00:00:00", zone).fill_null("+00:00:00")
    z = pc.if_else(pc.equal(pc.utf8_length(z), 6), pc.binary_join_element_wise(z, ":00", ""), z)
    sign = np.where(np.asarray(pc.starts_with(z, "-"), bool), -1, 1)
    hh = np.asarray(pc.cast(pc.utf8_slice_codeunits(z, 1, 3), pa.int64()), np.int64)
    mm = np.asarray(pc.cast(pc.utf8_slice_codeunits(z, 4, 6), pa.int64()), np.int64)
    ss = np.asarray(pc.cast(pc.utf8_slice_codeunits(z, 7, 9), pa.int64()), np.int64)
    return sign * (hh * 3600 + mm * 60 + ss)


def days_from_civil(y: np.ndarray, m: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Days since 1970-01-01 of proleptic Gregorian dates (any year), and whether each date exists."""
    leap = ((y % 4 == 0) & (y % 100 != 0)) | (y % 400 == 0)
    month_days = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], np.int64)
    ok = (m >= 1) & (m <= 12)
    mi = np.clip(m, 1, 12) - 1
    ok &= (d >= 1) & (d <= month_days[mi] + ((mi == 1) & leap))
    yy = y - (m <= 2)
    era = np.floor_divide(yy, 400)
    yoe = yy - era * 400
    mp = (m + 9) % 12
    doy = (153 * mp + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468, ok
