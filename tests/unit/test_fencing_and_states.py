"""The checkpoint fence and the processor state machine."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from weirflow.base.errors import LockLostError, StateError
from weirflow.coordination.state import ProcessorState, check_transition
from weirflow.interfaces.checkpoint import Checkpoint
from weirflow.interfaces.system import SystemStreamPartition
from weirflow.local.checkpoint import SqliteCheckpointManager
from weirflow.local.coordination import SqliteCoordinationUtils
from weirflow.runtime.fencing import FencedCheckpointWriter
from weirflow.testing import wait_until

SSP = SystemStreamPartition("local", "events", 0)


def test_a_processor_that_lost_its_lock_cannot_overwrite_the_new_owners_checkpoint(tmp_path: Path) -> None:
    db = tmp_path / "job.db"
    old = SqliteCoordinationUtils(db, "paused", lease_ms=300).lock("task-main-0")
    new = SqliteCoordinationUtils(db, "successor", lease_ms=300).lock("task-main-0")
    manager = SqliteCheckpointManager(db)
    assert old.try_acquire()
    FencedCheckpointWriter("main-0", manager, old).write(Checkpoint({SSP: "10"}))

    # the old owner pauses past its lease; the successor takes the task over and moves on
    wait_until(new.try_acquire, 5, "the lease to expire")
    FencedCheckpointWriter("main-0", manager, new).write(Checkpoint({SSP: "25"}))

    with pytest.raises(LockLostError, match="task-main-0"):
        FencedCheckpointWriter("main-0", manager, old).write(Checkpoint({SSP: "11"}))
    assert manager.read_last_checkpoint("main-0").offsets == {SSP: "25"}
    assert not old.renew()


def test_the_embedded_store_checks_the_lock_inside_the_checkpoint_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that passed the writer's lock check, then waited (a pause) until the lease ran out, is refused by
    the store's own transaction, before any next holder claimed the task (the epoch token would let it in)."""
    from weirflow.base.errors import FencedOffError
    from weirflow.runtime import fencing

    db = tmp_path / "job.db"
    lock = SqliteCoordinationUtils(db, "paused", lease_ms=300).lock("task-main-0")
    manager = SqliteCheckpointManager(db)
    assert lock.try_acquire()
    writer = FencedCheckpointWriter("main-0", manager, lock)
    writer.write(Checkpoint({SSP: "10"}))

    def pause_past_the_lease(task: str, checkpoint: Checkpoint) -> None:
        wait_until(lambda: not lock.is_held(), 5, "the lease to run out")

    monkeypatch.setattr(fencing, "before_write", pause_past_the_lease)
    with pytest.raises(FencedOffError, match="the task's lock expired"):
        writer.write(Checkpoint({SSP: "11"}))
    assert manager.read_last_checkpoint("main-0").offsets == {SSP: "10"}


def test_lock_history_closes_an_expired_tenure_at_its_expiry(tmp_path: Path) -> None:
    db = tmp_path / "job.db"
    first = SqliteCoordinationUtils(db, "a", lease_ms=200)
    second = SqliteCoordinationUtils(db, "b", lease_ms=200)
    assert first.lock("x").try_acquire()
    acquired = time.time() * 1000
    wait_until(second.lock("x").try_acquire, 5, "b to take the expired lock")
    second.lock("x").release()
    history = [h for h in first.lock_history() if h["name"] == "x"]
    assert [(h["owner"], h["end_reason"]) for h in history] == [("a", "expired"), ("b", "released")]
    assert history[0]["ended_ms"] <= history[1]["acquired_ms"]
    assert history[0]["ended_ms"] >= acquired + 150


@pytest.mark.parametrize(
    "path",
    [
        ["NEW", "STARTED", "IN_REBALANCE", "RUNNING", "IN_REBALANCE", "RUNNING", "STOPPING", "STOPPED"],
        ["NEW", "STARTED", "STOPPING", "STOPPED"],
        ["NEW", "STARTED", "IN_REBALANCE", "FAILED", "STOPPED"],
    ],
)
def test_the_protocol_paths_are_legal(path: list[str]) -> None:
    for current, new in zip(path, path[1:], strict=False):
        check_transition(ProcessorState(current), ProcessorState(new))


@pytest.mark.parametrize(("current", "new"), [("NEW", "RUNNING"), ("STOPPED", "STARTED"), ("RUNNING", "STARTED")])
def test_illegal_transitions_raise(current: str, new: str) -> None:
    with pytest.raises(StateError, match="illegal processor state change"):
        check_transition(ProcessorState(current), ProcessorState(new))
