"""How soon a job's first processor runs its tasks (docs/coordination.md, "Rebalance"), in-process on the
embedded SQLite backend with a fake data plane (`tests/unit/test_processor_faults.py`'s `FakeRunner`):

* the processor is a member from its announcement, before its data plane starts, so the leader's debounce runs
  while the data plane (a SparkSession, seconds) starts, and is still honoured;
* its leader and follower loops wake each other: with a poll interval longer than the test's whole wait, the
  model is published, its latch joined and completed and the tasks started without waiting for one poll.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.unit.test_processor_faults import TASKS, FakeRunner, Running, plan
from weirflow import clock
from weirflow.config import load_config
from weirflow.coordination.job_model_store import read_job_model
from weirflow.coordination.processor import StreamProcessor
from weirflow.job_context import JobContext
from weirflow.local.launcher import wait_until
from weirflow.tasks.runner import TaskRunner

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


def test_the_first_processor_starts_its_tasks_once_its_data_plane_is_up_without_a_poll(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(CONFIG)
    config = load_config(tmp_path / "job.yaml")
    plane: dict[str, Any] = {}

    def slow_plane(ctx: JobContext) -> TaskRunner:
        """A data plane that takes as long to start as the debounce (as a SparkSession takes seconds)."""
        plane["began_ms"] = clock.now_ms()
        registry = ctx.coordination.processor_registry()

        def debounced() -> bool:
            rows = [r for r in registry.processors() if r.processor_id == "p1"]
            return bool(rows) and clock.now_ms() - rows[0].started_ms > DEBOUNCE_MS

        wait_until(debounced, WAIT_S, "the debounce to pass while the data plane starts", interval_s=0.05)
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
