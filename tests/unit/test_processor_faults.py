"""`StreamProcessor` under injected faults, in-process on the embedded SQLite backend (real SQLite; the faults
are wrappers of our own `Latch` and `CheckpointManager` interfaces, and the data plane is a fake runner).

* a storage error part-way through joining a latch is retried, and every assigned task still starts;
* "job finished" costs no checkpoint scan: the leader reads one checkpoint per unfinished task, rarely, and
  everyone else reads one small document;
* a task stop that hangs is abandoned after `task.stop.timeout.ms` and reported;
* a lock whose renewal hangs has its task abandoned before the lease can expire, while the other locks and
  the heartbeat go on being renewed;
* a processor whose start takes longer than the liveness timeout after its data plane exists (its endpoint
  server) stays live all along: no failover is recorded for it;
* a processor that fails to start after the leader counted it marks its row failed and is treated as gone at
  once, with no failover recorded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from weirflow.base.errors import ServiceUnavailableError, StartupError
from weirflow.config import load_config
from weirflow.coordination.job_finished import JOB_FINISHED_KEY
from weirflow.coordination.job_model_store import read_job_model
from weirflow.coordination.model_history import read_history_or_report
from weirflow.coordination.processor import StreamProcessor
from weirflow.endpoints.processor_server import serving_processor
from weirflow.interfaces.checkpoint import Checkpoint, CheckpointManager
from weirflow.interfaces.coordination import CoordinationUtils, Latch, LatchState, Lock
from weirflow.interfaces.metadata import Document, MetadataStore
from weirflow.job.context import JobContext
from weirflow.job.model import TaskModel
from weirflow.tasks.runner import TaskRunner
from weirflow.testing import wait_until

TASKS = [f"main-{n}" for n in range(4)]

CONFIG = """
job.name: faults
job.coordinator.lease.duration.ms: 3000
job.coordinator.lease.renew.interval.ms: 1000
job.coordinator.heartbeat.interval.ms: 300
job.coordinator.liveness.timeout.ms: 2000
job.coordinator.poll.interval.ms: 100
job.coordinator.finished.check.interval.ms: 300
job.debounce.time.ms: 300
task.stop.timeout.ms: 500
"""


def job_config(tmp_path: Path) -> Any:
    path = tmp_path / "job.yaml"
    path.write_text(CONFIG)
    return load_config(path)


def plan(_ctx: JobContext) -> Callable[[], dict[str, TaskModel]]:
    return lambda: {name: TaskModel(name, "main", ()) for name in TASKS}


class FakeRunner(TaskRunner):
    """Runs nothing: remembers which tasks are started. With ``finish_after_s`` each task checkpoints
    ``finished`` that long after it starts (as a bounded task does when its inputs end)."""

    def __init__(self, checkpoints: CheckpointManager, finish_after_s: float | None = None) -> None:
        self._checkpoints = checkpoints
        self._finish_after_s = finish_after_s
        self._running: set[str] = set()
        self.abandoned: list[str] = []
        self._guard = threading.Lock()

    def start_task(self, task: TaskModel, lock: Lock) -> None:
        with self._guard:
            self._running.add(task.name)
        if self._finish_after_s is not None:
            finish = Checkpoint({}, control={"finished": True})
            timer = threading.Timer(self._finish_after_s, self._checkpoints.write_checkpoint, (task.name, finish))
            timer.daemon = True
            timer.start()

    def stop_task(self, task_name: str) -> None:
        with self._guard:
            self._running.discard(task_name)

    def abandon_tasks(self, task_names: Iterable[str]) -> None:
        names = list(task_names)
        self.abandoned += names
        self.abandoned_ms = time.time() * 1000
        for name in names:
            self.stop_task(name)

    def running(self) -> set[str]:
        with self._guard:
            return set(self._running)

    def failures(self) -> dict[str, str]:
        return {}

    def forget(self, task_name: str) -> None:
        pass


# --- fault-injecting wrappers of our own interfaces ----------------------------------------------------------
class FlakyLatch(Latch):
    """Delegates to a real latch; the follower's first ``join`` and first ``state`` raise."""

    def __init__(self, inner: Latch, faults: dict[str, int]) -> None:
        self.name = inner.name
        self._inner = inner
        self._faults = faults

    def _maybe_fail(self, call: str) -> None:
        if threading.current_thread().name.startswith("follower") and self._faults.get(call, 0) > 0:
            self._faults[call] -= 1
            raise ServiceUnavailableError(f"injected: {call} of {self.name} failed")

    def join(self, participant: str) -> None:
        self._maybe_fail("join")
        self._inner.join(participant)

    def participants(self) -> set[str]:
        return self._inner.participants()

    def complete(self) -> None:
        self._inner.complete()

    def time_out(self) -> None:
        self._inner.time_out()

    def state(self) -> LatchState:
        self._maybe_fail("state")
        return self._inner.state()


class FlakyCoordination(CoordinationUtils):
    def __init__(self, inner: CoordinationUtils, faults: dict[str, int]) -> None:
        self._inner = inner
        self.faults = faults

    def leader_elector(self):  # type: ignore[no-untyped-def]
        return self._inner.leader_elector()

    def lock(self, name: str) -> Lock:
        return self._inner.lock(name)

    def latch(self, name: str) -> Latch:
        return FlakyLatch(self._inner.latch(name), self.faults)

    def processor_registry(self):  # type: ignore[no-untyped-def]
        return self._inner.processor_registry()

    def close(self) -> None:
        self._inner.close()


class CountingCheckpoints(CheckpointManager):
    def __init__(self, inner: CheckpointManager) -> None:
        self._inner = inner
        self.reads: dict[str, int] = {"read_last_checkpoint": 0, "read_all": 0}

    def write_checkpoint(self, task_name: str, checkpoint: Checkpoint) -> None:
        self._inner.write_checkpoint(task_name, checkpoint)

    def read_last_checkpoint(self, task_name: str) -> Checkpoint | None:
        self.reads["read_last_checkpoint"] += 1
        return self._inner.read_last_checkpoint(task_name)

    def read_all(self) -> dict[str, Checkpoint]:
        self.reads["read_all"] += 1
        return self._inner.read_all()


class CountingMetadata(MetadataStore):
    def __init__(self, inner: MetadataStore) -> None:
        self._inner = inner
        self.gets: dict[str, int] = {}

    def get(self, key: str) -> Document | None:
        self.gets[key] = self.gets.get(key, 0) + 1
        return self._inner.get(key)

    def put(
        self, key: str, value: dict[str, Any], *, if_match: str | None = None, if_none_match: bool = False
    ) -> str:
        return self._inner.put(key, value, if_match=if_match, if_none_match=if_none_match)

    def delete(self, key: str, *, if_match: str | None = None) -> None:
        self._inner.delete(key, if_match=if_match)

    def list(self, prefix: str = "") -> list[Document]:
        return self._inner.list(prefix)


class HangingLock(Lock):
    """Delegates to a real lock, but its renewals never answer (until ``release``): a store that went silent
    for this one lease."""

    def __init__(self, inner: Lock, release: threading.Event) -> None:
        self.name = inner.name
        self.owner = inner.owner
        self._inner = inner
        self._release = release

    def try_acquire(self) -> bool:
        return self._inner.try_acquire()

    def renew(self) -> bool:
        self._release.wait(60)
        return False

    def release(self) -> None:
        self._inner.release()

    def is_held(self) -> bool:
        return self._inner.is_held()


class OneHangingLock(FlakyCoordination):
    """The first lock object handed out for ``name`` hangs on renew; later ones (re-acquisitions) work."""

    def __init__(self, inner: CoordinationUtils, name: str, release: threading.Event) -> None:
        super().__init__(inner, {})
        self._name = name
        self._release = release
        self._handed = False

    def lock(self, name: str) -> Lock:
        inner = self._inner.lock(name)
        if name == self._name and not self._handed:
            self._handed = True
            return HangingLock(inner, self._release)
        return inner


# --- running processors in threads ---------------------------------------------------------------------------
class Running:
    def __init__(self, processor: StreamProcessor) -> None:
        self.processor = processor
        self.result: int | None = None
        self.thread = threading.Thread(target=self._run, name=f"follower-{processor.processor_id}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.result = self.processor.run()

    def stop(self) -> int | None:
        self.processor.stop()
        self.thread.join(30)
        return self.result


def start(config: Any, pid: str, setup: Callable[[JobContext], TaskRunner]) -> Running:
    return Running(serving_processor(config, processor_id=pid, runner_factory=setup, planner_factory=plan))


def runs_its_assignment(processor: StreamProcessor) -> bool:
    if processor.ctx is None or processor.runner is None:
        return False
    model, _ = read_job_model(processor.ctx.metadata)
    return (
        model.version > 0
        and processor.state.value == "RUNNING"
        and processor.runner.running() == set(model.tasks_of(processor.processor_id))
    )


def test_a_storage_error_while_joining_the_latch_is_retried_and_every_assigned_task_starts(tmp_path: Path) -> None:
    config = job_config(tmp_path)
    faults = {"join": 1, "state": 1}

    def flaky(ctx: JobContext) -> TaskRunner:
        ctx.coordination = FlakyCoordination(ctx.coordination, faults)
        return FakeRunner(ctx.checkpoints)

    def plain(ctx: JobContext) -> TaskRunner:
        return FakeRunner(ctx.checkpoints)

    p1 = start(config, "p1", plain)
    wait_until(lambda: runs_its_assignment(p1.processor), 30, "p1 running every task")
    p2 = start(config, "p2", flaky)  # joins mid-job: a rebalance, where its join and first state() fail
    try:
        wait_until(
            lambda: (
                runs_its_assignment(p1.processor)
                and runs_its_assignment(p2.processor)
                and p1.processor.runner.running() | p2.processor.runner.running() == set(TASKS)
                and len(p2.processor.runner.running()) == 2
            ),
            30,
            "both processors running their assigned tasks",
        )
        assert faults == {"join": 0, "state": 0}, "the injected faults were not hit"
    finally:
        assert p2.stop() == 0
        assert p1.stop() == 0


def test_a_bounded_job_finishes_on_every_processor_without_scanning_checkpoints(tmp_path: Path) -> None:
    config = job_config(tmp_path)
    counters: dict[str, tuple[CountingCheckpoints, CountingMetadata]] = {}

    def counting(ctx: JobContext) -> TaskRunner:
        real = ctx.checkpoints
        ctx.checkpoints = CountingCheckpoints(real)
        ctx.metadata = CountingMetadata(ctx.metadata)
        counters[ctx.owner] = (ctx.checkpoints, ctx.metadata)
        return FakeRunner(real, finish_after_s=1.5)

    began = time.monotonic()
    processors = [start(config, pid, counting) for pid in ("p1", "p2", "p3")]
    for running in processors:
        running.thread.join(60)
        assert not running.thread.is_alive(), f"{running.processor.processor_id} did not finish"
        assert running.result == 0 and running.processor.finished
    elapsed_s = time.monotonic() - began
    checks = elapsed_s / 0.3 + 2  # at most one check per finished.check.interval per processor
    for pid, (checkpoints, metadata) in counters.items():
        assert checkpoints.reads["read_all"] == 0, f"{pid} scanned the checkpoint table"
        # the leader reads each task's checkpoint once it finished, plus one unfinished task per check
        assert checkpoints.reads["read_last_checkpoint"] <= len(TASKS) + checks, (pid, checkpoints.reads)
        assert metadata.gets.get(JOB_FINISHED_KEY, 0) <= checks, (pid, metadata.gets)
    print(f"finished in {elapsed_s:.1f} s; reads: { ({p: (c.reads, m.gets) for p, (c, m) in counters.items()}) }")


class HangingRunner(FakeRunner):
    def __init__(self, checkpoints: CheckpointManager) -> None:
        super().__init__(checkpoints)
        self.release = threading.Event()

    def stop_tasks(self, task_names: Iterable[str]) -> None:
        self.release.wait(30)


def test_a_stuck_task_stop_is_abandoned_after_the_stop_timeout_and_reported(tmp_path: Path) -> None:
    config = job_config(tmp_path)
    processor = StreamProcessor(config, processor_id="p1")
    runner = HangingRunner(checkpoints=None)  # type: ignore[arg-type]
    processor.runner = runner
    began = time.monotonic()
    processor._stop_tasks(["main-0", "main-1"], reason="test")
    took = time.monotonic() - began
    runner.release.set()
    assert runner.abandoned == ["main-0", "main-1"]
    assert "did not stop within task.stop.timeout.ms (500 ms)" in processor.error
    assert took < 10
    processor._keeper.close()


@pytest.fixture(autouse=True)
def _quiet_threads() -> Iterable[None]:
    """Each test ends with the threads it started (processors, their loops and pools, stuck stops): the next
    test starts among its own threads only."""
    before = set(threading.enumerate())
    yield
    started = [thread for thread in threading.enumerate() if thread not in before]
    wait_until(
        lambda: not any(thread.is_alive() for thread in started),
        10,
        f"the threads the test left running to end: {[thread.name for thread in started if thread.is_alive()]}",
        interval_s=0.01,
    )


def test_a_lock_whose_renewal_hangs_is_abandoned_before_it_expires_and_the_others_are_renewed(
    tmp_path: Path,
) -> None:
    from weirflow.local.coordination import SqliteCoordinationUtils
    from weirflow.local.factories import job_database_path

    config = job_config(tmp_path)
    release = threading.Event()
    runners: list[FakeRunner] = []

    def setup(ctx: JobContext) -> TaskRunner:
        ctx.coordination = OneHangingLock(ctx.coordination, "task-main-0", release)
        runners.append(FakeRunner(ctx.checkpoints))
        return runners[0]

    p1 = start(config, "p1", setup)
    try:
        wait_until(lambda: runs_its_assignment(p1.processor), 30, "p1 running every task")
        wait_until(lambda: runners[0].abandoned == ["main-0"], 30, "main-0 abandoned")
        abandoned_ms = runners[0].abandoned_ms
        # the follower takes main-0 again: the store says the lease is still ours (only the renewals hung), so
        # the re-entrant acquire succeeds with a fresh deadline, through a new lock object that renews fine
        wait_until(lambda: runs_its_assignment(p1.processor), 30, "main-0 running again")
        history = SqliteCoordinationUtils(job_database_path(config), "test", lease_ms=3000).lock_history()
        acquired_ms = next(h["acquired_ms"] for h in history if h["name"] == "task-main-0")
        expires_ms = acquired_ms + 3000  # had nothing renewed it: the renewals hung from the first one
        assert abandoned_ms < expires_ms, "the task was still running when its lease could expire"
        print(f"abandoned {expires_ms - abandoned_ms:.0f} ms before the lease could expire (margin 1000 ms)")
        # the other locks were renewed all along: each has one tenure, still held
        others = [h for h in history if h["name"].startswith("task-") and h["name"] != "task-main-0"]
        assert len(others) == 3 and all(h["ended_ms"] is None for h in others)
        assert runners[0].abandoned == ["main-0"]
        rows = p1.processor.ctx.coordination.processor_registry().processors()
        assert time.time() * 1000 - rows[0].heartbeat_ms < 2000, "the heartbeat stalled"
    finally:
        release.set()
        assert p1.stop() == 0


def test_a_processor_whose_endpoint_server_starts_slowly_is_never_counted_silent(tmp_path: Path) -> None:
    """The starting processor's announcement runs until its own first heartbeat: a server that takes longer
    than the liveness timeout to start (2 s here) must not make the leader count it silent and move its tasks."""
    config = job_config(tmp_path)
    entered, release = threading.Event(), threading.Event()

    def slow_server(processor: StreamProcessor) -> None:
        entered.set()
        release.wait(60)  # longer than the waits below: a processor counted silent fails them
        return None

    p1 = start(config, "p1", lambda ctx: FakeRunner(ctx.checkpoints))
    p2: Running | None = None
    try:
        wait_until(lambda: runs_its_assignment(p1.processor), 30, "p1 running every task")
        p2 = Running(
            StreamProcessor(
                config,
                processor_id="p2",
                runner_factory=lambda ctx: FakeRunner(ctx.checkpoints),
                planner_factory=plan,
                server_factory=slow_server,
            )
        )
        assert entered.wait(30), "p2 never reached its server's start"
        registry = p1.processor.ctx.coordination.processor_registry()
        # the leader sees p2 (its announcement) and shares the tasks with it; p2's row goes on being written
        # while its server starts, here for 15 more heartbeats (4.5 s: over twice the liveness timeout)
        wait_until(
            lambda: set(read_job_model(p1.processor.ctx.metadata)[0].processors) == {"p1", "p2"},
            30,
            "a model with p2",
        )

        def beats() -> int:
            return next((row.beat for row in registry.processors() if row.processor_id == "p2"), 0)

        first = beats()
        wait_until(lambda: beats() >= first + 15, 30, "p2's row written while its server starts", 0.1)
        release.set()
        wait_until(
            lambda: runs_its_assignment(p1.processor) and runs_its_assignment(p2.processor), 30, "both running"
        )
        history, _etag = read_history_or_report(p1.processor.ctx.metadata)
        assert any("p2" in change.joined for change in history.changes), history.changes
        silent = [change.version for change in history.changes if change.silent]
        assert history.failovers == 0 and not silent, f"p2 was counted silent while it started: {silent}"
        assert "p2" in {row.processor_id for row in registry.processors()}
    finally:
        release.set()
        if p2 is not None:
            assert p2.stop() == 0
        assert p1.stop() == 0


def test_a_processor_that_fails_to_start_leaves_at_once_instead_of_going_silent(tmp_path: Path) -> None:
    """A run whose data plane cannot start (a config error found then, say) after the leader counted it from
    its announcement marks its row failed: the leader moves its tasks back for a processor that left, without
    waiting out the liveness timeout and without recording a failover."""
    config = job_config(tmp_path)
    p1 = start(config, "p1", lambda ctx: FakeRunner(ctx.checkpoints))
    try:
        wait_until(lambda: runs_its_assignment(p1.processor), 30, "p1 running every task")
        metadata = p1.processor.ctx.metadata

        def failing(ctx: JobContext) -> TaskRunner:
            wait_until(lambda: "p2" in read_job_model(metadata)[0].processors, 30, "a model with p2")
            raise StartupError("the data plane cannot start")

        p2 = StreamProcessor(config, processor_id="p2", runner_factory=failing, planner_factory=plan)
        with pytest.raises(StartupError):
            p2.run()
        rows = {row.processor_id: row for row in p1.processor.ctx.coordination.processor_registry().processors()}
        assert rows["p2"].state == "FAILED", rows["p2"]
        wait_until(
            lambda: read_job_model(metadata)[0].processors == ("p1",) and runs_its_assignment(p1.processor),
            30,
            "p1 running every task again",
        )
        history, _etag = read_history_or_report(metadata)
        assert any("p2" in change.left for change in history.changes), history.changes
        assert history.failovers == 0, history.changes
    finally:
        assert p1.stop() == 0
