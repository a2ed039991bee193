"""`StreamProcessor`: one `weirflow run` process taking part in the job-coordination protocol.

Three loops, each a thread with one job, so that none can starve another:

* **follower** (the caller's thread, `run`): watches the job model; on version v it stops the tasks it lost
  and releases their locks, joins the latch of v, waits for the leader to complete it, then takes the lock
  of each gained task and starts it. Tasks it keeps run on undisturbed (sticky rebalance). Each step is
  resumable: a storage error part-way (joining the latch, reading its state, taking a lock) is retried on the
  next round from where it stopped, so a gained task is never left unstarted.
* **leader** (`weirflow.coordination.leader_role`): tries to win the leadership lease every poll; while
  leading, renews it and runs `LeaderDuties.tick`; on a failed renew it steps down at once, and it also steps
  down (self-fence) when no renewal was confirmed by ``deadline - margin`` (see `weirflow.coordination.keeper`);
  every write of its duties checks that deadline first (`weirflow.coordination.leader_fence`).
* **keeper** (`weirflow.coordination.keeper_role`): writes the heartbeat row and renews the task locks, each on
  its own (`LeaseKeeper`); a lock that is lost, or whose renewal is not confirmed by ``deadline - margin``, has
  its task abandoned at once (`TaskRunner.abandon_tasks`: no further output or checkpoint), before another
  processor can take it. The keeper runs until the very end of a shutdown, so the locks of tasks being stopped
  stay renewed.

An exception in any loop is logged with its traceback, stored as the processor's ``error`` (visible in
`weirflow status`) and retried on the next round; if errors go on for four lease durations
(`weirflow.coordination.processor_core`) the processor moves to FAILED and `run` returns non-zero. Nothing is
swallowed. A task stop that takes longer than `task.stop.timeout.ms` is abandoned and reported.

**Malformed documents** (`weirflow.base.malformed`: reported once, never a loop error, since no retry repairs
them):
a job model that cannot be read is not used (the processor keeps the model it works on and waits for a readable
one); a task whose checkpoint cannot be read is not started (neither from the start nor from a guess) and is
retried every `_TASK_RETRY_MS` while the other tasks run; drain notices and registry rows that cannot be read
are skipped by their readers.

**Shutdown** (`stop`, SIGTERM): the processor turns STOPPING, stops all its tasks in parallel while the keeper
keeps renewing their locks, so each writes its final checkpoint under a valid lock, then releases each lock
and leaves. Its registry row lists the tasks whose locks it still holds until they are released.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future

from weirflow.base import clock, malformed
from weirflow.base.disk import is_disk_full
from weirflow.base.errors import MalformedDocumentError
from weirflow.config.loader import Config
from weirflow.coordination.data_plane import JobDataPlane
from weirflow.coordination.drain_monitor import DrainMonitor
from weirflow.coordination.identity import Announcement, default_processor_id, ensure_sole_instance
from weirflow.coordination.job_finished import read_job_finished
from weirflow.coordination.job_model_store import read_job_model_or_report
from weirflow.coordination.keeper import LeaseKeeper
from weirflow.coordination.keeper_role import KeeperRole
from weirflow.coordination.leader import JobView
from weirflow.coordination.leader_role import LATCH_POLL_MS, LeaderRole
from weirflow.coordination.loops import Leadership, LoopErrors, run_bounded
from weirflow.coordination.server_hook import ProcessorServer
from weirflow.coordination.state import ProcessorState
from weirflow.coordination.timings import CoordinationTimings
from weirflow.interfaces.coordination import LatchState, ProcessorInfo, latch_name, task_lock_name
from weirflow.job.context import JobContext
from weirflow.job.drain_notice import run_id_of
from weirflow.job.model import JobModel, TaskModel
from weirflow.job.runs import RUN_RECORD_SOURCE, RunBook, RunDecision, deployment_of
from weirflow.tasks.runner import TaskRunner

log = logging.getLogger("weirflow.processor")

_TASK_RETRY_MS = 5000


#: Starts the processor's server (None: it runs none, e.g. with ``endpoints.enabled`` off).
ServerFactory = Callable[["StreamProcessor"], ProcessorServer | None]


class StreamProcessor(LeaderRole, KeeperRole):
    """Runs one processor of a job until `stop` is called (or a persistent error).

    ``runner_factory`` builds the `TaskRunner` from the opened `JobContext`; ``planner_factory`` builds the
    function the leader calls to plan the job's tasks. Both default to the job's own data plane
    (`weirflow.coordination.data_plane`). ``server_factory`` starts what serves the processor's state over the
    network (`weirflow.endpoints.processor_server`, which `weirflow run` passes); None: nothing.
    """

    def __init__(
        self,
        config: Config,
        *,
        processor_id: str | None = None,
        runner_factory: Callable[[JobContext], TaskRunner] | None = None,
        planner_factory: Callable[[JobContext], Callable[[], dict[str, TaskModel]]] | None = None,
        server_factory: ServerFactory | None = None,
    ) -> None:
        self.config = config
        self.processor_id = processor_id or config.get("processor.id") or default_processor_id()
        # this run of the processor: leases are held by (processor id, instance); weirflow.coordination.identity
        self.instance_id = uuid.uuid4().hex[:12]
        self.timings = CoordinationTimings.from_config(config)
        plane = JobDataPlane()
        self._runner_factory = runner_factory or plane.runner
        self._planner_factory = planner_factory or plane.planner
        self._server_factory = server_factory
        self.finished = False
        self._state = ProcessorState.NEW
        self._state_lock = threading.Lock()
        self._stop = threading.Event()  # ends the follower and leader loops (set through `_halt`)
        # A loop's pause between rounds ends early when the other loop of this process has news for it: the
        # leader published a model or completed a latch (the follower), the follower joined a latch (the
        # leader). Processors of other processes see the same news at their next poll.
        self._wake_follower = threading.Event()
        self._wake_leader = threading.Event()
        self._keeper_stop = threading.Event()  # ends the keeper, last of all
        self.error = ""
        self._fatal = False
        self._model = JobModel.empty()
        self._working_version = -1
        self._awaiting_latch = False  # joined (or joining) the latch of the working version, not yet complete
        self._latch_joined = False
        self._latch_complete = False  # the working version's latch completed: its tasks may run
        self._round_again = False  # the follower's next round runs without a pause
        self._keeper = LeaseKeeper(self.timings)  # the task locks held, by task name
        self._pending: dict[str, int] = {}  # gained task -> earliest next start attempt (ms); follower only
        self._unreadable: dict[str, str] = {}  # pending task -> why its checkpoint cannot be read; follower only
        self._lost: set[str] = set()  # tasks the keeper abandoned (lock lost); the follower retries them
        self._lost_guard = threading.Lock()
        self._started_ms = clock.now_ms()
        self._heartbeat_now = threading.Event()
        self._heartbeat_future: Future[None] | None = None
        self._heartbeat_again = False
        self._last_heartbeat = float("-inf")
        self._beats = itertools.count(1_000_000)  # above the announcement's beats: the row's beat only grows
        self._next_finished_read = 0.0
        self._finished_known = False  # this process's leader wrote `job-finished` (the follower then reads it)
        self._drain: DrainMonitor | None = None
        self.ctx: JobContext | None = None
        self.runner: TaskRunner | None = None
        self._tenure: Leadership | None = None
        self._server: ProcessorServer | None = None
        self.endpoint_url = ""
        self.rebalances = 0  # job models this processor moved to (GET /metrics)

    # --- public ---------------------------------------------------------------------------------------
    @property
    def state(self) -> ProcessorState:
        return self._state

    def stop(self) -> None:
        """Ask the processor to stop; `run` then stops every task, releases its leases and returns. Call it from
        any thread but not from a signal handler of the thread running `run`, which may hold the lock of an
        event this sets (`weirflow run` hands signals to a thread of their own)."""
        self._halt()

    def run(self) -> int:
        """Run until stopped. Returns 0 after a clean stop, 1 after a persistent error (FAILED)."""
        self.ctx = JobContext.open(self.config, self.processor_id, self.instance_id, self.timings)
        registry = self.ctx.coordination.processor_registry()
        try:
            ensure_sole_instance(registry, self.processor_id, self.instance_id, self.timings)
        except Exception:
            self.ctx.close()
            raise
        decision = self._choose_run()
        if decision.superseded:
            log.warning(
                "this processor's deployment drained and was upgraded: the job now runs as %s; exiting without "
                'running anything (stop this deployment\'s processors; docs/drain.md, "Run ids")',
                decision.how.removeprefix("superseded by "),
            )
            self.finished = True
            self.ctx.close()
            return 0
        starting = ProcessorInfo(
            self.processor_id,
            socket.gethostname(),
            os.getpid(),
            ProcessorState.NEW.value,
            started_ms=clock.now_ms(),
            instance=self.instance_id,
        )
        # The announcement's heartbeats cover everything up to the processor's own first one: the data plane
        # (a Spark session), the endpoint server, the planner. A gap between the two longer than the liveness
        # timeout (an endpoint server starting on a loaded machine) had the leader count this processor silent,
        # publish a model without it, and record a failover that never was.
        announcement = Announcement(registry, starting, self.timings).start()
        try:
            self.runner = self._runner_factory(self.ctx)
            self.runner.on_started = self._heartbeat_now.set
            self.runner.lease_valid = self._keeper.valid
            self.runner.lease_valid_until = self._keeper.valid_until
            if self._server_factory is not None:
                self._server = self._server_factory(self)
                self.endpoint_url = self._server.url if self._server is not None else ""
            planner = self._planner_factory(self.ctx)
            self._drain = DrainMonitor(self.ctx.metadata, self.config)
        except BaseException:
            announcement.stop(failed=True)
            raise
        announcement.stop()
        self._set_state(ProcessorState.STARTED)
        # Registration time stays the announcement's: the leader debounces membership from the latest member's,
        # and the announcement's row made this processor a member while its data plane started. Counting it from
        # here instead would make the first leader of a job, or a joiner the leader has not published yet, wait
        # a debounce more after its Spark session was ready; a burst of processors starting together announces
        # together, so it is still debounced into one model.
        self._started_ms = starting.started_ms
        self._write_heartbeat()
        log.info("processor %s started", self.processor_id)
        leader = threading.Thread(target=self._leader_loop, args=(planner,), name="leader", daemon=True)
        keeper = threading.Thread(target=self._keeper_loop, name="keeper", daemon=True)
        leader.start()
        keeper.start()
        try:
            self._follower_loop()
        finally:
            self._shutdown(leader, keeper)
        return 1 if self._fatal else 0

    def _choose_run(self) -> RunDecision:
        """Resolve the run this processor belongs to (`weirflow.job.runs`) and run under it: the config (and the
        context every part of the processor reads it from) gets it as `app.run.id`."""
        assert self.ctx is not None
        explicit = self.config.get("app.run.id") or None
        decision = RunBook(self.ctx.metadata).resolve(deployment_of(self.config), explicit)
        log.info("run %s (%s)", decision.run_id, decision.how)
        if explicit is None and not decision.superseded:
            self.config = self.config.with_values({"app.run.id": decision.run_id}, RUN_RECORD_SOURCE)
            self.ctx = dataclasses.replace(self.ctx, config=self.config)
        return decision

    # --- plain state (read by the processor's server) ------------------------------------------------
    @property
    def leading(self) -> bool:
        return self._tenure is not None and self._tenure.duties is not None

    @property
    def job_view(self) -> JobView | None:
        """The job as this processor saw it at its last tick as leader (`JobView`); None unless it leads."""
        tenure = self._tenure
        return tenure.duties.view if tenure is not None and tenure.duties is not None else None

    @property
    def working_version(self) -> int:
        """The job model version this processor works on (-1 before the first)."""
        return self._working_version

    @property
    def lease_renewals(self) -> int:
        """Task-lock renewals confirmed so far (`LeaseKeeper.renewals`)."""
        return self._keeper.renewals

    def owner_of(self, task: str) -> str | None:
        """The processor the job model this processor knows assigns ``task`` to."""
        return self._model.owner_of(task)

    # --- state ----------------------------------------------------------------------------------------
    def _info(self) -> ProcessorInfo:
        assert self.runner is not None
        tasks = self.runner.running() - self.runner.starting()
        if self._state is ProcessorState.STOPPING:
            tasks |= self._keeper.names()  # still holds their locks: not to be moved yet
        return ProcessorInfo(
            processor_id=self.processor_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            state=self._state.value,
            job_model_version=self._working_version,
            tasks=sorted(tasks),
            heartbeat_ms=clock.now_ms(),
            started_ms=self._started_ms,
            error=self.error,
            instance=self.instance_id,
            beat=next(self._beats),
            endpoint=self.endpoint_url,
        )

    def _write_heartbeat(self) -> None:
        assert self.ctx is not None
        sent_at = self._keeper.now()  # before the request: the alive deadline counts from here
        self.ctx.coordination.processor_registry().heartbeat(self._info())
        self._keeper.heartbeat_confirmed(sent_at)

    # --- follower -------------------------------------------------------------------------------------
    def _follower_loop(self) -> None:
        errors = LoopErrors()
        while not self._stop.is_set():
            try:
                self._follower_round()
                self._recovered(errors, "follower")
            except Exception as exc:
                self._loop_error("follower", errors, exc)
            if self.finished:
                break
            if self._round_again:  # the model moved on while this round waited on a latch: read it now
                self._round_again = False
                continue
            self._wait(self._round_ms(), self._wake_follower)

    def _follower_round(self) -> None:
        assert self.ctx is not None
        stored = self._read_model()
        model = self._model if stored is None else stored
        if stored is not None and stored.version > self._working_version:
            self._begin_rebalance(stored)
        if self._awaiting_latch:
            self._await_latch()
        self._start_pending(model)
        if (
            self._latch_complete
            and self._state is ProcessorState.IN_REBALANCE
            and model.version == self._working_version
        ):
            self._set_state(ProcessorState.RUNNING)  # a rebalance resumed after an error
        self._reap_failed_tasks()
        if self._drain is not None and self._drain.poll() is not None:
            assert self.runner is not None
            self.runner.drain(self._drain.run_id)
            watch = self._tenure.finished if self._tenure is not None else None  # read once: the leader's thread
            if watch is not None:  # may step down meanwhile
                watch.hurry(self._finished_check_ms())
        if self._job_finished(model):
            if self._drain is not None and self._drain.notice is not None:
                log.info("job drained: all %d tasks stopped at their cut with nothing in flight", len(model.tasks))
            else:
                log.info("job finished: all %d tasks consumed their bounded inputs", len(model.tasks))
            self.finished = True
            self._halt()

    def _job_finished(self, model: JobModel) -> bool:
        """Whether the leader recorded every task of the model as finished (`weirflow.coordination.job_finished`):
        one small read at most every `job.coordinator.finished.check.interval.ms`, never a checkpoint scan."""
        assert self.ctx is not None
        if not model.tasks or model.version != self._working_version or self._awaiting_latch:
            return False
        now = time.monotonic()
        if now < self._next_finished_read:
            return False
        self._next_finished_read = now + self._finished_check_ms() / 1000
        return read_job_finished(self.ctx.metadata, model, run_id_of(self.config))

    def _finished_check_ms(self) -> int:
        """How often the end of the job is checked (the leader) and read (everyone): every poll while a drain is
        under way, since every second between its last task drained and the exit is a second the drain takes."""
        interval_ms = self.timings.finished_check_interval_ms
        if self._drain is not None and self._drain.notice is not None:
            interval_ms = min(interval_ms, self._round_ms())
        return interval_ms

    def _read_model(self) -> JobModel | None:
        """The published job model, or None when the stored document is malformed: it is reported once
        (`weirflow.base.malformed`) and not used; the processor keeps the model it works on and waits for the
        leader
        (or an operator) to publish a readable one, instead of failing over a document no retry can repair."""
        assert self.ctx is not None
        model, _ = read_job_model_or_report(self.ctx.metadata)
        return model

    def _newer_model_published(self, version: int) -> bool:
        model = self._read_model()
        return model is not None and model.version > version

    def _begin_rebalance(self, model: JobModel) -> None:
        """Model v arrived: stop the tasks moved away, then wait on v's latch (`_await_latch`)."""
        assert self.runner is not None
        if self._state in (ProcessorState.STARTED, ProcessorState.RUNNING):
            self._set_state(ProcessorState.IN_REBALANCE)
        mine = set(model.tasks_of(self.processor_id))
        self.rebalances += 1
        log.info("job model v%d: %d tasks for this processor", model.version, len(mine))
        self._stop_tasks(sorted(self.runner.running() - mine), reason=f"moved away in v{model.version}")
        self._pending = {t: p for t, p in self._pending.items() if t in mine}
        self._unreadable = {t: why for t, why in self._unreadable.items() if t in mine}
        self._model = model
        self._working_version = model.version
        self._latch_joined = False
        self._latch_complete = False
        self._awaiting_latch = True

    def _await_latch(self) -> None:
        """Join the working version's latch (once), wait for it to complete, then take and start the gained
        tasks. Raises on a storage error; the next round resumes here (joining is idempotent)."""
        assert self.ctx is not None and self.runner is not None
        model = self._model
        latch = self.ctx.coordination.latch(latch_name(model.version))
        if not self._latch_joined:
            latch.join(self.processor_id)
            self._latch_joined = True
            self._heartbeat_now.set()
            self._wake_leader.set()  # if this process leads, it completes the latch now
        while not self._stop.is_set():
            state = latch.state()
            if state is LatchState.COMPLETE:
                break
            if state is LatchState.TIMED_OUT or self._newer_model_published(model.version):
                log.info("job model v%d superseded before its latch completed", model.version)
                self._awaiting_latch = False
                self._round_again = True
                return
            self._wait(min(LATCH_POLL_MS, self.timings.poll_interval_ms), self._wake_follower)
        if self._stop.is_set():
            return
        self._awaiting_latch = False
        self._latch_complete = True
        now = clock.now_ms()
        for task in sorted(set(model.tasks_of(self.processor_id)) - self.runner.running()):
            self._pending.setdefault(task, now)
        self._start_pending(model, deadline_ms=now + self.timings.lock_timeout_ms)
        self._set_state(ProcessorState.RUNNING)

    def _start_pending(self, model: JobModel, deadline_ms: int | None = None) -> None:
        """Take the lock of each pending task and start it. With a deadline, keep trying until every task
        started, the deadline passed, a newer model appeared or stop was requested."""
        assert self.ctx is not None and self.runner is not None
        if model.version != self._working_version or self._awaiting_latch:
            return
        while self._pending and not self._stop.is_set():
            now = clock.now_ms()
            with self.runner.starting_together():
                refused = []  # locks held elsewhere
                for task in sorted(self._pending):
                    if self._pending[task] <= now and not self._start_one(model, task):
                        refused.append(task)
                for task in self._break_silent_locks(refused):
                    self._start_one(model, task)
            if deadline_ms is None or not set(self._pending) - set(self._unreadable):
                return
            if now >= deadline_ms:
                self.error = f"could not take the locks of {sorted(self._pending)} within the lock timeout"
                log.error(self.error)
                return
            if self._newer_model_published(model.version):
                return
            self._wait(self.timings.poll_interval_ms, self._wake_follower)

    def _start_one(self, model: JobModel, task: str) -> bool:
        """Take the task's lock and start it; it stays pending when the lock is held elsewhere (False)."""
        assert self.ctx is not None and self.runner is not None
        lock = self.ctx.coordination.lock(task_lock_name(task))
        sent_at = self._keeper.now()  # before the request: the lease's local deadline counts from here
        if not lock.try_acquire():
            return False
        self._keeper.add(task, lock, sent_at)
        try:
            self.runner.start_task(model.tasks[task], lock)
        except MalformedDocumentError as exc:
            self._checkpoint_unreadable(task, exc)
            return True
        del self._pending[task]
        if self._unreadable.pop(task, None) is not None and self.error.startswith(f"task {task} not "):
            self.error = ""  # its checkpoint was repaired
        log.info("started task %s (v%d)", task, model.version)
        self._heartbeat_now.set()
        return True

    def _break_silent_locks(self, refused: list[str]) -> list[str]:
        """Of the tasks whose locks were refused, those whose holder is silent past the liveness timeout, with
        their locks broken (`weirflow.coordination.silence`): they can be taken at once. One registry read."""
        assert self.ctx is not None
        if not refused:
            return []
        holders = self._silent_holders()
        silent = holders.silent()
        if not silent:
            return []
        broken = []
        for task in refused:
            lock = self.ctx.coordination.lock(task_lock_name(task))
            if holders.break_lease(
                f"the lock of task {task}", lock.current_holder(), silent, lock.break_if_held_by
            ):
                broken.append(task)
        return broken

    def _checkpoint_unreadable(self, task: str, exc: MalformedDocumentError) -> None:
        """The task's checkpoint is malformed: the task is not started (starting it as if it had none would
        replay its inputs from the start, and guessing its positions could skip records), its lock is released
        and it is tried again every `_TASK_RETRY_MS`, so a repaired checkpoint is picked up; the processor's
        other tasks run on. Reported once per checkpoint content (`weirflow.base.malformed`)."""
        self._release(task)
        self._pending[task] = clock.now_ms() + _TASK_RETRY_MS
        first = self._unreadable.get(task) != str(exc)
        self._unreadable[task] = str(exc)
        self.error = f"task {task} not started: its checkpoint cannot be read: {exc}"
        malformed.report(f"checkpoint/{task}", exc, action=f"task {task} is not started until it is repaired")
        if first:
            log.error("%s; retrying every %d s", self.error, _TASK_RETRY_MS // 1000)

    def _stop_tasks(self, tasks: list[str], reason: str) -> None:
        """Stop ``tasks`` in parallel (each writes its final checkpoint) while the keeper renews their locks,
        then release the locks. A stop that fails or outlasts `task.stop.timeout.ms` is abandoned (nothing more
        is written) and reported; the locks are released either way."""
        assert self.runner is not None
        if not tasks:
            return
        runner = self.runner
        timeout_ms = self.timings.task_stop_timeout_ms
        try:
            stopped = run_bounded(lambda: runner.stop_tasks(tasks), timeout_ms / 1000, "stop-tasks")
            problem = "" if stopped else f"did not stop within task.stop.timeout.ms ({timeout_ms} ms)"
        except Exception as exc:
            problem = f"failed to stop ({type(exc).__name__}: {exc})"
            log.error("stopping %s failed", ", ".join(tasks), exc_info=exc)
        if problem:
            runner.abandon_tasks(tasks)
            self.error = f"tasks {', '.join(tasks)} {problem}; abandoned (they resume from their last checkpoint)"
            log.error(self.error)
        for task in tasks:
            self._release(task)
            log.info("stopped task %s (%s)", task, reason)
        self._heartbeat_now.set()

    def _release(self, task: str) -> None:
        lock = self._keeper.remove(task)
        if lock is None:
            return
        try:
            lock.release()
        except Exception as exc:  # the lease expires on its own; nothing of the task runs any more
            log.error("could not release the lock of task %s (it expires by itself): %s", task, exc)

    def _reap_failed_tasks(self) -> None:
        assert self.runner is not None
        with self._lost_guard:
            lost, self._lost = self._lost, set()
        for task in lost:
            if task in self._model.tasks_of(self.processor_id):
                self._pending[task] = clock.now_ms() + self.timings.poll_interval_ms
        for task, error in self.runner.failures().items():
            self.runner.forget(task)
            self._release(task)
            if is_disk_full(error):
                self._stop_on_full_disk(f"task {task}", error)
                return
            self.error = f"task {task}: {error}"
            if task in self._model.tasks_of(self.processor_id):
                self._pending[task] = clock.now_ms() + _TASK_RETRY_MS
                log.error("task %s failed (%s); retrying in %d s", task, error, _TASK_RETRY_MS // 1000)

    # --- leader ---------------------------------------------------------------------------------------
    # --- shutdown -------------------------------------------------------------------------------------
    def _shutdown(self, leader: threading.Thread, keeper: threading.Thread) -> None:
        """Stop every task in parallel while the keeper still renews their locks, release the locks, then stop
        the keeper and write the final row."""
        assert self.ctx is not None and self.runner is not None
        if self._state is not ProcessorState.FAILED:
            self._set_state(ProcessorState.STOPPING)
        self._halt()
        self._heartbeat_now.set()
        leader.join()
        try:
            self._stop_tasks(sorted(self.runner.running() | self._keeper.names()), reason="processor stopping")
            self.runner.close()
            for lock in self._keeper.remove_all():
                try:
                    lock.release()
                except Exception as exc:
                    log.error("could not release lock %s (it expires by itself): %s", lock.name, exc)
        finally:
            self._keeper_stop.set()
            self._heartbeat_now.set()
            keeper.join()
            self._keeper.close(timeout_s=self.timings.lease_ms / 1000)
            self._state = ProcessorState.STOPPED if not self._fatal else ProcessorState.FAILED
            try:
                self._write_heartbeat()
            except Exception as exc:
                log.error("could not write the final heartbeat: %s", exc)
            if self._server is not None:
                self._server.stop()
            self.ctx.close()
            log.info("processor %s stopped", self.processor_id)
