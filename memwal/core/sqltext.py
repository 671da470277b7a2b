"""Values and names written into SQL text (the DataFusion dialect Lance's filters use).

Readers build key predicates and views build group predicates from Python values; both
must quote the same way, so the quoting lives here, below both.
"""

from __future__ import annotations

import datetime as dt
import decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc

from memwal.core.errors import PrimaryKeyError


def sql_literal(value: Any) -> str:
    """A DataFusion SQL literal for a key value."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, decimal.Decimal):
        # typed, so it compares with a decimal column of any precision and scale
        digits = len(value.as_tuple().digits)
        scale = max(0, -int(value.as_tuple().exponent))
        return f"CAST('{value}' AS DECIMAL({max(digits, scale, 1)}, {scale}))"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, bytes):
        return "X'" + value.hex() + "'"
    if isinstance(value, dt.datetime):
        return f"TIMESTAMP '{value.isoformat(sep=' ')}'"
    if isinstance(value, dt.date):
        return f"DATE '{value.isoformat()}'"
    raise PrimaryKeyError(f"cannot express key value {value!r} in SQL")


def quote_ident(name: str) -> str:
    """A column name quoted for SQL when it needs it."""
    if name.isidentifier() and name.lower() == name:
        return name
    return '"' + name.replace('"', '""') + '"'


def in_filter(column: str, values: "pa.Array | pa.ChunkedArray", column_type: "pa.DataType") -> "str | pc.Expression":
    """A Lance filter ``column IN values``: a pyarrow expression over the array where Lance
    takes one (it then parses no thousand literals, and the column's BTREE still answers),
    SQL text otherwise (Lance's Substrait conversion takes no unsigned integers)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_unsigned_integer(column_type) or not (
        pa.types.is_integer(column_type) or pa.types.is_string(column_type) or pa.types.is_large_string(column_type)
        or pa.types.is_decimal(column_type) or pa.types.is_date(column_type) or pa.types.is_timestamp(column_type)
    ):
        return f"{column} IN ({', '.join(sql_literal(v) for v in values.to_pylist())})"
    array = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    return pc.field(column).isin(array.cast(column_type))
