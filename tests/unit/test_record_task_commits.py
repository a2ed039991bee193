"""A record task commits by time, not by read: within one read (`task.poll.max.records` records) it sends its
outputs and writes its checkpoint once `task.commit.ms` has passed, and a stop ends it after the record in
hand, checkpointing exactly what it sent (docs/architecture.md, "Record tasks: commits and stops").

One read here holds the partition's whole backlog, so a runner that committed or stopped only between reads
would show no checkpoint before the backlog's end and would relay all of it after a stop."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_record_task_fence import HeldLock  # a lock the test holds throughout
from weirflow.config import load_config
from weirflow.interfaces.checkpoint import Checkpoint
from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.job.model import TaskModel
from weirflow.job.systems import Systems
from weirflow.local.checkpoint import SqliteCheckpointManager
from weirflow.tasks.record_task import RecordTaskRunner
from weirflow.testing import wait_until

BACKLOG = 100
COMMIT_MS = 200
INPUT = SystemStreamPartition("local", "in", 0)
TASK = TaskModel("main-0", "main", (INPUT,))


class Harness:
    """A runner over one partition holding `BACKLOG` records, read in one poll; ``on_record`` (offset ->
    None) is called by the record function before it relays the record, from the task's thread."""

    def __init__(self, root: Path) -> None:
        path = root / "job.yaml"
        path.write_text("job.name: commits\n")
        self.systems = Systems(load_config(path))
        admin = self.systems.admin("local")
        admin.create_stream(StreamSpec("in", 1))
        admin.create_stream(StreamSpec("out", 1))
        self.systems.producer("local").send([OutgoingRecord("in", str(n).encode()) for n in range(BACKLOG)])
        self.checkpoints = SqliteCheckpointManager(root / "checkpoints.db")
        self.on_record: Callable[[int], None] = lambda offset: None
        self.runner = RecordTaskRunner(
            self.systems, self.checkpoints, self.relay, commit_ms=COMMIT_MS, max_records=BACKLOG * 2
        )

    def relay(self, record: dict[str, Any]) -> list[dict[str, Any]]:
        self.on_record(int(record["offset"]))
        return [{"stream": "out", "value": record["value"]}]

    def relayed(self) -> list[int]:
        batch = self.systems.consumer("local").read(SystemStreamPartition("local", "out", 0), "0", BACKLOG * 10)
        return [int(r.value) for r in batch]

    def checkpointed(self) -> int | None:
        """The checkpointed offset of the input; None before the task checkpointed any (the claim a task writes
        when it starts names no offsets)."""
        checkpoint: Checkpoint | None = self.checkpoints.read_last_checkpoint(TASK.name)
        offset = checkpoint.offsets.get(INPUT) if checkpoint is not None else None
        return int(offset) if offset is not None else None

    def close(self) -> None:
        self.runner.close()
        self.systems.close()


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    found = Harness(tmp_path)
    yield found
    found.close()


def test_a_stop_ends_the_task_after_the_record_in_hand_and_checkpoints_exactly_what_it_sent(
    harness: Harness,
) -> None:
    stop_at = 30

    def on_record(offset: int) -> None:
        if offset == stop_at:  # the processor's stop arrives while the task is in the middle of its read
            harness.runner._tasks[TASK.name].stop_event.set()

    harness.on_record = on_record
    harness.runner.start_task(TASK, HeldLock("task-main-0"))
    wait_until(lambda: harness.runner.running() == set(), 10, "the task to stop")
    assert harness.runner.failures() == {}
    assert harness.relayed() == list(range(stop_at + 1)), "the stop waited for the rest of the read"
    assert harness.checkpointed() == stop_at + 1


def test_a_long_read_is_checkpointed_every_commit_interval_with_its_outputs_sent_first(harness: Harness) -> None:
    slow_at, look_at = 50, 60
    seen: dict[str, Any] = {}
    looked = threading.Event()

    def on_record(offset: int) -> None:
        if offset == slow_at:
            time.sleep(COMMIT_MS * 1.5 / 1000)  # not synchronisation: one slow record outlasts the commit interval
        if offset == look_at:  # still inside the same read: what has been committed so far?
            seen["checkpoint"], seen["relayed"] = harness.checkpointed(), harness.relayed()
            looked.set()

    harness.on_record = on_record
    harness.runner.start_task(TASK, HeldLock("task-main-0"))
    assert looked.wait(10)
    checkpoint = seen["checkpoint"]
    assert checkpoint is not None, "no checkpoint was written inside a read that outlasted task.commit.ms"
    assert slow_at < checkpoint <= look_at
    assert seen["relayed"][:checkpoint] == list(range(checkpoint)), "a checkpoint named an output not yet sent"
    wait_until(lambda: harness.checkpointed() == BACKLOG, 10, "the backlog checkpointed")
    assert harness.relayed() == list(range(BACKLOG))
