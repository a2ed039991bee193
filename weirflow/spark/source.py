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
need no cut: they end when every producer task's drain message arrived (`weirflow.runtime.control`), and drain
messages of another deployment (another ``run-id``) are ignored.

``w`` is the watermark the task's reconciliation asked for (see `weirflow.runtime.control`): the processor stores
it
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
  seen | rows | marks, ``ssp``, ``producer``, ``task_count``, ``ctl_ms``, ``detail``) that the query's
  ``observe`` collects. A ``dlq`` row stands for the ``task_count`` undecodable records of one read (each was
  sent to the dead-letter stream); a ``seen`` row gives the latest event time (``ctl_ms``) of one read of an
  input stream; a ``rows`` row the rows one read of an intermediate partition took (``task_count``: replays
  left out, dead letters in), the task's records in, since its packed records each hold many.

Data rows are thus two cheap columns wider than the user's: the JVM copies every column of every row more
than once per micro-batch, so the width is paid per row.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql import types as T
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows

from weirflow.interfaces.spark_checkpoint import PartitionOffset, SourceOffset
from weirflow.runtime.control import (
    DRAIN_KIND,
    END_OF_STREAM_KIND,
    INJECT_KIND,
    MAX_TIMESTAMP_MS,
)
from weirflow.spark import workergc
from weirflow.spark.batch_reader import BatchReader
from weirflow.spark.drain_cut import cut_past_written, read_floor, written_ends
from weirflow.spark.source_spec import (
    CONTROL_TYPE,
    INTERNAL_COLUMNS,
    INTERNAL_FIELDS,
    POSITION_FIELDS,
    SourceSpec,
    checkpoints_for,
    partition_of,
    systems_for,
)

__all__ = [
    "CONTROL_TYPE",
    "INTERNAL_COLUMNS",
    "INTERNAL_FIELDS",
    "POSITION_FIELDS",
    "SOURCE_NAME",
    "SourceSpec",
    "WeirflowSource",
    "WeirflowStreamReader",
    "systems_for",
]

SOURCE_NAME = "weirflow"


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
            from weirflow.interfaces.plugins import checkpoint_factory

            config = Config.from_snapshot(self.spec.snapshot)
            self._checkpoints = checkpoint_factory(config).get_checkpoint_manager(config)
            self._checkpoints.start()
        checkpoint = self._checkpoints.read_last_checkpoint(self.spec.inject)
        if checkpoint is None:
            return None
        value = dict(checkpoint.control).get("injected", {}).get(self.spec.stream_id)
        return int(value) if value is not None else None

    def _shared_injected(self) -> int | None:
        """The watermark a shared aggregation query's processor asks for (`weirflow.spark.rebuild`): the file it
        rewrites after each batch, ``{"<stream id>": <ms>}``; None before it wrote one."""
        try:
            with open(self.spec.inject_file, encoding="utf-8") as file:
                value = json.load(file).get(self.spec.stream_id)
        except (FileNotFoundError, ValueError):
            return None
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
            self._cut = self._drain_cut({key: int(start.partitions[key].offset) for key in open_keys})
        cut = self._cut
        metadata = self._refresh(start, open_keys if cut is None else [], per_task)
        for key in self.spec.ssps:
            current = start.partitions[key]
            if current.ended:
                ends[key] = current
                continue
            partition = partition_of(key)
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

    def _drain_cut(self, read_to: dict[str, int]) -> dict[str, int]:
        """A drain's cut: where the query has read to, or, where an earlier holder of a task wrote rows of a
        batch it never checkpointed to the stage's intermediate streams, past them (`weirflow.spark.drain_cut`);
        for a stateful task that wrote results past its checkpoint, no earlier than its floor
        (`StageQuery._drain_floor`)."""
        floor = read_floor(self.spec.drain_floor_file)
        if floor:
            read_to = {key: max(offset, floor.get(key, 0)) for key, offset in read_to.items()}
        if not self.spec.written_to or not read_to:
            return read_to
        snapshot = self.spec.snapshot
        written = written_ends(
            systems_for(snapshot),
            checkpoints_for(snapshot),
            self.spec.producer,
            self.spec.written_to,
            self.spec.stream_code,
        )
        return cut_past_written(read_to, written, partition_of)

    def _watermark(self, start: SourceOffset, ends: dict[str, PartitionOffset]) -> int:
        """The watermark the next batch injects: the one the task's reconciliation asked for, or +infinity when
        the batch reads a bounded input to its end (or its drain cut), so the windows flush in the next batch
        instead of two batches later."""
        watermark = start.watermark
        if self.spec.inject_file:  # a shared aggregation query: the least over its tasks, from the processor
            shared = self._shared_injected()
            if shared is not None and shared > watermark:
                watermark = shared
        elif self.spec.inject:
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
            plan = (
                admin.plan_read(self.spec.physical, partition_of(key), current.offset, budget) if budget else None
            )
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
        metadata = admin.partition_metadata_of(self.spec.physical, [partition_of(k) for k in stale])
        for key in stale:
            self._known[key] = int(metadata[partition_of(key)].upcoming)
        return dict(metadata)

    def partitions(self, start_json: dict[str, Any], end_json: dict[str, Any]) -> list[InputPartition]:
        start, end = SourceOffset.from_json(start_json), SourceOffset.from_json(end_json)
        ranges = []
        for key in self.spec.ssps:
            a, b = start.partitions[key], end.partitions[key]
            marker = (DRAIN_KIND if b.drained else END_OF_STREAM_KIND) if b.ended and not a.ended else ""
            moved = int(b.offset) > int(a.offset) if self.spec.dense else b.offset != a.offset
            if moved or marker:
                ranges.append(("ssp", key, a.offset, b.offset, marker))
        # a shared aggregation query's partitions are read by one Spark task, which sees every partition's
        # control messages (`BatchReader._shared_early`)
        groups = 1 if self.spec.part_column else self.spec.read_groups
        if groups and len(ranges) > groups:  # see `SystemConsumer.warm`
            parts = [InputPartition(("group", tuple(ranges[i::groups]))) for i in range(groups)]
        else:
            parts = [InputPartition(r) for r in ranges]
        if end.watermark > start.watermark:
            parts.append(InputPartition((INJECT_KIND, end.watermark)))
        return parts

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing: positions are checkpointed by the processor from query progress (see docs/pipelines.md)."""

    def stop(self) -> None:
        if self._checkpoints is not None:
            self._checkpoints.stop()

    # --- executor side ----------------------------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        workergc.before_task()
        return BatchReader(self.spec).read(partition.value)
