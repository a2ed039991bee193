"""`StageQuery`: one Spark streaming query of a stage, its start and its stop.

A task of a *stateful* stage runs as a query of its own with its own Spark checkpoint directory, which may be
restored from the Spark state store, discarded when it is behind the checkpoint store, or caught up with when
it is ahead (`StageQuery._stale`, `TaskProgress._catch_up`). The tasks a processor holds of a *stateless* stage
run as one query (``merged``) that always starts from the checkpoint store with a fresh Spark checkpoint,
removed when it stops. What the query does with each finished batch is `weirflow.spark.task_progress`.
"""

from __future__ import annotations

import json
import logging
import secrets
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from weirflow.interfaces.checkpoint import Checkpoint
from weirflow.interfaces.spark_checkpoint import (
    RESULTS_DIR,
    PartitionOffset,
    has_offsets,
    history_of,
    last_committed,
    last_committed_batch,
    planned_batch,
)
from weirflow.interfaces.system import SystemStreamPartition
from weirflow.job.start_position import resume_offset, start_offset
from weirflow.spark import fence
from weirflow.spark.progress import ProgressView
from weirflow.spark.query import QueryScope
from weirflow.spark.query_host import QueryHost
from weirflow.spark.replay import ROW_BITS, pss
from weirflow.spark.result_replays import from_checkpoint, tails_of, written_since
from weirflow.spark.shared_progress import rebuild_starts, write_injected
from weirflow.spark.shared_results import SharedResults
from weirflow.spark.task_progress import TaskProgress
from weirflow.spark.task_state import TaskState

if TYPE_CHECKING:
    from weirflow.pipeline.plan import Stage

log = logging.getLogger("weirflow.spark")

_ALIVE_CHECK_S = 2.0  # how often a query's liveness is asked of Spark beyond its termination event
_STATELESS_DIR = "_stateless"
_COUNTS_DIR = "_written"  # per query: records written per output and batch, from the sink (records out)
_MARKS_DIR = "_marks"  # per run id: marks of the intermediate partitions read here (`weirflow.spark.replay`)
_FLOOR_DIR = "_drain_floor"  # per stateful task's query: the least drain cut (`StageQuery._drain_floor`)
_INJECT_DIR = "_inject"  # per shared aggregation query: the watermark its source injects


class StageQuery(TaskProgress):
    """One Spark streaming query and the tasks it runs: a stateful stage's task alone (``merged`` False), or
    every task of a stateless stage this processor holds."""

    def __init__(
        self, runner: QueryHost, stage: Stage, tasks: list[TaskState], merged: bool, shared: bool = False
    ) -> None:
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
        self.stopping = False  # set when `stop` begins, before Spark's query has ended
        self.terminated: str | None = None  # set when Spark reports the query ended ("" without an error)
        self.location: Path | None = None
        self.history: str | None = None
        self.counts_dir: Path | None = None
        self.replays_file: Path | None = None  # results of an earlier attempt not to write again
        self._replay_until: dict[str, str] = {}  # ... and the input ends they come of, at most (`_drain_floor`)
        self.records_out: dict[str, int] = {}  # output stream -> records written by this query
        self._alive_checked = time.monotonic()
        # a stateful stage's tasks sharing the query (`weirflow.spark.shared_aggregation`): each rebuilds its open
        # windows from its partition (`weirflow.spark.rebuild`), and the processor keeps the watermark to inject
        self.shared = shared
        self.inject_file: Path | None = None

    @property
    def name(self) -> str:
        """The query's stable name, its ``query`` label in ``GET /metrics``: a stateless stage's shared query is
        named by its stage, whatever tasks it runs, a stateful task's by the task."""
        return self.stage.name if self.merged else self.tasks[0].name

    # --- start ------------------------------------------------------------------------------------------
    def start(self) -> None:
        runner = self.runner
        if self.shared:
            starts = {ssp.key(): PartitionOffset(o, False) for ssp, o in rebuild_starts(self).items()}
        else:
            starts = {
                ssp.key(): PartitionOffset(self._start_offset(t, ssp), self._ended(t, ssp))
                for t in self.tasks
                for ssp in t.task.ssps
            }
        self._pin(starts)
        if self.shared:
            self.inject_file = (
                runner.checkpoint_root / _INJECT_DIR / f"{self.stage.name}-{uuid.uuid4().hex[:12]}.json"
            )
            write_injected(self)
        floor_file = (
            None
            if self.merged or self.shared
            else runner.checkpoint_root / _FLOOR_DIR / f"{self.name}-{uuid.uuid4().hex[:12]}.json"
        )
        scope = QueryScope(
            ssps=tuple(ssp for t in self.tasks for ssp in t.task.ssps),
            task_of={key: t.name for key, t in self.by_ssp.items()},
            inject="" if self.merged else self.tasks[0].name,
            marks_dir=str(runner.checkpoint_root / _MARKS_DIR / quote(runner.run_id, safe="")),
            fence=self._fence(),
            shared=self.shared,
            rebuild_until={
                key: [until, t.rebuild.closed]
                for t in self.tasks
                if t.rebuild is not None
                for key, until in t.rebuild.until.items()
            },
            closed={
                ssp.partition: -1 if t.control.closed is None else t.control.closed
                for t in self.tasks
                for ssp in t.task.ssps
            }
            if self.shared
            else {},
            inject_file=str(self.inject_file or ""),
            drain_floor_file=str(floor_file or ""),
        )
        for t in self.tasks:
            t.read_to = {ssp: str(starts[ssp.key()].offset) for ssp in t.task.ssps}
        self.inputs, frames = runner.builder.build(self.stage, scope, {k: p.to_json() for k, p in starts.items()})
        sink, sinks = runner.builder.sink_frame(self.stage, frames)
        if self.merged:
            location = runner.checkpoint_root / _STATELESS_DIR / f"{self.stage.name}-{uuid.uuid4().hex[:12]}"
            fresh = True
        else:
            location = runner.spark_checkpoint_dir(self.tasks[0].name)
            if runner.state_store is not None:  # another machine ran it further: its copy of the state
                runner.state_store.restore(self.tasks[0].name, location)
            fresh = not has_offsets(location) or self._stale(self.tasks[0], location)
            if fresh and location.exists():
                shutil.rmtree(location)
            if not fresh:
                self._catch_up(self.tasks[0], location)
                if self.tasks[0].done:
                    return
        self.location = location
        self.counts_dir = runner.checkpoint_root / _COUNTS_DIR / uuid.uuid4().hex[:12]
        self.replays_file = (
            None
            if self.merged
            else self._replays(self.tasks[0], sinks, self.counts_dir / "replays.json", starts, location)
        )
        if floor_file is not None:
            self._drain_floor(floor_file, location)
        shared = self._shared_results(sinks, starts, location) if self.shared else None
        self.query = (
            sink.writeStream.format("weirflow-sink")
            .option("config", runner.builder.snapshot)
            .option("sinks", json.dumps(sinks))
            .option("fence", self._fence())
            .option("served_dir", str(location) if self.stage.serves else "")
            .option("counts_dir", str(self.counts_dir))
            .option("tasks", json.dumps([t.name for t in self.tasks]))
            .option("replays_file", str(self.replays_file or ""))
            .option("results_dir", "" if self.merged else str(location / RESULTS_DIR))
            .option("attempt", secrets.token_hex(8))
            .option("checkpointLocation", str(location))
            .outputMode(runner.output_mode)
            .trigger(processingTime=f"{runner.trigger_ms} milliseconds")
            .option("owners", json.dumps(self._owners()))
            .option("rows_until", json.dumps(self._rows_until(sinks)))
            .option("shared", json.dumps(shared.to_json()) if shared is not None else "")
            .queryName(f"{runner.job}-{self.name}" + (f"[{len(self.tasks)} tasks]" if self.merged else ""))
            .start()
        )
        self.id = str(self.query.id)
        log.info(
            "%s: query %s started (%s Spark checkpoint) at %s",
            ", ".join(t.name for t in self.tasks) if self.merged else self.name,
            self.id,
            "new" if fresh else "existing",
            {k: p.offset for k, p in starts.items()},
        )

    def _pin(self, starts: dict[str, PartitionOffset]) -> None:
        """Pin the starts that mean "where the stream starts now" to a record (`SystemAdmin.pin_starts`; only
        Kinesis has such starts) and checkpoint them before the query reads: a replay of the first batch then
        numbers its records as the first attempt did, however much retention dropped meanwhile."""
        by_stream: dict[tuple[str, str], dict[int, str]] = {}
        for key, start in starts.items():
            if not start.ended:
                ssp = SystemStreamPartition.parse(key)
                by_stream.setdefault((ssp.system, ssp.stream), {})[ssp.partition] = str(start.offset)
        pinned: set[str] = set()
        for (system, stream), offsets in by_stream.items():
            for partition, offset in self.runner.plan.systems.admin(system).pin_starts(stream, offsets).items():
                if offset != offsets[partition]:
                    key = SystemStreamPartition(system, stream, partition).key()
                    starts[key] = PartitionOffset(offset, starts[key].ended)
                    pinned.add(key)
        for t in self.tasks:
            if pinned & t.keys:
                t.offsets = {ssp: str(starts[ssp.key()].offset) for ssp in t.task.ssps}
                t.writer.write(Checkpoint(offsets=dict(t.offsets), control=t.control.to_json()))
                log.info(
                    "task %s: its starts in %s pinned and checkpointed before its first read",
                    t.name,
                    ", ".join(sorted(pinned & t.keys)),
                )

    def _fence(self) -> str:
        """The fence of the query's sends (its sink's and its readers' dead letters): every task's lock."""
        return fence.encode([fence.LockRef.of(t.lock) for t in self.tasks], self.runner.leases_file())

    def _owners(self) -> dict[str, str]:
        """For a query shared by several tasks: each input partition's ``__pss`` (`weirflow.spark.replay.pss`:
        the input's code and the partition) -> the task reading it, with which the sink counts the rows it
        writes per task. A query of one task needs none."""
        if len(self.tasks) == 1:
            return {}
        owners = {}
        for (system, physical), code in self.runner.builder.input_codes(self.inputs).items():
            for t in self.tasks:
                for ssp in t.task.ssps:
                    if (ssp.system, ssp.stream) == (system, physical):
                        owners[str(pss(code, ssp.partition))] = t.name
        return owners

    def _shared_results(
        self, sinks: list[dict[str, Any]], starts: dict[str, PartitionOffset], location: Path
    ) -> SharedResults:
        """A shared aggregation query's results bookkeeping: each task's replays (`_replays`) and ledgers."""
        assert self.counts_dir is not None
        files = {}
        for i, t in enumerate(self.tasks):
            path = self._replays(t, sinks, self.counts_dir / f"replays-{i}.json", starts, location)
            if path is not None:
                files[t.name] = str(path)
        task_of = {ssp.partition: t.name for t in self.tasks for ssp in t.task.ssps}
        return SharedResults(task_of, files, str(location / RESULTS_DIR), str(location))

    def _replays(
        self,
        t: TaskState,
        sinks: list[dict[str, Any]],
        path: Path,
        starts: dict[str, PartitionOffset],
        location: Path,
    ) -> Path | None:
        """The file of results an earlier attempt of stateful task ``t`` wrote past its checkpoint, which this
        query will produce again and must not write (`weirflow.spark.result_replays`): those its checkpoint
        still carries, and what the streams it writes results to hold of it beyond the checkpoint's tails."""
        streams = [(s["system"], s["physical"]) for s in sinks if s.get("results") and not s.get("serve")]
        if not streams:
            return None
        if not t.control.tails:
            self._first_tails(t, streams, starts)
        replays = from_checkpoint(t.name, t.control.replays, location / RESULTS_DIR)
        if t.control.tails:
            since = written_since(self.runner.plan.systems, t.name, t.control.tails)
            if len(since):
                log.info(
                    "task %s: %d results written past its checkpoint by an earlier attempt; a replay will not "
                    "write them again",
                    t.name,
                    len(since),
                )
                replays.merge(since)
                replays.await_input(self._input_ends(t))
        if not len(replays):
            return None
        self._replay_until = dict(replays.until)
        replays.save(path)
        return path

    def _drain_floor(self, path: Path, location: Path) -> None:
        """Where a drain may cut this task's input at the earliest (the source reads ``path`` as it fixes the
        cut): nothing, unless an earlier attempt wrote results past the checkpoint of a batch Spark will not run
        again as it was planned (its offset log ends at its last commit: the batch was planned on another
        machine, or the directory is new). A drain cut where the query has read to would leave those results
        written and their input past the cut, where the next deployment counts it again; cut at ``until`` (no
        earlier attempt read further), the query produces them again, and they are left out as replays."""
        until = self._replay_until
        if not until:
            return
        committed = last_committed_batch(location)
        if planned_batch(location, 0 if committed is None else committed + 1) is not None:
            return  # Spark runs the planned batch again first: the cut comes after it
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(until))

    def _rows_until(self, sinks: list[dict[str, Any]]) -> dict[str, int]:
        """For a stage that sends partials (`weirflow.spark.partials`): per input partition (``__pss``) of each
        task that an earlier query may have run past its checkpoint, the position where the partition ends now.
        Below it, batches send rows, which the consumer's marks tell from what an earlier attempt wrote;
        partials of a range that attempt also summed could be neither dropped nor taken."""
        if not any(s.get("partials") for s in sinks):
            return {}
        codes = self.runner.builder.input_codes(self.stage.input_ids)
        bounds: dict[str, int] = {}
        for t in self.tasks:
            if t.started_before:
                for key, end in self._input_ends(t).items():
                    ssp = SystemStreamPartition.parse(key)
                    value = pss(codes[(ssp.system, ssp.stream)], ssp.partition)
                    bounds[str(value)] = int(end) << ROW_BITS
            t.started_before = True
        if bounds:
            log.info("%s: rows, not partials, until its inputs pass %s", self.name, bounds)
        return bounds

    def _input_ends(self, t: TaskState) -> dict[str, str]:
        """The next offset of every input partition of ``t`` now: as its replay begins, no earlier attempt of the
        task read further (each stopped writing before this holder started: the fence)."""
        ends: dict[str, str] = {}
        by_stream: dict[tuple[str, str], list[int]] = {}
        for ssp in t.task.ssps:
            by_stream.setdefault((ssp.system, ssp.stream), []).append(ssp.partition)
        for (system, stream), partitions in by_stream.items():
            metadata = self.runner.plan.systems.admin(system).partition_metadata_of(stream, partitions)
            for partition in partitions:
                ends[SystemStreamPartition(system, stream, partition).key()] = metadata[partition].upcoming
        return ends

    def _first_tails(
        self, t: TaskState, streams: list[tuple[str, str]], starts: dict[str, PartitionOffset]
    ) -> None:
        """Tails for a stateful task whose checkpoint has none (its first start, or the first since it writes
        results), checkpointed before the query writes anything, with the offsets it starts from: without them a
        kill before the first batch's checkpoint would leave the next attempt nothing to read back from, and it
        would write the first attempt's results again."""
        t.control.tails = tails_of(self.runner.plan.systems, streams)
        if not t.offsets:
            t.offsets = {ssp: str(starts[ssp.key()].offset) for ssp in t.task.ssps}
        t.writer.write(Checkpoint(offsets=dict(t.offsets), control=t.control.to_json()))
        log.info("task %s: tails of its results checkpointed before its first batch", t.name)

    def _stale(self, t: TaskState, location: Path) -> bool:
        """Whether the task's Spark checkpoint is *behind* the checkpoint store (another processor ran the task
        further meanwhile, from a Spark checkpoint of its own): the store wins, since resuming from Spark's
        position would read again what was already processed and then move the store's offsets backwards.
        Spark's checkpoint *ahead* of the store is normal (a processor killed between Spark's commit and its
        own checkpoint) and is caught up with instead (`_catch_up`).

        A Spark checkpoint with no committed batch (its query stopped or died during its first batch) is
        discarded too: it holds no operator state (state is committed with a batch) and Spark refuses to run
        batch 0 again over its leftovers (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``, Spark 4.x), which
        failed the task on every retry. So is one of another Spark history than the one the store's offsets were
        written from (`TaskControl.spark_history`): its batch numbers and offsets say nothing about them."""
        committed = last_committed(location)
        if committed is None:
            log.info("task %s: Spark checkpoint %s has no committed batch; starting a new one", t.name, location)
            return True
        history = history_of(location)
        recorded = t.control.spark_history
        if recorded and history and history != recorded:
            log.warning(
                "task %s: its Spark checkpoint %s is of another history (%s) than the one the checkpoint store's "
                "offsets were written from (%s); discarding it and starting from the store's offsets",
                t.name,
                location,
                history,
                recorded,
            )
            return True
        spark_at: dict[str, str] = {}
        for source in committed.sources:
            for key, end in source.partitions.items():
                spark_at[key] = end.offset
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
        stream_id = self.runner.stream_id_of(ssp)
        admin = self.runner.plan.systems.admin(ssp.system)
        intermediate = self.runner.plan.is_intermediate(stream_id)
        if ssp in t.offsets:  # an input's may have outlived its retention; an intermediate's is never trimmed
            held = t.offsets[ssp]
            return held if intermediate else resume_offset(self.runner.plan.config, stream_id, admin, ssp, held)
        if intermediate:
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

    # --- stop -------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop the query, then checkpoint its tasks' last completed batches (their events may not have
        arrived yet). A stateless stage's Spark checkpoint is removed: it is never used again."""
        with self.guard:
            # from here the query ends on purpose: the monitor must not take its end for a death (it asks
            # `failure` from another thread while ``query.stop()`` may take seconds on a busy machine)
            self.stopping = True
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
        if self.inject_file is not None:
            self.inject_file.unlink(missing_ok=True)
        if self.counts_dir is not None:
            shutil.rmtree(self.counts_dir, ignore_errors=True)

    def failure(self) -> str | None:
        """Why the query died, or None while it runs (or after it was stopped on purpose)."""
        if self.query is None or self.stopping or self.stopped:
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
