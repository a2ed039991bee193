"""CheckpointManager contract: per-task offsets (next offset to read) and control state."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from weirflow.interfaces.checkpoint import Checkpoint, CheckpointManager
from weirflow.interfaces.system import SystemStreamPartition
from weirflow.testing.backend import Backend
from weirflow.testing.contracts._base import Contract, new_job_name

A0 = SystemStreamPartition("local", "views", 0)
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
