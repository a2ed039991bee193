"""`StreamProcessor`: one `weirflow run` process taking part in the job-coordination protocol.

Three loops, each a thread with one job, so that none can starve another:

* **follower** (the caller's thread, `run`): watches the job model; on version v it stops the tasks it lost
  and releases their locks, joins the latch of v, waits for the leader to complete it, then takes the lock
  of each gained task and starts it. Tasks it keeps run on undisturbed (sticky rebalance).
* **leader**: tries to win the leadership lease every poll; while leading, renews it and runs
  `LeaderDuties.tick`; on a failed renew it steps down at once.
* **keeper**: writes the heartbeat row and renews the task locks; a lock that cannot be renewed stops its
  task at once (the fence: the task's next checkpoint would be refused anyway).

An exception in any loop is logged with its traceback, stored as the processor's ``error`` (visible in
`weirflow status`) and retried on the next round; if errors go on for `_FATAL_AFTER_LEASES` lease durations
the processor moves to FAILED and `run` returns non-zero. Nothing is swallowed.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from typing import Any

from weirflow import clock
from weirflow.coordination.job_model_store import latch_name, read_job_model, task_lock_name
from weirflow.coordination.leader import LeaderDuties
from weirflow.coordination.state import ProcessorState, check_transition
from weirflow.coordination.timings import CoordinationTimings
from weirflow.interfaces.coordination import LatchState, Lock, ProcessorInfo
from weirflow.job_context import JobContext
from weirflow.job_model import JobModel, TaskModel
from weirflow.tasks.runner import TaskRunner

log = logging.getLogger("weirflow.processor")

_FATAL_AFTER_LEASES = 4
_TASK_RETRY_MS = 5000


def default_processor_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class _LoopErrors:
    """Consecutive-failure bookkeeping of one loop: the first error time, to decide when to give up."""

    def __init__(self) -> None:
        self.since_ms: int | None = None

    def ok(self) -> bool:
        """Record a good round; True when it ends a run of failures."""
        recovered = self.since_ms is not None
        self.since_ms = None
        return recovered

    def failed(self, now: int) -> int:
        if self.since_ms is None:
            self.since_ms = now
        return now - self.since_ms


class StreamProcessor:
    """Runs one processor of a job until `stop` is called (or a persistent error).

    ``runner_factory`` builds the `TaskRunner` from the opened `JobContext`; ``planner_factory`` builds the
    function the leader calls to plan the job's tasks. Both default to the record-task data plane.
    """

    def __init__(
        self,
        config: Any,
        *,
        processor_id: str | None = None,
        runner_factory: Callable[[JobContext], TaskRunner] | None = None,
        planner_factory: Callable[[JobContext], Callable[[], dict[str, TaskModel]]] | None = None,
    ) -> None:
        self.config = config
        self.processor_id = processor_id or config.get("processor.id") or default_processor_id()
        self.timings = CoordinationTimings.from_config(config)
        self._runner_factory = runner_factory or _default_runner
        self._planner_factory = planner_factory or _default_planner
        self.finished = False
        self._state = ProcessorState.NEW
        self._state_lock = threading.Lock()
        self._stop = threading.Event()
        self.error = ""
        self._fatal = False
        self._model = JobModel.empty()
        self._working_version = -1
        self._locks: dict[str, Lock] = {}
        self._locks_guard = threading.Lock()
        self._pending: dict[str, int] = {}  # gained task -> earliest next start attempt (ms); follower only
        self._lost: set[str] = set()  # tasks whose lock the keeper found lost; the follower retries them
        self._started_ms = clock.now_ms()
        self._heartbeat_now = threading.Event()
        self.ctx: JobContext | None = None
        self.runner: TaskRunner | None = None

    # --- public ---------------------------------------------------------------------------------------
    @property
    def state(self) -> ProcessorState:
        return self._state

    def stop(self) -> None:
        """Ask the processor to stop; `run` then stops every task, releases its leases and returns."""
        self._stop.set()

    def run(self) -> int:
        """Run until stopped. Returns 0 after a clean stop, 1 after a persistent error (FAILED)."""
        self.ctx = JobContext.open(self.config, self.processor_id)
        self.runner = self._runner_factory(self.ctx)
        self.runner.on_started = self._heartbeat_now.set
        planner = self._planner_factory(self.ctx)
        self._set_state(ProcessorState.STARTED)
        # registration time: the leader debounces membership from it, so it must not include the time this
        # process took to get here (a Spark session takes seconds), or a burst of joins is not debounced
        self._started_ms = clock.now_ms()
        self._write_heartbeat()
        log.info("processor %s started", self.processor_id)
        threads = [
            threading.Thread(target=self._leader_loop, args=(planner,), name="leader", daemon=True),
            threading.Thread(target=self._keeper_loop, name="keeper", daemon=True),
        ]
        for thread in threads:
            thread.start()
        try:
            self._follower_loop()
        finally:
            self._shutdown(threads)
        return 1 if self._fatal else 0

    # --- state ----------------------------------------------------------------------------------------
    def _set_state(self, new: ProcessorState) -> None:
        with self._state_lock:
            if self._state is new:
                return
            check_transition(self._state, new)
            log.info("state %s -> %s", self._state.value, new.value)
            self._state = new
        self._heartbeat_now.set()

    def _info(self) -> ProcessorInfo:
        assert self.runner is not None
        return ProcessorInfo(
            processor_id=self.processor_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            state=self._state.value,
            job_model_version=self._working_version,
            tasks=sorted(self.runner.running() - self.runner.starting()),
            heartbeat_ms=clock.now_ms(),
            started_ms=self._started_ms,
            error=self.error,
        )

    def _write_heartbeat(self) -> None:
        assert self.ctx is not None
        self.ctx.coordination.processor_registry().heartbeat(self._info())

    def _loop_error(self, loop: str, errors: _LoopErrors, exc: BaseException) -> None:
        elapsed = errors.failed(clock.now_ms())
        self.error = f"{loop}: {type(exc).__name__}: {exc}"
        log.error("%s loop error (failing for %d ms): %s", loop, elapsed, exc, exc_info=exc)
        if elapsed > self.timings.lease_ms * _FATAL_AFTER_LEASES:
            log.critical("%s loop has failed for %d s; the processor gives up", loop, elapsed // 1000)
            self._fatal = True
            self._set_state(ProcessorState.FAILED)
            self._stop.set()

    def _recovered(self, errors: _LoopErrors, loop: str) -> None:
        if errors.ok() and self.error.startswith(f"{loop}:"):
            log.info("%s loop recovered", loop)
            self.error = ""

    def _wait(self, ms: int) -> bool:
        """Sleep up to ``ms`` unless stopping; True when stop was requested."""
        return self._stop.wait(ms / 1000)

    # --- follower -------------------------------------------------------------------------------------
    def _follower_loop(self) -> None:
        assert self.ctx is not None
        errors = _LoopErrors()
        while not self._stop.is_set():
            try:
                model, _ = read_job_model(self.ctx.metadata)
                if model.version > self._working_version:
                    self._rebalance(model)
                self._start_pending(model)
                self._reap_failed_tasks()
                if self._job_finished(model):
                    log.info("job finished: all %d tasks consumed their bounded inputs", len(model.tasks))
                    self.finished = True
                    self._stop.set()
                    break
                self._recovered(errors, "follower")
            except Exception as exc:
                self._loop_error("follower", errors, exc)
            self._wait(self.timings.poll_interval_ms)

    def _job_finished(self, model: JobModel) -> bool:
        """Every task of the model checkpointed ``finished`` (bounded inputs consumed, end-of-stream sent)."""
        assert self.ctx is not None
        if not model.tasks or model.version != self._working_version:
            return False
        checkpoints = self.ctx.checkpoints.read_all()
        return all(
            name in checkpoints and dict(checkpoints[name].control).get("finished") for name in model.tasks
        )

    def _newer_model_published(self, version: int) -> bool:
        assert self.ctx is not None
        return read_job_model(self.ctx.metadata)[0].version > version

    def _rebalance(self, model: JobModel) -> None:
        assert self.ctx is not None and self.runner is not None
        if self._state in (ProcessorState.STARTED, ProcessorState.RUNNING):
            self._set_state(ProcessorState.IN_REBALANCE)
        mine = set(model.tasks_of(self.processor_id))
        log.info("job model v%d: %d tasks for this processor", model.version, len(mine))
        self._stop_tasks(sorted(self.runner.running() - mine), reason=f"moved away in v{model.version}")
        self._pending = {t: p for t, p in self._pending.items() if t in mine}
        self._model = model
        self._working_version = model.version
        latch = self.ctx.coordination.latch(latch_name(model.version))
        latch.join(self.processor_id)
        self._heartbeat_now.set()
        while not self._stop.is_set():
            state = latch.state()
            if state is LatchState.COMPLETE:
                break
            if state is LatchState.TIMED_OUT or self._newer_model_published(model.version):
                log.info("job model v%d superseded before its latch completed", model.version)
                return
            self._wait(self.timings.poll_interval_ms)
        if self._stop.is_set():
            return
        now = clock.now_ms()
        for task in sorted(mine - self.runner.running()):
            self._pending.setdefault(task, now)
        self._start_pending(model, deadline_ms=now + self.timings.lock_timeout_ms)
        self._set_state(ProcessorState.RUNNING)

    def _start_pending(self, model: JobModel, deadline_ms: int | None = None) -> None:
        """Take the lock of each pending task and start it. With a deadline, keep trying until every task
        started, the deadline passed, a newer model appeared or stop was requested."""
        assert self.ctx is not None and self.runner is not None
        if model.version != self._working_version:
            return
        while self._pending and not self._stop.is_set():
            now = clock.now_ms()
            for task in sorted(self._pending):
                if self._pending[task] > now:
                    continue
                lock = self.ctx.coordination.lock(task_lock_name(task))
                if lock.try_acquire():
                    with self._locks_guard:
                        self._locks[task] = lock
                    self.runner.start_task(model.tasks[task], lock)
                    del self._pending[task]
                    log.info("started task %s (v%d)", task, model.version)
                    self._heartbeat_now.set()
            if deadline_ms is None or not self._pending:
                return
            if now >= deadline_ms:
                self.error = f"could not take the locks of {sorted(self._pending)} within the lock timeout"
                log.error(self.error)
                return
            if self._newer_model_published(model.version):
                return
            self._wait(self.timings.poll_interval_ms)

    def _stop_task(self, task: str, reason: str) -> None:
        self._stop_tasks([task], reason)

    def _stop_tasks(self, tasks: list[str], reason: str) -> None:
        """Stop ``tasks`` (each writes its final checkpoint), then release their locks."""
        assert self.runner is not None
        if not tasks:
            return
        self.runner.stop_tasks(tasks)
        for task in tasks:
            with self._locks_guard:
                lock = self._locks.pop(task, None)
            if lock is not None:
                lock.release()
            log.info("stopped task %s (%s)", task, reason)
        self._heartbeat_now.set()

    def _reap_failed_tasks(self) -> None:
        assert self.runner is not None
        with self._locks_guard:
            lost, self._lost = self._lost, set()
        for task in lost:
            if task in self._model.tasks_of(self.processor_id):
                self._pending[task] = clock.now_ms() + self.timings.poll_interval_ms
        for task, error in self.runner.failures().items():
            self.runner.forget(task)
            with self._locks_guard:
                lock = self._locks.pop(task, None)
            if lock is not None:
                lock.release()
            self.error = f"task {task}: {error}"
            if task in self._model.tasks_of(self.processor_id):
                self._pending[task] = clock.now_ms() + _TASK_RETRY_MS
                log.error("task %s failed (%s); retrying in %d s", task, error, _TASK_RETRY_MS // 1000)

    # --- leader ---------------------------------------------------------------------------------------
    def _leader_loop(self, planner: Callable[[], dict[str, TaskModel]]) -> None:
        assert self.ctx is not None
        elector = self.ctx.coordination.leader_elector()
        duties: LeaderDuties | None = None
        last_renew = 0.0
        errors = _LoopErrors()
        while not self._stop.is_set():
            try:
                now = clock.now_ms()
                if duties is None:
                    if elector.try_become_leader():
                        log.info("became leader")
                        last_renew = now
                        duties = LeaderDuties(
                            self.processor_id, self.ctx.coordination, self.ctx.metadata, planner, self.timings
                        )
                elif now - last_renew >= self.timings.renew_interval_ms:
                    if elector.renew():
                        last_renew = now
                    else:
                        log.warning("lost leadership (lease renewal failed); stepping down")
                        duties = None
                if duties is not None:
                    duties.tick()
                self._recovered(errors, "leader")
            except Exception as exc:
                self._loop_error("leader", errors, exc)
            self._wait(self.timings.poll_interval_ms)
        try:
            elector.resign()
        except Exception as exc:
            log.error("could not resign leadership: %s", exc)

    # --- keeper ---------------------------------------------------------------------------------------
    def _keeper_loop(self) -> None:
        last_heartbeat = last_renew = clock.now_ms()
        errors = _LoopErrors()
        tick_s = min(self.timings.poll_interval_ms, self.timings.heartbeat_interval_ms) / 1000
        while not self._stop.is_set():
            self._heartbeat_now.wait(tick_s)
            if self._stop.is_set():
                break
            try:
                now = clock.now_ms()
                if now - last_renew >= self.timings.renew_interval_ms:
                    self._renew_locks()
                    last_renew = now
                if self._heartbeat_now.is_set() or now - last_heartbeat >= self.timings.heartbeat_interval_ms:
                    self._heartbeat_now.clear()
                    self._write_heartbeat()
                    last_heartbeat = now
                self._recovered(errors, "keeper")
            except Exception as exc:
                self._loop_error("keeper", errors, exc)

    def _renew_locks(self) -> None:
        with self._locks_guard:
            held = dict(self._locks)
        for task, lock in held.items():
            if not lock.renew():
                log.error("lost the lock of task %s; stopping it before it writes anything", task)
                self.error = f"lost the lock of task {task}"
                self._stop_task(task, reason="lock lost")
                with self._locks_guard:
                    self._lost.add(task)

    # --- shutdown -------------------------------------------------------------------------------------
    def _shutdown(self, threads: list[threading.Thread]) -> None:
        assert self.ctx is not None and self.runner is not None
        if self._state is not ProcessorState.FAILED:
            self._set_state(ProcessorState.STOPPING)
        self._stop.set()
        self._heartbeat_now.set()
        for thread in threads:
            thread.join()
        try:
            self._stop_tasks(sorted(self.runner.running()), reason="processor stopping")
            self.runner.close()
            with self._locks_guard:
                leftover = list(self._locks.values())
                self._locks.clear()
            for lock in leftover:
                lock.release()
        finally:
            self._state = ProcessorState.STOPPED if not self._fatal else ProcessorState.FAILED
            try:
                self._write_heartbeat()
            except Exception as exc:
                log.error("could not write the final heartbeat: %s", exc)
            self.ctx.close()
            log.info("processor %s stopped", self.processor_id)


def _default_runner(ctx: JobContext) -> TaskRunner:
    """The Spark data plane when the job has a pipeline (`app.pipeline`), else the record runner."""
    if ctx.config.get("app.pipeline"):
        from weirflow.spark.plane import data_plane

        return data_plane(ctx).runner
    return _record_runner(ctx)


def _default_planner(ctx: JobContext) -> Callable[[], dict[str, TaskModel]]:
    if ctx.config.get("app.pipeline"):
        from weirflow.spark.plane import data_plane

        return data_plane(ctx).planner()
    return _record_planner(ctx)


def _record_runner(ctx: JobContext) -> TaskRunner:
    from weirflow.tasks.record_task import RecordTaskRunner

    return RecordTaskRunner.from_config(ctx.config, ctx.systems, ctx.checkpoints)


def _record_planner(ctx: JobContext) -> Callable[[], dict[str, TaskModel]]:
    from weirflow.tasks.planning import plan_record_tasks

    return lambda: plan_record_tasks(ctx.config, ctx.systems)
