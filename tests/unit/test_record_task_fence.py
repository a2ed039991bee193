"""The record runner's side of the self-fence: `abandon_tasks` and `lease_valid` stop a task's writes at once;
`current_task` tells the record function who it runs as; `stop_tasks` stops tasks in parallel."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from weirflow.config import load_config
from weirflow.interfaces.coordination import Lock
from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.job.model import TaskModel
from weirflow.job.systems import Systems
from weirflow.local.checkpoint import SqliteCheckpointManager
from weirflow.tasks.record_task import RecordTaskRunner, current_task
from weirflow.testing import wait_until

PARTITIONS = 2


class HeldLock(Lock):
    def __init__(self, name: str) -> None:
        self.name = name
        self.owner = "p1"
        self.instance = "i1"
        self.epoch = 7

    def try_acquire(self) -> bool:
        return True

    def renew(self) -> bool:
        return True

    def release(self) -> None:
        pass

    def is_held(self) -> bool:
        return True


def slow_relay(record: dict) -> list[dict]:
    time.sleep(0.01)  # not synchronisation: a slow function, so tasks are mid-record when abandoned
    task = current_task()
    assert task is not None
    tag = {"task": task.name, "processor": task.processor_id, "instance": task.instance, "epoch": task.epoch}
    return [{"stream": "out", "value": {"offset": record["offset"], **tag}}]


@pytest.fixture
def runner(tmp_path: Path):
    path = tmp_path / "job.yaml"
    path.write_text("job.name: fence\n")
    config = load_config(path)
    systems = Systems(config)
    admin = systems.admin("local")
    admin.create_stream(StreamSpec("in", PARTITIONS))
    admin.create_stream(StreamSpec("out", 1))
    systems.producer("local").send(
        [OutgoingRecord("in", b"x", partition=n % PARTITIONS) for n in range(PARTITIONS * 2000)]
    )
    checkpoints = SqliteCheckpointManager(tmp_path / "checkpoints.db")
    runner = RecordTaskRunner(systems, checkpoints, slow_relay, commit_ms=100, max_records=20)
    yield runner
    runner.close()
    systems.close()


def task(n: int) -> TaskModel:
    return TaskModel(f"main-{n}", "main", (SystemStreamPartition("local", "in", n),))


def outputs(runner: RecordTaskRunner) -> list[dict]:
    consumer = runner.systems.consumer("local")
    found: list[dict] = []
    offset = "0"
    while batch := consumer.read(SystemStreamPartition("local", "out", 0), offset, 5000):
        found += [json.loads(r.value) for r in batch]
        offset = batch[-1].next_offset
    return found


def test_the_record_function_knows_its_task_processor_and_lock_epoch(runner: RecordTaskRunner) -> None:
    runner.start_task(task(0), HeldLock("task-main-0"))
    wait_until(lambda: len(outputs(runner)) > 0, 10, "an output")
    runner.stop_tasks(["main-0"])
    assert {(o["task"], o["processor"], o["instance"], o["epoch"]) for o in outputs(runner)} == {
        ("main-0", "p1", "i1", 7)
    }
    assert current_task() is None  # outside a task thread


def test_no_output_or_checkpoint_begins_after_abandon_tasks_returns(runner: RecordTaskRunner) -> None:
    for n in range(PARTITIONS):
        runner.start_task(task(n), HeldLock(f"task-main-{n}"))
    wait_until(lambda: len(outputs(runner)) >= 100, 20, "outputs of both tasks")
    wait_until(lambda: runner.checkpoints.read_last_checkpoint("main-1") is not None, 10, "a checkpoint")
    runner.abandon_tasks(["main-0", "main-1"])
    after = len(outputs(runner))
    checkpoints = {n: runner.checkpoints.read_last_checkpoint(f"main-{n}") for n in range(PARTITIONS)}
    assert runner.running() == set()
    time.sleep(1)  # not synchronisation: a write that should not come (10 ms a record) would show within this
    assert len(outputs(runner)) == after
    assert {n: runner.checkpoints.read_last_checkpoint(f"main-{n}") for n in range(PARTITIONS)} == checkpoints
    assert runner.failures() == {}


def test_a_task_whose_lease_is_no_longer_valid_abandons_itself_before_writing(runner: RecordTaskRunner) -> None:
    valid = {"main-0": True}
    runner.lease_valid = lambda name: valid[name]
    runner.start_task(task(0), HeldLock("task-main-0"))
    wait_until(lambda: len(outputs(runner)) > 0, 10, "an output")
    valid["main-0"] = False  # as after a pause past the lease: the keeper has not run yet
    wait_until(lambda: runner.running() == set(), 10, "the task to abandon itself")
    after = len(outputs(runner))
    time.sleep(0.5)  # not synchronisation: a write that should not come would show within this
    assert len(outputs(runner)) == after
    assert runner.failures() == {}
