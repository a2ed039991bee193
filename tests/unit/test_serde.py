"""`JsonDecoder.decode_many` (Arrow's JSON reader on whole chunks) gives exactly what decoding each value
alone gives: the same rows in the same order, and the same dead letters with the same reasons."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pyspark.sql import types as T

from weirflow.spark.serde import DecodeError, JsonDecoder, KeyValueDecoder

SCHEMA = T.StructType(
    [
        T.StructField("user", T.StringType(), False),
        T.StructField("page", T.StringType(), True),
        T.StructField("n", T.IntegerType(), True),
        T.StructField("small", T.ByteType(), True),
        T.StructField("big", T.LongType(), True),
        T.StructField("score", T.DoubleType(), True),
        T.StructField("ratio", T.FloatType(), True),
        T.StructField("ok", T.BooleanType(), True),
        T.StructField("event_time", T.TimestampType(), True),
    ]
)

_times = st.datetimes(min_value=dt.datetime(1970, 1, 2), max_value=dt.datetime(2200, 1, 1))
_timestamps = st.one_of(
    _times.map(lambda t: t.isoformat()),
    _times.map(lambda t: t.strftime("%Y-%m-%dT%H:%M:%SZ")),
    _times.map(lambda t: t.strftime("%Y-%m-%d %H:%M:%S")),
    _times.map(lambda t: t.replace(tzinfo=dt.timezone(dt.timedelta(hours=2))).isoformat()),
    st.integers(min_value=0, max_value=10**13),  # epoch milliseconds
    st.just("not a time"),
)
_anything = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=2),
)
_FIELDS = {
    "user": st.one_of(st.text(max_size=12), _anything),
    "page": st.one_of(st.text(max_size=12), _anything),
    "n": st.one_of(st.integers(min_value=-(2**31), max_value=2**31 - 1), _anything),
    "small": st.one_of(st.integers(min_value=-200, max_value=200), _anything),
    "big": st.one_of(st.integers(min_value=-(2**63), max_value=2**63 - 1), _anything),
    "score": st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-(10**6), 10**6), _anything),
    "ratio": st.one_of(st.floats(width=32, allow_nan=False, allow_infinity=False), _anything),
    "ok": st.one_of(st.booleans(), _anything),
    "event_time": st.one_of(_timestamps, _anything),
}


@st.composite
def values(draw: Any) -> bytes:
    kind = draw(st.sampled_from(["valid", "valid", "valid", "mixed", "garbage"]))
    if kind == "garbage":
        return draw(
            st.sampled_from(
                [
                    b"",
                    b"{",
                    b"[1, 2]",
                    b"42",
                    b'"text"',
                    b"\xff\xfe",
                    b'{"user": "a"}\n{}',
                    b"null",
                    b'{"user": "x", "n": 1}garbage',
                ]
            )
        )
    obj: dict[str, Any] = {}
    for name, strategy in _FIELDS.items():
        if kind == "valid":
            value = draw(strategy.filter(lambda v: v is not None)) if name == "user" else draw(strategy)
        else:
            value = draw(_anything)
        if draw(st.booleans()) or name == "user":
            obj[name] = value
    if draw(st.booleans()):
        obj["extra"] = draw(_anything)
    return json.dumps(obj).encode()


def _one_by_one(decoder: JsonDecoder, raw: list[bytes]) -> tuple[list[dict[str, Any]], list[int], list[Any]]:
    rows, decoded, failed = [], [], []
    for i, value in enumerate(raw):
        try:
            rows.append(decoder.decode(value))
            decoded.append(i)
        except DecodeError as exc:
            failed.append((i, str(exc)))
    arrays = [pa.array([r[k] for r in rows], type=f.type) for k, f in enumerate(decoder.arrow_schema)]
    table = pa.Table.from_arrays(arrays, schema=decoder.arrow_schema)
    return table.to_pylist(), decoded, failed


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(values(), min_size=1, max_size=60))
@example([b"null"])  # pyarrow 26 crashed the process on it
@example([b'{"user": "", "event_time": 9223372036854776.0}'])  # epoch ms beyond Spark's timestamps
@example([b'{"user": "a"}', b'{"user": "b", "n": 1} null'])
def test_whole_chunks_decode_like_single_values(raw: list[bytes]) -> None:
    expected_rows, expected_decoded, expected_failed = _one_by_one(JsonDecoder(SCHEMA), raw)
    table, decoded, failed = JsonDecoder(SCHEMA).decode_many(raw)
    order = sorted(range(len(decoded)), key=decoded.__getitem__)
    assert [decoded[i] for i in order] == expected_decoded
    rows = table.to_pylist()
    assert [rows[i] for i in order] == expected_rows
    assert sorted(failed) == expected_failed


def test_a_clean_chunk_takes_the_vector_path_and_bad_values_keep_their_reasons() -> None:
    good = [
        json.dumps({"user": f"u{i}", "n": i, "event_time": "2026-11-23T10:00:00Z"}).encode() for i in range(100)
    ]
    bad = [b'{"user": "x", "n": "seven"}', b'{"n": 1}', b"{"]
    raw = good[:50] + bad + good[50:]
    decoder = JsonDecoder(SCHEMA)
    table, decoded, failed = decoder.decode_many(raw)
    assert table.num_rows == 100 and sorted(decoded) == [i for i in range(len(raw)) if i not in (50, 51, 52)]
    assert failed == [
        (50, "field 'n': expected an integer of 32 bits, got \"seven\""),
        (51, "field 'user' is missing or null but the schema says NOT NULL"),
        (52, failed[2][1]),
    ]
    assert failed[2][1].startswith("not valid JSON")
    assert decoder._parse(good) is not None, "a clean chunk is parsed by Arrow in one call"


@pytest.mark.parametrize("as_text", [True, False])
def test_key_value_decoding_of_a_chunk(as_text: bool) -> None:
    decoder = KeyValueDecoder(as_text)
    keys, raw = [b"k1", None, b"k3"], [b"one", b"\xff", b"three"]
    table, decoded, failed = decoder.decode_many(keys, raw)
    pairs = zip(keys, raw, strict=True)
    expected = [decoder.decode_pair(k, v) for k, v in pairs if not as_text or v != b"\xff"]
    assert [list(r.values()) for r in table.to_pylist()] == expected
    if as_text:
        assert decoded == [0, 2] and [i for i, _ in failed] == [1]
    else:
        assert decoded == [0, 1, 2] and failed == []
