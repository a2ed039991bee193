"""`weirflow` — the PySpark streaming data source reading one stream's SSPs of one task.

It works for any system whose offsets are decimal sequence numbers (the embedded log, Event Hubs) through the
system's `SystemAdmin` and `SystemConsumer`. Where the code runs (see DESIGN.md): ``initialOffset``,
``latestOffset`` and ``partitions`` in a Python process Spark starts for the query, ``read`` in executor
workers. Neither shares memory with the processor, so everything the source needs comes in its options (the
job config as a snapshot, the task's SSPs and start offsets) or from the stores.

**Offsets** (Spark's offset log keeps them)::

    {"s": "<stream id>", "p": {"<ssp key>": {"o": "<next offset>", "e": <ended>, "x": {...}}},
     "w": <injected watermark ms>}

``x`` (optional) is the system's native position of the record before ``o`` (Event Hubs offset and sequence
number), known when a batch reads up to the partition's newest record; it becomes the checkpoint's
``positions``.

``e`` marks a bounded stream's partition as consumed to its end; the batch that sets it carries one ``eos``
control row for that SSP. ``w`` is the watermark the task's reconciliation asked for (see `weirflow.control`):
the processor stores it in the task's checkpoint, ``latestOffset`` picks it up and the batch carries one
``inject`` row whose ``__wm_time`` moves Spark's watermark to exactly that point.

**Rows**: internal columns (``__kind`` data | watermark | eos | drain | inject | dlq, the SSP and offset, the
control fields, the dead letter's reason and raw bytes, ``__wm_time``) followed by the user's columns, then
the system's record columns the stream asked for (`streams.<id>.system-columns`, from
`IncomingRecord.attributes`: Event Hubs properties, partition key, enqueued time, sequence number, offset).
Data rows move Spark's watermark through ``__wm_time`` only on input streams; on intermediate streams only
the reconciled watermark does (the producers' in-band watermarks are the truth there, seed 004).
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql import types as T
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows

from weirflow.control import MalformedMessageError, MessageType, decode
from weirflow.spark.serde import DecodeError, JsonDecoder, KeyValueDecoder

SOURCE_NAME = "weirflow"

INTERNAL_FIELDS = [
    T.StructField("__kind", T.StringType(), False),
    T.StructField("__ssp", T.StringType(), True),
    T.StructField("__offset", T.StringType(), True),
    T.StructField("__producer", T.StringType(), True),
    T.StructField("__task_count", T.IntegerType(), True),
    T.StructField("__ctl_ms", T.LongType(), True),
    T.StructField("__error", T.StringType(), True),
    T.StructField("__raw", T.BinaryType(), True),
    T.StructField("__wm_time", T.TimestampType(), True),
]
INTERNAL_COLUMNS = [f.name for f in INTERNAL_FIELDS]
_CONTROL_KINDS = {MessageType.WATERMARK: "watermark", MessageType.END_OF_STREAM: "eos", MessageType.DRAIN: "drain"}
_READ_CHUNK = 5000

# Clients per worker process, reused across micro-batches (Spark reuses Python workers).
_clients: dict[str, Any] = {}
_clients_lock = threading.Lock()


def systems_for(snapshot: str) -> Any:
    """This worker's `Systems` for a job config snapshot, built once and reused across micro-batches."""
    with _clients_lock:
        systems = _clients.get(snapshot)
        if systems is None:
            from weirflow.config.loader import Config
            from weirflow.systems import Systems

            systems = _clients[snapshot] = Systems(Config.from_snapshot(snapshot))
        return systems


class SourceSpec:
    """The source's options, parsed once (they are all strings on the wire)."""

    def __init__(self, options: Any) -> None:
        self.snapshot: str = options["config"]
        self.stream_id: str = options["stream"]
        self.task: str = options["task"]
        self.system: str = options["system"]
        self.physical: str = options["physical"]
        self.ssps: list[str] = json.loads(options["ssps"])
        self.start: dict[str, Any] = json.loads(options["start"])
        self.serde: str = options["serde"]
        self.user_schema = T.StructType.fromJson(json.loads(options["user_schema"]))
        self.event_time_field: str = options["event_time_field"]
        self.event_time_from_record: bool = options["event_time_from_record"] == "true"
        self.delay_ms = int(options["delay_ms"])
        self.intermediate = options["intermediate"] == "true"
        self.bounded = options["bounded"] == "true"
        self.max_records = int(options["max_records"])
        # the system's record columns asked for (streams.<id>.system-columns)
        self.system_schema = T.StructType.fromJson(json.loads(options.get("system_schema") or '{"fields": []}'))

    @property
    def schema(self) -> T.StructType:
        fields = list(INTERNAL_FIELDS) + list(self.user_schema.fields)
        fields += list(self.system_schema.fields)
        if self.event_time_from_record:
            fields.append(T.StructField(self.event_time_field, T.TimestampType(), True))
        return T.StructType(fields)


class WeirflowSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> T.StructType:
        return SourceSpec(self.options).schema

    def streamReader(self, schema: T.StructType) -> DataSourceStreamReader:
        return WeirflowStreamReader(SourceSpec(self.options))


class WeirflowStreamReader(DataSourceStreamReader):
    def __init__(self, spec: SourceSpec) -> None:
        self.spec = spec
        self._checkpoints: Any = None

    # --- driver side (Spark's data-source process) ------------------------------------------------------
    def initialOffset(self) -> dict[str, Any]:
        return {"s": self.spec.stream_id, "p": self.spec.start, "w": -1}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.spec.max_records)

    def _injected(self) -> int | None:
        if self._checkpoints is None:
            from weirflow.config.loader import Config
            from weirflow.factories import checkpoint_factory

            config = Config.from_snapshot(self.spec.snapshot)
            self._checkpoints = checkpoint_factory(config).get_checkpoint_manager(config)
            self._checkpoints.start()
        checkpoint = self._checkpoints.read_last_checkpoint(self.spec.task)
        if checkpoint is None:
            return None
        value = dict(checkpoint.control).get("injected", {}).get(self.spec.stream_id)
        return int(value) if value is not None else None

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        ends: dict[str, Any] = {}
        metadata = None
        for key in self.spec.ssps:
            current = start["p"][key]
            if current["e"]:
                ends[key] = current
                continue
            if metadata is None:
                admin = systems_for(self.spec.snapshot).admin(self.spec.system)
                metadata = admin.partition_metadata(self.spec.physical)
            partition = int(key.rsplit(".", 1)[1])
            position = int(current["o"])
            available = max(0, int(metadata[partition].upcoming) - position)
            take = available if budget is None else min(available, budget)
            if budget is not None:
                budget -= take
            ended = self.spec.bounded and take == available
            if take == 0 and ended == current["e"]:
                ends[key] = current  # unchanged: the same offset, so Spark plans no batch
                continue
            ends[key] = {"o": str(position + take), "e": ended}
            newest = metadata[partition].newest_position
            if newest and take == available:  # reading up to the newest record: its native position is known
                ends[key]["x"] = dict(newest)
        watermark = int(start.get("w", -1))
        injected = self._injected()
        if injected is not None and injected > watermark:
            watermark = injected
        return {"s": self.spec.stream_id, "p": ends, "w": watermark}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        parts: list[InputPartition] = []
        for key in self.spec.ssps:
            a, b = start["p"][key], end["p"][key]
            eos = bool(b["e"]) and not a["e"]
            if int(b["o"]) > int(a["o"]) or eos:
                parts.append(InputPartition(("ssp", key, a["o"], b["o"], eos)))
        if int(end.get("w", -1)) > int(start.get("w", -1)):
            parts.append(InputPartition(("inject", int(end["w"]))))
        return parts

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing: positions are checkpointed by the processor from query progress (see DESIGN.md)."""

    def stop(self) -> None:
        if self._checkpoints is not None:
            self._checkpoints.stop()

    # --- executor side ----------------------------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _BatchReader(self.spec).read(partition.value)


class _BatchReader:
    """Reads one planned range and turns it into Arrow batches of the source's schema."""

    def __init__(self, spec: SourceSpec) -> None:
        self.spec = spec
        self.schema = spec.schema
        self.arrow_schema = to_arrow_schema(self.schema, timezone="UTC")
        self.user_width = len(spec.user_schema.fields)
        self.system_names = spec.system_schema.fieldNames()
        self._dead: list[tuple[dict[str, Any], bytes | None]] = []
        if spec.serde == "json":
            self.json = JsonDecoder(spec.user_schema)
        else:
            self.kv = KeyValueDecoder(as_text=spec.serde == "string")
        if not spec.event_time_from_record:
            self.event_time_index = spec.user_schema.fieldNames().index(spec.event_time_field)

    def _empty_columns(self) -> list[list[Any]]:
        return [[] for _ in self.schema.fields]

    def _batch(self, columns: list[list[Any]]) -> pa.RecordBatch:
        arrays = [pa.array(col, type=field.type) for col, field in zip(columns, self.arrow_schema, strict=True)]
        return pa.RecordBatch.from_arrays(arrays, schema=self.arrow_schema)

    def _control_row(self, columns: list[list[Any]], kind: str, ssp: str | None, offset: str | None,
                     producer: str | None, task_count: int | None, ctl_ms: int, wm_us: int) -> None:
        values = [kind, ssp, offset, producer, task_count, ctl_ms, None, None, wm_us]
        values += [None] * (len(columns) - len(values))
        for col, value in zip(columns, values, strict=True):
            col.append(value)

    def read(self, value: tuple[Any, ...]) -> Iterator[pa.RecordBatch]:
        if value[0] == "inject":
            columns = self._empty_columns()
            watermark = int(value[1])
            self._control_row(columns, "inject", None, None, None, None, watermark,
                              (watermark + self.spec.delay_ms) * 1000)
            yield self._batch(columns)
            return
        _, key, start, end, eos = value
        from weirflow.interfaces.system import SystemStreamPartition

        ssp = SystemStreamPartition(self.spec.system, self.spec.physical, int(key.rsplit(".", 1)[1]))
        consumer = systems_for(self.spec.snapshot).consumer(self.spec.system)
        position = start
        while int(position) < int(end):
            records = consumer.read(ssp, position, _READ_CHUNK, end)
            if not records:
                raise RuntimeError(f"{key}: offsets [{position}, {end}) were planned but cannot be read")
            columns = self._rows(key, records)
            self._send_dead_letters(ssp)
            yield self._batch(columns)
            position = records[-1].next_offset
        if eos:
            columns = self._empty_columns()
            self._control_row(columns, "eos", key, end, f"{self.spec.stream_id}:{key}", 1, 0, 0)
            yield self._batch(columns)

    def _send_dead_letters(self, ssp: Any) -> None:
        """Write this chunk's undecodable records to ``<physical>.dlq`` (same system, same partition) before
        the batch can commit, so a dead letter is never lost; a replayed batch may write it again."""
        if not self._dead:
            return
        from weirflow.interfaces.system import OutgoingRecord

        records = [
            OutgoingRecord(stream=f"{self.spec.physical}.dlq", value=json.dumps(letter).encode(), key=key,
                           partition=ssp.partition)
            for letter, key in self._dead
        ]
        systems_for(self.spec.snapshot).producer(self.spec.system).send(records)
        self._dead = []

    def _rows(self, key: str, records: list[Any]) -> list[list[Any]]:
        spec = self.spec
        columns = self._empty_columns()
        width = len(INTERNAL_FIELDS)
        user_cols = columns[width : width + self.user_width]
        system_cols = columns[width + self.user_width : width + self.user_width + len(self.system_names)]
        for record in records:
            payload = record.value
            try:
                if spec.intermediate:
                    kind, body = decode(payload)
                    if kind is not MessageType.USER:
                        assert not isinstance(body, bytes)
                        self._control_row(columns, _CONTROL_KINDS[kind], key, record.offset, body.task_name,
                                          body.task_count, body.timestamp, 0)
                        continue
                    payload = body  # type: ignore[assignment]
                if spec.serde == "json":
                    row = self.json.decode(payload)
                else:
                    row = self.kv.decode_pair(record.key, payload)
            except (DecodeError, MalformedMessageError) as exc:
                letter = {
                    "error": str(exc),
                    "stream": spec.stream_id,
                    "ssp": key,
                    "offset": record.offset,
                    "task": spec.task,
                    "timestamp_ms": record.timestamp_ms,
                    "raw_base64": base64.b64encode(record.value).decode(),
                }
                self._dead.append((letter, record.key))
                values = ["dlq", key, record.offset, None, None, None, str(exc), record.value, 0]
                values += [None] * (len(columns) - len(values))
                for col, v in zip(columns, values, strict=True):
                    col.append(v)
                continue
            if spec.event_time_from_record:
                event_us = record.timestamp_ms * 1000
            else:
                event_us = row[self.event_time_index]
            wm_us = 0 if spec.intermediate or event_us is None else event_us
            internal = ["data", key, record.offset, None, None, None, None, None, wm_us]
            for col, v in zip(columns[:width], internal, strict=True):
                col.append(v)
            for col, v in zip(user_cols, row, strict=True):
                col.append(v)
            for col, name in zip(system_cols, self.system_names, strict=True):
                col.append(record.attributes.get(name))
            if spec.event_time_from_record:
                columns[-1].append(event_us)
        return columns
