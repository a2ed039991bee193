"""The Spark runner's task lifecycle on a stateless stage: its tasks share one query per processor, a task
stopped before its query started never runs, and a task that joins later restarts the stage's query from
the checkpoint store's positions, with every record written once."""

from __future__ import annotations

import json
import textwrap
import threading
from pathlib import Path

import pytest

from weirflow.config import load_config
from weirflow.interfaces.system import OutgoingRecord, SystemStreamPartition
from weirflow.job.context import JobContext
from weirflow.testing import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]

PIPELINE = """
def pipeline(app):
    app.input("events").send_to("out")
"""

CONFIG = """
job: {name: runner}
app: {pipeline: "runner_pipeline:pipeline"}
task.trigger.interval.ms: 200
job.coordinator.lease.duration.ms: 600000   # nothing renews the test's task locks
streams:
  events: {partitions: 2, serde: string}
  out: {partitions: 1}
spark: {master: "local[1]"}
"""


def test_stateless_tasks_share_a_query_and_a_stopped_start_never_runs(tmp_path: Path, measure) -> None:
    (tmp_path / "runner_pipeline.py").write_text(textwrap.dedent(PIPELINE))
    (tmp_path / "job.yaml").write_text(CONFIG)
    config = load_config(tmp_path / "job.yaml")
    ctx = JobContext.open(config, "test")
    from weirflow.spark.plane import SparkDataPlane

    plane = SparkDataPlane(ctx)
    runner = plane.runner
    try:
        tasks = plane.plan.plan_tasks()
        assert sorted(tasks) == ["events-0", "events-1"]
        producer = ctx.systems.producer("local")
        producer.send(
            [OutgoingRecord("events", f"p{p}-{i}".encode(), partition=p) for p in (0, 1) for i in range(20)]
        )
        locks = {name: ctx.coordination.lock(f"task-{name}") for name in tasks}
        assert all(lock.try_acquire() for lock in locks.values())

        def written() -> list[str]:
            records = ctx.systems.consumer("local").read(SystemStreamPartition("local", "out", 0), "0", 1000)
            return sorted(
                json.loads(r.value)["value"] if r.value.startswith(b"{") else r.value.decode() for r in records
            )

        # Both accepted; while their query's start waits for its turn (another start holds the session),
        # one is withdrawn: the start finds it gone and runs only the other.
        with runner._starting:
            runner.start_task(tasks["events-0"], locks["events-0"])
            runner.start_task(tasks["events-1"], locks["events-1"])
            wait_until(lambda: runner._busy, 30, "the stage's start to be under way", 0.01)
            stopper = threading.Thread(target=runner.stop_tasks, args=(["events-1"],))
            stopper.start()
            wait_until(lambda: "events-1" not in runner.running(), 30, "events-1 to be withdrawn", 0.01)
        stopper.join(60)
        assert not stopper.is_alive()
        wait_until(lambda: len(written()) >= 20 and not runner.starting(), 120, "events-0 to copy", 0.2)
        assert runner.running() == {"events-0"} and not runner.failures()
        assert written() == sorted(f"p0-{i}" for i in range(20)), "only the task still held ran"
        withdrawn = ctx.checkpoints.read_last_checkpoint("events-1")  # claimed (its epoch) when accepted
        assert withdrawn is None or not withdrawn.offsets, "the withdrawn task never ran"

        def checkpointed(name: str) -> int:
            checkpoint = ctx.checkpoints.read_last_checkpoint(name)
            return int(next(iter(checkpoint.offsets.values()))) if checkpoint and checkpoint.offsets else 0

        # (a query stopped in the middle of a batch writes that batch again when it restarts: at-least-once)
        wait_until(lambda: checkpointed("events-0") == 20, 60, "events-0's batch to be checkpointed", 0.1)

        # the second task joins: the stage's one query restarts for both, from their checkpointed positions
        runner.start_task(tasks["events-1"], locks["events-1"])
        took = wait_until(lambda: len(written()) >= 40 and not runner.starting(), 120, "events-1 to run", 0.2)
        measure(f"a stateless stage's query restarted for a joining task in {took:.1f} s")
        assert runner.running() == {"events-0", "events-1"}
        assert len(plane.spark.streams.active) == 1, "one query for the stage's two tasks"
        assert written() == sorted(f"p{p}-{i}" for p in (0, 1) for i in range(20)), "every record once"
    finally:
        runner.close()
        ctx.close()
        plane.spark.stop()
