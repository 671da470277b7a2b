"""What a view computes, and what its SQL says about the columns it reads and groups by.

A definition is data: it is stored as JSON in the view's Lance config and read back by
every process that refreshes the view, so it holds only names and SQL text. The little
SQL it must understand itself (which items are aggregates, the expression behind a GROUP
BY alias, which base columns are mentioned) is sniffed here with regular expressions;
everything else is left to DataFusion.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import re
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import pyarrow as pa

from memwal.core.errors import InvalidArgumentError
from memwal.core.schema import parse_type
from memwal.views.errors import ViewError

_AGG = re.compile(r"^\s*(count|sum|min|max|avg)\s*\(\s*(.*?)\s*\)\s+as\s+([A-Za-z_][A-Za-z0-9_]*)\s*$", re.I | re.S)
_ALIAS = re.compile(r"^(.*?)\s+as\s+([A-Za-z_][A-Za-z0-9_]*)\s*$", re.I | re.S)
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class UdfColumn:
    """A view column computed by a Python function on Arrow batches.

    ``function`` is ``"module:attribute"``; it takes a ``pyarrow.RecordBatch`` of the
    ``inputs`` columns (outputs of ``select``) and returns an array of ``output_type``.
    The explicit ``version`` and a checksum of the function's code identify its results:
    a change of either recomputes the column for every row.
    """

    name: str
    function: str
    inputs: tuple[str, ...]
    output_type: str
    version: str = "1"

    def load(self) -> Callable[[pa.RecordBatch], Any]:
        module, _, attr = self.function.partition(":")
        if not attr:
            raise ViewError(f"UDF {self.name}: function must be 'module:attribute', got {self.function!r}")
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj

    def checksum(self) -> str:
        fn = self.load()
        try:
            code = inspect.getsource(fn)
        except (OSError, TypeError):
            code = getattr(getattr(fn, "__code__", None), "co_code", b"").hex()
        return hashlib.sha256(code.encode()).hexdigest()[:16]

    def arrow_type(self) -> pa.DataType:
        try:
            return parse_type(self.output_type)
        except InvalidArgumentError as e:
            raise ViewError(str(e)) from None

    def identity(self) -> str:
        """What results depend on: the explicit version and the code."""
        return f"{self.version}:{self.checksum()}"


@dataclass(frozen=True)
class AggregateItem:
    """One ``func(expr) AS alias`` item of an aggregate view's ``select``."""

    func: str  # count, sum, min, max or avg (lower case)
    expr: str
    alias: str


@dataclass(frozen=True)
class ViewDefinition:
    """What a view computes: ``select`` and ``where`` in DataFusion SQL over the base
    table, UDF columns on the selected rows, an optional shuffle of row views, or
    ``group_by`` with ``count``/``sum``/``min``/``max``/``avg`` aggregates."""

    name: str
    source: str
    select: tuple[str, ...] = ()
    where: str | None = None
    group_by: tuple[str, ...] = ()
    udfs: tuple[UdfColumn, ...] = ()
    shuffle_seed: int | None = None

    @property
    def aggregate(self) -> bool:
        return bool(self.group_by)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ViewDefinition":
        d = json.loads(text)
        d["select"] = tuple(d.get("select", ()))
        d["group_by"] = tuple(d.get("group_by", ()))
        d["udfs"] = tuple(UdfColumn(**{**u, "inputs": tuple(u["inputs"])}) for u in d.get("udfs", ()))
        return cls(**d)

    def columns_used(self, names: Sequence[str]) -> list[str]:
        """The base columns (of ``names``) the view reads: every one it names in its SQL or
        its UDF inputs, or all of them for ``SELECT *``. Reading only these keeps a refresh
        from pulling vector columns it never uses."""
        if not self.select or any(re.fullmatch(r"\s*(\w+\.)?\*\s*", item) for item in self.select):
            return list(names)
        text = " ".join([*self.select, self.where or "", *self.group_by])
        words = {w.lower() for w in re.findall(r'[A-Za-z_][A-Za-z0-9_]*|"[^"]+"', text)}
        words |= {w.strip('"').lower() for w in words}
        used = {c for u in self.udfs for c in u.inputs}
        return [n for n in names if n.lower() in words or n in used]

    def aggregates(self) -> list[AggregateItem]:
        """Every aggregate item of ``select``, in order."""
        out = []
        for item in self.select:
            m = _AGG.match(item)
            if m:
                out.append(AggregateItem(m.group(1).lower(), m.group(2), m.group(3)))
        return out

    def group_expr(self, column: str) -> str:
        """The SQL expression of a GROUP BY column: its ``select`` item's (``EXPR AS column``),
        or the base column itself."""
        for item in self.select:
            m = _ALIAS.match(item)
            if m and m.group(2) == column and not _AGG.match(item):
                return m.group(1).strip()
        return column

    def where_clause(self) -> str:
        return f" WHERE {self.where}" if self.where else ""

    def check(self) -> None:
        """Refuse a definition that cannot be maintained, at create time rather than at the
        first refresh."""
        if not _NAME.fullmatch(self.name):
            raise ViewError(f"view name {self.name!r}: use letters, digits, '_', '.', '-'")
        if self.group_by:
            for item in (s for s in self.select if not _AGG.match(s)):
                m = _ALIAS.match(item)
                col = (m.group(2) if m else item).strip()
                if col not in self.group_by:
                    raise ViewError(f"view {self.name}: {item!r} is neither an aggregate nor a GROUP BY column")
            if not self.aggregates():
                raise ViewError(f"view {self.name}: GROUP BY without aggregates")
            if self.udfs:
                raise ViewError(f"view {self.name}: UDF columns are not supported on aggregate views")
            if self.shuffle_seed is not None:
                raise ViewError(f"view {self.name}: shuffle applies to row views only")
        for u in self.udfs:
            u.load()  # fail at definition time if the function cannot be imported
