"""`SparkTaskRunner`: each task is one Spark streaming query; the processor checkpoints it from query progress.

Why progress events (DESIGN.md, "Data plane"): the source's driver-side methods run in another process and
Spark never calls ``commit(end)`` for a query's last batch, so the processor writes each task's checkpoint
itself, from the end offsets of every batch Spark reports as done (read from each query's progress by this
process, where the task's lock is held, so every write goes through the fence).

On each progress event of a task (`TaskQuery.on_progress`):

1. the batch's control rows (collected by ``observe``) update the task's `TaskControl`; the reconciled
   watermark of each intermediate input, when it advanced, is stored as ``injected`` so the source feeds it
   into Spark on its next batch;
2. when every input has ended, ``injected`` becomes +infinity; once Spark's watermark got there (or at once
   for a stateless stage) the task sends end-of-stream downstream, checkpoints ``finished`` and stops;
3. the checkpoint (end offsets + control state) is written through the fence;
4. a watermark message goes to every partition of each intermediate output when the task's watermark moved.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import shutil
import threading
from pathlib import Path
from typing import Any

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
from weirflow.errors import LockLostError
from weirflow.fencing import FencedCheckpointWriter
from weirflow.interfaces.checkpoint import Checkpoint
from weirflow.interfaces.coordination import Lock
from weirflow.interfaces.system import OutgoingRecord, SystemStreamPartition
from weirflow.job_model import TaskModel
from weirflow.pipeline.plan import PipelinePlan, Stage
from weirflow.spark.query import StageBuilder, observation_name
from weirflow.start_position import start_offset
from weirflow.tasks.runner import TaskRunner

log = logging.getLogger("weirflow.spark")

_CONTROL_TYPES = {"watermark": MessageType.WATERMARK, "eos": MessageType.END_OF_STREAM, "drain": MessageType.DRAIN}
_MONITOR_S = 0.1


def _source_watermark(source: Any) -> int:
    end = json.loads(source.endOffset) if source.endOffset else {}
    return int(end.get("w", -1)) if isinstance(end, dict) else -1


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


def parse_spark_time(text: str | None) -> int | None:
    """Milliseconds of a progress timestamp such as ``2026-01-01T00:00:00.000Z``; None when absent."""
    if not text:
        return None
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return MAX_TIMESTAMP_MS if text.startswith("+") or text[:4] > "9998" else None
    return int(parsed.timestamp() * 1000)


class TaskQuery:
    """One task's query and the bookkeeping between its progress events."""

    def __init__(self, runner: SparkTaskRunner, task: TaskModel, lock: Lock, stage: Stage) -> None:
        self.runner = runner
        self.task = task
        self.stage = stage
        self.lock = lock
        self.writer = FencedCheckpointWriter(task.name, runner.checkpoints, lock)
        self.guard = threading.RLock()
        self.query: Any = None
        self.inputs: list[str] = []
        self.control = TaskControl()
        self.last_batch = -1
        self.done = False  # finished: stop the query, never restart it
        self.stopped = False
        self.error: str | None = None

    # --- start ------------------------------------------------------------------------------------------
    def start(self, checkpoint: Checkpoint | None) -> None:
        """Start the query from ``checkpoint`` (the task's last one, already read by the runner)."""
        runner = self.runner
        self.control = TaskControl.from_json(checkpoint.control if checkpoint else None)
        stored = dict(checkpoint.offsets) if checkpoint else {}
        starts = {
            ssp.key(): {"o": self._start_offset(ssp, stored), "e": self._ended(ssp)} for ssp in self.task.ssps
        }
        self.inputs, frames = runner.builder.build(self.stage, self.task, starts)
        sink, sinks = runner.builder.sink_frame(self.stage, frames)
        location = runner.spark_checkpoint_dir(self.task.name)
        fresh = not (location / "offsets").exists()
        if fresh and location.exists():
            shutil.rmtree(location)
        if not fresh:
            self._catch_up(location, stored)
            if self.done:
                return
        self.query = (
            sink.writeStream.format("weirflow-sink")
            .option("config", runner.builder.snapshot)
            .option("sinks", json.dumps(sinks))
            .option("checkpointLocation", str(location))
            .outputMode(runner.output_mode)
            .trigger(processingTime=f"{runner.trigger_ms} milliseconds")
            .queryName(f"{runner.job}-{self.task.name}")
            .start()
        )
        log.info(
            "task %s: query %s started (%s Spark checkpoint) at %s",
            self.task.name,
            self.query.id,
            "new" if fresh else "existing",
            {k: v["o"] for k, v in starts.items()},
        )

    def _start_offset(self, ssp: SystemStreamPartition, stored: dict[SystemStreamPartition, str]) -> str:
        if ssp in stored:
            return stored[ssp]
        stream_id = self.runner.stream_id_of(ssp)
        admin = self.runner.plan.systems.admin(ssp.system)
        if self.runner.plan.is_intermediate(stream_id):
            return admin.partition_metadata(ssp.stream)[ssp.partition].oldest
        return start_offset(self.runner.plan.config, stream_id, admin, ssp)

    def _ended(self, ssp: SystemStreamPartition) -> bool:
        stream_id = self.runner.stream_id_of(ssp)
        part = self.control.streams.get(stream_id, None)
        return bool(part and part.ended([ssp.key()])) and not self.runner.plan.is_intermediate(stream_id)

    # --- progress ---------------------------------------------------------------------------------------
    def on_progress(self, progress: Any) -> None:
        with self.guard:
            if self.stopped or self.done or progress.batchId <= self.last_batch:
                return
            self.last_batch = progress.batchId
            try:
                self._apply(progress)
            except LockLostError as exc:
                self.error = str(exc)
                log.error("task %s: %s", self.task.name, exc)
            except Exception as exc:
                self.error = f"{type(exc).__name__}: {exc}"
                log.exception("task %s: could not checkpoint batch %s", self.task.name, progress.batchId)

    def _apply(self, progress: Any) -> None:
        offsets: dict[SystemStreamPartition, str] = {}
        positions: dict[SystemStreamPartition, dict[str, str]] = {}
        for source in progress.sources:
            end = json.loads(source.endOffset) if source.endOffset else None
            if not end or "p" not in end:
                continue
            for key, position in end["p"].items():
                ssp = SystemStreamPartition.parse(key)
                offsets[ssp] = position["o"]
                if position.get("x"):
                    positions[ssp] = position["x"]
        metrics = progress.observedMetrics or {}
        for index, stream_id in enumerate(self.inputs):
            row = metrics.get(observation_name(index))
            if row is None:
                continue
            dead = 0
            for ctl in row["control"] or []:
                if ctl["kind"] == "dlq":
                    dead += int(ctl["task_count"] or 0)
                    continue
                if ctl["kind"] == "inject":
                    continue
                message = ControlMessage(
                    type=_CONTROL_TYPES[ctl["kind"]],
                    task_name=str(ctl["producer"]),
                    task_count=int(ctl["task_count"] or 1),
                    timestamp=int(ctl["ctl_ms"] or 0),
                )
                self.control.stream(stream_id).apply(str(ctl["ssp"]), message)
            if dead:
                self.control.dead_letters += dead
                log.warning("task %s: %d undecodable records of %s sent to its dead-letter stream",
                            self.task.name, dead, stream_id)
        self._reconcile()
        spark_watermark = parse_spark_time(progress.eventTime.get("watermark")) or 0
        injected_all = all(_source_watermark(s) >= MAX_TIMESTAMP_MS for s in progress.sources)
        finishing = self._all_inputs_ended() and injected_all and (
            not progress.stateOperators or spark_watermark >= FLUSHED_WATERMARK_MS
        )
        out = self._output_watermark(progress, spark_watermark)
        if finishing:
            self._send_control(MessageType.END_OF_STREAM, MAX_TIMESTAMP_MS)
            self.control.finished = True
        elif out is not None and out > self.control.sent_watermark:
            self._send_control(MessageType.WATERMARK, out)
            self.control.sent_watermark = out
        self.writer.write(Checkpoint(offsets=offsets, control=self.control.to_json(), positions=positions))
        if finishing:
            self.done = True
            log.info("task %s finished: inputs ended, windows flushed, end-of-stream sent", self.task.name)

    def _ssps_of(self, stream_id: str) -> list[str]:
        ref = self.runner.plan.ref(stream_id)
        return [s.key() for s in self.task.ssps if (s.system, s.stream) == (ref.system, ref.physical)]

    def _all_inputs_ended(self) -> bool:
        return all(self.control.injected.get(s, -1) >= MAX_TIMESTAMP_MS for s in self.inputs if self._ssps_of(s))

    def _catch_up(self, location: Path, offsets: dict[SystemStreamPartition, str]) -> None:
        """Bring the control state up to Spark's last committed batch before the query restarts.

        Spark commits a batch before the processor hears of it, so a processor killed in between leaves
        Spark's checkpoint ahead of the checkpoint store; the control rows of those batches would be lost
        (Spark will not read them again). They are re-read here from the streams themselves.
        """
        committed = _last_committed(location)
        if committed is None:
            return
        metadata, sources = committed
        plan = self.runner.plan
        for source in sources:
            stream_id = source.get("s")
            if stream_id not in self.inputs:
                continue
            state = self.control.stream(stream_id)
            for key, end in source["p"].items():
                ssp = SystemStreamPartition.parse(key)
                start = offsets.get(ssp)
                if plan.is_intermediate(stream_id) and start is not None and int(start) < int(end["o"]):
                    consumer = plan.systems.consumer(ssp.system)
                    position = start
                    while records := consumer.read(ssp, position, 5000, end["o"]):
                        for record in records:
                            if is_control(record.value):
                                try:
                                    kind, body = decode(record.value)
                                except MalformedMessageError:
                                    continue
                                assert isinstance(body, ControlMessage)
                                state.apply(key, body)
                        position = records[-1].next_offset
                elif end.get("e"):
                    state.apply(key, ControlMessage(MessageType.END_OF_STREAM, f"{stream_id}:{key}", 1, 0))
                offsets[ssp] = end["o"]
        self._reconcile()
        stateless = not (location / "state").exists()
        flushed = stateless or int(metadata.get("batchWatermarkMs", 0)) >= FLUSHED_WATERMARK_MS
        injected = all(int(s.get("w", -1)) >= MAX_TIMESTAMP_MS for s in sources)
        if self._all_inputs_ended() and injected and flushed:
            self._send_control(MessageType.END_OF_STREAM, MAX_TIMESTAMP_MS)
            self.control.finished = True
            self.done = True
        self.writer.write(Checkpoint(offsets=dict(offsets), control=self.control.to_json()))
        log.info("task %s: control state caught up with Spark's batch %s%s", self.task.name,
                 metadata.get("batchId", "?"), " (already finished)" if self.done else "")

    def _reconcile(self) -> None:
        all_ended = True
        for stream_id in self.inputs:
            keys = self._ssps_of(stream_id)
            state = self.control.stream(stream_id)
            if not keys:
                continue
            if not state.ended(keys):
                all_ended = False
            if self.runner.plan.is_intermediate(stream_id):
                watermark = state.watermark(keys)
                if watermark is not None and watermark > self.control.injected.get(stream_id, -1):
                    self.control.injected[stream_id] = watermark
        if all_ended:
            for stream_id in self.inputs:
                self.control.injected[stream_id] = MAX_TIMESTAMP_MS

    def _output_watermark(self, progress: Any, spark_watermark: int) -> int | None:
        """The task's event-time watermark after this batch: Spark's watermark of the next batch, which is
        known now for a one-input stage (max event time seen minus the lateness)."""
        out = spark_watermark or None
        if len(self.inputs) == 1:
            seen = parse_spark_time(progress.eventTime.get("max"))
            if seen is not None:
                delay = self.runner.builder.settings(self.inputs[0]).delay_ms
                out = max(out or 0, seen - delay)
        return out

    def _send_control(self, kind: MessageType, timestamp: int) -> None:
        message = ControlMessage(
            type=kind,
            task_name=self.task.name,
            task_count=self.runner.plan.task_count(self.stage),
            timestamp=timestamp,
            run_id=str(self.runner.plan.config.get("app.run.id") or ""),
        ).encode()
        by_system: dict[str, list[OutgoingRecord]] = {}
        for sink in self.stage.sinks:
            if not sink.intermediate:
                continue
            ref = self.runner.plan.ref(sink.stream_id)
            for partition in range(self.runner.plan.partition_count(sink.stream_id)):
                by_system.setdefault(ref.system, []).append(
                    OutgoingRecord(stream=ref.physical, value=message, partition=partition)
                )
        for system, records in by_system.items():
            self.runner.plan.systems.producer(system).send(records)

    # --- stop -------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop the query, then checkpoint its last completed batch (its event may not have arrived yet)."""
        if self.query is not None:
            try:
                self.query.stop()
            except Exception as exc:
                log.warning("task %s: stopping its query raised %s", self.task.name, exc)
            if not self.done:
                self.poll_progress()
        with self.guard:
            self.stopped = True

    def poll_progress(self) -> None:
        """Apply the progress of every batch completed since the last call, in order.

        Progress is read as Spark's own JSON (two Py4J calls per query and poll) rather than through a
        `StreamingQueryListener`, whose Python side converts every event field by field over Py4J (dozens of
        calls per batch, measured at about a tenth of a core for 8 queries). Spark keeps the last
        ``spark.sql.streaming.numRecentProgressUpdates`` (100) progress reports, so a poll misses none.
        """
        if self.query is None:
            return
        with self.guard:  # one poller at a time: batches must be applied in order
            jquery = self.query._jsq
            last = jquery.lastProgress()
            if last is None:
                return
            latest = json.loads(last.json())
            if latest["batchId"] <= self.last_batch:
                return
            reports = [latest]
            if latest["batchId"] > self.last_batch + 1:
                recent = [json.loads(p.json()) for p in jquery.recentProgress()]
                reports = sorted((p for p in recent if p["batchId"] > self.last_batch), key=lambda p: p["batchId"])
            for report in reports:
                self.on_progress(_ProgressView(report))

    def failure(self) -> str | None:
        if self.error:
            return self.error
        if self.query is not None and not self.query.isActive and not self.stopped and not self.done:
            exc = self.query.exception()
            return f"query stopped: {exc}" if exc else "query stopped unexpectedly"
        return None


class _ProgressView:
    """``query.lastProgress`` is a dict; give it the attribute shape of a progress event."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.batchId = data["batchId"]
        self.eventTime = data.get("eventTime") or {}
        self.stateOperators = data.get("stateOperators") or []
        self.observedMetrics = data.get("observedMetrics") or {}
        self.sources = [_SourceView(s) for s in data.get("sources") or []]


class _SourceView:
    def __init__(self, data: dict[str, Any]) -> None:
        end = data.get("endOffset")
        self.endOffset = json.dumps(end) if isinstance(end, dict) else end


class SparkTaskRunner(TaskRunner):
    """Runs tasks of a pipeline as queries on this processor's SparkSession."""

    def __init__(self, spark: Any, plan: PipelinePlan, checkpoints: Any, builder: StageBuilder) -> None:
        config = plan.config
        self.spark = spark
        self.plan = plan
        self.checkpoints = checkpoints
        self.builder = builder
        self.job = f"{config.get('job.name')}-{config.get('job.id')}"
        self.trigger_ms = int(config.get("task.trigger.interval.ms"))
        self.output_mode = str(config.get("task.output.mode"))
        self.checkpoint_root = (
            config.path("task.spark.checkpoint.dir")
            if config.get("task.spark.checkpoint.dir")
            else config.state_dir() / "spark" / self.job
        )
        self._tasks: dict[str, TaskQuery] = {}
        self._failed: dict[str, str] = {}
        self._finished: set[str] = set()
        self._guard = threading.Lock()
        self._closing = threading.Event()
        self._monitor = threading.Thread(target=self._monitor_loop, name="spark-monitor", daemon=True)
        self._monitor.start()

    def spark_checkpoint_dir(self, task_name: str) -> Path:
        return self.checkpoint_root / task_name

    def stream_id_of(self, ssp: SystemStreamPartition) -> str:
        for stage in self.plan.stages:
            for stream_id in stage.input_ids:
                ref = self.plan.ref(stream_id)
                if (ref.system, ref.physical) == (ssp.system, ssp.stream):
                    return stream_id
        return ssp.stream

    # --- TaskRunner -------------------------------------------------------------------------------------
    def start_task(self, task: TaskModel, lock: Lock) -> None:
        with self._guard:
            if task.name in self._tasks or task.name in self._finished:
                return
        checkpoint = self.checkpoints.read_last_checkpoint(task.name)
        if checkpoint and TaskControl.from_json(checkpoint.control).finished:
            with self._guard:
                self._finished.add(task.name)
            log.info("task %s already finished", task.name)
            return
        stage = self.plan.stage(task.name.rsplit("-", 1)[0])
        handle = TaskQuery(self, task, lock, stage)
        with self._guard:
            self._tasks[task.name] = handle
            self._failed.pop(task.name, None)
        try:
            handle.start(checkpoint)
        except Exception as exc:
            with self._guard:
                self._tasks.pop(task.name, None)
                self._failed[task.name] = f"{type(exc).__name__}: {exc}"
            log.exception("task %s could not start", task.name)
            return

    def stop_task(self, task_name: str) -> None:
        with self._guard:
            handle = self._tasks.pop(task_name, None)
        if handle is None:
            return
        handle.stop()

    def running(self) -> set[str]:
        with self._guard:
            return {n for n, h in self._tasks.items() if not h.done and h.error is None}

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
        self._closing.set()
        super().close()

    # --- events -----------------------------------------------------------------------------------------
    def _monitor_loop(self) -> None:
        """Applies each query's progress, stops finished tasks' queries and turns dead queries into failures."""
        while not self._closing.wait(_MONITOR_S):
            with self._guard:
                handles = list(self._tasks.values())
            for handle in handles:
                try:
                    handle.poll_progress()
                except Exception as exc:  # a query stopping under us; the failure check below reports it
                    log.debug("task %s: reading its progress failed: %s", handle.task.name, exc)
                if handle.done:
                    handle.stop()
                    with self._guard:
                        self._tasks.pop(handle.task.name, None)
                        self._finished.add(handle.task.name)
                    continue
                error = handle.failure()
                if error:
                    handle.stop()
                    with self._guard:
                        self._tasks.pop(handle.task.name, None)
                        self._failed[handle.task.name] = error
                    log.error("task %s failed: %s", handle.task.name, error)
