"""Serdes: turning a stream's raw values into typed columns, in the source's executor processes.

* ``json`` — each value is a JSON object; its fields are checked against the declared schema
  (`streams.<id>.schema`, Spark DDL) one by one, so an undecodable value is rejected with a reason that names
  the field ("field 'event_time': expected a timestamp ..."), and goes to the dead-letter stream.
* ``string`` — columns ``key`` and ``value`` as UTF-8 text (invalid UTF-8 is a dead letter).
* ``bytes`` — columns ``key`` and ``value`` as binary; never fails.

Decoding here rather than with Spark's ``from_json`` is deliberate: Spark's permissive mode turns a bad value
into nulls without saying why, and a dead letter without a reason is not actionable.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from collections.abc import Callable
from typing import Any

from pyspark.sql import types as T

SERDES = ("json", "string", "bytes")

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


class DecodeError(ValueError):
    """A value the serde cannot decode; the message is the dead letter's reason."""


def _timestamp_us(value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError
    if isinstance(value, int | float):
        return int(value * 1000)  # epoch milliseconds
    if isinstance(value, str):
        parsed = dt.datetime.fromisoformat(value)
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=dt.UTC)
        delta = parsed - _EPOCH
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    raise TypeError


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise TypeError
    return int(value)


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
    if isinstance(data_type, T.ByteType | T.ShortType | T.IntegerType | T.LongType):
        return _integer, "an integer"
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


class JsonDecoder:
    """Decodes JSON objects into one column list per field of ``schema``."""

    def __init__(self, schema: T.StructType) -> None:
        self.schema = schema
        self._fields = [(f.name, f.nullable, *_converter(f.dataType)) for f in schema.fields]

    def decode(self, raw: bytes) -> list[Any]:
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise DecodeError(f"not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise DecodeError(f"expected a JSON object, got {type(data).__name__}")
        row = []
        for name, nullable, convert, expected in self._fields:
            value = data.get(name)
            if value is None:
                if not nullable:
                    raise DecodeError(f"field '{name}' is missing or null but the schema says NOT NULL")
                row.append(None)
                continue
            try:
                row.append(convert(value))
            except (TypeError, ValueError, decimal.InvalidOperation):
                raise DecodeError(f"field '{name}': expected {expected}, got {json.dumps(value)[:80]}") from None
        return row


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

    def decode_pair(self, key: bytes | None, raw: bytes) -> list[Any]:
        if not self.as_text:
            return [key, raw]
        try:
            return [key.decode() if key is not None else None, raw.decode()]
        except UnicodeDecodeError as exc:
            raise DecodeError(f"not valid UTF-8: {exc}") from None
