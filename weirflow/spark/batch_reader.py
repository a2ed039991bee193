"""The executor side of the `weirflow` source: one planned range of one SSP read through the system's consumer
and turned into Arrow batches of the source's schema (docs/pipelines.md, "How a task runs"), replayed
intermediate rows dropped on the way (`weirflow.spark.replay`)."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Generator, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema

from weirflow.base.clock import now_ms
from weirflow.base.errors import MalformedDocumentError, UnreadableRangeError
from weirflow.interfaces.system import OffsetRange, RecordColumns
from weirflow.runtime.control import (
    CONTROL_KIND_NAMES,
    DEAD_LETTERS_KIND,
    END_OF_STREAM_KIND,
    INJECT_KIND,
    MARKS_KIND,
    ROWS_KIND,
    SEEN_KIND,
    ControlMessage,
    MalformedMessageError,
    MessageType,
    StreamControl,
    TaskControl,
    decode,
)
from weirflow.spark import lane_marks
from weirflow.spark.lane_marks import LaneCheck
from weirflow.spark.packing import unpack
from weirflow.spark.replay import (
    ROW_BITS,
    Marks,
    MarksCache,
    bring_forward,
    compare_offsets,
    lane_pss,
    producer_of,
    pss,
    strip,
)
from weirflow.spark.serde import JsonDecoder, KeyValueDecoder
from weirflow.spark.source_spec import SourceSpec, checkpoints_for, partition_of, systems_for

log = logging.getLogger("weirflow.spark.reader")

_READ_CHUNK = 10_000


class BatchReader:
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
        self._marks: Marks | None = None  # the marks of the partition being read (intermediate streams)
        self._dropped = 0  # replayed rows the read dropped
        self._taken = 0  # rows of an intermediate partition the read took (replays not), and its dead letters
        # control messages of the partition being read, and the task's control state they are added to: the
        # watermark this read moves Spark to (`_early_watermark`)
        self._heard: list[tuple[str, ControlMessage]] = []
        self._heard_all: list[tuple[str, ControlMessage]] = []  # a shared query's, over every partition read
        self._early: StreamControl | None = None
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
        detail: str | None = None,
    ) -> dict[str, Any]:
        return {
            "kind": kind,
            "ssp": ssp,
            "producer": producer,
            "task_count": task_count,
            "ctl_ms": ctl_ms,
            "detail": detail,
        }

    def read(self, value: tuple[Any, ...]) -> Iterator[pa.RecordBatch]:
        if value[0] == INJECT_KIND:
            watermark = int(value[1])
            wm_us = (watermark + self.spec.delay_ms) * 1000
            yield self._control_batch([(wm_us, self._ctl(INJECT_KIND, None, ctl_ms=watermark))])
            return
        from weirflow.interfaces.system import SystemStreamPartition

        parts = value[1] if value[0] == "group" else (value,)
        consumer = systems_for(self.spec.snapshot).consumer(self.spec.system)
        for _, key, start, end, _marker in parts:  # a group's receivers all attach at once (`SystemConsumer.warm`)
            if int(end) > int(start) if self.spec.dense else end != start:
                ssp = SystemStreamPartition(self.spec.system, self.spec.physical, partition_of(key))
                consumer.warm(ssp, start, end)
        if value[0] == "group":
            for part in parts:
                yield from self.read(part)
            yield from self._shared_early({part[1]: part[3] for part in parts})
            return
        _, key, start, end, marker = value

        ssp = SystemStreamPartition(self.spec.system, self.spec.physical, partition_of(key))
        consumer = systems_for(self.spec.snapshot).consumer(self.spec.system)
        cache = MarksCache(self.spec.marks_dir, self.spec.dense) if self.spec.keeps_marks else None
        self._marks = self._marks_at(key, ssp, start, cache) if cache is not None else None
        self._dropped = 0
        self._taken = 0
        position = start
        while int(position) < int(end) if self.spec.dense else position != end:
            chunk = consumer.read_columns(ssp, position, _READ_CHUNK, end, attributes=bool(self.system_fields))
            if not len(chunk) and (self.spec.dense or chunk.next_offset == position):
                raise UnreadableRangeError(f"{key}: offsets [{position}, {end}) were planned but cannot be read")
            yield from self._decode(key, chunk)
            self._send_dead_letters(ssp)
            position = chunk.next_offset
        yield from self._read_ended(key, start, end, marker, cache)

    def _read_ended(
        self, key: str, start: str, end: str, marker: Any, cache: MarksCache | None
    ) -> Iterator[pa.RecordBatch]:
        """The control rows a read of one partition ends with: the watermark it moves Spark to, the rows it took
        of an intermediate partition (the task's records in: its packed records each hold many), its marks, and
        the partition's end or drain."""
        if self._heard:
            early = self._early_watermark()
            if early is not None:
                yield self._control_batch(
                    [((early + self.spec.delay_ms) * 1000, self._ctl(INJECT_KIND, None, ctl_ms=early))]
                )
        if self.spec.intermediate and self._taken:
            yield self._control_batch([(0, self._ctl(ROWS_KIND, key, task_count=self._taken))])
        if self._marks is not None and cache is not None and self._order(end, start) != 0:
            self._marks.at = end
            self._prune_lanes(key, self._marks)
            cache.save(key, self._marks, start)
            detail = json.dumps({**self._marks.to_json(), "dropped": self._dropped})
            yield self._control_batch([(0, self._ctl(MARKS_KIND, key, detail=detail))])
        if marker:  # END_OF_STREAM_KIND or DRAIN_KIND (True from plans of earlier versions)
            kind = marker if isinstance(marker, str) else END_OF_STREAM_KIND
            yield self._control_batch([(0, self._ctl(kind, key, f"{self.spec.stream_id}:{key}", 1, 0))])

    # --- the watermark a read moves Spark to -----------------------------------------------------------
    def _shared_early(self, ends: dict[str, str]) -> Iterator[pa.RecordBatch]:
        """A shared aggregation query's watermark from this batch's read of all its partitions (one Spark task
        reads them: `weirflow.spark.source`), moved in the batch that read the messages as a query of one task
        moves it (`_early_watermark`): once every partition of the query heard from every producer in this read,
        the least of what they said. A task's reconciled watermark takes the largest a producer ever said in its
        partition, so this is never ahead of the least over the query's tasks, which the processor injects a batch
        later; a task still rebuilding holds it at its ``closed`` (`weirflow.spark.rebuild`)."""
        if not self.spec.part_column or not self._heard_all:
            return
        heard = StreamControl()
        for key, message in self._heard_all:
            heard.apply(key, message)
        self._heard_all.clear()
        early = heard.watermark(self.spec.ssps)
        if early is None:
            return
        for key, (until, closed) in self.spec.rebuild_until.items():
            if int(ends.get(key, -1)) < until:
                early = min(early, closed)
        yield self._control_batch(
            [((early + self.spec.delay_ms) * 1000, self._ctl(INJECT_KIND, None, ctl_ms=early))]
        )

    def _early_watermark(self) -> int | None:
        """The reconciled watermark of the stream over the task's partitions once this read's control messages
        are added to the task's checkpointed control state (`weirflow.runtime.control.StreamControl`); None while a
        producer has not reported.

        A stateful task's query otherwise moves Spark's watermark only in the batch after the processor
        reconciled this one's messages (the ``inject`` partition), and emits the windows it closes in the batch
        after that. Carried by a row of this batch, the same value is Spark's watermark from the next batch on:
        a window leaves a batch sooner. It is never ahead of the truth: the checkpoint may lag the batches
        before this one (the processor writes it after Spark's commit), and a lagging state only lowers a
        minimum of per-producer maxima; replayed messages change nothing (`PartitionControl.apply`)."""
        if self._early is None:
            try:
                checkpoint = checkpoints_for(self.spec.snapshot).read_last_checkpoint(self.spec.inject)
                control = TaskControl.from_json(checkpoint.control if checkpoint else None)
            except MalformedDocumentError:
                control = TaskControl()
            if control.drained or control.finished:  # a task drained in another deployment starts afresh
                control = control.for_new_run()
            self._early = control.stream(self.spec.stream_id)
        for key, message in self._heard:
            self._early.apply(key, message)
        self._heard.clear()
        return self._early.watermark(self.spec.ssps)

    # --- marks of an intermediate partition (`weirflow.spark.replay`) -------------------------------------
    def _marks_at(self, key: str, ssp: Any, start: str, cache: MarksCache) -> Marks:
        """The partition's marks at ``start``: kept from the read that ended there, else rebuilt from those in
        the task's checkpoint by reading the stream from their offset to ``start``."""
        cached = cache.load(key, start)
        if cached is not None:
            return cached
        checkpoint = checkpoints_for(self.spec.snapshot).read_last_checkpoint(self.spec.tasks.get(key, ""))
        stored = dict(checkpoint.control).get("marks", {}).get(key) if checkpoint is not None else None
        if stored is None:
            return Marks(start)  # nothing read from this partition yet (or a checkpoint written before marks)
        marks = Marks.from_json(stored)
        if self._order(marks.at, start) != -1:  # a read from before the checkpoint's marks: they cannot apply
            return marks if marks.at == start else Marks(start)
        consumer = systems_for(self.spec.snapshot).consumer(self.spec.system)
        return bring_forward(consumer, systems_for(self.spec.snapshot).admin(self.spec.system), ssp, marks, start)

    def _prune_lanes(self, key: str, marks: Marks) -> None:
        """Forget the marks of lanes no row will come from again (`weirflow.spark.lane_marks`)."""
        if not self.spec.lane_sources:
            return
        systems, checkpoints = systems_for(self.spec.snapshot), checkpoints_for(self.spec.snapshot)
        check = LaneCheck(self.spec.lane_sources, checkpoints.read_last_checkpoint, systems.admin)
        partition = partition_of(key)

        def end() -> str:
            admin = systems.admin(self.spec.system)
            return str(admin.partition_metadata_of(self.spec.physical, [partition])[partition].upcoming)

        dropped = lane_marks.prune(
            marks, now_ms(), check.live_lanes, end, lambda offset: (self._order(marks.at, offset) or 0) >= 0
        )
        if dropped:
            log.info("%s: the marks of %d lanes read to their end dropped", key, dropped)

    def _order(self, a: str, b: str) -> int | None:
        """Offset ``a`` of one of this stream's partitions against ``b``
        (`weirflow.spark.replay.compare_offsets`)."""
        return compare_offsets(systems_for(self.spec.snapshot).admin(self.spec.system), a, b)

    # --- decoding a chunk -------------------------------------------------------------------------------
    def _decode(self, key: str, chunk: RecordColumns) -> Iterator[pa.RecordBatch]:
        controls: list[tuple[int, dict[str, Any]]] = []
        if self.spec.intermediate:
            dead = yield from self._decode_intermediate(key, chunk, controls)
        else:
            dead = yield from self._decode_input(key, chunk, controls)
        if dead:
            controls.append((0, self._ctl(DEAD_LETTERS_KIND, key, task_count=dead)))
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
                controls.append((0, self._ctl(SEEN_KIND, key, ctl_ms=latest // 1000)))
            yield batch
        return sum(self._dead_letter(key, chunk, i, reason) for i, reason in failed)

    def _decode_intermediate(
        self, key: str, chunk: RecordColumns, controls: list[tuple[int, dict[str, Any]]]
    ) -> Generator[pa.RecordBatch, None, int]:
        """Records of an intermediate stream: packed Arrow rows (``\\x04``), single JSON rows (``\\x00``) and
        control messages. Returns how many went to the dead-letter stream."""
        dead = 0
        user: list[int] = []
        latest: list[int] = []  # per data batch, its latest event time (``seen`` rows asked for)
        for i, raw in enumerate(chunk.values):
            kind = raw[:1]
            if kind == b"\x04":
                try:
                    rows = unpack(raw)
                except (pa.ArrowInvalid, OSError) as exc:
                    dead += self._dead_letter(key, chunk, i, f"bad packed rows: {exc}")
                    continue
                batch, reason = self._packed_rows(key, chunk, i, rows)
                if reason is not None:
                    dead += self._dead_letter(key, chunk, i, reason)
                elif batch is not None:
                    self._taken += batch.num_rows
                    self._note_latest(batch, latest)
                    yield batch
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
                self._hear(key, message)
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
                self._taken += table.num_rows
                data = self._data(key, table, [user[j] for j in decoded], chunk)
                self._note_latest(data, latest)
                yield data
            dead += sum(self._dead_letter(key, chunk, user[j], reason) for j, reason in failed)
        self._add_seen(key, latest, controls)
        self._taken += dead
        return dead

    def _hear(self, key: str, message: ControlMessage) -> None:
        """Keep a control message read for the watermark this read moves Spark to: the task's
        (`_early_watermark`), or a shared query's (`_shared_early`)."""
        if self.spec.inject:
            self._heard.append((key, message))
        elif self.spec.part_column:
            self._heard_all.append((key, message))

    def _add_seen(self, key: str, latest: list[int], controls: list[tuple[int, dict[str, Any]]]) -> None:
        """One ``seen`` row for the chunk's data batches (their latest event time), when there were any."""
        if latest:
            controls.append((0, self._ctl(SEEN_KIND, key, ctl_ms=max(latest) // 1000)))

    def _note_latest(self, batch: pa.RecordBatch, latest: list[int]) -> None:
        """Add the latest event time (µs) of a data batch of an intermediate stream to ``latest``, when the
        query asked for ``seen`` rows there (a shared aggregation query's rebuild marks,
        `weirflow.spark.rebuild`)."""
        if not self.spec.seen_rows:
            return
        value = pc.max(batch.column(self.spec.event_time_field).cast(pa.int64())).as_py()
        if value is not None:
            latest.append(int(value))

    def _packed_rows(
        self, key: str, chunk: RecordColumns, i: int, rows: pa.Table
    ) -> tuple[pa.RecordBatch | None, str | None]:
        """The rows of packed record ``i`` that are not replays (`weirflow.spark.replay`), positioned by the
        record's offset and their index in it (None when all of them were); or why the record cannot be read
        as this stage's rows (rows of another version of the pipeline, docs/drain.md): a dead letter."""
        row_index = np.arange(rows.num_rows, dtype=np.int64)
        # replays first: a replay of rows counted before an upgrade is dropped as one, not read as v2's input
        if self._marks is not None:
            keep = self._marks.admit(producer_of(rows), rows)
            if keep is not None:
                self._dropped += rows.num_rows - pc.sum(keep).as_py()
                rows, row_index = rows.filter(keep), row_index[keep.to_numpy(zero_copy_only=False)]
                if rows.num_rows == 0:
                    return None, None
        missing = [f.name for f in self.user_fields if f.name not in rows.column_names]
        if missing:
            return None, (
                f"packed rows lack column(s) {', '.join(missing)} of this stage's input (written by another "
                f"version of the pipeline?)"
            )
        if self.spec.dense:
            position = (int(chunk.offsets[i]) << ROW_BITS) | row_index
        elif chunk.ordinals:
            position = (int(chunk.ordinals[i]) << ROW_BITS) | row_index
        else:
            position = None
        try:
            return self._data(key, strip(rows), [i] * rows.num_rows, chunk, position), None
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            return None, f"packed rows do not fit this stage's input columns: {exc}"

    def _data(
        self, key: str, table: pa.Table, index: list[int], chunk: RecordColumns, position: Any = None
    ) -> pa.RecordBatch:
        """Data rows: the decoded user columns of the records at ``index`` of ``chunk``, with the internal
        columns, the rows' positions (``position``: their ``__pos``, by default the records' offsets) and the
        system's record columns around them."""
        spec = self.spec
        n = table.num_rows
        base = pss(spec.stream_code, partition_of(key))
        if spec.dense:
            if position is None:
                position = _dense_positions(chunk, index)
            pss_array = pa.repeat(pa.scalar(base, pa.int64()), n)
            pos_array = pa.array(np.asarray(position, dtype=np.int64))
        elif chunk.ordinals:  # each lane is a partition of its own (`weirflow.spark.replay.lane_pss`)
            at = np.asarray(index, dtype=np.int64)
            if position is None:
                position = np.asarray(chunk.ordinals, dtype=np.int64)[at] << ROW_BITS
            pss_array = pa.array(lane_pss(base, np.asarray(chunk.lanes, dtype=np.int64)[at]))
            pos_array = pa.array(np.asarray(position, dtype=np.int64))
        else:
            pss_array, pos_array = pa.nulls(n, pa.int64()), pa.nulls(n, pa.int64())
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
        arrays = [watermark, pa.nulls(n, self.control_type), pss_array, pos_array, *columns]
        for field in self.system_fields:
            arrays.append(pa.array([chunk.attributes[i].get(field.name) for i in index], type=field.type))
        if spec.event_time_from_record:
            arrays.append(event_time)
        if spec.part_column:
            arrays.append(pa.repeat(pa.scalar(partition_of(key), pa.int32()), n))
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
        the batch can commit, so a dead letter is never lost; a replayed batch writes it again with the same
        id (`OutgoingRecord.id`), which the embedded log drops. Sent fenced, as the sink sends (a reader whose
        processor lost the task writes nothing, however long a send waited)."""
        if not self._dead:
            return
        from weirflow.interfaces.system import OutgoingRecord
        from weirflow.job.systems import dead_letter_stream

        stream = dead_letter_stream(self.spec.physical)
        records = [  # named by the record's place, so a replayed read's dead letter is recognised (its id)
            OutgoingRecord(
                stream=stream,
                value=json.dumps(letter).encode(),
                key=key,
                partition=ssp.partition,
                id=f"{letter['ssp']}/{letter['offset']}",
            )
            for letter, key in self._dead
        ]
        spec = self.spec
        producer = systems_for(spec.snapshot).producer(spec.system)
        producer.send_fenced(records, lambda: spec.fence.check(spec.snapshot))
        self._dead = []


def _dense_positions(chunk: RecordColumns, index: list[int]) -> np.ndarray:
    """The ``__pos`` of the records at ``index`` of ``chunk`` (dense offsets; their first row each): from the
    first offset when they are consecutive (`OffsetRange`), without a string per record."""
    at = np.asarray(index, dtype=np.int64)
    if isinstance(chunk.offsets, OffsetRange):
        return (at + chunk.offsets.first) << ROW_BITS
    return np.array(chunk.offsets).astype(np.int64)[at] << ROW_BITS


def _column(table: pa.Table, field: pa.Field) -> pa.Array:
    """Column ``field.name`` of ``table`` as one array of ``field.type`` (Spark wants the exact type)."""
    column = table.column(field.name)
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return array if array.type == field.type else array.cast(field.type)
