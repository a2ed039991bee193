"""What a task's query does with each micro-batch Spark finished: the task's side of the progress protocol.

The source's driver-side methods run in another process and Spark never calls ``commit(end)`` for a query's
last batch, so the processor writes each task's checkpoint itself, from the end offsets of every batch Spark
reports as done (`weirflow.spark.progress`), in this process, where the task's lock is held: every write goes
through the fence. On each report, per task of the query (`TaskProgress._apply`):

1. the batch's control rows (collected by ``observe``) update the task's `TaskControl`; the reconciled
   watermark of each intermediate input, when it advanced, is stored as ``injected`` so the source feeds it
   into Spark on its next batch (a stateful task's reads have usually moved Spark there already, in the batch
   that read the messages: `weirflow.spark.batch_reader.BatchReader._early_watermark`);
2. when every input has ended, ``injected`` becomes +infinity; once Spark's watermark got there (at once for
   a stateless stage) the task sends end-of-stream downstream, checkpoints ``finished`` and stops; when an
   input ended by a **drain** (docs/drain.md) the task sends drain instead and checkpoints ``drained`` with
   the deployment's run id;
3. the task's Spark state is mirrored (`weirflow.interfaces.spark_state`), then the checkpoint (end offsets +
   control state) is written through the fence;
4. a watermark message goes to every partition of each intermediate output when the task's watermark moved.

A task whose Spark checkpoint is ahead of the checkpoint store (its processor was killed between Spark's
commit and its own) is caught up with before its query restarts (`TaskProgress._catch_up`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from weirflow.base import clock
from weirflow.base.errors import FencedOffError, LockLostError
from weirflow.interfaces.checkpoint import Checkpoint
from weirflow.interfaces.spark_checkpoint import RESULTS_DIR, has_state, history_of, last_committed
from weirflow.interfaces.system import OutgoingRecord, SystemStreamPartition
from weirflow.job.systems import Systems
from weirflow.runtime import fault_points
from weirflow.runtime.control import (
    CONTROL_KIND_TYPES,
    DEAD_LETTERS_KIND,
    FLUSHED_WATERMARK_MS,
    MARKS_KIND,
    MAX_TIMESTAMP_MS,
    ROWS_KIND,
    SEEN_KIND,
    ControlMessage,
    MalformedMessageError,
    MessageType,
    decode,
    is_control,
)
from weirflow.spark.progress import ProgressView, parse_spark_time
from weirflow.spark.query import observation_name
from weirflow.spark.query_host import QueryHost
from weirflow.spark.replay import compare_offsets
from weirflow.spark.result_replays import ResultsLedger, in_checkpoint
from weirflow.spark.shared_progress import note_batch, write_injected
from weirflow.spark.task_state import TaskState
from weirflow.spark.writer_log import WROTE_FORMAT

if TYPE_CHECKING:
    from weirflow.pipeline.plan import Stage

log = logging.getLogger("weirflow.spark")

# One line per batch and table output (`weirflow.spark.table_commits`): the query, the batch, the output, the rows
# committed and the commit's milliseconds (benchmarks/delta_output.py reads them).
TABLE_COMMIT_FORMAT = "%s: batch %d committed %d rows to table %s in %.1f ms"

# Per SSP of one task after a batch: its next offset, and the system's native position of its last record.
Offsets = dict[SystemStreamPartition, str]
Positions = dict[SystemStreamPartition, dict[str, str]]


def records_between(systems: Systems, before: Offsets, after: Offsets) -> int:
    """Records read between two checkpoints' offsets, counted by each SSP's system
    (`SystemAdmin.records_read`: offsets are compared and counted only through the admin); an SSP its system
    cannot count adds nothing."""
    total = 0
    for ssp, end in after.items():
        start = before.get(ssp, end)
        if start == end:
            continue
        try:
            counted = systems.admin(ssp.system).records_read(ssp.stream, ssp.partition, start, end)
        except ValueError:
            continue
        total += counted or 0
    return total


class TaskProgress:
    """The per-batch work of one Spark query for the tasks it runs (see the module docstring). `StageQuery`
    is the one such query: it supplies the attributes declared here, and adds starting and stopping."""

    runner: QueryHost
    stage: Stage
    tasks: list[TaskState]
    merged: bool
    shared: bool  # a stateful stage's tasks sharing the query (`weirflow.spark.shared_aggregation`)
    inject_file: Path | None
    by_ssp: dict[str, TaskState]
    inputs: list[str]
    location: Path | None
    history: str | None  # the Spark history (query id) of ``location``, read at the first checkpoint
    counts_dir: Path | None
    replays_file: Path | None
    records_out: dict[str, int]

    def _apply(self, report: ProgressView) -> None:
        """One finished micro-batch: its end offsets and control rows become each task's checkpoint."""
        before = sum(self.records_out.values())
        replayed = self._count_written(report.batchId)
        wrote = sum(self.records_out.values()) > before  # the batch wrote rows (of any of the query's tasks)
        self._batch_results(report.batchId, replayed)
        offsets, positions = self._batch_ends(report)
        dead, rows = self._apply_control_rows(report)
        spark_watermark = parse_spark_time(report.eventTime.get("watermark")) or 0
        injected_all = all(s.watermark() >= MAX_TIMESTAMP_MS for s in report.sources)
        for t in self.tasks:
            if t.done or t.error:
                continue
            if dead.get(t.name):
                t.control.dead_letters += dead[t.name]
                log.warning("task %s: %d undecodable records sent to its dead-letter stream", t.name, dead[t.name])
            self._reconcile(t)
            finishing, out = self._watermarks(t, report, spark_watermark, injected_all, offsets[t.name])
            if not self._checkpoint(t, report, finishing, out, offsets[t.name], positions[t.name], wrote):
                continue
            t.stats.batches += 1
            t.stats.records_in += self._records_read(t, offsets[t.name]) + rows.get(t.name, 0)
            t.read_to.update(offsets[t.name])
            t.stats.last_batch_ms = report.duration_ms
            t.stats.batch_seconds.observe(report.duration_ms / 1000)
            t.stats.last_checkpoint_ms = clock.now_ms()
            if finishing:
                t.done = True
                if t.control.drained:
                    log.info("task %s drained: inputs cut or drained, windows flushed, drain sent", t.name)
                else:
                    log.info("task %s finished: inputs ended, windows flushed, end-of-stream sent", t.name)
                self.runner.wake()
        if self.shared:
            write_injected(self)  # type: ignore[arg-type]

    def _batch_results(self, batch: int, replayed: int) -> None:
        """A stateful task's results of the batch (where its writes end, what it did not write), from its ledger:
        the one task's of its own query, or each task's of a shared query."""
        if not self.merged:
            self._results_written(self.tasks[0], batch, replayed)
        elif self.shared and self.location is not None:
            for t in self.tasks:
                self._results_written(t, batch, 0, self.location / RESULTS_DIR / quote(t.name, safe=""))
            if replayed:
                log.info("stage %s: %d replayed results not written again", self.stage.name, replayed)

    def _watermarks(
        self, t: TaskState, report: ProgressView, spark_watermark: int, injected_all: bool, offsets: Offsets
    ) -> tuple[bool, int | None]:
        """Whether ``t`` finishes with this batch, and the watermark it sends downstream; a stateful task's
        ``closed`` (and in a shared query its rebuild marks, `weirflow.spark.shared_progress.note_batch`)."""
        if self.merged and not self.shared:
            return self._all_inputs_ended(t), self._stateless_watermark(t)
        if self.shared:
            note_batch(t, offsets, spark_watermark, self.runner.builder.shared(self.stage).length_ms)
        elif report.stateOperators:  # what a shared query of the task would start from (`weirflow.spark.rebuild`)
            t.control.closed = max(-1 if t.control.closed is None else t.control.closed, spark_watermark)
        # windows are flushed once a batch ran at the end of time (the source moved Spark there as soon as it
        # read the last end, `BatchReader._early_watermark`); without state, once it was injected
        flushed = spark_watermark >= FLUSHED_WATERMARK_MS if report.stateOperators else injected_all
        return self._all_inputs_ended(t) and flushed, self._output_watermark(t, report, spark_watermark)

    def _records_read(self, t: TaskState, offsets: Offsets) -> int:
        """The records of ``t``'s input streams its batch read up to ``offsets``, counted by their systems'
        admins. Not those of intermediate streams: a record there packs many rows (and control messages pass
        between them), so the task's reads count the rows they took instead (``rows`` control rows)."""
        plan = self.runner.plan
        packed = {(plan.ref(s).system, plan.ref(s).physical) for s in self.inputs if plan.is_intermediate(s)}
        inputs = {ssp: o for ssp, o in offsets.items() if (ssp.system, ssp.stream) not in packed}
        return records_between(plan.systems, t.read_to, inputs)

    def _count_written(self, batch: int) -> int:
        """Add the sink's counts of ``batch`` (written by its ``commit``) to the query's ``records_out`` and to
        its tasks': a query of one task wrote all of them for it; a shared query's rows were counted per task
        by the sink, those it could attribute (`WeirflowStreamWriter`). Returns how many replayed results the
        batch did not write (`weirflow.spark.result_replays`)."""
        if self.counts_dir is None:
            return 0
        path = self.counts_dir / f"{batch}.json"
        try:
            summary = json.loads(path.read_text())
            path.unlink()
        except (FileNotFoundError, ValueError):
            return 0
        counts = {str(stream): int(n) for stream, n in dict(summary.get("counts", {})).items()}
        for stream, n in counts.items():
            self.records_out[stream] = self.records_out.get(stream, 0) + n
        by_task = {self.tasks[0].name: counts} if len(self.tasks) == 1 else dict(summary.get("by_task", {}))
        for t in self.tasks:
            for stream, n in dict(by_task.get(t.name, {})).items():
                t.stats.records_out[stream] = t.stats.records_out.get(stream, 0) + int(n)
        for stream, (rows, ms) in dict(summary.get("tables", {})).items():
            query = self.stage.name if self.merged else self.tasks[0].name
            log.info(TABLE_COMMIT_FORMAT, query, batch, int(rows), stream, float(ms))
        return int(summary.get("replayed", 0))

    def _results_written(self, t: TaskState, batch: int, replayed: int, ledgers: Path | None = None) -> None:
        """Carry into the task's checkpoint of ``batch`` where the partitions it writes results to ended at the
        batch's commit and the replays still to come after it: the batch's own ledger, which the sink's commit
        wrote before Spark started the next batch (the next batch may have changed the replays since). A shared
        query's task (``ledgers``: its own) keeps its replays in the checkpoint whatever their size: the query's
        directory does not outlive the query."""
        if self.location is not None:
            directory = ledgers or self.location / RESULTS_DIR
            ledger = ResultsLedger.load(directory, batch)
            if ledger is not None:
                kept = ledger.replays.to_json() if ledgers else in_checkpoint(ledger.replays, batch)
                t.control.tails, t.control.replays = ledger.tails, kept
                ResultsLedger.prune(directory, batch)
        if replayed:
            t.stats.replays_dropped += replayed
            log.info("task %s: %d replayed results not written again", t.name, replayed)

    def _batch_ends(self, report: ProgressView) -> tuple[dict[str, Offsets], dict[str, Positions]]:
        """Per task, the next offset of each of its SSPs after the batch, and the systems' native positions."""
        offsets: dict[str, Offsets] = {t.name: {} for t in self.tasks}
        positions: dict[str, Positions] = {t.name: {} for t in self.tasks}
        for source in report.sources:
            if source.end is None:
                continue
            for key, position in source.end.partitions.items():
                owner = self.by_ssp.get(key)
                if owner is None:
                    continue
                ssp = SystemStreamPartition.parse(key)
                offsets[owner.name][ssp] = position.offset
                if position.position:
                    positions[owner.name][ssp] = position.position
        return offsets, positions

    def _apply_control_rows(self, report: ProgressView) -> tuple[dict[str, int], dict[str, int]]:
        """The batch's observed control rows applied to their tasks; returns dead letters per task, and the rows
        each task took from intermediate streams (its records in there)."""
        dead: dict[str, int] = {}
        rows: dict[str, int] = {}
        for index, stream_id in enumerate(self.inputs):
            row = report.observedMetrics.get(observation_name(index))
            for ctl in (row or {}).get("control") or []:
                owner = self.by_ssp.get(str(ctl["ssp"]))
                if owner is None:  # inject rows name no partition
                    continue
                if ctl["kind"] == DEAD_LETTERS_KIND:
                    dead[owner.name] = dead.get(owner.name, 0) + int(ctl["task_count"] or 0)
                elif ctl["kind"] == ROWS_KIND:
                    rows[owner.name] = rows.get(owner.name, 0) + int(ctl["task_count"] or 0)
                elif ctl["kind"] == MARKS_KIND:
                    self._take_marks(owner, str(ctl["ssp"]), json.loads(ctl["detail"]))
                elif ctl["kind"] == SEEN_KIND:
                    owner.seen[ctl["ssp"]] = max(owner.seen.get(ctl["ssp"], 0), int(ctl["ctl_ms"]))
                elif ctl["kind"] in CONTROL_KIND_TYPES:
                    message = ControlMessage(
                        type=CONTROL_KIND_TYPES[ctl["kind"]],
                        task_name=str(ctl["producer"]),
                        task_count=int(ctl["task_count"] or 1),
                        timestamp=int(ctl["ctl_ms"] or 0),
                    )
                    owner.control.stream(stream_id).apply(str(ctl["ssp"]), message)
        return dead, rows

    def _take_marks(self, t: TaskState, ssp_key: str, detail: dict[str, Any]) -> None:
        """The marks a read of one intermediate partition ended with (`weirflow.spark.replay`): kept in the
        task's control state, checkpointed with the batch's offsets."""
        dropped = int(detail.pop("dropped", 0))
        if dropped:
            t.stats.replays_dropped += dropped
            log.info("task %s: %d replayed rows of %s dropped", t.name, dropped, ssp_key)
        current = t.control.marks.get(ssp_key)
        if current is None:
            t.control.marks[ssp_key] = detail
            return
        admin = self.runner.plan.systems.admin(SystemStreamPartition.parse(ssp_key).system)
        if compare_offsets(admin, str(detail["at"]), str(current["at"])) != -1:  # incomparable: the newer read
            t.control.marks[ssp_key] = detail

    def _checkpoint(
        self,
        t: TaskState,
        report: ProgressView,
        finishing: bool,
        out: int | None,
        offsets: Offsets,
        positions: Positions,
        wrote: bool = False,
    ) -> bool:
        """Send the task's control messages, then write its checkpoint; False (task failed) when that fails.
        ``wrote``: the batch wrote rows (a fault point tells such batches apart)."""
        valid = self.runner.lease_valid
        if valid is not None and not valid(t.name):  # paused past the lease: nothing more for this task
            t.error = "its lock was not confirmed in time (the processor was paused or cut off)"
            log.error("task %s: %s; writing nothing more", t.name, t.error)
            self.runner.wake()
            return False
        try:
            if finishing:
                self._finish(t)
                if t.control.drained:
                    fault_points.reached("before-drained-checkpoint", t.name)
            elif out is not None and out > t.control.sent_watermark:
                self._send_control(t, MessageType.WATERMARK, out)
                t.control.sent_watermark = out
            self._mirror_state(t, report.batchId)
            fault_points.reached("before-checkpoint", t.name)
            if wrote:
                fault_points.reached("before-checkpoint-of-rows", t.name)
            if not self.merged and self.location is not None:
                if self.history is None:  # the query's directory keeps its history: read its metadata once
                    self.history = history_of(self.location) or ""
                t.control.spark_history = self.history
            t.offsets.update(offsets)
            t.writer.write(Checkpoint(offsets=offsets, control=t.control.to_json(), positions=positions))
            # one line per committed batch and task: who wrote for the task when (weirflow.spark.writer_log)
            log.info(
                WROTE_FORMAT,
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

    def _mirror_state(self, t: TaskState, batch: int, location: Path | None = None) -> None:
        """Copy the task's Spark checkpoint directory as of ``batch`` to the state store, before the store's
        checkpoint names the batch's offsets: a copy at least as far on as the store, so that the next holder
        restores state matching the offsets it resumes from (a copy ahead of them is caught up with)."""
        store = self.runner.state_store
        location = location or self.location
        if store is None or self.merged or location is None:
            return
        if not self.stage.serves and not has_state(location):
            return  # no operator state: the checkpoint store's offsets are all the task needs elsewhere
        report = store.mirror(t.name, location, batch, t.writer.epoch)
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
        """A task query's event-time watermark after this batch, sent downstream after the batch's rows.

        A stateless one-input stage passes its rows on at once: Spark's watermark of the next batch, known now
        (max event time seen minus the lateness). A stateful stage's rows are results, those the batch's own
        watermark closed (Spark's, of this batch); the windows the next batch's watermark closes are written
        only then, so that watermark must not go downstream ahead of them: a consumer would take their rows
        for late ones, or end before them when it is the end of time."""
        out = spark_watermark or None
        if len(self.inputs) == 1 and not report.stateOperators:
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

    def _caught_up_results(self, t: TaskState, location: Path, batch: int) -> None:
        """A stateful task's tails and replays as of Spark's committed ``batch`` (its ledger), not as of the
        older checkpoint: read back from the older tails, the results of the batches in between (which Spark will
        not run again) would be taken for replays still to come, and equal new results left out for them."""
        ledger = ResultsLedger.load(location / RESULTS_DIR, batch)
        if ledger is not None:
            t.control.tails, t.control.replays = ledger.tails, in_checkpoint(ledger.replays, batch)
            return
        if not t.control.tails and not t.control.replays:
            return  # the task writes no results, or none were written yet
        log.warning(
            "task %s: Spark's batch %s has no results ledger (its checkpoint was written by an older version); "
            "its results past the checkpoint are not read back: a replay may write some of them again",
            t.name,
            batch,
        )
        t.control.tails, t.control.replays = {}, {}

    def _catch_up(self, t: TaskState, location: Path) -> None:
        """Bring a task query's control state up to Spark's last committed batch before it restarts.

        Spark commits a batch before the processor hears of it, so a processor killed in between leaves
        Spark's checkpoint ahead of the checkpoint store; the control rows of those batches would be lost
        (Spark will not read them again). They are re-read here from the streams themselves.
        """
        committed = last_committed(location)
        if committed is None:
            return
        plan = self.runner.plan
        offsets = t.offsets
        for source in committed.sources:
            stream_id = source.stream_id
            if stream_id not in self.inputs:
                continue
            state = t.control.stream(stream_id)
            for key, end in source.partitions.items():
                ssp = SystemStreamPartition.parse(key)
                start = offsets.get(ssp)
                if (
                    plan.is_intermediate(stream_id)
                    and start is not None
                    and (plan.systems.admin(ssp.system).compare_offsets(start, end.offset) or 0) < 0
                ):
                    consumer = plan.systems.consumer(ssp.system)
                    position = start
                    while records := consumer.read(ssp, position, 5000, end.offset):
                        for record in records:
                            if is_control(record.value):
                                try:
                                    _, body = decode(record.value)
                                except MalformedMessageError:
                                    continue
                                assert isinstance(body, ControlMessage)
                                state.apply(key, body)
                        position = records[-1].next_offset
                elif end.ended:
                    kind = MessageType.DRAIN if end.drained else MessageType.END_OF_STREAM
                    state.apply(key, ControlMessage(kind, f"{stream_id}:{key}", 1, 0))
                offsets[ssp] = end.offset
        self._reconcile(t)
        self._caught_up_results(t, location, committed.batch)
        flushed = not has_state(location) or committed.watermark_ms >= FLUSHED_WATERMARK_MS
        injected = all(s.watermark >= MAX_TIMESTAMP_MS for s in committed.sources)
        if self._all_inputs_ended(t) and injected and flushed:
            self._finish(t)
            t.done = True
        # the state as of the batch goes to the store before its checkpoint names the batch's offsets, as after
        # every batch (`_mirror_state`): a copy behind the store would restore state older than its offsets
        self._mirror_state(t, committed.batch, location)
        t.writer.write(Checkpoint(offsets=dict(offsets), control=t.control.to_json()))
        log.info(
            "task %s: control state caught up with Spark's batch %s%s",
            t.name,
            committed.batch,
            " (already finished)" if t.done else "",
        )
