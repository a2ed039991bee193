"""The fence: only the holder of a task's lock may write the task's checkpoint.

A processor that was paused (GC, SIGSTOP, a slow disk) past its lease can wake up still believing it runs a
task that another processor has taken over. Every checkpoint write therefore asks the backend first whether
the lock is still ours, and refuses with `LockLostError` when it is not.
"""

from __future__ import annotations

from weirflow.errors import LockLostError
from weirflow.interfaces.checkpoint import Checkpoint, CheckpointManager
from weirflow.interfaces.coordination import Lock


class FencedCheckpointWriter:
    """Writes one task's checkpoints through ``manager`` only while ``lock`` is held."""

    def __init__(self, task_name: str, manager: CheckpointManager, lock: Lock) -> None:
        self.task_name = task_name
        self._manager = manager
        self._lock = lock

    def write(self, checkpoint: Checkpoint) -> None:
        if not self._lock.is_held():
            raise LockLostError(self._lock.name, self._lock.owner)
        self._manager.write_checkpoint(self.task_name, checkpoint)
