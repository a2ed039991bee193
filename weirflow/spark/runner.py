"""`SparkTaskRunner`: a pipeline's tasks as Spark streaming queries, checkpointed by the processor from progress.

**Queries.** A task of a *stateful* stage (aggregations, joins, deduplication: its Spark checkpoint holds
operator state) runs as a query of its own with its own Spark checkpoint directory, so it can move between
processors. The tasks a processor holds of a *stateless* stage (`StageBuilder.stateless`) run as **one**
query over all their partitions (`task.stateless.merge`, on by default): the fixed costs of a micro-batch
(planning, offset and commit logs, the source's Python planner process, task launches) are paid once per
stage instead of once per task. Such a query keeps nothing in its Spark checkpoint that the checkpoint store
lacks, so it always starts from the store with a fresh Spark checkpoint, and it is restarted (its tasks'
final checkpoints written first) whenever the set of tasks it runs changes. Per task it keeps what a query of
its own would: its lock and fence, its control state, its checkpoint, its output watermark.

Queries start and stop on the runner's own threads, several at a time: `start_task` only registers the task,
so the processor's follower never waits for Spark and always reacts to a new job model within one poll.

**Progress.** The source's driver-side methods run in another process and Spark never calls
``commit(end)`` for a query's last batch, so the processor writes each task's checkpoint itself, from the end
offsets of every batch Spark reports as done (`weirflow.spark.progress`), in this process, where the task's
lock is held: every write goes through the fence. On each report, per task of the query:

1. the batch's control rows (collected by ``observe``) update the task's `TaskControl`; the reconciled
   watermark of each intermediate input, when it advanced, is stored as ``injected`` so the source feeds it
   into Spark on its next batch;
2. when every input has ended, ``injected`` becomes +infinity; once Spark's watermark got there (at once for
   a stateless stage) the task sends end-of-stream downstream, checkpoints ``finished`` and stops; when an
   input ended by a **drain** (docs/drain.md) the task sends drain instead and checkpoints ``drained`` with
   the deployment's run id;
3. the checkpoint (end offsets + control state) is written through the fence;
4. a watermark message goes to every partition of each intermediate output when the task's watermark moved.
"""

from __future__ import annotations

import json
import logging
import queue
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weirflow import clock
from weirflow.control import (
    FLUSHED_WATERMARK_MS,
    MAX_TIMESTAMP_MS,
    ControlMessage,
    MalformedMessageError,
    MessageType,
    TaskControl,
    decode,
    is_control,
)
from weirflow.drain_notice import run_id_of
from weirflow.errors import FencedOffError, LockLostError
from weirflow.fencing import FencedCheckpointWriter
from weirflow.interfaces.checkpoint import Checkpoint
from weirflow.interfaces.coordination import Lock
from weirflow.interfaces.spark_state import SparkStateStore
from weirflow.interfaces.system import OutgoingRecord, SystemStreamPartition
from weirflow.job_model import TaskModel
from weirflow.pipeline.plan import PipelinePlan, Stage
from weirflow.served_tables import TableReader
from weirflow.spark import fence
from weirflow.spark.progress import ProgressFeed, ProgressView, parse_spark_time
from weirflow.spark.query import QueryScope, StageBuilder, observation_name
from weirflow.start_position import start_offset
from weirflow.tasks.runner import TaskRunner

log = logging.getLogger("weirflow.spark")

_CONTROL_TYPES = {"watermark": MessageType.WATERMARK, "eos": MessageType.END_OF_STREAM, "drain": MessageType.DRAIN}
# Per SSP of one task after a batch: its next offset, and the system's native position of its last record.
_Offsets = dict[SystemStreamPartition, str]
_Positions = dict[SystemStreamPartition, dict[str, str]]
_MONITOR_S = 0.1
_ALIVE_CHECK_S = 2.0  # how often a query's liveness is asked of Spark beyond its termination event
_SETTLE_S = 0.05  # starts wait this long after the last change, so a rebalance restarts a stage's query once
_START_THREADS = 4
_MONITOR_GIVE_UP_S = 3.0  # a query whose health check fails this long fails its tasks
_STATELESS_DIR = "_stateless"
_COUNTS_DIR = "_written"  # per query: records written per output and batch, from the sink (records out)


def _last_committed(location: Path) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """(metadata, source offsets) of the last batch in Spark's commit log at ``location``; None if none.

    Reads Spark's offset-log files (``offsets/<batch>``: a version line, a metadata line, one JSON line per
    source); only the weirflow sources' own offsets are used.
    """
    log_dir = location / "commits"
    commits = [int(p.name) for p in log_dir.glob("[0-9]*")] if log_dir.exists() else []
    if not commits:
        return None
    batch = max(commits)
    lines = (location / "offsets" / str(batch)).read_text().splitlines()
    metadata = json.loads(lines[1])
    metadata["batchId"] = batch
    sources = [json.loads(line) for line in lines[2:] if line.strip().startswith("{")]
    return metadata, [s for s in sources if isinstance(s, dict) and "p" in s]


@dataclass
class TaskStats:
    """What a task did here, for ``GET /metrics`` and the status page (docs/endpoints.md)."""

    batches: int = 0
    records_in: int = 0  # records read from its input partitions (a packed intermediate record counts once)
    last_batch_ms: int = 0  # duration of its query's last micro-batch
    last_checkpoint_ms: int = 0  # wall-clock time of its last checkpoint write

    def to_json(self) -> dict[str, int]:
        return {
            "batches": self.batches,
            "records_in": self.records_in,
            "last_batch_ms": self.last_batch_ms,
            "last_checkpoint_ms": self.last_checkpoint_ms,
        }


def _records_between(before: _Offsets, after: _Offsets) -> int:
    """Records read between two checkpoints' offsets (systems whose offsets count records; 0 otherwise)."""
    total = 0
    for ssp, end in after.items():
        try:
            total += max(0, int(end) - int(before.get(ssp, end)))
        except ValueError:
            continue
    return total


class TaskState:
    """One task this processor runs: its lock and fence, control state, last offsets and progress."""

    def __init__(
        self, runner: SparkTaskRunner, task: TaskModel, lock: Lock, checkpoint: Checkpoint | None
    ) -> None:
        self.task = task
        self.lock = lock
        self.stage = runner.plan.stage(task.stage)
        self.writer = FencedCheckpointWriter(task.name, runner.checkpoints, lock)
        self.control = TaskControl.from_json(checkpoint.control if checkpoint else None)
        self.offsets: dict[SystemStreamPartition, str] = dict(checkpoint.offsets) if checkpoint else {}
        self.keys = {ssp.key() for ssp in task.ssps}
        self.seen: dict[str, int] = {}  # SSP key -> latest event time read (ms): stateless output watermark
        self.done = False  # finished: its inputs ended and end-of-stream went downstream
        self.error: str | None = None
        self.stats = TaskStats()
        self.read_to: dict[SystemStreamPartition, str] = {}  # where its query's last batch ended (records in)

    @property
    def name(self) -> str:
        return self.task.name


class StageQuery:
    """One Spark streaming query and the tasks it runs: a stateful stage's task alone (``merged`` False), or
    every task of a stateless stage this processor holds."""

    def __init__(self, runner: SparkTaskRunner, stage: Stage, tasks: list[TaskState], merged: bool) -> None:
        self.runner = runner
        self.stage = stage
        self.tasks = tasks
        self.merged = merged
        self.by_ssp = {key: t for t in tasks for key in t.keys}
        self.guard = threading.RLock()
        self.query: Any = None
        self.id = ""
        self.inputs: list[str] = []
        self.last_batch = -1
        self.stopped = False
        self.terminated: str | None = None  # set when Spark reports the query ended ("" without an error)
        self.location: Path | None = None
        self.counts_dir: Path | None = None
        self.records_out: dict[str, int] = {}  # output stream -> records written by this query
        self._alive_checked = time.monotonic()

    @property
    def name(self) -> str:
        return f"{self.stage.name}[{len(self.tasks)} tasks]" if self.merged else self.tasks[0].name

    # --- start ------------------------------------------------------------------------------------------
    def start(self) -> None:
        runner = self.runner
        starts = {
            ssp.key(): {"o": self._start_offset(t, ssp), "e": self._ended(t, ssp)}
            for t in self.tasks
            for ssp in t.task.ssps
        }
        scope = QueryScope(
            ssps=tuple(ssp for t in self.tasks for ssp in t.task.ssps),
            task_of={key: t.name for key, t in self.by_ssp.items()},
            inject="" if self.merged else self.tasks[0].name,
        )
        for t in self.tasks:
            t.read_to = {ssp: str(starts[ssp.key()]["o"]) for ssp in t.task.ssps}
        self.inputs, frames = runner.builder.build(self.stage, scope, starts)
        sink, sinks = runner.builder.sink_frame(self.stage, frames)
        if self.merged:
            location = runner.checkpoint_root / _STATELESS_DIR / f"{self.stage.name}-{uuid.uuid4().hex[:12]}"
            fresh = True
        else:
            location = runner.spark_checkpoint_dir(self.tasks[0].name)
            if runner.state_store is not None:  # another machine ran it further: its copy of the state
                runner.state_store.restore(self.tasks[0].name, location)
            fresh = not (location / "offsets").exists() or self._stale(self.tasks[0], location)
            if fresh and location.exists():
                shutil.rmtree(location)
            if not fresh:
                self._catch_up(self.tasks[0], location)
                if self.tasks[0].done:
                    return
        self.location = location
        self.counts_dir = runner.checkpoint_root / _COUNTS_DIR / uuid.uuid4().hex[:12]
        self.query = (
            sink.writeStream.format("weirflow-sink")
            .option("config", runner.builder.snapshot)
            .option("sinks", json.dumps(sinks))
            .option("fence", fence.encode([fence.LockRef.of(t.lock) for t in self.tasks]))
            .option("served_dir", str(location) if self.stage.serves else "")
            .option("counts_dir", str(self.counts_dir))
            .option("checkpointLocation", str(location))
            .outputMode(runner.output_mode)
            .trigger(processingTime=f"{runner.trigger_ms} milliseconds")
            .queryName(f"{runner.job}-{self.name}")
            .start()
        )
        self.id = str(self.query.id)
        log.info(
            "%s: query %s started (%s Spark checkpoint) at %s",
            ", ".join(t.name for t in self.tasks) if self.merged else self.name,
            self.id,
            "new" if fresh else "existing",
            {k: v["o"] for k, v in starts.items()},
        )

    def _stale(self, t: TaskState, location: Path) -> bool:
        """Whether the task's Spark checkpoint is *behind* the checkpoint store (another processor ran the task
        further meanwhile, from a Spark checkpoint of its own): the store wins, since resuming from Spark's
        position would read again what was already processed and then move the store's offsets backwards.
        Spark's checkpoint *ahead* of the store is normal (a processor killed between Spark's commit and its
        own checkpoint) and is caught up with instead (`_catch_up`).

        A Spark checkpoint with no committed batch (its query stopped or died during its first batch) is
        discarded too: it holds no operator state (state is committed with a batch) and Spark refuses to run
        batch 0 again over its leftovers (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``, Spark 4.x), which
        failed the task on every retry."""
        committed = _last_committed(location)
        if committed is None:
            log.info("task %s: Spark checkpoint %s has no committed batch; starting a new one", t.name, location)
            return True
        spark_at: dict[str, str] = {}
        for source in committed[1] if committed else []:
            for key, end in source["p"].items():
                spark_at[key] = str(end["o"])
        behind = [
            ssp.key() for ssp, offset in t.offsets.items() if self._ahead(ssp, offset, spark_at.get(ssp.key()))
        ]
        if behind:
            log.warning(
                "task %s: its Spark checkpoint %s is behind the checkpoint store for %s (store %s, Spark %s); "
                "discarding it and starting from the store's offsets (operator state in it is lost)",
                t.name,
                location,
                ", ".join(behind[:4]),
                {k: str(t.offsets[SystemStreamPartition.parse(k)]) for k in behind[:4]},
                {k: spark_at.get(k) for k in behind[:4]},
            )
        return bool(behind)

    def _ahead(self, ssp: SystemStreamPartition, offset: str, spark: str | None) -> bool:
        """Whether the checkpoint store's ``offset`` is past Spark's (or Spark has none); offsets are compared by
        their system (`SystemAdmin.compare_offsets`), and incomparable ones count as ahead (the store wins)."""
        if spark is None:
            return True
        order = self.runner.plan.systems.admin(ssp.system).compare_offsets(offset, spark)
        return order is None or order > 0

    def _start_offset(self, t: TaskState, ssp: SystemStreamPartition) -> str:
        if ssp in t.offsets:
            return t.offsets[ssp]
        stream_id = self.runner.stream_id_of(ssp)
        admin = self.runner.plan.systems.admin(ssp.system)
        if self.runner.plan.is_intermediate(stream_id):
            return admin.partition_metadata_of(ssp.stream, [ssp.partition])[ssp.partition].oldest
        return start_offset(self.runner.plan.config, stream_id, admin, ssp)

    def _ended(self, t: TaskState, ssp: SystemStreamPartition) -> bool:
        stream_id = self.runner.stream_id_of(ssp)
        part = t.control.streams.get(stream_id, None)
        return bool(part and part.ended([ssp.key()])) and not self.runner.plan.is_intermediate(stream_id)

    # --- progress ---------------------------------------------------------------------------------------
    def on_progress(self, report: ProgressView) -> None:
        with self.guard:
            if self.stopped or report.batchId <= self.last_batch:
                return
            self.last_batch = report.batchId
            self._apply(report)

    def poll_progress(self) -> None:
        """Apply every batch Spark completed that no progress event brought yet (``recentProgress`` keeps
        the last 100), in order; used when the query stops, whose last event may still be on its way."""
        if self.query is None:
            return
        with self.guard:
            try:
                reports = [ProgressView(p) for p in self.query.recentProgress]
            except Exception as exc:
                log.warning("%s: could not read its last progress: %s", self.name, exc)
                return
            for report in sorted(reports, key=lambda r: r.batchId):
                self.on_progress(report)

    def _apply(self, report: ProgressView) -> None:
        """One finished micro-batch: its end offsets and control rows become each task's checkpoint."""
        self._count_written(report.batchId)
        offsets, positions = self._batch_ends(report)
        dead = self._apply_control_rows(report)
        spark_watermark = parse_spark_time(report.eventTime.get("watermark")) or 0
        injected_all = all(s.watermark() >= MAX_TIMESTAMP_MS for s in report.sources)
        for t in self.tasks:
            if t.done or t.error:
                continue
            if dead.get(t.name):
                t.control.dead_letters += dead[t.name]
                log.warning("task %s: %d undecodable records sent to its dead-letter stream", t.name, dead[t.name])
            self._reconcile(t)
            if self.merged:
                finishing = self._all_inputs_ended(t)
                out = self._stateless_watermark(t)
            else:
                finishing = (
                    self._all_inputs_ended(t)
                    and injected_all
                    and (not report.stateOperators or spark_watermark >= FLUSHED_WATERMARK_MS)
                )
                out = self._output_watermark(t, report, spark_watermark)
            if not self._checkpoint(t, report, finishing, out, offsets[t.name], positions[t.name]):
                continue
            t.stats.batches += 1
            t.stats.records_in += _records_between(t.read_to, offsets[t.name])
            t.read_to.update(offsets[t.name])
            t.stats.last_batch_ms = report.duration_ms
            t.stats.last_checkpoint_ms = clock.now_ms()
            if finishing:
                t.done = True
                if t.control.drained:
                    log.info("task %s drained: inputs cut or drained, windows flushed, drain sent", t.name)
                else:
                    log.info("task %s finished: inputs ended, windows flushed, end-of-stream sent", t.name)
                self.runner.wake()

    def _count_written(self, batch: int) -> None:
        """Add the sink's counts of ``batch`` (written by its ``commit``) to ``records_out``."""
        if self.counts_dir is None:
            return
        path = self.counts_dir / f"{batch}.json"
        try:
            counts = json.loads(path.read_text())
            path.unlink()
        except (FileNotFoundError, ValueError):
            return
        for stream, n in counts.items():
            self.records_out[stream] = self.records_out.get(stream, 0) + int(n)

    def _batch_ends(self, report: ProgressView) -> tuple[dict[str, _Offsets], dict[str, _Positions]]:
        """Per task, the next offset of each of its SSPs after the batch, and the systems' native positions."""
        offsets: dict[str, _Offsets] = {t.name: {} for t in self.tasks}
        positions: dict[str, _Positions] = {t.name: {} for t in self.tasks}
        for source in report.sources:
            if not source.end or "p" not in source.end:
                continue
            for key, position in source.end["p"].items():
                owner = self.by_ssp.get(key)
                if owner is None:
                    continue
                ssp = SystemStreamPartition.parse(key)
                offsets[owner.name][ssp] = position["o"]
                if position.get("x"):
                    positions[owner.name][ssp] = position["x"]
        return offsets, positions

    def _apply_control_rows(self, report: ProgressView) -> dict[str, int]:
        """The batch's observed control rows applied to their tasks; returns dead letters per task."""
        dead: dict[str, int] = {}
        for index, stream_id in enumerate(self.inputs):
            row = report.observedMetrics.get(observation_name(index))
            for ctl in (row or {}).get("control") or []:
                owner = self.by_ssp.get(str(ctl["ssp"]))
                if owner is None:  # inject rows name no partition
                    continue
                if ctl["kind"] == "dlq":
                    dead[owner.name] = dead.get(owner.name, 0) + int(ctl["task_count"] or 0)
                elif ctl["kind"] == "seen":
                    owner.seen[ctl["ssp"]] = max(owner.seen.get(ctl["ssp"], 0), int(ctl["ctl_ms"]))
                elif ctl["kind"] in _CONTROL_TYPES:
                    message = ControlMessage(
                        type=_CONTROL_TYPES[ctl["kind"]],
                        task_name=str(ctl["producer"]),
                        task_count=int(ctl["task_count"] or 1),
                        timestamp=int(ctl["ctl_ms"] or 0),
                    )
                    owner.control.stream(stream_id).apply(str(ctl["ssp"]), message)
        return dead

    def _checkpoint(
        self,
        t: TaskState,
        report: ProgressView,
        finishing: bool,
        out: int | None,
        offsets: _Offsets,
        positions: _Positions,
    ) -> bool:
        """Send the task's control messages, then write its checkpoint; False (task failed) when that fails."""
        valid = self.runner.lease_valid
        if valid is not None and not valid(t.name):  # paused past the lease: nothing more for this task
            t.error = "its lock was not confirmed in time (the processor was paused or cut off)"
            log.error("task %s: %s; writing nothing more", t.name, t.error)
            self.runner.wake()
            return False
        try:
            if finishing:
                self._finish(t)
            elif out is not None and out > t.control.sent_watermark:
                self._send_control(t, MessageType.WATERMARK, out)
                t.control.sent_watermark = out
            self._mirror_state(t, report.batchId)
            t.offsets.update(offsets)
            t.writer.write(Checkpoint(offsets=offsets, control=t.control.to_json(), positions=positions))
            # one line per committed batch and task: who wrote for the task when (benchmarks/chaos.py reads it)
            log.info(
                "wrote task=%s batch=%d epoch=%d processor=%s start_ms=%d end_ms=%d",
                t.name,
                report.batchId,
                t.writer.epoch,
                t.lock.owner,
                report.started_ms or 0,
                clock.now_ms(),
            )
            return True
        except (LockLostError, FencedOffError) as exc:
            t.error = str(exc)
            log.error("task %s: %s", t.name, exc)
        except Exception as exc:
            t.error = f"{type(exc).__name__}: {exc}"
            log.exception("task %s: could not checkpoint batch %s", t.name, report.batchId)
        self.runner.wake()
        return False

    def _mirror_state(self, t: TaskState, batch: int) -> None:
        """Copy the task's Spark checkpoint directory as of ``batch`` to the state store, before the store's
        checkpoint names the batch's offsets: a copy at least as far on as the store, so that the next holder
        restores state matching the offsets it resumes from (a copy ahead of them is caught up with)."""
        store = self.runner.state_store
        if store is None or self.merged or self.location is None:
            return
        if not self.stage.serves and not (self.location / "state").exists():
            return  # no operator state: the checkpoint store's offsets are all the task needs elsewhere
        report = store.mirror(t.name, self.location, batch, t.writer.epoch)
        if report.uploaded or report.deleted:
            log.debug(
                "task %s: Spark state of batch %d mirrored: %d files (%d bytes) sent, %d deleted, %.3f s",
                t.name,
                batch,
                report.uploaded,
                report.uploaded_bytes,
                report.deleted,
                report.seconds,
            )

    def _ssps_of(self, t: TaskState, stream_id: str) -> list[str]:
        ref = self.runner.plan.ref(stream_id)
        return [s.key() for s in t.task.ssps if (s.system, s.stream) == (ref.system, ref.physical)]

    def _all_inputs_ended(self, t: TaskState) -> bool:
        return all(t.control.injected.get(s, -1) >= MAX_TIMESTAMP_MS for s in self.inputs if self._ssps_of(t, s))

    def _reconcile(self, t: TaskState) -> None:
        all_ended = True
        for stream_id in self.inputs:
            keys = self._ssps_of(t, stream_id)
            state = t.control.stream(stream_id)
            if not keys:
                continue
            if not state.ended(keys):
                all_ended = False
            if self.runner.plan.is_intermediate(stream_id):
                watermark = state.watermark(keys)
                if watermark is not None and watermark > t.control.injected.get(stream_id, -1):
                    t.control.injected[stream_id] = watermark
        if all_ended:
            for stream_id in self.inputs:
                t.control.injected[stream_id] = MAX_TIMESTAMP_MS

    def _output_watermark(self, t: TaskState, report: ProgressView, spark_watermark: int) -> int | None:
        """A task query's event-time watermark after this batch: Spark's watermark of the next batch, which
        is known now for a one-input stage (max event time seen minus the lateness)."""
        out = spark_watermark or None
        if len(self.inputs) == 1:
            seen = parse_spark_time(report.eventTime.get("max"))
            if seen is not None:
                delay = self.runner.builder.settings(self.inputs[0]).delay_ms
                out = max(out or 0, seen - delay)
        return out

    def _stateless_watermark(self, t: TaskState) -> int | None:
        """A task's watermark in a stateless stage's query (Spark's watermark there spans every task): per
        input, the latest event time the task read minus the lateness, or the reconciled watermark of an
        intermediate input; the minimum over its inputs (Spark's own rule); None until every input has one."""
        values = []
        for stream_id in self.inputs:
            keys = self._ssps_of(t, stream_id)
            if not keys:
                continue
            if self.runner.plan.is_intermediate(stream_id):
                value = t.control.injected.get(stream_id)
            else:
                seen = [t.seen[k] for k in keys if k in t.seen]
                value = max(seen) - self.runner.builder.settings(stream_id).delay_ms if seen else None
            if value is None:
                return None
            values.append(value)
        return min(values) if values else None

    def _finish(self, t: TaskState) -> None:
        """Send the task's last control message downstream and mark its control state (checkpointed next):
        drain and ``drained`` when one of its inputs ended by a drain, else end-of-stream and ``finished``."""
        if t.control.draining():
            self._send_control(t, MessageType.DRAIN, MAX_TIMESTAMP_MS)
            t.control.drained = self.runner.run_id
        else:
            self._send_control(t, MessageType.END_OF_STREAM, MAX_TIMESTAMP_MS)
            t.control.finished = True

    def _send_control(self, t: TaskState, kind: MessageType, timestamp: int) -> None:
        plan = self.runner.plan
        message = ControlMessage(
            type=kind,
            task_name=t.name,
            task_count=plan.task_count(self.stage),
            timestamp=timestamp,
            run_id=self.runner.run_id,
        ).encode()
        by_system: dict[str, list[OutgoingRecord]] = {}
        for sink in self.stage.sinks:
            if not sink.intermediate:
                continue
            ref = plan.ref(sink.stream_id)
            for partition in range(plan.partition_count(sink.stream_id)):
                by_system.setdefault(ref.system, []).append(
                    OutgoingRecord(stream=ref.physical, value=message, partition=partition)
                )
        for system, records in by_system.items():
            plan.systems.producer(system).send(records)

    def _catch_up(self, t: TaskState, location: Path) -> None:
        """Bring a task query's control state up to Spark's last committed batch before it restarts.

        Spark commits a batch before the processor hears of it, so a processor killed in between leaves
        Spark's checkpoint ahead of the checkpoint store; the control rows of those batches would be lost
        (Spark will not read them again). They are re-read here from the streams themselves.
        """
        committed = _last_committed(location)
        if committed is None:
            return
        metadata, sources = committed
        plan = self.runner.plan
        offsets = t.offsets
        for source in sources:
            stream_id = source.get("s")
            if stream_id not in self.inputs:
                continue
            state = t.control.stream(stream_id)
            for key, end in source["p"].items():
                ssp = SystemStreamPartition.parse(key)
                start = offsets.get(ssp)
                if (
                    plan.is_intermediate(stream_id)
                    and start is not None
                    and (plan.systems.admin(ssp.system).compare_offsets(start, end["o"]) or 0) < 0
                ):
                    consumer = plan.systems.consumer(ssp.system)
                    position = start
                    while records := consumer.read(ssp, position, 5000, end["o"]):
                        for record in records:
                            if is_control(record.value):
                                try:
                                    _, body = decode(record.value)
                                except MalformedMessageError:
                                    continue
                                assert isinstance(body, ControlMessage)
                                state.apply(key, body)
                        position = records[-1].next_offset
                elif end.get("e"):
                    kind = MessageType.DRAIN if end.get("d") else MessageType.END_OF_STREAM
                    state.apply(key, ControlMessage(kind, f"{stream_id}:{key}", 1, 0))
                offsets[ssp] = end["o"]
        self._reconcile(t)
        stateless = not (location / "state").exists()
        flushed = stateless or int(metadata.get("batchWatermarkMs", 0)) >= FLUSHED_WATERMARK_MS
        injected = all(int(s.get("w", -1)) >= MAX_TIMESTAMP_MS for s in sources)
        if self._all_inputs_ended(t) and injected and flushed:
            self._finish(t)
            t.done = True
        t.writer.write(Checkpoint(offsets=dict(offsets), control=t.control.to_json()))
        log.info(
            "task %s: control state caught up with Spark's batch %s%s",
            t.name,
            metadata.get("batchId", "?"),
            " (already finished)" if t.done else "",
        )

    # --- stop -------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop the query, then checkpoint its tasks' last completed batches (their events may not have
        arrived yet). A stateless stage's Spark checkpoint is removed: it is never used again."""
        if self.query is not None:
            try:
                self.query.stop()
            except Exception as exc:
                log.warning("%s: stopping its query raised %s", self.name, exc)
            self.poll_progress()
        with self.guard:
            self.stopped = True
        if self.merged and self.location is not None:
            shutil.rmtree(self.location, ignore_errors=True)
        if self.counts_dir is not None:
            shutil.rmtree(self.counts_dir, ignore_errors=True)

    def failure(self) -> str | None:
        """Why the query died, or None while it runs (or after it was stopped on purpose)."""
        if self.query is None or self.stopped:
            return None
        if self.terminated is None and time.monotonic() - self._alive_checked >= _ALIVE_CHECK_S:
            self._alive_checked = time.monotonic()
            if not self.query.isActive:
                exc = self.query.exception()
                self.terminated = str(exc) if exc else ""
        if self.terminated is None:
            return None
        if not self.terminated:  # the termination event carried no error: ask the query itself once
            try:
                exc = self.query.exception()
            except Exception:  # a Py4J failure here must not hide the termination
                exc = None
            self.terminated = str(exc) if exc else "stopped without an error from Spark"
        return f"query stopped: {self.terminated}"


class SparkTaskRunner(TaskRunner):
    """Runs tasks of a pipeline as queries on this processor's SparkSession (see the module docstring)."""

    def __init__(
        self,
        spark: Any,
        plan: PipelinePlan,
        checkpoints: Any,
        builder: StageBuilder,
        prepare: Callable[[], None] | None = None,
        state_store: SparkStateStore | None = None,
    ) -> None:
        """``prepare`` (registering the data sources, analysing stages) runs in the background at once; no
        query starts before it has finished, and if it fails every task fails with its error.
        ``state_store`` keeps copies of stateful tasks' Spark checkpoint directories for other machines
        (`weirflow.interfaces.spark_state`); None keeps them on local disk only."""
        config = plan.config
        self.spark = spark
        self.state_store = state_store
        self.plan = plan
        self.checkpoints = checkpoints
        self.builder = builder
        self.job = f"{config.get('job.name')}-{config.get('job.id')}"
        self.run_id = run_id_of(config)
        self.trigger_ms = int(config.get("task.trigger.interval.ms"))
        self.output_mode = str(config.get("task.output.mode"))
        self.merge_stateless = bool(config.get("task.stateless.merge"))
        self.checkpoint_root = (
            config.path("task.spark.checkpoint.dir")
            if config.get("task.spark.checkpoint.dir")
            else config.state_dir() / "spark" / self.job
        )
        self._guard = threading.RLock()
        self._tasks: dict[str, TaskState] = {}  # accepted and not stopped, finished or failed
        self._pending: set[str] = set()  # accepted, waiting for a query
        self._changed = 0.0  # monotonic time of the last change to _pending
        self._query_of: dict[str, StageQuery] = {}
        self._by_id: dict[str, StageQuery] = {}
        self._merged: dict[str, StageQuery] = {}  # stateless stage -> its query
        self._readers: dict[tuple[str, str], TableReader] = {}  # served tables of tasks running here
        self._busy: dict[str, Future[None]] = {}  # start unit -> its start in progress
        self._failed: dict[str, str] = {}
        self._finished: set[str] = set()
        self._closing = threading.Event()
        self._wake = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=_START_THREADS, thread_name_prefix="query-start")
        # Query starts run one at a time: two `DataStreamWriter.start` calls at once on one session corrupted a
        # task's serialized closure in Spark 4.3 (OptionalDataException when an executor read it back). Stops,
        # and the restarts of stateless stages they lead to, still overlap with them.
        self._starting = threading.Lock()
        self._feed = ProgressFeed()
        self._feed.register(spark)
        self._ready = threading.Event()
        self._prepare_error: str | None = None
        self._threads = [
            threading.Thread(target=self._prepare, args=(prepare,), name="spark-prepare", daemon=True),
            threading.Thread(target=self._launch_loop, name="spark-launcher", daemon=True),
            threading.Thread(target=self._progress_loop, name="spark-progress", daemon=True),
            threading.Thread(target=self._monitor_loop, name="spark-monitor", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def spark_checkpoint_dir(self, task_name: str) -> Path:
        return self.checkpoint_root / task_name

    def stream_id_of(self, ssp: SystemStreamPartition) -> str:
        return self.plan.stream_id_of(ssp.system, ssp.stream)

    def wake(self) -> None:
        self._wake.set()

    def _prepare(self, prepare: Callable[[], None] | None) -> None:
        try:
            if prepare is not None:
                self._set_active_session()
                prepare()
        except Exception as exc:
            self._prepare_error = f"{type(exc).__name__}: {exc}"
            log.exception("could not prepare the Spark data plane")
        finally:
            self._ready.set()

    def _set_active_session(self) -> None:
        # Spark finds Python data sources through the calling thread's active session, which a new thread
        # (and the JVM thread Py4J pairs with it) does not have yet.
        self.spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(self.spark._jsparkSession)

    def _merges(self, stage: Stage) -> bool:
        if not self.merge_stateless:
            return False
        self._ready.wait()
        return self._prepare_error is None and not stage.serves and self.builder.stateless(stage)

    def _unit(self, t: TaskState) -> str:
        return f"stage:{t.stage.name}" if self._merges(t.stage) else f"task:{t.name}"

    # --- TaskRunner -------------------------------------------------------------------------------------
    def start_task(self, task: TaskModel, lock: Lock) -> None:
        """Register the task; the launcher starts its query (or restarts its stage's) in the background."""
        with self._guard:
            if task.name in self._tasks or task.name in self._finished:
                return
        checkpoint = self.checkpoints.read_last_checkpoint(task.name)
        control = TaskControl.from_json(checkpoint.control if checkpoint else None)
        if checkpoint and control.done_in(self.run_id):
            with self._guard:
                self._finished.add(task.name)
            how = "finished" if control.finished else f"drained in run {self.run_id}"
            log.info("task %s already %s", task.name, how)
            return
        upgrade = checkpoint is not None and bool(control.drained)
        if upgrade:
            assert checkpoint is not None
            checkpoint = Checkpoint(
                checkpoint.offsets, control.for_new_run().to_json(), checkpoint.positions, checkpoint.epoch
            )
        state = TaskState(self, task, lock, checkpoint)
        try:  # this holder's epoch in the store first: no former holder's write lands after it
            state.writer.claim(checkpoint)
            if upgrade:
                self._start_new_run(state, control.drained)
        except Exception as exc:
            with self._guard:
                self._failed[task.name] = f"could not claim its checkpoint: {type(exc).__name__}: {exc}"
            log.error("task %s: could not claim its checkpoint: %s", task.name, exc)
            return
        with self._guard:
            self._tasks[task.name] = state
            self._failed.pop(task.name, None)
            self._pending.add(task.name)
            self._changed = time.monotonic()
        self._wake.set()

    def _start_new_run(self, state: TaskState, drained_in: str) -> None:
        """The task drained in run ``drained_in`` and this is another deployment (docs/drain.md): its Spark
        checkpoint (the old code's state, which the new code may not read) is deleted and its control state is
        reset in the store, so it starts with a fresh Spark checkpoint at exactly its drained offsets."""
        shutil.rmtree(self.spark_checkpoint_dir(state.name), ignore_errors=True)
        if self.state_store is not None:
            self.state_store.discard(state.name)
        state.writer.write(Checkpoint(offsets=dict(state.offsets), control=state.control.to_json()))
        log.info(
            "task %s: drained in run %s; starting run %s from its drained offsets with a fresh Spark checkpoint",
            state.name,
            drained_in,
            self.run_id,
        )

    def stop_task(self, task_name: str) -> None:
        """Stop the task and write its final checkpoint before returning. A stateless stage's query is
        stopped with it and restarted for the stage's other tasks."""
        self.stop_tasks([task_name])

    def stop_tasks(self, task_names: Iterable[str]) -> None:
        """Stop the tasks, each with its final checkpoint, before returning. All of them are dropped first,
        so a start still queued for one of them finds it gone and starts nothing (a rebalance then waits
        only for the starts already under way); each query they ran is stopped once."""
        with self._guard:
            states = [s for s in (self._tasks.pop(n, None) for n in task_names) if s is not None]
            for state in states:
                self._pending.discard(state.name)
        for unit in dict.fromkeys(self._unit(state) for state in states):
            self._await_start(unit)
        with self._guard:
            found = [q for q in (self._query_of.pop(s.name, None) for s in states) if q is not None]
        queries = list({id(q): q for q in found}.values())
        if len(queries) > 1:  # each stop waits for Spark to end the query's stream thread: stop them together
            with ThreadPoolExecutor(max_workers=min(8, len(queries)), thread_name_prefix="query-stop") as pool:
                list(pool.map(lambda q: self._retire(q, keep=True), queries))
        else:
            for query in queries:
                self._retire(query, keep=True)

    def abandon_tasks(self, task_names: Iterable[str]) -> None:
        """The self-fence: the tasks write nothing more (their progress reports are ignored from now, so no
        checkpoint; the sink's own fence refuses their batches once the lock is gone) and their queries are
        stopped on a thread of their own, so this returns at once instead of waiting for Spark to end a batch.
        A stateless stage's other tasks restart without them."""
        with self._guard:
            states = [s for s in (self._tasks.pop(n, None) for n in task_names) if s is not None]
            for state in states:
                self._pending.discard(state.name)
                state.error = "abandoned: its lock was not confirmed in time"
            found = [q for q in (self._query_of.pop(s.name, None) for s in states) if q is not None]
        for query in {id(q): q for q in found}.values():
            log.warning("%s: abandoned (lock not confirmed in time); stopping its query", query.name)
            threading.Thread(target=self._retire, args=(query, True), name="query-abandon", daemon=True).start()

    def running(self) -> set[str]:
        with self._guard:
            return {n for n, t in self._tasks.items() if not t.done and t.error is None}

    def starting(self) -> set[str]:
        with self._guard:
            return {n for n in self._tasks if n not in self._query_of}

    def task_stats(self) -> dict[str, dict[str, Any]]:
        """Per task running here: `TaskStats`, its next offset per SSP and its dead letters so far."""
        with self._guard:
            tasks = [(t, self._query_of.get(t.name)) for t in self._tasks.values()]
        return {
            t.name: {
                **t.stats.to_json(),
                "dead_letters": t.control.dead_letters,
                "offsets": {ssp.key(): str(o) for ssp, o in t.offsets.items()},
                # written by the task's query: its own, or (a stateless stage's) the merged query's
                "records_out": dict(q.records_out) if q is not None else {},
                "query": q.name if q is not None else None,
            }
            for t, q in tasks
        }

    @property
    def table_routes(self) -> PipelinePlan:
        return self.plan  # the tables a pipeline serves (``Stream.serve``) and the task holding each key

    @property
    def intermediate_streams(self) -> list[str]:
        return list(self.plan.app.intermediates)

    def table(self, task_name: str, table: str) -> TableReader | None:
        """Called on the endpoint server's event loop for every lookup, so it takes no lock: the runner's guard
        can be held while a query starts or stops, and a lookup must not wait for that. Single dict reads
        are atomic; the reader cache is only touched from the event loop."""
        location: Path | None
        if task_name in self._finished:
            location = self.spark_checkpoint_dir(task_name)
        else:
            t, query = self._tasks.get(task_name), self._query_of.get(task_name)
            ok = t is not None and t.error is None and query is not None and not query.merged
            location = query.location if ok and query is not None else None
        if location is None:
            self._readers.pop((task_name, table), None)
            return None
        reader = self._readers.get((task_name, table))
        if reader is None or reader.location != location:
            reader = self._readers[(task_name, table)] = TableReader(location, table)
        return reader

    def failures(self) -> dict[str, str]:
        with self._guard:
            return dict(self._failed)

    def forget(self, task_name: str) -> None:
        with self._guard:
            self._failed.pop(task_name, None)

    def finished(self) -> set[str]:
        with self._guard:
            return set(self._finished)

    def close(self) -> None:
        self._closing.set()  # nothing starts from now on
        self._wake.set()
        with self._guard:
            names = list(self._tasks)
        self.stop_tasks(names)
        self._pool.shutdown(wait=True)
        if self.state_store is not None:
            self.state_store.close()
        try:
            self._feed.unregister(self.spark)
        except Exception as exc:
            log.debug("could not remove the progress feed: %s", exc)

    # --- starting and stopping queries --------------------------------------------------------------------
    def _await_start(self, unit: str) -> None:
        future = self._busy.get(unit)
        if future is not None:
            try:
                future.result()
            except Exception as exc:  # reported by _launch already
                log.debug("start of %s failed: %s", unit, exc)

    def _launch_loop(self) -> None:
        """Starts the queries of pending tasks, several at a time: one per stateful task, one per stateless
        stage (restarting the stage's running query with its new set of tasks). Changes settle for
        `_SETTLE_S` first, so a rebalance that moves several tasks restarts a stage's query once."""
        while not self._closing.is_set():
            self._wake.wait(_MONITOR_S)
            self._wake.clear()
            with self._guard:
                if not self._pending:
                    continue
                wait = _SETTLE_S - (time.monotonic() - self._changed)
            if wait > 0:
                time.sleep(wait)
            with self._guard:
                if self._closing.is_set():
                    return
                units: dict[str, list[TaskState]] = {}
                for name in sorted(self._pending):
                    state = self._tasks.get(name)
                    if state is None:
                        self._pending.discard(name)
                    else:
                        units.setdefault(self._unit(state), []).append(state)
                for unit, states in units.items():
                    busy = self._busy.get(unit)
                    if busy is not None and not busy.done():
                        continue  # its start is still running; next round
                    for state in states:
                        self._pending.discard(state.name)
                    self._busy[unit] = self._pool.submit(self._launch, states)

    def _launch(self, states: list[TaskState]) -> None:
        self._set_active_session()
        self._ready.wait()
        stage = states[0].stage
        merged = self._merges(stage)
        members = self._with_merged_members(stage.name, list(states)) if merged else list(states)
        query = None
        try:
            with self._starting:
                # checked again once it is this start's turn: tasks stopped meanwhile are not started
                with self._guard:
                    members = [t for t in members if self._tasks.get(t.name) is t]
                if not members:
                    return
                if self._prepare_error is not None:
                    raise RuntimeError(f"the Spark data plane could not be prepared: {self._prepare_error}")
                query = StageQuery(self, stage, members, merged)
                query.start()
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            log.exception("%s could not start", query.name if query is not None else stage.name)
            with self._guard:
                for t in members:
                    if self._tasks.pop(t.name, None) is not None:
                        self._failed[t.name] = error
            return
        gone = self._register(query, members)
        if gone:  # stopped while the query was starting: it must not run them
            self._retire(query, keep=True)
        elif gone is not None and self.on_started is not None:
            self.on_started()

    def _with_merged_members(self, stage_name: str, members: list[TaskState]) -> list[TaskState]:
        """A stateless stage's running query is stopped; its live tasks join the ones about to start."""
        with self._guard:
            current = self._merged.pop(stage_name, None)
        if current is None:
            return members
        self._retire(current, keep=False)
        with self._guard:
            return members + [
                t
                for t in current.tasks
                if t.name in self._tasks and not t.done and not t.error and t not in members
            ]

    def _register(self, query: StageQuery, members: list[TaskState]) -> list[TaskState] | None:
        """Record a started query; returns its members stopped meanwhile, or None when the query ended at
        once (every task of a stateful query already done)."""
        with self._guard:
            for t in members:
                if t.done and not query.merged:
                    self._tasks.pop(t.name, None)
                    self._finished.add(t.name)
            if query.query is None:
                return None
            self._by_id[query.id] = query
            if query.merged:
                self._merged[query.stage.name] = query
            for t in members:
                self._query_of[t.name] = query
            return [t for t in members if self._tasks.get(t.name) is not t]

    def _retire(self, query: StageQuery, keep: bool) -> None:
        """Stop ``query``. With ``keep``, its tasks still held here go back to pending (a stateless stage's
        query restarts for them); otherwise the caller takes care of them."""
        query.stop()
        with self._guard:
            self._by_id.pop(query.id, None)
            if self._merged.get(query.stage.name) is query:
                del self._merged[query.stage.name]
            for t in query.tasks:
                if self._query_of.get(t.name) is query:
                    del self._query_of[t.name]
                if keep and self._tasks.get(t.name) is t and not t.done and t.error is None:
                    self._pending.add(t.name)
                    self._changed = time.monotonic()
        if keep:
            self._wake.set()

    # --- progress and health ------------------------------------------------------------------------------
    def _progress_loop(self) -> None:
        while not self._closing.is_set():
            try:
                event = self._feed.events.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                if event[0] == "progress":
                    report = ProgressView(json.loads(event[1]))
                    with self._guard:
                        query = self._by_id.get(report.id)
                    if query is not None:
                        query.on_progress(report)
                elif event[0] == "terminated":
                    with self._guard:
                        query = self._by_id.get(event[1])
                    if query is not None and query.terminated is None:
                        query.terminated = event[2]
                        self._wake.set()
            except Exception:
                log.exception("could not apply a progress report")

    def _monitor_loop(self) -> None:
        """Stops the queries of finished tasks and turns dead queries and lost locks into task failures. An
        error never ends the loop; a query whose health check keeps failing (a Py4J error asking Spark about
        it, say) for `_MONITOR_GIVE_UP_S` fails its tasks with that error, so that they do not keep their
        locks while nobody can tell whether they run."""
        failing: dict[str, float] = {}  # query id -> monotonic time its checks began to fail
        while not self._closing.wait(_MONITOR_S):
            with self._guard:
                queries = list(self._by_id.values())
            for query in queries:
                try:
                    self._check(query)
                    failing.pop(query.id, None)
                except Exception as exc:
                    log.exception("%s: health check failed", query.name)
                    since = failing.setdefault(query.id, time.monotonic())
                    if time.monotonic() - since >= _MONITOR_GIVE_UP_S:
                        failing.pop(query.id, None)
                        self._give_up(query, f"its health check kept failing: {type(exc).__name__}: {exc}")

    def _give_up(self, query: StageQuery, error: str) -> None:
        """Fail every task of ``query`` still held here with ``error`` and stop the query."""
        with self._guard:
            for t in query.tasks:
                if self._tasks.get(t.name) is t:
                    del self._tasks[t.name]
                    self._failed[t.name] = error
                    log.error("task %s failed: %s", t.name, error)
        try:
            self._retire(query, keep=False)
        except Exception:
            log.exception("%s: could not stop the query", query.name)

    def _check(self, query: StageQuery) -> None:
        error = query.failure()
        broken = [t for t in query.tasks if t.error is not None]
        finished = [t for t in query.tasks if t.done]
        with self._guard:
            for t in finished:
                if self._tasks.get(t.name) is t:
                    del self._tasks[t.name]
                    self._finished.add(t.name)
        if error is None and not broken and len(finished) < len(query.tasks):
            return
        if error is None and not broken:  # every task finished
            self._retire(query, keep=False)
            return
        with self._guard:
            for t in query.tasks:
                if self._tasks.get(t.name) is not t:
                    continue
                if t.error is not None or (error is not None and not t.done):
                    del self._tasks[t.name]
                    self._failed[t.name] = t.error or str(error)
                    log.error("task %s failed: %s", t.name, self._failed[t.name])
        # A lost lock stops the whole query at once (the fence); the stage's other tasks restart without it.
        self._retire(query, keep=error is None)
