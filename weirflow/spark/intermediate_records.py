"""The records a stage writes to an intermediate stream: its rows packed into Arrow records, or per batch the
partials of an aggregation the next stage declared (docs/pipelines.md, "How a task runs" and "Aggregations").

Only weirflow reads intermediate streams, so rows travel packed (`weirflow.spark.packing`): a record holds up to
4,096 rows of one partition with their positions, and names the stage or the task that wrote it. A row too
large to send even alone goes to the stream's dead-letter stream with the reason.
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from weirflow.interfaces.system import OutgoingRecord
from weirflow.job.systems import dead_letter_stream
from weirflow.spark.packing import pack
from weirflow.spark.partials import BatchMode, Partial, PartialSpec, combine_batch, rows_alone
from weirflow.spark.replay import POS, PRODUCER_KEY, PSS, K
from weirflow.spark.result_replays import PART_KEY, TASK_KEY

log = logging.getLogger("weirflow.spark")


def packed_records(
    rows: pa.RecordBatch, sink: dict[str, Any], producer: Any, task: str | None = None, writer: int = 0
) -> list[OutgoingRecord]:
    """The rows of one intermediate stream as packed records, one run per partition (rows keep their
    order within a partition); a row too large to send alone becomes a dead letter. With positions, each
    record carries its rows' (``__pss``, ``__pos``, ``__k``) and names the stage that wrote it; a stateful
    task's record names the task and the Spark partition that wrote it (``writer``,
    `weirflow.spark.result_replays`)."""
    physical = sink["physical"]
    columns, names = (list(c) for c in zip(*sink["rows"], strict=True))
    metadata = None
    if sink.get("positions"):
        columns, names = columns + [PSS, POS, K], names + [PSS, POS, K]
        metadata = {PRODUCER_KEY: str(sink["stage"]).encode()}
    elif task is not None:
        metadata = {TASK_KEY: task.encode(), PART_KEY: str(writer).encode()}
    arrays = [rows.column(c) for c in columns]
    schema = pa.schema([pa.field(n, a.type) for n, a in zip(names, arrays, strict=True)], metadata=metadata)
    data = pa.RecordBatch.from_arrays(arrays, schema=schema)
    partitions = rows.column("__partition")
    present = sorted(partitions.unique().to_pylist())
    limit = producer.max_record_bytes(physical)
    records = []
    for partition in present:
        part = data if len(present) == 1 else data.filter(pc.equal(partitions, partition))
        for record, piece in pack(part, limit):
            if record is not None:
                records.append(OutgoingRecord(stream=physical, value=record, partition=partition))
                continue
            reason = f"row too large for stream '{physical}' even alone (limit {limit} bytes)"
            row = json.dumps(piece.to_pylist()[0], default=str).encode()
            records.append(
                OutgoingRecord(
                    stream=dead_letter_stream(physical),
                    value=json.dumps(
                        {
                            "error": reason,
                            "stream": physical,
                            "head_base64": base64.b64encode(row[:1024]).decode(),
                        }
                    ).encode(),
                    partition=partition,
                )
            )
            log.warning("one output row of %s was too large: sent to its dead-letter stream", physical)
    return records


def partial_records(
    sink: dict[str, Any], batches: list[pa.RecordBatch], producer: Any, rows_until: dict[int, int]
) -> list[OutgoingRecord]:
    """The records of an intermediate stream of partials for this partition's rows of the batch: per
    intermediate partition and input partition one record of the batch's partials, or the rows one by
    one where the batch may not send partials or they do not fit one record (`weirflow.spark.partials`)."""
    alias = {name: column for column, name in sink["rows"]}
    declared = sink["partials"]
    spec = PartialSpec(
        tuple(alias[k] for k in declared["keys"]),
        alias[declared["time"]],
        tuple(Partial(alias[column], kind) for column, kind in declared["partials"]),
    )
    table = pa.Table.from_batches(batches)
    rows = table.select([column for column, _ in sink["rows"]] + [PSS, POS, "__partition"])
    records: list[OutgoingRecord] = []
    for piece in combine_batch(rows, spec, "__partition", BatchMode(rows_until)):
        sent = packed_records(_with_partition(piece.rows, piece.partition), sink, producer)
        if piece.combined and len(sent) != 1:  # over the system's record size: the rows one by one
            sent = packed_records(_with_partition(rows_alone(piece.source), piece.partition), sink, producer)
        records.extend(sent)
    return records


def _with_partition(rows: pa.Table, partition: int) -> pa.RecordBatch:
    """``rows`` of one intermediate partition as one record batch with its ``__partition`` column."""
    rows = rows.append_column("__partition", pa.array([partition] * rows.num_rows, pa.int32()))
    return rows.combine_chunks().to_batches(max_chunksize=max(1, rows.num_rows))[0]
