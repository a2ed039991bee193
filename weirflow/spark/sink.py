"""`weirflow-sink` — the PySpark streaming data sink writing a stage's outputs through the systems' producers.

A stage may write several streams (``send_to`` outputs, the intermediate stream of a ``partition_by``, the
dead-letter streams); the runtime unions them into one DataFrame with columns ``stream`` (stream id),
``key`` (binary, may be null), ``value`` (binary) and ``partition`` (int, may be null), so one query has one
sink. Executors send with `SystemProducer.send`, which is durable when it returns: a micro-batch commits only
after every output record was written (at-least-once; a replayed batch may write some records twice, which
is why outputs should be keyed so that replays are idempotent).

Values of intermediate streams get the user-message type byte (seed 004) here.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql import types as T
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

from weirflow.control import encode_user
from weirflow.errors import RecordTooLargeError
from weirflow.interfaces.system import OutgoingRecord
from weirflow.spark.source import systems_for

log = logging.getLogger("weirflow.spark")

SINK_NAME = "weirflow-sink"

SINK_SCHEMA = T.StructType(
    [
        T.StructField("stream", T.StringType(), False),
        T.StructField("key", T.BinaryType(), True),
        T.StructField("value", T.BinaryType(), True),
        T.StructField("partition", T.IntegerType(), True),
    ]
)


class WrittenCount(WriterCommitMessage):
    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts


class WeirflowSink(DataSource):
    @classmethod
    def name(cls) -> str:
        return SINK_NAME

    def schema(self) -> T.StructType:
        return SINK_SCHEMA

    def streamWriter(self, schema: T.StructType, overwrite: bool) -> WeirflowStreamWriter:
        return WeirflowStreamWriter(self.options["config"], json.loads(self.options["streams"]))


class WeirflowStreamWriter(DataSourceStreamArrowWriter):
    """``streams`` maps each stream id to ``{"system", "physical", "intermediate"}``."""

    def __init__(self, snapshot: str, streams: dict[str, dict[str, Any]]) -> None:
        self.snapshot = snapshot
        self.streams = streams

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WrittenCount:
        systems = systems_for(self.snapshot)
        counts: dict[str, int] = {}
        for batch in iterator:
            data = batch.to_pydict()
            by_system: dict[str, list[OutgoingRecord]] = {}
            for stream_id, key, value, partition in zip(
                data["stream"], data["key"], data["value"], data["partition"], strict=True
            ):
                target = self.streams[stream_id]
                payload = value if value is not None else b""
                if target["intermediate"]:
                    payload = encode_user(payload)
                by_system.setdefault(target["system"], []).append(
                    OutgoingRecord(stream=target["physical"], value=payload, key=key, partition=partition)
                )
                counts[stream_id] = counts.get(stream_id, 0) + 1
            for system, records in by_system.items():
                self._send(systems.producer(system), records)
        return WrittenCount(counts)

    @staticmethod
    def _send(producer: Any, records: list[OutgoingRecord]) -> None:
        """Send; records the system can never take (too large) go to their stream's ``<physical>.dlq`` with the
        reason and the rest are sent again (the producer sent nothing when it refused)."""
        try:
            producer.send(records)
            return
        except RecordTooLargeError as exc:
            refused = {id(r) for r in exc.records}
            letters = [
                OutgoingRecord(
                    stream=f"{record.stream}.dlq",
                    value=json.dumps(
                        {
                            "error": reason,
                            "stream": record.stream,
                            "size": len(record.value),
                            "key_base64": base64.b64encode(record.key).decode() if record.key else None,
                            "head_base64": base64.b64encode(record.value[:1024]).decode(),
                        }
                    ).encode(),
                    key=record.key,
                    partition=record.partition,
                )
                for record, reason in zip(exc.records, exc.reasons, strict=True)
            ]
            log.warning(
                "%d output record(s) too large: sent to dead-letter streams (%s)", len(letters), exc.reasons[0]
            )
            producer.send(letters)
            rest = [r for r in records if id(r) not in refused]
            if rest:
                producer.send(rest)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: every partition's records were durable when its `write` returned."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: the batch will be replayed; consumers see duplicates, never gaps."""
