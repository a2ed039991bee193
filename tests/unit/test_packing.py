"""Packed intermediate records (`weirflow.spark.packing`): every row comes back, in order, and no record
exceeds the system's size limit or `MAX_ROWS`."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from weirflow.runtime.control import MessageType, encode_rows, is_control
from weirflow.spark import packing
from weirflow.spark.packing import COMPRESS_FROM_BYTES, _encode, unpack


def _noise(chars: int) -> str:
    """Text LZ4 cannot shrink, so sizes are what they seem."""
    return os.urandom(chars // 2 + 1).hex()[:chars]


def _batch(rows: int, width: int = 10) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "page": [f"/p/{i % 7}" + _noise(width) for i in range(rows)],
            "n": pa.array(range(rows), pa.int64()),
            "when": pa.array([i * 1000 for i in range(rows)], pa.timestamp("us", tz="UTC")),
        }
    )


@pytest.mark.parametrize(("rows", "max_bytes"), [(1, None), (10_000, None), (10_000, 64 * 1024), (3, 9_000)])
def test_rows_round_trip_in_order_within_the_limits(rows: int, max_bytes: int | None) -> None:
    batch = _batch(rows, width=2000 if rows == 3 else 10)
    pieces = list(packing.pack(batch, max_bytes=max_bytes))
    records = [record for record, _ in pieces]
    assert all(record is not None for record in records)
    assert all(r[0] == MessageType.ROWS and not is_control(r) for r in records), "framed as rows, not control"
    back = pa.concat_tables([packing.unpack(r) for r in records])
    assert back.to_pylist() == pa.Table.from_batches([batch]).to_pylist()
    assert all(piece.num_rows <= packing.MAX_ROWS for _, piece in pieces)
    if max_bytes is not None:
        assert max(len(r) for r in records) <= max_bytes
        assert len(records) > 1, "the limit split the rows"


def test_a_row_bigger_than_the_limit_comes_back_without_a_record() -> None:
    big = _noise(50_000)
    batch = pa.RecordBatch.from_pydict({"value": ["small", big, "small too"]})
    pieces = list(packing.pack(batch, max_bytes=8_000))
    assert [piece.to_pylist() for record, piece in pieces if record is None] == [[{"value": big}]]
    kept = pa.concat_tables([packing.unpack(r) for r, _ in pieces if r is not None]).to_pylist()
    assert kept == [{"value": "small"}, {"value": "small too"}]


def test_small_records_are_written_plain_and_large_ones_compressed() -> None:
    """LZ4 costs a fixed ~0.2 ms a record each way: a few partial rows go plain, a large record compressed, and
    both read back the same."""

    def rows(n: int) -> pa.RecordBatch:
        pages = [f"/page/{i % 60}" for i in range(n)]
        views = pa.array([i % 7 for i in range(n)], pa.int64())
        return pa.RecordBatch.from_pydict({"page": pages, "views": views})

    def plain(batch: pa.RecordBatch) -> bytes:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema, options=pa.ipc.IpcWriteOptions(compression=None)) as writer:
            writer.write_batch(batch)
        return encode_rows(sink.getvalue().to_pybytes())

    small, large = rows(20), rows(4096)
    assert small.nbytes < COMPRESS_FROM_BYTES <= large.nbytes
    assert _encode(small) == plain(small)
    assert len(_encode(large)) < len(plain(large)) / 2
    for batch in (small, large):
        assert unpack(_encode(batch)).equals(pa.Table.from_batches([batch]))
