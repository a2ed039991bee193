"""`weirflow-sink` — the PySpark streaming data sink writing a stage's outputs through the systems' producers.

A stage may write several streams (``send_to`` outputs, the intermediate stream of a ``partition_by``); the
runtime unions them into one DataFrame (`StageBuilder.sink_frame`), so one query has one sink. The sink's
``sinks`` option describes them in order (``stream``, ``system``, ``physical``, and for an intermediate stream
``rows``: pairs of the frame's column and the row's column name); a ``__sink`` column says which output a row
belongs to when there are several:

* output streams: columns ``__key`` (binary, may be null) and ``__value`` (the row as JSON);
* intermediate streams: ``__partition`` (chosen in the JVM) and the rows' own columns, packed per partition
  into Arrow records (`weirflow.spark.packing`): no row is encoded one by one.

A served table (``Stream.serve``) is not sent anywhere: each partition returns its latest row per key in its
commit message, and ``commit`` writes them into the task's Spark checkpoint directory (``served_dir``,
`weirflow.runtime.served_tables`).

Executors send with `SystemProducer.send_fenced`, which is durable when it returns and checks the fence
(`weirflow.spark.fence`) right before every attempt: a micro-batch commits only after every output record
was written. A row-wise stage's replayed batch writes its rows again with the same positions and ids
(``OutgoingRecord.id``), which the next stage, the embedded log and a consumer use to drop replays; a stateful
task leaves out the results an earlier attempt wrote past its checkpoint and gives each new one an id of its
own (`weirflow.spark.result_replays`, docs/guarantees.md). Records a system can never take (too large) go to
the stream's ``<physical>.dlq`` with the reason.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

from weirflow.base.errors import RecordTooLargeError
from weirflow.interfaces.system import OutgoingRecord
from weirflow.job.systems import dead_letter_stream
from weirflow.results.ids import result_digest, result_id, result_origin, row_id
from weirflow.runtime import fault_points
from weirflow.runtime.served_tables import write_batch
from weirflow.spark import workergc
from weirflow.spark.fence import Fence
from weirflow.spark.fence import decode as decode_fence
from weirflow.spark.intermediate_records import packed_records, partial_records
from weirflow.spark.replay import POS, PSS, K, input_partition, output_index
from weirflow.spark.result_replays import (
    Replays,
    ResultsLedger,
    batch_tails,
    read_past,
    replay_key,
    row_digests,
)
from weirflow.spark.shared_results import SharedResults, task_key
from weirflow.spark.source import systems_for
from weirflow.spark.table_commits import commit_rows, ship, unship

log = logging.getLogger("weirflow.spark")

SINK_NAME = "weirflow-sink"

# What `schema()` declares; Spark hands the writer the frame's actual columns (see the module docstring).
SINK_SCHEMA = T.StructType(
    [
        T.StructField("__key", T.BinaryType(), True),
        T.StructField("__value", T.BinaryType(), True),
    ]
)


class WrittenCount(WriterCommitMessage):
    """What one partition wrote: rows per output, and of them those of each task (task -> output -> rows) when
    the query runs several tasks and the rows say whose they are (`WeirflowStreamWriter._by_task`); per served
    table its latest row per key (key -> JSON), which ``commit`` records on the driver's machine
    (`weirflow.runtime.served_tables`); the replayed results it did not write again (replay key -> copies,
    `weirflow.spark.result_replays`); per output that is a table its rows, which ``commit`` commits
    (`weirflow.spark.table_commits`)."""

    def __init__(
        self,
        counts: dict[str, int],
        served: dict[str, dict[str, str]] | None = None,
        replayed: dict[str, int] | None = None,
        by_task: dict[str, dict[str, int]] | None = None,
        tables: dict[str, list[bytes]] | None = None,
    ) -> None:
        self.counts = counts
        self.served = served or {}
        self.replayed = replayed or {}
        self.by_task = by_task or {}
        self.tables = tables or {}  # output -> its rows as Arrow IPC, for a table's commit (`table_commits`)

    @classmethod
    def total(cls, messages: list[WriterCommitMessage | None]) -> WrittenCount:
        """The partitions' messages of one batch added up (a served table's rows merged by key)."""
        total = cls({})
        for message in messages:
            if not isinstance(message, WrittenCount):
                continue
            for table, rows in message.served.items():
                total.served.setdefault(table, {}).update(rows)
            _add(total.counts, message.counts)
            _add(total.replayed, message.replayed)
            for task, written in message.by_task.items():
                _add(total.by_task.setdefault(task, {}), written)
            for stream, payloads in message.tables.items():
                total.tables.setdefault(stream, []).extend(payloads)
        return total


def _latest_by_key(rows: pa.RecordBatch, table: dict[str, str]) -> None:
    """A served table's rows into ``table``: the latest row per key, a later row of the partition winning."""
    for key, value in zip(rows.column("__key").to_pylist(), rows.column("__value").to_pylist(), strict=True):
        if key is not None:
            table[key.decode("utf-8", "replace")] = (value or b"null").decode("utf-8", "replace")


def _add(into: dict[str, int], more: dict[str, int]) -> None:
    for name, n in more.items():
        into[name] = into.get(name, 0) + n


def spark_task() -> tuple[int, int, int]:
    """The Spark task a writer runs in: its micro-batch, its partition and its try (0 first), from Spark's
    ``TaskContext``; (0, 0, 0) outside Spark (a writer driven by a test)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return 0, 0, 0
    batch = context.getLocalProperty("streaming.sql.batchId")
    return int(batch) if batch else 0, context.partitionId(), context.attemptNumber()


_counts: dict[tuple[str, str, str], int] = {}  # (snapshot, system, stream) -> partitions, fixed while a job runs


def _partition_count(snapshot: str, system: str, stream: str) -> int:
    """An output stream's partition count, asked of its system once per worker process (on Event Hubs each
    ask is a management round trip)."""
    key = (snapshot, system, stream)
    if key not in _counts:
        _counts[key] = systems_for(snapshot).admin(system).partition_count(stream)
    return _counts[key]


class WeirflowSink(DataSource):
    @classmethod
    def name(cls) -> str:
        return SINK_NAME

    def schema(self) -> T.StructType:
        return SINK_SCHEMA

    def streamWriter(self, schema: T.StructType, overwrite: bool) -> WeirflowStreamWriter:
        workergc.before_task()
        fence = decode_fence(self.options.get("fence"))
        served_dir = self.options.get("served_dir") or None
        counts_dir = self.options.get("counts_dir") or None
        tasks = json.loads(self.options.get("tasks") or "[]")
        shared = json.loads(self.options.get("shared") or "{}")
        return WeirflowStreamWriter(
            self.options["config"],
            json.loads(self.options["sinks"]),
            fence,
            served_dir,
            counts_dir,
            tasks,
            self.options.get("replays_file") or None,
            {int(k): v for k, v in json.loads(self.options.get("owners") or "{}").items()},
            self.options.get("attempt") or None,
            self.options.get("results_dir") or None,
            {int(k): int(v) for k, v in json.loads(self.options.get("rows_until") or "{}").items()},
            SharedResults.from_json(shared) if shared else None,
        )


class WeirflowStreamWriter(DataSourceStreamArrowWriter):
    """Writes each Arrow batch Spark hands over to the outputs described by ``sinks``, each once the fence
    (`weirflow.spark.fence`) confirmed that the query's processor still holds every lock in ``fence``."""

    def __init__(
        self,
        snapshot: str,
        sinks: list[dict[str, Any]],
        fence: Fence | None = None,
        served_dir: str | None = None,
        counts_dir: str | None = None,
        tasks: list[str] | None = None,
        replays_file: str | None = None,
        owners: dict[int, str] | None = None,
        attempt: str | None = None,
        results_dir: str | None = None,
        rows_until: dict[int, int] | None = None,
        shared: SharedResults | None = None,
    ) -> None:
        self.snapshot = snapshot
        # a shared aggregation query's tasks' replays and ledgers (rows name their partition: ``__part``)
        self.shared = shared
        self._current: str | None = None  # the task whose results are being written (a shared query)
        # per input partition (``__pss``), the position below which a batch sends rows, not partials: where it
        # ended when a start that may replay began (`weirflow.spark.partials.BatchMode`)
        self.rows_until = rows_until or {}
        self.tasks = tasks or []  # the tasks the query runs (a stateful stage's query runs one)
        self.owners = owners or {}  # a shared query's input partitions (their ``__pss``) -> the task reading each
        self.sinks = sinks
        self.fence = fence or Fence()
        self.served_dir = served_dir  # the task's Spark checkpoint directory, where served tables are kept
        self.counts_dir = counts_dir  # where commit leaves each batch's counts for the runner (records out)
        # a stateful task's results an earlier attempt wrote past its checkpoint (`weirflow.spark.result_replays`)
        self.replays_file = replays_file
        # where a stateful task's sink keeps each batch's `ResultsLedger` (its Spark checkpoint's ``results/``)
        self.results_dir = results_dir
        # the query's token in its results' ids (`weirflow.results.ids`): one per start of the query
        self.attempt = attempt or secrets.token_hex(8)
        self._written = 0  # results named so far by this writer (the index in their ids)
        self._task = (0, 0, 0)  # the Spark task writing (`spark_task`), set by each `write`
        # per output: the last row written of this partition (its __pss, __pos, __k), for the next batch's __k
        self._carry: dict[int, tuple[int, int, int]] = {}

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WrittenCount:
        workergc.before_task()
        systems = systems_for(self.snapshot)
        self._task = spark_task()
        counts: dict[str, int] = {}
        served: dict[str, dict[str, str]] = {}
        single = Replays.load(Path(self.replays_file)) if self.replays_file else None
        if self.shared is not None:
            self.shared.fresh()
        replayed: dict[str, int] = {}
        by_task: dict[str, dict[str, int]] = {}
        tables: dict[str, list[bytes]] = {}
        gathered: dict[int, list[pa.RecordBatch]] = {}  # outputs of partials: the partition's rows, merged last
        for batch in iterator:
            if batch.num_rows == 0:
                continue
            by_system: dict[str, list[OutgoingRecord]] = {}
            for index, task, rows in self._parts(batch, by_task):
                sink = self.sinks[index]
                self._current = task
                replays = self.shared.replays(task) if self.shared is not None and task else single
                counts[sink["stream"]] = counts.get(sink["stream"], 0) + rows.num_rows
                self._by_task(sink, rows, by_task)
                if sink.get("serve"):
                    _latest_by_key(rows, served.setdefault(sink["serve"], {}))
                    continue
                if sink.get("table"):
                    tables.setdefault(sink["stream"], []).append(
                        ship(self._table_rows(index, sink, rows, systems, replays, replayed))
                    )
                    continue
                if sink.get("partials"):
                    gathered.setdefault(index, []).append(rows)
                    continue
                out = by_system.setdefault(sink["system"], [])
                if sink.get("rows"):
                    out.extend(self._intermediate(index, rows, sink, systems, replays, replayed))
                else:
                    out.extend(self._records(index, sink, rows, replays, replayed))
            # Before every send and retry, not once per partition: a partition's rows arrive over time (a slow
            # transform upstream), and the lock may move while they do or while a send waits to retry.
            for system, records in by_system.items():
                self._send(systems.producer(system), records)
        for index, batches in gathered.items():
            self._send_partials(self.sinks[index], batches, systems)
        return WrittenCount(counts, served, replayed, by_task, tables)

    def _parts(
        self, batch: pa.RecordBatch, by_task: dict[str, dict[str, int]]
    ) -> list[tuple[int, str | None, pa.RecordBatch]]:
        """``batch``'s rows per output and, in a shared aggregate query, per task: (output, task or None, rows)."""
        if "__sink" in batch.schema.names:
            which = batch.column("__sink")
            parts = [(i, batch.filter(pc.equal(which, i))) for i in which.unique().to_pylist()]
        else:
            parts = [(0, batch)]
        if self.shared is None:
            return [(i, None, rows) for i, rows in parts]
        return [(i, t, r) for i, rows in parts for t, r in self.shared.split(rows, self.sinks[i], by_task)]

    def _send_partials(self, sink: dict[str, Any], batches: list[pa.RecordBatch], systems: Any) -> None:
        """This partition's rows of the batch for an intermediate stream of partials, merged (`partial_records`),
        in two sends: the first intermediate partition's, then the others' at once (at 64 partitions a send each
        was 64 fence checks and log writes per writer and batch)."""
        producer = systems.producer(sink["system"])
        by_partition: dict[int | None, list[OutgoingRecord]] = {}
        for record in partial_records(sink, batches, producer, self.rows_until):
            by_partition.setdefault(record.partition, []).append(record)
        parts = list(by_partition.values())
        if parts:
            self._send(producer, parts[0])
        if len(parts) > 1:
            fault_points.reached("between-partial-sends", str(sink["stage"]))
            self._send(producer, [r for records in parts[1:] for r in records])

    def _by_task(self, sink: dict[str, Any], rows: pa.RecordBatch, by_task: dict[str, dict[str, int]]) -> None:
        """Add to ``by_task`` the rows of ``rows`` per task of a stateless query shared by several tasks: each
        row's ``__pss`` names its input partition, hence its task (``owners``); rows without positions are counted
        for the query only (docs/endpoints.md, "Status page and metrics")."""
        if not self.owners or not sink.get("positions") or PSS not in rows.schema.names:
            return
        counted = pc.value_counts(rows.column(PSS))
        stream = sink["stream"]
        for value, n in zip(counted.field("values").to_pylist(), counted.field("counts").to_pylist(), strict=True):
            task = self.owners.get(input_partition(value)) if value is not None else None
            if task is not None:
                _add(by_task.setdefault(task, {}), {stream: int(n)})

    def _intermediate(
        self,
        index: int,
        rows: pa.RecordBatch,
        sink: dict[str, Any],
        systems: Any,
        replays: Replays | None,
        replayed: dict[str, int],
    ) -> list[OutgoingRecord]:
        """The packed records of output ``index``, an intermediate stream: with positions (a row-wise stage),
        or named by their task and without what an earlier attempt already wrote (a stateful stage)."""
        task = self._task_results(sink)
        if sink.get("positions"):
            rows = self._indexed(index, rows)
        elif replays and task:
            rows = self._not_replayed(rows, sink, replays, replayed)
            if rows.num_rows == 0:
                return []
        return packed_records(rows, sink, systems.producer(sink["system"]), task, self._task[1])

    def _task_results(self, sink: dict[str, Any]) -> str | None:
        """The task whose results ``sink`` writes (a stateful stage's query runs one task, a shared aggregation
        query's rows name theirs), else None."""
        if not sink.get("results"):
            return None
        if sink.get("task_column"):
            return self._current
        return self.tasks[0] if len(self.tasks) == 1 else None

    def _not_replayed(
        self, rows: pa.RecordBatch, sink: dict[str, Any], replays: Replays, replayed: dict[str, int]
    ) -> pa.RecordBatch:
        """``rows`` without the results an earlier attempt of the task already wrote from this Spark partition
        (each copy once, `weirflow.spark.result_replays`)."""
        columns, names = (list(c) for c in zip(*sink["rows"], strict=True))
        digests = row_digests(pa.RecordBatch.from_arrays([rows.column(c) for c in columns], names=names))
        keep = self._take_replays(sink, digests, replays, replayed)
        return rows if all(keep) else rows.filter(pa.array(keep))

    def _take_replays(
        self, sink: dict[str, Any], digests: list[str], replays: Replays | None, replayed: dict[str, int]
    ) -> list[bool]:
        """Per result digest, whether it is new: False for each one that uses up a copy an earlier attempt of
        the task wrote from this writer's Spark partition (counted in ``replayed``)."""
        if not replays:
            return [True] * len(digests)
        stream, partition = f"{sink['system']}.{sink['physical']}", self._task[1]
        keep = []
        for digest in digests:
            key = replay_key(stream, partition, digest)
            again = replays.take(key)
            keep.append(not again)
            if again:
                counted = task_key(self._current, key) if self._current else key
                replayed[counted] = replayed.get(counted, 0) + 1
        return keep

    def _records(
        self,
        index: int,
        sink: dict[str, Any],
        rows: pa.RecordBatch,
        replays: Replays | None,
        replayed: dict[str, int],
    ) -> list[OutgoingRecord]:
        """The records of output ``index``, an output stream, each with its id (docs/guarantees.md): a
        row-wise stage's rows named by their position, ``<stage>/<__pss>/<__pos>/<__k>``; a stateful task's
        results by where they are first written (`weirflow.results.ids`), without those an earlier attempt
        already wrote; rows that lost their positions get none.

        A row-wise row sent without a key goes to the partition of its input partition (its ``__pss`` modulo
        the stream's partitions), not wherever the system spreads keyless records (Event Hubs round robin,
        Kinesis a random key): its replay then lands where the first copy did, in the same order, and a reader
        recognises it (`weirflow.results.ReplayFilter`)."""
        keys = rows.column("__key").to_pylist()
        values = [value or b"" for value in rows.column("__value").to_pylist()]
        physical = sink["physical"]
        if sink.get("positions"):
            rows = self._indexed(index, rows)
            stage = sink["stage"]
            columns = [rows.column(c).to_pylist() for c in (PSS, POS, K)]
            ids = [row_id(stage, a, b, c) for a, b, c in zip(*columns, strict=True)]
            places: list[int | None] = [None] * len(keys)
            if any(k is None for k in keys):
                count = _partition_count(self.snapshot, sink["system"], physical)
                places = [
                    input_partition(a) % count if k is None else None
                    for k, a in zip(keys, columns[0], strict=True)
                ]
            return [
                OutgoingRecord(physical, v, key=k, partition=place, id=i)
                for k, v, i, place in zip(keys, values, ids, places, strict=True)
            ]
        task = self._task_results(sink)
        if task is None:
            return [OutgoingRecord(physical, v, key=k) for k, v in zip(keys, values, strict=True)]
        digests = [result_digest(k, v) for k, v in zip(keys, values, strict=True)]
        keep = self._take_replays(sink, digests, replays, replayed)
        return [
            OutgoingRecord(physical, value, key=key, id=self._result_id(task, digest))
            for key, value, digest, new in zip(keys, values, digests, keep, strict=True)
            if new
        ]

    def _table_rows(
        self,
        index: int,
        sink: dict[str, Any],
        rows: pa.RecordBatch,
        systems: Any,
        replays: Replays | None,
        replayed: dict[str, int],
    ) -> pa.Table:
        """The rows of output ``index``, a table, with their own column names and the table's id column: a
        row-wise stage's rows keep their positions for the commit's marks (`weirflow.spark.table_commits`); a
        stateful task's results leave out what an earlier attempt committed, and each gets an id of its own."""
        id_column = systems.table_writer(sink["system"]).id_column
        columns, names = (list(c) for c in zip(*sink["rows"], strict=True))
        own = pa.Table.from_batches([pa.RecordBatch.from_arrays([rows.column(c) for c in columns], names=names)])
        if sink.get("positions"):
            rows = self._indexed(index, rows)
            stage = sink["stage"]
            places = [rows.column(c).to_pylist() for c in (PSS, POS, K)]
            ids = pa.array([row_id(stage, a, b, c) for a, b, c in zip(*places, strict=True)], pa.string())
            own = own.append_column(id_column, ids)
            for name in (PSS, POS):
                own = own.append_column(name, rows.column(name))
            return own
        task = self._task_results(sink)
        if task is None:
            return own.append_column(id_column, pa.nulls(own.num_rows, pa.string()))
        digests = row_digests(own)
        keep = self._take_replays(sink, digests, replays, replayed)
        if not all(keep):
            own = own.filter(pa.array(keep))
        ids = [self._result_id(task, d) for d, new in zip(digests, keep, strict=True) if new]
        return own.append_column(id_column, pa.array(ids, pa.string()))

    def _result_id(self, task: str, digest: str) -> str:
        """A new result's id: where this writer writes it (unique, however equal the result is to another)."""
        batch, partition, try_number = self._task
        origin = result_origin(self.attempt, batch, partition, try_number, self._written)
        self._written += 1
        return result_id(task, origin, digest)

    def _indexed(self, index: int, rows: pa.RecordBatch) -> pa.RecordBatch:
        """``rows`` of output ``index`` with ``__k``, each row's index among the outputs of its input row
        (`weirflow.spark.replay`), counted on from the previous batch's last row."""
        pss_values = rows.column(PSS).to_numpy(zero_copy_only=False)
        pos = rows.column(POS).to_numpy(zero_copy_only=False)
        k = output_index(pss_values, pos, self._carry.get(index))
        if len(k):
            self._carry[index] = (int(pss_values[-1]), int(pos[-1]), int(k[-1]))
        return rows.append_column(K, pa.array(k, pa.int32()))

    def _fence_check(self) -> None:
        self.fence.check(self.snapshot)

    def _send(self, producer: Any, records: list[OutgoingRecord]) -> None:
        """Send, fenced; records the system can never take (too large) go to their stream's ``<physical>.dlq``
        with the reason and the rest are sent again (the producer sent nothing when it refused)."""
        try:
            producer.send_fenced(records, self._fence_check)
            return
        except RecordTooLargeError as exc:
            refused = {id(r) for r in exc.records}
            letters = [
                OutgoingRecord(
                    stream=dead_letter_stream(record.stream),
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
                    id=record.id,  # the record's own id: a replay's dead letter is recognised as its record is
                )
                for record, reason in zip(exc.records, exc.reasons, strict=True)
            ]
            log.warning(
                "%d output record(s) too large: sent to dead-letter streams (%s)", len(letters), exc.reasons[0]
            )
            producer.send_fenced(letters, self._fence_check)
            rest = [r for r in records if id(r) not in refused]
            if rest:
                producer.send_fenced(rest, self._fence_check)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Every partition's records were durable when its `write` returned; what is left is the served
        tables' rows of the batch, recorded here on the driver's machine before Spark commits the batch, and a
        stateful task's `ResultsLedger` of the batch (its tails and the replays still to come).

        The batch's counts go to ``<counts_dir>/<batchId>.json`` for the runner (`TaskProgress._count_written`):
        ``{"counts": {stream: rows}, "by_task": {task: {stream: rows}}, "replayed": n, "tables": {stream: [rows
        committed, ms]}}``, e.g. ``{"counts": {"out": 7}, "by_task": {"s-0": {"out": 4}, "s-1": {"out": 3}},
        "replayed": 0, "tables": {}}``."""
        workergc.before_task()
        total = WrittenCount.total(messages)
        tables, counts, replayed, by_task = total.served, total.counts, total.replayed, total.by_task
        committed = self._commit_tables(total.tables)  # before the tails: a table's tail is its version after
        if self.shared is not None:
            self.shared.commit(self.snapshot, replayed, batchId, self.attempt, self._tails(counts, batchId))
            self._counts(counts, by_task, replayed, committed, batchId)
            for task in self.tasks:
                if any(by_task.get(task, {}).get(s["stream"]) for s in self.sinks if s.get("results")):
                    fault_points.reached("before-spark-commit", task)
            return
        left = Replays()
        if self.replays_file:  # used up, and one batch older: the next batch's writers read what is left, and
            # once none is left nobody reads the file again
            left = Replays.load(Path(self.replays_file))
            left.used(replayed)
            spark_dir = Path(self.results_dir).parent if self.results_dir else None
            left = left.aged(lambda until: read_past(systems_for(self.snapshot), spark_dir, batchId, until))
            left.save(Path(self.replays_file))
        tails = self._tails(counts, batchId)
        if tails and self.results_dir is not None:
            ResultsLedger(tails, left, self.attempt).save(Path(self.results_dir), batchId)
        self._counts(counts, by_task, replayed, committed, batchId)
        if any(counts.get(s["stream"]) for s in self._result_sinks()):
            fault_points.reached("before-spark-commit", self.tasks[0])
        if not tables or self.served_dir is None:
            return
        self._fence_check()
        for table, rows in tables.items():
            write_batch(Path(self.served_dir), table, batchId, rows)

    def _counts(
        self,
        counts: dict[str, int],
        by_task: dict[str, dict[str, int]],
        replayed: dict[str, int],
        committed: dict[str, list[float]],
        batch: int,
    ) -> None:
        """The batch's counts for the runner (see `commit`)."""
        if not (counts or replayed) or self.counts_dir is None:
            return
        directory = Path(self.counts_dir)
        directory.mkdir(parents=True, exist_ok=True)
        summary = {"counts": counts, "by_task": by_task, "replayed": sum(replayed.values()), "tables": committed}
        (directory / f".{batch}.tmp").write_text(json.dumps(summary))
        (directory / f".{batch}.tmp").replace(directory / f"{batch}.json")

    def _commit_tables(self, shipped: dict[str, list[bytes]]) -> dict[str, list[float]]:
        """Each table output's rows of the batch in one commit, through the fence (`table_commits`); returns per
        table output the rows committed and the commit's milliseconds."""
        committed: dict[str, list[float]] = {}
        if not shipped:
            return committed
        systems = systems_for(self.snapshot)
        for sink in self.sinks:
            rows = unship(shipped.get(sink["stream"], [])) if sink.get("table") else None
            if rows is not None:
                began = time.perf_counter()
                writer = systems.table_writer(sink["system"])
                n = commit_rows(writer, sink["physical"], sink["stage"], rows, self._fence_check)
                committed[sink["stream"]] = [n, round((time.perf_counter() - began) * 1000, 1)]
        return committed

    def _result_sinks(self) -> list[dict[str, Any]]:
        """The outputs a stateful task writes its results to (intermediate and output streams)."""
        return [s for s in self.sinks if not s.get("serve") and self._task_results(s)]

    def _tails(self, written: dict[str, int], batch: int) -> dict[str, str]:
        """For a stateful task writing results, each partition's next offset of the streams it writes them to,
        as the batch commits: everything the task writes after this batch lies beyond
        (`weirflow.spark.result_replays`). A stream this batch wrote nothing to keeps the tails this query
        attempt noted at its previous batch, without asking its system."""
        sinks = [s for s in self.sinks if s.get("results") and not s.get("serve")]
        if not sinks or (self.shared is None and not self._result_sinks()):
            return {}
        ledgers = self.shared.ledgers(self.tasks[0]) if self.shared is not None else self.results_dir
        previous = ResultsLedger.load(Path(ledgers), batch - 1) if ledgers else None
        ours = previous.tails if previous is not None and previous.attempt == self.attempt else {}
        streams = [(s["system"], s["physical"], bool(written.get(s["stream"]))) for s in sinks]
        return batch_tails(systems_for(self.snapshot), streams, ours)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: the batch will be replayed; consumers see duplicates, never gaps."""
