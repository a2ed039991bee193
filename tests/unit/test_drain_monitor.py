"""A processor's drain monitor (`weirflow.coordination.drain_monitor`) and how a drained deployment is recorded as
done (`weirflow.coordination.job_finished`): the run-id checks on both, on the embedded stores."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from weirflow.config.loader import Config
from weirflow.coordination.drain_monitor import DrainMonitor
from weirflow.coordination.job_finished import JOB_FINISHED_KEY, FinishedWatch, read_job_finished
from weirflow.interfaces.checkpoint import Checkpoint
from weirflow.job.drain_notice import DrainUtils
from weirflow.job.model import JobModel, TaskModel
from weirflow.local.checkpoint import SqliteCheckpointManager
from weirflow.local.metadata import SqliteMetadataStore
from weirflow.runtime.control import TaskControl


@pytest.fixture
def metadata(tmp_path: Path):
    store = SqliteMetadataStore(tmp_path / "job.db")
    store.start()
    yield store
    store.stop()


def _config(tmp_path: Path, run_id: str) -> Config:
    return Config.from_dict({"job.name": "drains", "job.state.dir": str(tmp_path), "app.run.id": run_id})


def test_the_monitor_acts_on_its_own_run_only_and_polls_at_its_interval(
    metadata, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = [0.0]
    monitor = DrainMonitor(metadata, _config(tmp_path, "r2"), clock=lambda: now[0])
    drains = DrainUtils(metadata)
    other = drains.write("r1")
    with caplog.at_level(logging.INFO, logger="weirflow.processor"):
        assert monitor.poll() is None
        assert monitor.poll() is None  # not due again yet: no second read
    assert not monitor.flag.exists(), "another run's notice must not start a drain"
    assert sum(other.uuid in r.getMessage() for r in caplog.records) == 1  # logged once

    mine = drains.write("r2")
    assert monitor.poll() is None, "polled before the interval (500 ms) passed"
    now[0] += 0.5
    assert monitor.poll() == mine
    assert json.loads(monitor.flag.read_text())["uuid"] == mine.uuid  # what the Spark sources look for
    assert monitor.flag.name == "drains-1.r2.draining"
    drains.cleanup(mine)
    assert monitor.poll() == mine, "once seen, a drain is not cancelled"


def test_the_leader_records_a_drained_run_as_done_and_removes_its_notice(metadata, tmp_path: Path) -> None:
    checkpoints = SqliteCheckpointManager(tmp_path / "checkpoints.db")
    checkpoints.start()
    model = JobModel(
        version=3,
        tasks={"a-0": TaskModel("a-0", "a", ()), "b-0": TaskModel("b-0", "b", ())},
        assignment={"p0": ("a-0", "b-0")},
    )
    drains = DrainUtils(metadata)
    mine, other = drains.write("r1"), drains.write("r0")
    watch = FinishedWatch(checkpoints, metadata, interval_ms=1, run_id="r1", clock=iter(range(100)).__next__)

    checkpoints.write_checkpoint("a-0", Checkpoint({}, TaskControl(drained="r1").to_json()))
    checkpoints.write_checkpoint("b-0", Checkpoint({}, TaskControl(drained="r0").to_json()))
    assert not watch.check(model), "b-0 drained in another run: not done in this one"
    checkpoints.write_checkpoint("b-0", Checkpoint({}, TaskControl(drained="r1").to_json()))
    assert watch.check(model)
    document = metadata.get(JOB_FINISHED_KEY)
    assert document is not None and document.value["run_id"] == "r1" and document.value["drained"] is True
    assert [n.uuid for n in drains.all()] == [other.uuid], f"{mine.uuid} removed, another run's kept"
    assert read_job_finished(metadata, model, "r1")
    assert not read_job_finished(metadata, model, "r2"), "a drained run's document must not stop the next run"
    checkpoints.stop()


def test_a_drain_makes_the_leader_check_for_the_end_every_poll(metadata, tmp_path: Path) -> None:
    """Every second between a drain's last task drained and `job-finished` is a second the drain takes."""
    checkpoints = SqliteCheckpointManager(tmp_path / "checkpoints.db")
    checkpoints.start()
    model = JobModel(version=1, tasks={"a-0": TaskModel("a-0", "a", ())}, assignment={"p0": ("a-0",)})
    now = [100.0]
    watch = FinishedWatch(checkpoints, metadata, interval_ms=1000, run_id="r1", clock=lambda: now[0])
    assert not watch.check(model)  # checked at 100.0: the next check is due at 101.0
    checkpoints.write_checkpoint("a-0", Checkpoint({}, TaskControl(drained="r1").to_json()))
    now[0] = 100.5
    assert not watch.check(model), "checked before its interval"
    watch.hurry(250)
    now[0] = 100.75
    assert watch.check(model), "a hurried watch did not check within its new interval"
    checkpoints.stop()


def test_the_loops_go_round_faster_while_a_drain_is_under_way(metadata, tmp_path: Path) -> None:
    """Between a drain's last task drained and the processors' exit, every pause of a loop is time the drain
    takes: the leader and follower loops pause `DRAIN_POLL_MS`, not the poll interval, once the monitor saw the
    deployment's notice (and only then)."""
    from types import SimpleNamespace

    from weirflow.coordination.processor_core import DRAIN_POLL_MS, ProcessorCore

    class Loops(ProcessorCore):
        def __init__(self, drain: DrainMonitor) -> None:
            self.timings = SimpleNamespace(poll_interval_ms=500)  # type: ignore[assignment]
            self._drain = drain

    monitor = DrainMonitor(metadata, _config(tmp_path, "r1"))
    loops = Loops(monitor)
    assert loops._round_ms() == 500
    DrainUtils(metadata).write("r1")
    assert monitor.poll() is not None
    assert loops._round_ms() == DRAIN_POLL_MS < 500
