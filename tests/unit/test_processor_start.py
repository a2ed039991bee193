"""How soon a job's first processor runs its tasks (docs/coordination.md, "Rebalance"), in-process on the
embedded SQLite backend with a fake data plane (`tests/unit/test_processor_faults.py`'s `FakeRunner`):

* the processor is a member from its announcement, before its data plane starts, so the leader's debounce runs
  while the data plane (a SparkSession, seconds) starts, and is still honoured;
* its leader and follower loops wake each other: with a poll interval longer than the test's whole wait, the
  model is published, its latch joined and completed and the tasks started without waiting for one poll;
* two processors, which no wake-up connects, share the tasks without waiting for a poll either: while a latch is
  open, its leader and the processors waiting on it look at it every 100 ms.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.unit.test_processor_faults import TASKS, FakeRunner, Running, plan
from weirflow.base import clock
from weirflow.config import load_config
from weirflow.coordination.job_model_store import read_job_model
from weirflow.coordination.processor import StreamProcessor
from weirflow.job.context import JobContext
from weirflow.tasks.runner import TaskRunner
from weirflow.testing import wait_until

DEBOUNCE_MS = 800
# Every step must come from a wake-up: one poll is longer than the test waits for the tasks to start.
POLL_MS = 60_000
WAIT_S = 30

CONFIG = f"""
job.name: first-start
job.coordinator.lease.duration.ms: 20000
job.coordinator.lease.renew.interval.ms: 5000
job.coordinator.heartbeat.interval.ms: 500
job.coordinator.liveness.timeout.ms: 5000
job.coordinator.poll.interval.ms: {POLL_MS}
job.debounce.time.ms: {DEBOUNCE_MS}
"""


def job_config(tmp_path: Path) -> Any:
    (tmp_path / "job.yaml").write_text(CONFIG)
    return load_config(tmp_path / "job.yaml")


def await_debounce(ctx: JobContext, members: int) -> None:
    """Return once ``members`` processors announced themselves and the debounce after the latest passed: a data
    plane that takes this long to start (as a SparkSession takes seconds) is ready when the leader may publish."""
    registry = ctx.coordination.processor_registry()

    def debounced() -> bool:
        rows = registry.processors()
        return len(rows) == members and clock.now_ms() - max(r.started_ms for r in rows) > DEBOUNCE_MS

    wait_until(debounced, WAIT_S, f"{members} announced and the debounce after them", interval_s=0.05)


def test_the_first_processor_starts_its_tasks_once_its_data_plane_is_up_without_a_poll(tmp_path: Path) -> None:
    config = job_config(tmp_path)
    plane: dict[str, Any] = {}

    def slow_plane(ctx: JobContext) -> TaskRunner:
        plane["began_ms"] = clock.now_ms()
        await_debounce(ctx, members=1)
        plane["runner"] = FakeRunner(ctx.checkpoints)
        plane["ready_ms"] = clock.now_ms()
        return plane["runner"]

    running = Running(StreamProcessor(config, processor_id="p1", runner_factory=slow_plane, planner_factory=plan))
    try:
        wait_until(
            lambda: "runner" in plane and plane["runner"].running() == set(TASKS),
            WAIT_S,
            "every task started, with no poll in between",
            interval_s=0.05,
        )
        assert running.processor.ctx is not None
        model, _ = read_job_model(running.processor.ctx.metadata)
        (row,) = running.processor.ctx.coordination.processor_registry().processors()
        # a member (registered) before its data plane began, and the debounce counted from then
        assert row.started_ms <= plane["began_ms"], (row.started_ms, plane["began_ms"])
        assert model.version == 1 and model.created_ms - row.started_ms >= DEBOUNCE_MS
        assert model.created_ms >= plane["ready_ms"], "a model was published before the planner existed"
    finally:
        assert running.stop() == 0


def test_a_joiner_and_the_leader_see_a_latch_through_its_100_ms_checks_not_a_poll(tmp_path: Path) -> None:
    """p1 leads. p2's data plane is ready only once p1 published the model of both, so the only way p1's leader
    learns of p2's join, and p2 of the latch's completion, is by looking at the latch: a poll would come after
    the test's whole wait. Each data plane waits for both processors' announcements and the debounce after the
    later one, so the first model holds both whatever the machine's load (no second model, no second latch)."""
    config = job_config(tmp_path)
    runners: dict[str, FakeRunner] = {}

    def plane(pid: str, after_model: bool) -> Callable[[JobContext], TaskRunner]:
        def build(ctx: JobContext) -> TaskRunner:
            await_debounce(ctx, members=2)
            if after_model:
                published = lambda: read_job_model(ctx.metadata)[0].version >= 1  # noqa: E731
                wait_until(published, WAIT_S, "the leader's first model", interval_s=0.05)
            runners[pid] = FakeRunner(ctx.checkpoints)
            return runners[pid]

        return build

    processors = [
        Running(
            StreamProcessor(config, processor_id=pid, runner_factory=plane(pid, pid == "p2"), planner_factory=plan)
        )
        for pid in ("p1", "p2")
    ]

    def shared() -> bool:
        if len(runners) < 2:
            return False
        held = [runner.running() for runner in runners.values()]
        return all(held) and held[0] | held[1] == set(TASKS) and not held[0] & held[1]

    try:
        wait_until(shared, WAIT_S, "both processors running their share, with no poll in between", interval_s=0.05)
        assert processors[0].processor.leading and not processors[1].processor.leading
        assert processors[0].processor.ctx is not None
        model, _ = read_job_model(processors[0].processor.ctx.metadata)
        assert model.version == 1 and sorted(model.processors) == ["p1", "p2"], model
    finally:
        for running in processors:
            assert running.stop() == 0
