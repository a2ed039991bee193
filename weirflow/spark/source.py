"""`weirflow` — the PySpark streaming data source reading one stream's SSPs of one task.

It works for any system whose offsets are dense decimal sequence numbers (the contract in
`weirflow.interfaces.system`: the embedded log, Event Hubs) through the system's `SystemAdmin` and
`SystemConsumer`. Where the code runs (see docs/pipelines.md): ``initialOffset``,
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
control row for that SSP. ``d`` (with ``e``) marks an input partition consumed to its **drain cut** instead
(docs/drain.md): once the processor has seen a drain notification for this deployment it creates the local
file named by the ``drain_flag`` option, and the next ``latestOffset`` that finds it fixes the cut of every
open partition where the query has read to: it takes no new input (as Flink's ``stop --drain``: a backlog is
left to the next deployment, so a drain takes a few micro-batches however far behind the job is). That batch
reads nothing more and carries one ``drain`` control row per SSP instead of ``eos``. Intermediate streams
need no cut: they end when every producer task's drain message arrived (`weirflow.control`), and drain
messages of another deployment (another ``run-id``) are ignored.

``w`` is the watermark the task's reconciliation asked for (see `weirflow.control`): the processor stores it
in the task's checkpoint, ``latestOffset`` picks it up and the batch carries one ``inject`` row whose
``__wm_time`` moves Spark's watermark to exactly that point. A batch that reads a bounded input stream to its
end (or to its drain cut) injects +infinity at once. Queries of stateless stages inject nothing: they
hold no windows, and their tasks' output watermarks come from the ``seen`` rows (below).

**Rows**: two internal columns, then the user's columns, then the system's record columns the stream asked
for (`streams.<id>.system-columns`, from the records' attributes: Event Hubs properties, partition key,
enqueued time, sequence number, offset):

* ``__wm_time`` — what moves Spark's watermark: the event time of data rows on input streams; on
  intermediate streams only the reconciled watermark does (``inject`` rows: the producers' in-band watermarks
  are the truth there, docs/pipelines.md "Control messages"), so their data rows carry 0;
* ``__ctl`` — null on data rows; on every other row a struct (``kind`` watermark | eos | drain | inject | dlq |
  seen, ``ssp``, ``producer``, ``task_count``, ``ctl_ms``) that the query's ``observe`` collects. A ``dlq`` row
  stands for the ``task_count`` undecodable records of one read (each was sent to the dead-letter stream); a
  ``seen`` row gives the latest event time (``ctl_ms``) of one read of an input stream.

Data rows are thus two cheap columns wider than the user's: the JVM copies every column of every row more
than once per micro-batch, so the width is paid per row.
"""

from __future__ import annotations

import base64
import json
import os
import threading
from collections.abc import Generator, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows

from weirflow.control import (
    CONTROL_KIND_NAMES,
    MAX_TIMESTAMP_MS,
    ControlMessage,
    MalformedMessageError,
    MessageType,
    decode,
)
from weirflow.errors import UnreadableRangeError
from weirflow.interfaces.spark_checkpoint import PartitionOffset, SourceOffset
from weirflow.interfaces.system import RecordColumns
from weirflow.spark import workergc
from weirflow.spark.packing import unpack
from weirflow.spark.serde import JsonDecoder, KeyValueDecoder

SOURCE_NAME = "weirflow"

CONTROL_TYPE = T.StructType(
    [
        T.StructField("kind", T.StringType(), False),
        T.StructField("ssp", T.StringType(), True),
        T.StructField("producer", T.StringType(), True),
        T.StructField("task_count", T.IntegerType(), True),
        T.StructField("ctl_ms", T.LongType(), True),
    ]
)
INTERNAL_FIELDS = [
    T.StructField("__wm_time", T.TimestampType(), True),
    T.StructField("__ctl", CONTROL_TYPE, True),
]
INTERNAL_COLUMNS = [f.name for f in INTERNAL_FIELDS]
_READ_CHUNK = 10_000

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


def _partition(ssp_key: str) -> int:
    return int(ssp_key.rsplit(".", 1)[1])


class SourceSpec:
    """The source's options, parsed once (they are all strings on the wire)."""

    def __init__(self, options: Any) -> None:
        self.snapshot: str = options["config"]
        self.stream_id: str = options["stream"]
        # the task of each SSP (dead letters name it) and the task whose checkpoint holds the watermark to
        # inject ("" for queries of stateless stages, which need none)
        self.tasks: dict[str, str] = json.loads(options.get("tasks") or "{}")
        self.inject: str = options.get("inject", "")
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
        # Spark tasks a batch's partitions are spread over when the system warms reads (0: one per partition)
        self.read_groups = int(options.get("read_groups") or 0)
        # the local file whose existence means "this deployment drains" ("" where nothing drains), and the run id
        # whose drain messages count (docs/drain.md)
        self.drain_flag: str = options.get("drain_flag", "")
        self.run_id: str = options.get("run_id", "")
        # whether the system's offsets are dense sequence numbers (`SystemAdmin.dense_offsets`); positions are
        # planned and compared only through the system's admin
        self.dense: bool = options.get("dense", "true") == "true"
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
        workergc.before_task()
        return WeirflowStreamReader(SourceSpec(self.options))


class WeirflowStreamReader(DataSourceStreamReader):
    def __init__(self, spec: SourceSpec) -> None:
        self.spec = spec
        self._checkpoints: Any = None
        self._known: dict[str, int] = {}  # SSP key → the upcoming offset the system last reported
        self._drain_seen = False
        self._cut: dict[str, int] | None = None  # SSP key → drain cut, fixed by the first batch planned after it

    def _draining(self) -> bool:
        """Whether the processor asked this deployment to drain (one ``stat`` per planned batch)."""
        if not self._drain_seen and self.spec.drain_flag and not self.spec.intermediate:
            self._drain_seen = os.path.exists(self.spec.drain_flag)
        return self._drain_seen

    # --- driver side (Spark's data-source process) ------------------------------------------------------
    def initialOffset(self) -> dict[str, Any]:
        starts = {key: PartitionOffset.from_json(p) for key, p in self.spec.start.items()}
        return SourceOffset(self.spec.stream_id, starts, -1).to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.spec.max_records)

    def _injected(self) -> int | None:
        if self._checkpoints is None:
            from weirflow.config.loader import Config
            from weirflow.factories import checkpoint_factory

            config = Config.from_snapshot(self.spec.snapshot)
            self._checkpoints = checkpoint_factory(config).get_checkpoint_manager(config)
            self._checkpoints.start()
        checkpoint = self._checkpoints.read_last_checkpoint(self.spec.inject)
        if checkpoint is None:
            return None
        value = dict(checkpoint.control).get("injected", {}).get(self.spec.stream_id)
        return int(value) if value is not None else None

    def latestOffset(self, start_json: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """The offsets up to which the next batch reads: everything available, but at most the read limit
        per task (a stateless stage's query reads for several tasks, each with its own budget)."""
        start = SourceOffset.from_json(start_json)
        per_task = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if not self.spec.dense:
            return self._latest_positions(start, per_task).to_json()
        budgets: dict[str, int] = {}
        ends: dict[str, PartitionOffset] = {}
        open_keys = [key for key in self.spec.ssps if not start.partitions[key].ended]
        if self._draining() and self._cut is None:  # first batch planned since the drain: no new input from here
            self._cut = {key: int(start.partitions[key].offset) for key in open_keys}
        cut = self._cut
        metadata = self._refresh(start, open_keys if cut is None else [], per_task)
        for key in self.spec.ssps:
            current = start.partitions[key]
            if current.ended:
                ends[key] = current
                continue
            partition = _partition(key)
            position = int(current.offset)
            upto = self._known.get(key, position) if cut is None or key not in cut else cut[key]
            available = max(0, upto - position)
            take = available
            if per_task is not None:
                owner = self.spec.tasks.get(key, "")
                take = min(available, budgets.setdefault(owner, per_task))
                budgets[owner] -= take
            fresh = partition in metadata
            drained = cut is not None and key in cut and position + take >= cut[key]
            ended = drained or (self.spec.bounded and fresh and take == available)
            if take == 0 and ended == current.ended:
                ends[key] = current  # unchanged: the same offset, so Spark plans no batch
                continue
            newest = metadata[partition].newest_position if fresh else None
            # reading up to the newest record: its native position is known
            known = dict(newest) if newest and take == available else None
            ends[key] = PartitionOffset(str(position + take), ended, drained=drained, position=known)
        return SourceOffset(self.spec.stream_id, ends, self._watermark(start, ends)).to_json()

    def _watermark(self, start: SourceOffset, ends: dict[str, PartitionOffset]) -> int:
        """The watermark the next batch injects: the one the task's reconciliation asked for, or +infinity when
        the batch reads a bounded input to its end (or its drain cut), so the windows flush in the next batch
        instead of two batches later."""
        watermark = start.watermark
        if self.spec.inject:
            injected = self._injected()
            if injected is not None and injected > watermark:
                watermark = injected
            finite = self.spec.bounded or self._cut is not None
            if finite and not self.spec.intermediate and ends and all(e.ended for e in ends.values()):
                watermark = MAX_TIMESTAMP_MS
        return watermark

    def _latest_positions(self, start: SourceOffset, per_task: int | None) -> SourceOffset:
        """`latestOffset` for a system of positions (`SystemAdmin.dense_offsets` False): each open SSP asks the
        admin where a read of its task's remaining budget ends (`SystemAdmin.plan_read`). A drain cut is the
        position the query has read to."""
        admin = systems_for(self.spec.snapshot).admin(self.spec.system)
        budgets: dict[str, int] = {}
        ends: dict[str, PartitionOffset] = {}
        if self._draining() and self._cut is None:
            self._cut = {key: 0 for key in self.spec.ssps if not start.partitions[key].ended}
        for key in self.spec.ssps:
            current = start.partitions[key]
            if current.ended:
                ends[key] = current
                continue
            if self._cut is not None and key in self._cut:  # drained: no new input, the partition ends here
                ends[key] = PartitionOffset(current.offset, ended=True, drained=True)
                continue
            owner = self.spec.tasks.get(key, "")
            budget = budgets.setdefault(owner, per_task if per_task is not None else 1 << 62)
            plan = admin.plan_read(self.spec.physical, _partition(key), current.offset, budget) if budget else None
            if plan is None or plan.end == current.offset:
                ended = self.spec.bounded and plan is not None and plan.at_end
                ends[key] = current if ended == current.ended else PartitionOffset(current.offset, ended)
                continue
            budgets[owner] -= plan.records
            ends[key] = PartitionOffset(plan.end, self.spec.bounded and plan.at_end)
        return SourceOffset(self.spec.stream_id, ends, self._watermark(start, ends))

    def _refresh(self, start: SourceOffset, open_keys: list[str], per_task: int | None) -> dict[int, Any]:
        """Ask the system for the ends of those of ``open_keys`` whose tasks' budget the last known ends may not
        fill; returns its metadata by partition. A task known to have more waiting than it may read now needs
        no round trip (one Event Hubs management call costs ~0.35 s). A partition read from a known end is never
        ended by it (bounded streams end at the end the system reports when the task catches up)."""
        known_backlog: dict[str, int] = {}
        for key in open_keys:
            owner = self.spec.tasks.get(key, "")
            backlog = self._known.get(key, -1) - int(start.partitions[key].offset)
            known_backlog[owner] = known_backlog.get(owner, 0) + backlog if backlog >= 0 else -(1 << 62)
        stale = [
            key for key in open_keys if per_task is None or known_backlog[self.spec.tasks.get(key, "")] < per_task
        ]
        if not stale:
            return {}
        admin = systems_for(self.spec.snapshot).admin(self.spec.system)
        metadata = admin.partition_metadata_of(self.spec.physical, [_partition(k) for k in stale])
        for key in stale:
            self._known[key] = int(metadata[_partition(key)].upcoming)
        return dict(metadata)

    def partitions(self, start_json: dict[str, Any], end_json: dict[str, Any]) -> list[InputPartition]:
        start, end = SourceOffset.from_json(start_json), SourceOffset.from_json(end_json)
        ranges = []
        for key in self.spec.ssps:
            a, b = start.partitions[key], end.partitions[key]
            marker = ("drain" if b.drained else "eos") if b.ended and not a.ended else ""
            moved = int(b.offset) > int(a.offset) if self.spec.dense else b.offset != a.offset
            if moved or marker:
                ranges.append(("ssp", key, a.offset, b.offset, marker))
        groups = self.spec.read_groups
        if groups and len(ranges) > groups:  # see `SystemConsumer.warm`
            parts = [InputPartition(("group", tuple(ranges[i::groups]))) for i in range(groups)]
        else:
            parts = [InputPartition(r) for r in ranges]
        if end.watermark > start.watermark:
            parts.append(InputPartition(("inject", end.watermark)))
        return parts

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing: positions are checkpointed by the processor from query progress (see docs/pipelines.md)."""

    def stop(self) -> None:
        if self._checkpoints is not None:
            self._checkpoints.stop()

    # --- executor side ----------------------------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        workergc.before_task()
        return _BatchReader(self.spec).read(partition.value)


class _BatchReader:
    """Reads one planned range and turns it into Arrow batches of the source's schema.

    Values are decoded a chunk at a time (`JsonDecoder.decode_many`, `KeyValueDecoder.decode_many`), packed
    intermediate records go to Spark as the Arrow batches they hold (`weirflow.spark.packing`), and only
    control messages and dead letters are handled one by one."""

    def __init__(self, spec: SourceSpec) -> None:
        self.spec = spec
        self.schema = spec.schema
        self.arrow_schema = to_arrow_schema(self.schema, timezone="UTC")
        self.user_fields = list(to_arrow_schema(spec.user_schema, timezone="UTC"))
        self.system_fields = list(to_arrow_schema(spec.system_schema, timezone="UTC"))
        self.time_type = self.arrow_schema.field("__wm_time").type
        self.control_type = self.arrow_schema.field("__ctl").type
        self._dead: list[tuple[dict[str, Any], bytes | None]] = []
        if spec.serde == "json":
            self.json: JsonDecoder | None = JsonDecoder(spec.user_schema)
            self.kv: KeyValueDecoder | None = None
        else:
            self.json, self.kv = None, KeyValueDecoder(as_text=spec.serde == "string")

    # --- rows one by one (control rows, dead letters) -----------------------------------------------------
    def _control_batch(self, rows: list[tuple[int, dict[str, Any]]]) -> pa.RecordBatch:
        """A batch of control rows, each given as (``__wm_time`` in µs, the ``__ctl`` struct as a dict)."""
        n = len(rows)
        arrays = [
            pa.array([wm for wm, _ in rows], type=self.time_type),
            pa.array([ctl for _, ctl in rows], type=self.control_type),
            *[pa.nulls(n, field.type) for field in list(self.arrow_schema)[2:]],
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=self.arrow_schema)

    @staticmethod
    def _ctl(
        kind: str,
        ssp: str | None,
        producer: str | None = None,
        task_count: int | None = None,
        ctl_ms: int | None = None,
    ) -> dict[str, Any]:
        return {"kind": kind, "ssp": ssp, "producer": producer, "task_count": task_count, "ctl_ms": ctl_ms}

    def read(self, value: tuple[Any, ...]) -> Iterator[pa.RecordBatch]:
        if value[0] == "inject":
            watermark = int(value[1])
            wm_us = (watermark + self.spec.delay_ms) * 1000
            yield self._control_batch([(wm_us, self._ctl("inject", None, ctl_ms=watermark))])
            return
        from weirflow.interfaces.system import SystemStreamPartition

        parts = value[1] if value[0] == "group" else (value,)
        consumer = systems_for(self.spec.snapshot).consumer(self.spec.system)
        for _, key, start, end, _marker in parts:  # a group's receivers all attach at once (`SystemConsumer.warm`)
            if int(end) > int(start) if self.spec.dense else end != start:
                ssp = SystemStreamPartition(self.spec.system, self.spec.physical, _partition(key))
                consumer.warm(ssp, start, end)
        if value[0] == "group":
            for part in parts:
                yield from self.read(part)
            return
        _, key, start, end, marker = value

        ssp = SystemStreamPartition(self.spec.system, self.spec.physical, _partition(key))
        consumer = systems_for(self.spec.snapshot).consumer(self.spec.system)
        position = start
        while int(position) < int(end) if self.spec.dense else position != end:
            chunk = consumer.read_columns(ssp, position, _READ_CHUNK, end, attributes=bool(self.system_fields))
            if not len(chunk) and (self.spec.dense or chunk.next_offset == position):
                raise UnreadableRangeError(f"{key}: offsets [{position}, {end}) were planned but cannot be read")
            yield from self._decode(key, chunk)
            self._send_dead_letters(ssp)
            position = chunk.next_offset
        if marker:  # "eos" or "drain" (True from plans of earlier versions)
            kind = marker if isinstance(marker, str) else "eos"
            yield self._control_batch([(0, self._ctl(kind, key, f"{self.spec.stream_id}:{key}", 1, 0))])

    # --- decoding a chunk -------------------------------------------------------------------------------
    def _decode(self, key: str, chunk: RecordColumns) -> Iterator[pa.RecordBatch]:
        controls: list[tuple[int, dict[str, Any]]] = []
        if self.spec.intermediate:
            dead = yield from self._decode_intermediate(key, chunk, controls)
        else:
            dead = yield from self._decode_input(key, chunk, controls)
        if dead:
            controls.append((0, self._ctl("dlq", key, task_count=dead)))
        if controls:
            yield self._control_batch(controls)

    def _decode_input(
        self, key: str, chunk: RecordColumns, controls: list[tuple[int, dict[str, Any]]]
    ) -> Generator[pa.RecordBatch, None, int]:
        """Records of an input stream, decoded whole-chunk; a ``seen`` control row carries the chunk's latest
        event time (stateless stages' output watermark). Returns how many went to the dead-letter stream."""
        if self.json is not None:
            table, decoded, failed = self.json.decode_many(chunk.values)
        else:
            assert self.kv is not None
            table, decoded, failed = self.kv.decode_many(chunk.keys, chunk.values)
        if table.num_rows:
            batch = self._data(key, table, decoded, chunk)
            latest = pc.max(batch.column(0).cast(pa.int64())).as_py()
            if latest is not None:
                controls.append((0, self._ctl("seen", key, ctl_ms=latest // 1000)))
            yield batch
        return sum(self._dead_letter(key, chunk, i, reason) for i, reason in failed)

    def _decode_intermediate(
        self, key: str, chunk: RecordColumns, controls: list[tuple[int, dict[str, Any]]]
    ) -> Generator[pa.RecordBatch, None, int]:
        """Records of an intermediate stream: packed Arrow rows (``\\x04``), single JSON rows (``\\x00``) and
        control messages. Returns how many went to the dead-letter stream."""
        dead = 0
        user: list[int] = []
        for i, raw in enumerate(chunk.values):
            kind = raw[:1]
            if kind == b"\x04":
                try:
                    rows = unpack(raw)
                except (pa.ArrowInvalid, OSError) as exc:
                    dead += self._dead_letter(key, chunk, i, f"bad packed rows: {exc}")
                    continue
                yield self._data(key, rows, [i] * rows.num_rows, chunk)
            elif kind == b"\x00":
                user.append(i)
            else:
                try:
                    _, message = decode(raw)
                except MalformedMessageError as exc:
                    dead += self._dead_letter(key, chunk, i, str(exc))
                    continue
                assert isinstance(message, ControlMessage)
                if message.type is MessageType.DRAIN and message.run_id != self.spec.run_id:
                    continue  # another deployment's drain (docs/drain.md): not an end for this one
                controls.append(
                    (
                        0,
                        self._ctl(
                            CONTROL_KIND_NAMES[message.type],
                            key,
                            message.task_name,
                            message.task_count,
                            message.timestamp,
                        ),
                    )
                )
        if user:
            assert self.json is not None
            table, decoded, failed = self.json.decode_many([chunk.values[i][1:] for i in user])
            if table.num_rows:
                yield self._data(key, table, [user[j] for j in decoded], chunk)
            dead += sum(self._dead_letter(key, chunk, user[j], reason) for j, reason in failed)
        return dead

    def _data(self, key: str, table: pa.Table, index: list[int], chunk: RecordColumns) -> pa.RecordBatch:
        """Data rows: the decoded user columns of the records at ``index`` of ``chunk``, with the internal
        columns and the system's record columns around them."""
        spec = self.spec
        n = table.num_rows
        columns = [_column(table, f) for f in self.user_fields]
        event_time = None
        if spec.event_time_from_record:
            stamps = pa.array(chunk.timestamps_ms, pa.int64())
            if len(index) != len(stamps) or index[:1] != [0] or index[-1] != len(stamps) - 1:
                stamps = stamps.take(pa.array(index, pa.int64()))
            event_time = pc.multiply(stamps, 1000).cast(self.time_type)
        elif not spec.intermediate:
            event_time = columns[[f.name for f in self.user_fields].index(spec.event_time_field)]
        if spec.intermediate or event_time is None:
            watermark = pa.repeat(pa.scalar(0, self.time_type), n)
        else:
            watermark = event_time.fill_null(pa.scalar(0, self.time_type))
        arrays = [watermark, pa.nulls(n, self.control_type), *columns]
        for field in self.system_fields:
            arrays.append(pa.array([chunk.attributes[i].get(field.name) for i in index], type=field.type))
        if spec.event_time_from_record:
            arrays.append(event_time)
        return pa.RecordBatch.from_arrays(arrays, schema=self.arrow_schema)

    def _dead_letter(self, key: str, chunk: RecordColumns, i: int, reason: str) -> int:
        """Queue record ``i`` for the dead-letter stream (sent before the batch can commit); returns 1."""
        raw = chunk.values[i]
        self._dead.append(
            (
                {
                    "error": reason,
                    "stream": self.spec.stream_id,
                    "ssp": key,
                    "offset": chunk.offsets[i],
                    "task": self.spec.tasks.get(key, ""),
                    "timestamp_ms": chunk.timestamps_ms[i],
                    "raw_base64": base64.b64encode(raw).decode(),
                },
                chunk.keys[i],
            )
        )
        return 1

    def _send_dead_letters(self, ssp: Any) -> None:
        """Write this chunk's undecodable records to ``<physical>.dlq`` (same system, same partition) before
        the batch can commit, so a dead letter is never lost; a replayed batch may write it again."""
        if not self._dead:
            return
        from weirflow.interfaces.system import OutgoingRecord
        from weirflow.systems import dead_letter_stream

        stream = dead_letter_stream(self.spec.physical)
        records = [
            OutgoingRecord(stream=stream, value=json.dumps(letter).encode(), key=key, partition=ssp.partition)
            for letter, key in self._dead
        ]
        systems_for(self.spec.snapshot).producer(self.spec.system).send(records)
        self._dead = []


def _column(table: pa.Table, field: pa.Field) -> pa.Array:
    """Column ``field.name`` of ``table`` as one array of ``field.type`` (Spark wants the exact type)."""
    column = table.column(field.name)
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return array if array.type == field.type else array.cast(field.type)
