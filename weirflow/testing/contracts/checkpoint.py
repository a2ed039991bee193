"""CheckpointManager contract: per-task offsets (next offset to read) and control state."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from weirflow.base.errors import FencedOffError, LockLostError
from weirflow.interfaces.checkpoint import Checkpoint, CheckpointManager
from weirflow.interfaces.coordination import Lock
from weirflow.interfaces.system import SystemStreamPartition
from weirflow.runtime import fencing
from weirflow.runtime.fencing import FencedCheckpointWriter
from weirflow.testing.backend import Backend
from weirflow.testing.contracts._base import Contract, new_job_name

A0 = SystemStreamPartition("local", "views", 0)


class _HeldLock(Lock):
    """A lock this test holds throughout, at a given epoch: the race is between two holders' writes."""

    def __init__(self, name: str, epoch: int) -> None:
        self.name, self.owner, self.instance, self.epoch = name, f"holder-{epoch}", "", epoch

    def try_acquire(self) -> bool:
        return True

    def renew(self) -> bool:
        return True

    def release(self) -> None:
        pass

    def is_held(self) -> bool:
        return True


B0 = SystemStreamPartition("eh", "clicks.v2", 0)


class CheckpointManagerContract(Contract):
    """`weirflow.interfaces.checkpoint.CheckpointManager`, through ``Backend.checkpoint_manager``."""

    @pytest.fixture
    def checkpoint_manager(self, weirflow_backend: Backend, job_name: str) -> Iterator[CheckpointManager]:
        manager = weirflow_backend.checkpoint_manager(job_name)
        manager.start()
        yield manager
        manager.stop()

    def test_a_task_never_checkpointed_has_no_checkpoint(self, checkpoint_manager) -> None:
        assert checkpoint_manager.read_last_checkpoint("main-0") is None

    def test_offsets_and_control_round_trip(self, checkpoint_manager) -> None:
        control = {"watermarks": {"s0-1": 1700000000000}, "ended": ["s0-0"]}
        checkpoint_manager.write_checkpoint("main-0", Checkpoint({A0: "41", B0: "9000"}, control))
        checkpoint = checkpoint_manager.read_last_checkpoint("main-0")
        assert checkpoint.offsets == {A0: "41", B0: "9000"}
        assert checkpoint.control == control

    def test_a_partial_write_keeps_other_ssps_and_an_empty_control_keeps_the_stored_one(
        self, checkpoint_manager
    ) -> None:
        checkpoint_manager.write_checkpoint("main-0", Checkpoint({A0: "1", B0: "2"}, {"v": 1}))
        checkpoint_manager.write_checkpoint("main-0", Checkpoint({A0: "5"}))
        checkpoint = checkpoint_manager.read_last_checkpoint("main-0")
        assert checkpoint.offsets == {A0: "5", B0: "2"}
        assert checkpoint.control == {"v": 1}
        checkpoint_manager.write_checkpoint("main-0", Checkpoint({}, {"v": 2}))
        assert checkpoint_manager.read_last_checkpoint("main-0").control == {"v": 2}

    def test_tasks_are_independent_and_read_all_returns_each(self, checkpoint_manager) -> None:
        checkpoint_manager.write_checkpoint("main-0", Checkpoint({A0: "1"}))
        checkpoint_manager.write_checkpoint("main-1", Checkpoint({B0: "7"}))
        assert checkpoint_manager.read_last_checkpoint("main-0").offsets == {A0: "1"}
        everything = checkpoint_manager.read_all()
        assert {name: dict(c.offsets) for name, c in everything.items()} == {
            "main-0": {A0: "1"},
            "main-1": {B0: "7"},
        }

    def test_a_write_with_an_older_epoch_is_refused_and_changes_nothing(self, checkpoint_manager) -> None:
        checkpoint_manager.write_checkpoint("main-0", Checkpoint({A0: "100"}, {"finished": True}, epoch=3))
        with pytest.raises(FencedOffError):
            late = Checkpoint({A0: "50", B0: "1"}, {"finished": False}, epoch=2)
            checkpoint_manager.write_checkpoint("main-0", late)
        stored = checkpoint_manager.read_last_checkpoint("main-0")
        assert stored.offsets == {A0: "100"}, "a former holder's late write moved the offsets"
        assert stored.control == {"finished": True}, "a former holder's late write reverted the control state"
        assert stored.epoch == 3
        checkpoint_manager.write_checkpoint("main-0", Checkpoint({A0: "120"}, epoch=3))  # the holder goes on
        checkpoint_manager.write_checkpoint("main-0", Checkpoint({A0: "130"}, epoch=4))  # a later holder
        assert checkpoint_manager.read_last_checkpoint("main-0").epoch == 4
        assert checkpoint_manager.read_last_checkpoint("main-0").offsets == {A0: "130"}

    def test_a_later_holder_writing_between_the_lock_check_and_the_write_fences_the_former_one(
        self, checkpoint_manager, monkeypatch
    ) -> None:
        """The race the token closes: the former holder's lock check passed, then (in the delay before its
        write, `weirflow.runtime.fencing.before_write`) the task's next holder claimed it; the former write is
        refused."""
        former = FencedCheckpointWriter("main-0", checkpoint_manager, _HeldLock("task-main-0", epoch=1))
        former.claim(None)
        later = FencedCheckpointWriter("main-0", checkpoint_manager, _HeldLock("task-main-0", epoch=2))

        def the_next_holder_claims_meanwhile(task: str, checkpoint: Checkpoint) -> None:
            monkeypatch.setattr(fencing, "before_write", None)
            later.claim(checkpoint_manager.read_last_checkpoint(task))
            later.write(Checkpoint({A0: "7"}))

        checkpoint_manager.write_checkpoint("main-0", Checkpoint({A0: "5"}, epoch=1))
        monkeypatch.setattr(fencing, "before_write", the_next_holder_claims_meanwhile)
        with pytest.raises(LockLostError):
            former.write(Checkpoint({A0: "3"}, {"finished": True}))
        stored = checkpoint_manager.read_last_checkpoint("main-0")
        assert (dict(stored.offsets), dict(stored.control), stored.epoch) == ({A0: "7"}, {}, 2)

    def test_a_checkpoint_with_many_ssps_is_written_whole(self, checkpoint_manager) -> None:
        offsets = {SystemStreamPartition("local", f"s{i % 7}", i): str(i * 3) for i in range(500)}
        checkpoint_manager.write_checkpoint("wide", Checkpoint(offsets))
        assert checkpoint_manager.read_last_checkpoint("wide").offsets == offsets

    def test_another_manager_of_the_job_reads_the_checkpoint_and_other_jobs_do_not(
        self, weirflow_backend: Backend, job_name: str, checkpoint_manager
    ) -> None:
        checkpoint_manager.write_checkpoint("main-0", Checkpoint({A0: "3"}, {"v": 1}))
        for job, expected in ((job_name, {A0: "3"}), (new_job_name(), None)):
            other = weirflow_backend.checkpoint_manager(job)
            other.start()
            try:
                found = other.read_last_checkpoint("main-0")
                assert (None if found is None else dict(found.offsets)) == expected, job
            finally:
                other.stop()
