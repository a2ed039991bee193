"""`SparkTaskRunner`: a pipeline's tasks as Spark streaming queries, checkpointed by the processor from progress.

**Queries.** The tasks a processor holds of a *stateless* stage (`StageBuilder.stateless`) run as **one**
query over all their partitions (`task.stateless.merge`), and so do those of a stage whose work is one
aggregate (`task.aggregate.merge`, `weirflow.spark.shared_aggregation`): the fixed costs of a micro-batch
(planning, state store, offset and commit logs, the source's planner process, task launches) are paid once
per stage instead of once per task. Such a query keeps nothing in its Spark checkpoint that the checkpoint
store and the streams lack (an aggregate's open windows are rebuilt from its input: `weirflow.spark.rebuild`),
so it always starts with a fresh Spark checkpoint, and it is restarted (its tasks' final checkpoints written
first) whenever the set of tasks it runs changes. Per task it keeps what a query of its own would: its lock
and fence, its control state, its checkpoint, its output watermark. Any other stateful task (a join,
deduplication) runs as a query of its own, whose Spark checkpoint holds its state and moves with it.

Queries start and stop on the runner's own threads, several at a time: `start_task` only registers the task,
so the processor's follower never waits for Spark and always reacts to a new job model within one poll.
This module holds those threads (prepare, launch, progress, monitor); one query's start and stop is
`weirflow.spark.stage_query`, what it does with each finished batch (control rows, watermarks, finish and
drain, the fenced checkpoint, stats) is `weirflow.spark.task_progress`, and the layout of Spark's checkpoint
directory is `weirflow.interfaces.spark_checkpoint`.
"""

from __future__ import annotations

import json
import logging
import queue
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from weirflow.base.errors import StartupError
from weirflow.interfaces.checkpoint import Checkpoint
from weirflow.interfaces.coordination import Lock
from weirflow.interfaces.spark_state import SparkStateStore
from weirflow.interfaces.system import SystemStreamPartition
from weirflow.job.drain_notice import run_id_of
from weirflow.job.model import TaskModel
from weirflow.pipeline.plan import PipelinePlan, Stage
from weirflow.runtime.control import TaskControl
from weirflow.runtime.served_tables import TableReader
from weirflow.runtime.trim_points import TrimScope
from weirflow.spark.fence import LeaseBoard
from weirflow.spark.progress import ProgressFeed, ProgressView
from weirflow.spark.query import StageBuilder
from weirflow.spark.shared_progress import rebuildable
from weirflow.spark.stage_query import StageQuery
from weirflow.spark.task_state import TaskState
from weirflow.tasks.runner import TaskRunner

log = logging.getLogger("weirflow.spark")

_MONITOR_S = 0.1
_SETTLE_S = 0.05  # starts wait this long after the last change, so a rebalance restarts a stage's query once
_START_THREADS = 4
_MONITOR_GIVE_UP_S = 3.0  # a query whose health check fails this long fails its tasks


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
        # where this processor's Spark workers read until when each lock is confirmed (weirflow.spark.fence)
        self.lease_board = LeaseBoard(self.checkpoint_root / "_leases" / f"{uuid.uuid4().hex}.json")
        self._locks: dict[str, str] = {}  # task -> its lock's name, while the processor's keeper keeps it
        self._tasks: dict[str, TaskState] = {}  # accepted and not stopped, finished or failed
        self._pending: set[str] = set()  # accepted, waiting for a query
        self._changed = 0.0  # monotonic time of the last change to _pending
        self._rounds = 0  # rounds of starts under way (`starting_together`): no query starts meanwhile
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
        """Whether the tasks of ``stage`` held here run as one query: a stateless stage's (`task.stateless.merge`),
        or a stage whose work is one aggregate (`task.aggregate.merge`, `weirflow.spark.shared_aggregation`)."""
        self._ready.wait()
        if self._prepare_error is not None or stage.serves:
            return False
        if self.builder.stateless(stage):
            return self.merge_stateless
        return self.builder.shared(stage).shared

    def _unit(self, t: TaskState) -> str:
        shared = self._merges(t.stage) and (self.builder.stateless(t.stage) or rebuildable(t))
        return f"stage:{t.stage.name}" if shared else f"task:{t.name}"

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
        with self._guard:
            self._locks[task.name] = lock.name
        self.leases_renewed()
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

    @contextmanager
    def starting_together(self) -> Iterator[None]:
        with self._guard:
            self._rounds += 1
        try:
            yield
        finally:
            with self._guard:
                self._rounds -= 1
            self._wake.set()

    def leases_renewed(self) -> None:
        """Publish, for the workers' fence, until when each lock the keeper still keeps is confirmed; a lock
        it no longer keeps (lost, expiring, released) is left out, so the workers refuse to send for it."""
        valid_until = self.lease_valid_until
        if valid_until is None:
            return
        with self._guard:
            published: dict[str, float] = {}
            for task, lock_name in list(self._locks.items()):
                until = valid_until(task)
                if until is None:
                    del self._locks[task]
                else:
                    published[lock_name] = until
            self.lease_board.publish(published)

    def leases_file(self) -> str:
        """The file the sink's fence reads ("" when no keeper publishes deadlines: only the store is asked)."""
        return str(self.lease_board.path) if self.lease_valid_until is not None else ""

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
        A stateless stage's other tasks restart without them. Their locks leave the workers' lease board at
        once, so the workers refuse their next send without waiting for the store."""
        task_names = list(task_names)
        with self._guard:
            for name in task_names:
                self._locks.pop(name, None)
        self.leases_renewed()
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
        """Per task running here: `TaskStats` (its own records out among them), its next offset per SSP, its
        dead letters so far and the name of the query running it."""
        with self._guard:
            tasks = [(t, self._query_of.get(t.name)) for t in self._tasks.values()]
        return {
            t.name: {
                **t.stats.to_json(),
                "dead_letters": t.control.dead_letters,
                "offsets": {ssp.key(): str(o) for ssp, o in t.offsets.items()},
                "query": q.name if q is not None else None,
            }
            for t, q in tasks
        }

    def query_stats(self) -> dict[str, dict[str, Any]]:
        """Per query running here, by its stable name: its tasks and records written per output since its start."""
        with self._guard:
            queries = list({id(q): q for q in self._query_of.values()}.values())
        return {q.name: {"tasks": len(q.tasks), "records_out": dict(q.records_out)} for q in queries}

    @property
    def table_routes(self) -> PipelinePlan:
        return self.plan  # the tables a pipeline serves (``Stream.serve``) and the task holding each key

    @property
    def intermediate_streams(self) -> list[str]:
        return list(self.plan.app.intermediates)

    def trim_scope(self) -> TrimScope:
        return self.builder.trim_scope()

    def table(self, task_name: str, table: str) -> TableReader | None:
        """Called on the endpoint server's event loop for every lookup, so it takes no lock (the guard may be held
        while a query starts or stops); single dict reads are atomic, the reader cache is the loop's alone."""
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
        self.lease_board.close()
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

    def _prepared(self) -> bool:
        """Wait for the data plane's preparation (seconds in a fresh JVM), or until closing: whether it ended.
        Grouping tasks into start units asks whether stages merge, which needs it; the launcher waits here, not
        under the guard, which the lease keeper needs to publish renewals (and so to heartbeat): held through
        the preparation, it made a new processor fence itself."""
        while not self._ready.wait(_MONITOR_S):
            if self._closing.is_set():
                return False
        return True

    def _launch_loop(self) -> None:
        """Starts the queries of pending tasks, several at a time: one per stateful task, one per stateless
        stage (restarting the stage's running query with its new set of tasks). Changes settle for
        `_SETTLE_S` first, so a rebalance that moves several tasks restarts a stage's query once."""
        while not self._closing.is_set():
            self._wake.wait(_MONITOR_S)
            self._wake.clear()
            with self._guard:
                if not self._pending or self._rounds:
                    continue
                wait = _SETTLE_S - (time.monotonic() - self._changed)
            if wait > 0:
                time.sleep(wait)
            if not self._prepared():
                return
            with self._guard:
                if self._closing.is_set():
                    return
                if self._rounds:  # a round began during the settling wait: start after it
                    continue
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
        merged = self._unit(states[0]).startswith("stage:")
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
                    raise StartupError(f"the Spark data plane could not be prepared: {self._prepare_error}")
                query = StageQuery(self, stage, members, merged, merged and not self.builder.stateless(stage))
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
