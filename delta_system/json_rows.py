"""Table rows ↔ JSON objects, for the JSON records weirflow's CLI reads and writes (`weirflow streams consume`,
`weirflow streams produce`).

**Out** (`to_json`): one object per row, every column included (the id column too), as a JSON value can say
it: timestamps and dates as ISO 8601, decimals as strings (a float would round them), binary as base64.

**In** (`from_json`): JSON cannot say a column's type (``1`` may be a ``bigint`` or a ``double``, ``"2024-01-01"``
a string or a date), so objects are converted with the table's own schema, never guessed: numbers and strings
go into the column's type, strings into dates, timestamps and decimals by Arrow's parsing of them. A table
that does not exist yet has no schema to convert with (its columns come from its first commit), so JSON
cannot be its first write (docs/delta.md).
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from weirflow_delta.errors import DeltaSchemaError


def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    return str(value)


def to_json(rows: pa.Table) -> list[bytes]:
    """Each row of ``rows`` as a compact JSON object (UTF-8)."""
    return [
        json.dumps(row, default=_plain, separators=(",", ":"), ensure_ascii=False).encode()
        for row in rows.to_pylist()
    ]


def _column(values: list[Any], type_: pa.DataType) -> pa.Array:
    try:
        return pa.array(values, type=type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        if all(v is None or isinstance(v, str) for v in values):
            return pa.array(values, pa.string()).cast(type_)  # dates, timestamps, decimals written as text
        raise


def from_json(objects: Sequence[Mapping[str, Any]], schema: pa.Schema, table: str) -> pa.Table:
    """``objects`` as rows of ``schema`` (a column an object lacks is null); `DeltaSchemaError` naming the table,
    the column and its type when a value does not convert, or naming fields the table has no column for."""
    unknown = sorted({name for obj in objects for name in obj} - set(schema.names))
    if unknown:
        raise DeltaSchemaError(
            f"Delta table '{table}' has no column {', '.join(repr(n) for n in unknown)}; its columns are "
            f"{', '.join(schema.names)}"
        )
    columns = []
    for field in schema:
        values = [obj.get(field.name) for obj in objects]
        try:
            columns.append(_column(values, field.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError) as exc:
            raise DeltaSchemaError(
                f"column '{field.name}' of Delta table '{table}' is {field.type}, and a value of the JSON does "
                f"not convert to it ({str(exc).splitlines()[0]})"
            ) from exc
    return pa.Table.from_arrays(columns, schema=schema)
