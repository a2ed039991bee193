"""CheckpointManager contract: per-task offsets (next offset to read) and control state."""

from __future__ import annotations

from weirflow.interfaces.checkpoint import Checkpoint
from weirflow.interfaces.system import SystemStreamPartition

A0 = SystemStreamPartition("local", "views", 0)
B0 = SystemStreamPartition("eh", "clicks.v2", 0)


def test_a_task_never_checkpointed_has_no_checkpoint(checkpoint_manager) -> None:
    assert checkpoint_manager.read_last_checkpoint("main-0") is None


def test_offsets_and_control_round_trip(checkpoint_manager) -> None:
    control = {"watermarks": {"s0-1": 1700000000000}, "ended": ["s0-0"]}
    checkpoint_manager.write_checkpoint("main-0", Checkpoint({A0: "41", B0: "9000"}, control))
    checkpoint = checkpoint_manager.read_last_checkpoint("main-0")
    assert checkpoint.offsets == {A0: "41", B0: "9000"}
    assert checkpoint.control == control


def test_a_partial_write_keeps_other_ssps_and_an_empty_control_keeps_the_stored_one(checkpoint_manager) -> None:
    checkpoint_manager.write_checkpoint("main-0", Checkpoint({A0: "1", B0: "2"}, {"v": 1}))
    checkpoint_manager.write_checkpoint("main-0", Checkpoint({A0: "5"}))
    checkpoint = checkpoint_manager.read_last_checkpoint("main-0")
    assert checkpoint.offsets == {A0: "5", B0: "2"}
    assert checkpoint.control == {"v": 1}
    checkpoint_manager.write_checkpoint("main-0", Checkpoint({}, {"v": 2}))
    assert checkpoint_manager.read_last_checkpoint("main-0").control == {"v": 2}


def test_tasks_are_independent_and_read_all_returns_each(checkpoint_manager) -> None:
    checkpoint_manager.write_checkpoint("main-0", Checkpoint({A0: "1"}))
    checkpoint_manager.write_checkpoint("main-1", Checkpoint({B0: "7"}))
    assert checkpoint_manager.read_last_checkpoint("main-0").offsets == {A0: "1"}
    everything = checkpoint_manager.read_all()
    assert {name: dict(c.offsets) for name, c in everything.items()} == {"main-0": {A0: "1"}, "main-1": {B0: "7"}}


def test_a_checkpoint_with_many_ssps_is_written_whole(checkpoint_manager) -> None:
    offsets = {SystemStreamPartition("local", f"s{i % 7}", i): str(i * 3) for i in range(500)}
    checkpoint_manager.write_checkpoint("wide", Checkpoint(offsets))
    assert checkpoint_manager.read_last_checkpoint("wide").offsets == offsets
