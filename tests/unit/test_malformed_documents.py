"""A malformed document in the job's stores is reported once and skipped (`weirflow.base.malformed`,
docs/architecture.md "Malformed documents"): on the embedded default (SQLite), a processor keeps running, its
status lists the document, and a WARNING names it once however many rounds read it.

The processors run in-process with a fake runner (our own `TaskRunner` interface); the stores are real SQLite.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from weirflow.base import malformed
from weirflow.base.errors import MalformedDocumentError
from weirflow.config import load_config
from weirflow.coordination.job_model_store import JOB_MODEL_KEY, read_job_model, read_job_model_or_report
from weirflow.coordination.processor import StreamProcessor
from weirflow.interfaces.checkpoint import Checkpoint, CheckpointManager
from weirflow.interfaces.coordination import Lock, ProcessorInfo
from weirflow.interfaces.metadata import Document, MetadataStore
from weirflow.job.context import JobContext
from weirflow.job.drain_notice import DrainUtils
from weirflow.job.model import TaskModel
from weirflow.local.factories import job_database_path
from weirflow.ops.status import job_status
from weirflow.runtime.control import TaskControl
from weirflow.tasks.runner import TaskRunner
from weirflow.testing import wait_until

TASKS = [f"main-{n}" for n in range(3)]

CONFIG = """
job.name: malformed
app.pipeline: not.imported:here
job.coordinator.lease.duration.ms: 3000
job.coordinator.lease.renew.interval.ms: 1000
job.coordinator.heartbeat.interval.ms: 300
job.coordinator.liveness.timeout.ms: 2000
job.coordinator.poll.interval.ms: 50
job.drain.poll.interval.ms: 50
job.debounce.time.ms: 200
"""


@pytest.fixture(autouse=True)
def _nothing_reported_yet() -> Iterator[None]:
    malformed.forget()
    yield
    malformed.forget()


def job_config(tmp_path: Path) -> Any:
    path = tmp_path / "job.yaml"
    path.write_text(CONFIG + f"job.state.dir: {tmp_path / 'state'}\n")
    return load_config(path)


def plan(_ctx: JobContext) -> Callable[[], dict[str, TaskModel]]:
    return lambda: {name: TaskModel(name, "main", ()) for name in TASKS}


class CheckpointReadingRunner(TaskRunner):
    """Runs nothing, but starts a task the way the Spark runner does: it reads the task's checkpoint and
    decodes its control state first (`SparkTaskRunner.start_task`), so a malformed one raises there."""

    def __init__(self, checkpoints: CheckpointManager) -> None:
        self._checkpoints = checkpoints
        self._running: set[str] = set()
        self._guard = threading.Lock()

    def start_task(self, task: TaskModel, lock: Lock) -> None:
        checkpoint = self._checkpoints.read_last_checkpoint(task.name)
        TaskControl.from_json(checkpoint.control if checkpoint else None)
        with self._guard:
            self._running.add(task.name)

    def stop_task(self, task_name: str) -> None:
        with self._guard:
            self._running.discard(task_name)

    def abandon_tasks(self, task_names: Iterable[str]) -> None:
        for name in task_names:
            self.stop_task(name)

    def running(self) -> set[str]:
        with self._guard:
            return set(self._running)

    def failures(self) -> dict[str, str]:
        return {}

    def forget(self, task_name: str) -> None:
        pass


class CountingMetadata(MetadataStore):
    """Counts the reads of the store it wraps, so a test waits for rounds instead of sleeping."""

    def __init__(self, inner: MetadataStore) -> None:
        self.inner = inner
        self.gets: dict[str, int] = {}
        self.lists: dict[str, int] = {}

    def get(self, key: str) -> Document | None:
        self.gets[key] = self.gets.get(key, 0) + 1
        return self.inner.get(key)

    def put(
        self, key: str, value: dict[str, Any], *, if_match: str | None = None, if_none_match: bool = False
    ) -> str:
        return self.inner.put(key, value, if_match=if_match, if_none_match=if_none_match)

    def delete(self, key: str, *, if_match: str | None = None) -> None:
        self.inner.delete(key, if_match=if_match)

    def list(self, prefix: str = "") -> list[Document]:
        self.lists[prefix] = self.lists.get(prefix, 0) + 1
        return self.inner.list(prefix)


class Running:
    def __init__(self, config: Any, pid: str) -> None:
        self.metadata: CountingMetadata | None = None

        def runner(ctx: JobContext) -> TaskRunner:
            ctx.metadata = self.metadata = CountingMetadata(ctx.metadata)
            return CheckpointReadingRunner(ctx.checkpoints)

        self.processor = StreamProcessor(config, processor_id=pid, runner_factory=runner, planner_factory=plan)
        self.result: int | None = None
        self.thread = threading.Thread(target=self._run, name=f"processor-{pid}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.result = self.processor.run()

    def stop(self) -> int | None:
        self.processor.stop()
        self.thread.join(30)
        return self.result

    def running(self) -> set[str]:
        runner = self.processor.runner
        return runner.running() if runner is not None else set()

    def rounds_from_now(self, key: str, rounds: int, listing: bool = False) -> Callable[[], bool]:
        """A condition: the processor read ``key`` (listed the prefix) ``rounds`` more times."""
        assert self.metadata is not None
        counts = self.metadata.lists if listing else self.metadata.gets
        target = counts.get(key, 0) + rounds
        return lambda: counts.get(key, 0) >= target


@contextmanager
def store_context(config: Any) -> Iterator[JobContext]:
    ctx = JobContext.open(config, owner="test")
    try:
        yield ctx
    finally:
        ctx.close()


def warnings_about(caplog: pytest.LogCaptureFixture, document: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "weirflow.base.malformed" and r.levelno == logging.WARNING and document in r.getMessage()
    ]


def running_everything(p: Running) -> bool:
    return p.processor.state.value == "RUNNING" and p.running() == set(TASKS)


def test_a_malformed_drain_notice_is_reported_once_and_skipped_never_failing_the_processor(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="weirflow.base.malformed")
    config = job_config(tmp_path)
    p1 = Running(config, "p1")
    try:
        wait_until(lambda: running_everything(p1), 30, "p1 running every task")
        with store_context(config) as ctx:
            ctx.metadata.put("drain/x", {})
        wait_until(p1.rounds_from_now("drain/", 10, listing=True), 30, "ten more drain polls")
        assert p1.processor.error == ""
        assert p1.processor.state.value == "RUNNING"
        assert p1.running() == set(TASKS)
        assert len(warnings_about(caplog, "drain/x")) == 1, "reported once, not on every poll"
        status = job_status(config)  # what `weirflow status --json` prints and GET /status serves
        assert [m["document"] for m in status["malformed"]] == ["drain/x"]
        assert "uuid" in status["malformed"][0]["reason"]
        assert status["drain"] is None, "a malformed notification drains nothing"
    finally:
        assert p1.stop() == 0


def test_a_malformed_job_model_is_not_used_and_the_processor_keeps_its_model(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="weirflow.base.malformed")
    config = job_config(tmp_path)
    p1 = Running(config, "p1")
    try:
        wait_until(lambda: running_everything(p1), 30, "p1 running every task")
        version = p1.processor.working_version
        with store_context(config) as ctx:
            good, etag = read_job_model(ctx.metadata)
            broken = {**good.to_json(), "version": version + 1, "assignment": {"p1": ["no-such-task"]}}
            ctx.metadata.put(JOB_MODEL_KEY, broken, if_match=etag)
        wait_until(p1.rounds_from_now(JOB_MODEL_KEY, 10), 30, "ten more job model reads")
        assert p1.processor.error == ""
        assert p1.processor.working_version == version, "the malformed model was used"
        assert p1.processor.state.value == "RUNNING"
        assert p1.running() == set(TASKS)
        reports = warnings_about(caplog, JOB_MODEL_KEY)
        assert len(reports) == 1, reports
        assert "each processor keeps the job model it runs and waits" in reports[0]
        status = job_status(config)
        assert [m["document"] for m in status["malformed"]] == [JOB_MODEL_KEY]
        assert "no-such-task" in status["malformed"][0]["reason"]
    finally:
        assert p1.stop() == 0


def test_a_malformed_checkpoint_keeps_its_task_from_starting_while_the_others_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="weirflow.base.malformed")
    config = job_config(tmp_path)
    with store_context(config) as ctx:
        ctx.checkpoints.write_checkpoint("main-0", Checkpoint({}, control={"streams": 5}))
    p1 = Running(config, "p1")
    try:
        wait_until(lambda: p1.running() == {"main-1", "main-2"}, 30, "p1 running the tasks it can read")
        wait_until(p1.rounds_from_now(JOB_MODEL_KEY, 5), 30, "five more follower rounds")
        assert "main-0" not in p1.running(), "a task whose checkpoint cannot be read must not start afresh"
        assert p1.processor.error.startswith("task main-0 not started: its checkpoint cannot be read")
        assert p1.processor.state.value == "RUNNING"
        assert len(warnings_about(caplog, "checkpoint/main-0")) == 1
        status = job_status(config)
        assert status["tasks"]["main-0"] == "malformed"
        assert [m["document"] for m in status["malformed"]] == ["checkpoint/main-0"]
        with store_context(config) as ctx:  # repaired: the task starts on a later retry
            ctx.checkpoints.write_checkpoint("main-0", Checkpoint({}, control={"dead-letters": 0}))
        wait_until(lambda: running_everything(p1), 30, "main-0 started once its checkpoint is readable")
        assert p1.processor.error == ""
    finally:
        assert p1.stop() == 0


def test_a_checkpoint_whose_control_state_is_not_json_is_an_error_naming_the_task(tmp_path: Path) -> None:
    config = job_config(tmp_path)
    with store_context(config) as ctx:
        ctx.checkpoints.write_checkpoint("main-0", Checkpoint({}, control={"finished": False}))
        with sqlite3.connect(job_database_path(config)) as db:
            db.execute("UPDATE checkpoint_control SET control = '{not json' WHERE task = 'main-0'")
        with pytest.raises(MalformedDocumentError, match="checkpoint of task main-0"):
            ctx.checkpoints.read_last_checkpoint("main-0")


def test_a_malformed_processor_row_is_skipped_by_the_registry_and_listed_by_the_status(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="weirflow.base.malformed")
    config = job_config(tmp_path)
    with store_context(config) as ctx:
        registry = ctx.coordination.processor_registry()
        assert registry.processors() == []  # creates the table
        with sqlite3.connect(job_database_path(config)) as db:
            db.execute("INSERT INTO processors (processor_id, info) VALUES ('ghost', '{\"processor_id\": 5}')")
            db.execute("INSERT INTO processors (processor_id, info) VALUES ('torn', '{\"processor')")
        assert registry.processors() == []
        assert registry.processors() == []
    status = job_status(config)
    assert status["processors"] == []
    assert sorted(m["document"] for m in status["malformed"]) == ["processor/ghost", "processor/torn"]
    assert len(warnings_about(caplog, "processor/ghost")) == 1
    assert len(warnings_about(caplog, "processor/torn")) == 1


def test_a_malformed_azure_registry_entity_is_skipped_and_reported_once(caplog: pytest.LogCaptureFixture) -> None:
    from weirflow_azure.coordinator.registry import _readable, _to_entity

    caplog.set_level(logging.WARNING, logger="weirflow.base.malformed")
    good = _to_entity(ProcessorInfo("p1", "h", 1, "RUNNING", heartbeat_ms=1_763_820_000_000))
    ghost = {"PartitionKey": "processors", "RowKey": "ghost", "pid": "not a number"}
    for _ in range(3):  # three registry reads: one warning
        assert [row.processor_id for _, row in _readable([ghost, good])] == ["p1"]
    assert len(warnings_about(caplog, "processor/ghost")) == 1


def test_a_metadata_document_that_is_not_json_is_left_out_of_listings_and_not_used_as_the_job_model(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="weirflow.base.malformed")
    config = job_config(tmp_path)
    with store_context(config) as ctx:
        notice = DrainUtils(ctx.metadata).write("default")
        ctx.metadata.put("drain/torn", {})
        ctx.metadata.put(JOB_MODEL_KEY, {})
        with sqlite3.connect(job_database_path(config)) as db:
            torn = "UPDATE metadata SET value = '{\"uuid\": ' WHERE key IN ('drain/torn', ?)"
            db.execute(torn, (JOB_MODEL_KEY,))
        assert DrainUtils(ctx.metadata).all() == [notice]  # the readable one is still seen
        with pytest.raises(MalformedDocumentError, match="drain/torn is not JSON"):
            ctx.metadata.get("drain/torn")
        assert read_job_model_or_report(ctx.metadata) == (None, None)
    status = job_status(config)
    assert status["drain"] == notice.to_json()
    assert sorted(m["document"] for m in status["malformed"]) == ["drain/torn", JOB_MODEL_KEY]
    assert len(warnings_about(caplog, "drain/torn")) == 1
