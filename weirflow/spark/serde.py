"""Serdes: turning a stream's raw values into typed columns, in the source's executor processes.

* ``json`` — each value is a JSON object; its fields are checked against the declared schema
  (`streams.<id>.schema`, Spark DDL) one by one, so an undecodable value is rejected with a reason that names
  the field ("field 'event_time': expected a timestamp ..."), and goes to the dead-letter stream.
* ``string`` — columns ``key`` and ``value`` as UTF-8 text (invalid UTF-8 is a dead letter).
* ``bytes`` — columns ``key`` and ``value`` as binary; never fails.

Decoding here rather than with Spark's ``from_json`` is deliberate: Spark's permissive mode turns a bad value
into nulls without saying why, and a dead letter without a reason is not actionable.

**Whole columns at once.** `JsonDecoder.decode_many` parses a chunk of values in one call to Arrow's JSON
reader (C++, no Python per row) when the schema's types are ones whose Arrow parsing agrees with the rules
above (strings, integers, floats, booleans, timestamps); a chunk Arrow refuses is split in halves until the
values it refuses are found, and those are decoded one by one, so each dead letter keeps its reason.
(`tests/unit/test_serde.py` checks both paths give the same rows on generated values.)
"""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.json as pa_json
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from weirflow.base.errors import DecodeError

SERDES = ("json", "string", "bytes")

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MIN_EPOCH_MS = -62_135_596_800_000  # 0001-01-01T00:00:00Z
_MAX_EPOCH_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z


def _timestamp_us(value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError
    if isinstance(value, int | float):  # epoch milliseconds, within the years 1..9999 as ISO text is
        if not _MIN_EPOCH_MS <= value <= _MAX_EPOCH_MS:
            raise ValueError
        return int(value * 1000)
    if isinstance(value, str):
        parsed = dt.datetime.fromisoformat(value)
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=dt.UTC)
        delta = parsed - _EPOCH
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    raise TypeError


def _integer(bits: int) -> Callable[[Any], int]:
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1

    def convert(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
            raise TypeError
        if not low <= int(value) <= high:
            raise ValueError
        return int(value)

    return convert


_INTEGER_BITS: dict[type[T.DataType], int] = {T.ByteType: 8, T.ShortType: 16, T.IntegerType: 32, T.LongType: 64}


def _floating(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError
    return float(value)


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError
    return value


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError
    return value


def _date(value: Any) -> dt.date:
    return dt.date.fromisoformat(value)


def _decimal(value: Any) -> decimal.Decimal:
    if isinstance(value, bool):
        raise TypeError
    return decimal.Decimal(str(value))


def _converter(data_type: T.DataType) -> tuple[Callable[[Any], Any], str]:
    """(convert, what it expects) for one Spark type; complex types pass through to Arrow as they are."""
    if isinstance(data_type, T.TimestampType | T.TimestampNTZType):
        return _timestamp_us, "a timestamp (ISO-8601 text or epoch milliseconds)"
    if type(data_type) in _INTEGER_BITS:
        bits = _INTEGER_BITS[type(data_type)]
        return _integer(bits), f"an integer of {bits} bits"
    if isinstance(data_type, T.FloatType | T.DoubleType):
        return _floating, "a number"
    if isinstance(data_type, T.DecimalType):
        return _decimal, "a decimal number"
    if isinstance(data_type, T.StringType):
        return _string, "a string"
    if isinstance(data_type, T.BooleanType):
        return _boolean, "true or false"
    if isinstance(data_type, T.DateType):
        return _date, "an ISO-8601 date"
    return (lambda v: v), data_type.simpleString()


# Types whose Arrow JSON parsing accepts exactly what the per-value converters accept (checked by a property
# test): other schemas are decoded value by value.
_VECTOR_TYPES = (
    T.StringType,
    T.ByteType,
    T.ShortType,
    T.IntegerType,
    T.LongType,
    T.FloatType,
    T.DoubleType,
    T.BooleanType,
    T.TimestampType,
)
_SCALAR_BELOW = 16  # a refused chunk this small is decoded value by value instead of split again
_RETRY_EVERY = 8  # after a mostly refused chunk, try Arrow again on every 8th chunk only


class JsonDecoder:
    """Decodes JSON objects into one column list per field of ``schema``."""

    def __init__(self, schema: T.StructType) -> None:
        self.schema = schema
        self._fields = [(f.name, f.nullable, *_converter(f.dataType)) for f in schema.fields]
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        vector = all(type(f.dataType) in _VECTOR_TYPES for f in schema.fields) and bool(schema.fields)
        self._parse_schema = (
            pa.schema(
                [
                    pa.field(f.name, pa.float64() if pa.types.is_floating(f.type) else f.type)
                    for f in self.arrow_schema
                ]
            )
            if vector
            else None
        )
        self._required = [f.name for f in schema.fields if not f.nullable]
        self._chunks = 0
        self._scalar_rows = 0
        self._mostly_refused = False

    def decode(self, raw: bytes) -> list[Any]:
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise DecodeError(f"not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise DecodeError(f"expected a JSON object, got {type(data).__name__}")
        row: list[Any] = []
        for name, nullable, convert, expected in self._fields:
            value = data.get(name)
            if value is None:
                if not nullable:
                    raise DecodeError(f"field '{name}' is missing or null but the schema says NOT NULL")
                row.append(None)
                continue
            try:
                row.append(convert(value))
            except (TypeError, ValueError, OverflowError, decimal.InvalidOperation):
                raise DecodeError(f"field '{name}': expected {expected}, got {json.dumps(value)[:80]}") from None
        return row

    def decode_many(self, values: Sequence[bytes]) -> tuple[pa.Table, list[int], list[tuple[int, str]]]:
        """Decode a chunk: (the decoded rows as a table of ``arrow_schema``, the index in ``values`` of each of
        its rows, (index, reason) of each value that could not be decoded)."""
        tables: list[pa.Table] = []
        decoded: list[int] = []
        failed: list[tuple[int, str]] = []

        def run(lo: int, hi: int) -> None:
            table = self._parse(values[lo:hi])
            if table is not None:
                tables.append(table)
                decoded.extend(range(lo, hi))
            elif hi - lo <= _SCALAR_BELOW:
                run_scalar_range(lo, hi)
            else:
                mid = (lo + hi) // 2
                run(lo, mid)
                run(mid, hi)

        def run_scalar_range(lo: int, hi: int) -> None:
            rows = []
            self._scalar_rows += hi - lo
            for i in range(lo, hi):
                try:
                    rows.append(self.decode(values[i]))
                    decoded.append(i)
                except DecodeError as exc:
                    failed.append((i, str(exc)))
            if rows:
                columns = list(zip(*rows, strict=True))
                tables.append(
                    pa.Table.from_arrays(
                        [pa.array(c, type=f.type) for c, f in zip(columns, self.arrow_schema, strict=True)],
                        schema=self.arrow_schema,
                    )
                )

        if values:
            self._chunks += 1
            if self._mostly_refused and self._chunks % _RETRY_EVERY:
                run_scalar_range(0, len(values))
            else:
                run(0, len(values))
            # Values Arrow refuses (epoch-millisecond timestamps, say) tend to come in streams: after a chunk
            # that was mostly decoded one by one, skip the splitting for a while.
            self._mostly_refused = self._scalar_rows * 2 > len(values)
            self._scalar_rows = 0
        table = pa.concat_tables(tables) if tables else self.arrow_schema.empty_table()
        return table, decoded, failed

    def _parse(self, values: Sequence[bytes]) -> pa.Table | None:
        """All of ``values`` through Arrow's JSON reader, or None when it refuses any of them (or a value is
        not a single line, which would shift rows)."""
        if self._parse_schema is None:
            return None
        # Only objects go to Arrow: it reads a bare `null` as a row of nulls (and pyarrow 26 crashes on input
        # that begins with one), so anything else is left to the per-value path, which names the problem.
        if not all(v[:1] == b"{" and v[-1:] == b"}" for v in values):
            return None
        text = b"\n".join(values)
        if text.count(b"\n") != len(values) - 1 or b"\r" in text:
            return None
        try:
            table = pa_json.read_json(
                io.BytesIO(text),
                read_options=pa_json.ReadOptions(use_threads=False, block_size=max(len(text) + 1, 1 << 16)),
                parse_options=pa_json.ParseOptions(
                    explicit_schema=self._parse_schema, unexpected_field_behavior="ignore"
                ),
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
            return None
        if table.num_rows != len(values) or any(table.column(n).null_count for n in self._required):
            return None
        if table.schema != self.arrow_schema:
            try:
                table = table.select(self.arrow_schema.names).cast(self.arrow_schema)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                return None
        return table


def decoder_schema(serde: str, schema: T.StructType | None) -> T.StructType:
    """The user columns a serde produces."""
    if serde == "json":
        if schema is None:
            raise ValueError("the json serde needs a schema")
        return schema
    value_type: T.DataType = T.StringType() if serde == "string" else T.BinaryType()
    return T.StructType([T.StructField("key", value_type, True), T.StructField("value", value_type, True)])


class KeyValueDecoder:
    """The ``string`` and ``bytes`` serdes: key and value columns."""

    def __init__(self, as_text: bool) -> None:
        self.as_text = as_text

    def decode_many(
        self, keys: Sequence[bytes | None], values: Sequence[bytes]
    ) -> tuple[pa.Table, list[int], list[tuple[int, str]]]:
        """The chunk's ``key`` and ``value`` columns, as `JsonDecoder.decode_many` returns them; with text,
        a chunk that is not all UTF-8 is decoded pair by pair to find the values that are not."""
        kind = pa.string() if self.as_text else pa.binary()
        schema = pa.schema([("key", kind), ("value", kind)])
        key_array, value_array = pa.array(keys, pa.binary()), pa.array(values, pa.binary())
        if self.as_text:
            try:
                key_array, value_array = key_array.cast(kind), value_array.cast(kind)
            except pa.ArrowInvalid:
                rows: list[list[Any]] = []
                decoded: list[int] = []
                failed: list[tuple[int, str]] = []
                for i, (key, value) in enumerate(zip(keys, values, strict=True)):
                    try:
                        rows.append(self.decode_pair(key, value))
                        decoded.append(i)
                    except DecodeError as exc:
                        failed.append((i, str(exc)))
                columns: list[Sequence[Any]] = list(zip(*rows, strict=True)) or [[], []]
                arrays = [pa.array(c, type=kind) for c in columns]
                return pa.Table.from_arrays(arrays, schema=schema), decoded, failed
        return pa.Table.from_arrays([key_array, value_array], schema=schema), list(range(len(values))), []

    def decode_pair(self, key: bytes | None, raw: bytes) -> list[Any]:
        if not self.as_text:
            return [key, raw]
        try:
            return [key.decode() if key is not None else None, raw.decode()]
        except UnicodeDecodeError as exc:
            raise DecodeError(f"not valid UTF-8: {exc}") from None
