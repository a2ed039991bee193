"""Many rows in one intermediate-stream record: Arrow IPC streams behind the ``rows`` type byte (the framing
of docs/pipelines.md, "Control messages").

Only weirflow reads intermediate streams, so a stage writes its rows for one partition as one record: an
Arrow IPC stream (schema + one record batch, its buffers LZ4-compressed from `COMPRESS_FROM_BYTES` on)
instead of one JSON object per row.
Neither side then touches rows one by one in Python: the sink slices the Arrow batch Spark hands it, and the
next stage's source hands the decoded batch straight back to Spark.

A record holds at most `MAX_ROWS` rows and stays under the system's record size limit
(`SystemProducer.max_record_bytes`, e.g. an event hub's 1 MB), so one record never grows without bound and a
micro-batch's reading budget (records per trigger) still bounds its rows.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from weirflow.base.errors import MalformedMessageError
from weirflow.runtime.control import encode_rows

MAX_ROWS = 4096
# Arrow's IPC framing: schema message, batch header and padding, counted generously.
_FRAME_BYTES = 4096
_COMPRESSED = pa.ipc.IpcWriteOptions(compression="lz4" if pa.Codec.is_available("lz4") else None)
_PLAIN = pa.ipc.IpcWriteOptions(compression=None)
# Below this many bytes of columns a record is written uncompressed: LZ4 costs about 0.2 ms a record to write
# and as much to read whatever its size (a frame per buffer), and saves a few hundred bytes on a small one (20
# partial rows: 1,769 bytes plain, 1,561 compressed); a record of 4,096 rows (200 KB) it shrinks to a third.
COMPRESS_FROM_BYTES = 32 * 1024


def _encode(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    options = _COMPRESSED if batch.nbytes >= COMPRESS_FROM_BYTES else _PLAIN
    with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
        writer.write_batch(batch)
    return encode_rows(sink.getvalue().to_pybytes())


def pack(
    batch: pa.RecordBatch, max_bytes: int | None = None, max_rows: int = MAX_ROWS
) -> Iterator[tuple[bytes | None, pa.RecordBatch]]:
    """(framed record, its rows) covering every row of ``batch`` in order. The record is None for a single row
    that alone packs to more than ``max_bytes``: it can never be sent, and the caller dead-letters it."""
    if batch.num_rows == 0:
        return
    rows = min(max_rows, batch.num_rows)
    if max_bytes is not None and batch.nbytes:
        per_row = batch.nbytes / batch.num_rows
        rows = max(1, min(rows, int((max_bytes - _FRAME_BYTES) / max(per_row, 1.0))))
    start = 0
    while start < batch.num_rows:
        piece = batch.slice(start, rows)
        record = _encode(piece)
        if max_bytes is not None and len(record) > max_bytes:
            if piece.num_rows > 1:
                rows = max(1, piece.num_rows // 2)
                continue
            yield None, piece
        else:
            yield record, piece
        start += piece.num_rows


class MalformedRowsError(MalformedMessageError, pa.ArrowInvalid):
    """A ``rows`` record that is not an Arrow IPC stream (cut short, corrupted, not written by `pack`). A
    `pa.ArrowInvalid` too, which readers caught before it existed."""


def unpack(record: bytes) -> pa.Table:
    """The rows of one framed ``rows`` record (type byte included; nothing is copied). Raises
    `MalformedRowsError` (a `MalformedMessageError`) for bytes that are not such a record."""
    try:
        with pa.ipc.open_stream(pa.py_buffer(memoryview(record)[1:])) as reader:
            return reader.read_all()
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise MalformedRowsError(f"bad packed rows ({len(record)} bytes): {exc}") from exc
