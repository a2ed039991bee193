"""The fence: only the holder of a task's lock may write the task's checkpoint.

A processor that was paused (GC, SIGSTOP, a slow disk) past its lease can wake up still believing it runs a
task that another processor has taken over. Two checks stop its writes:

1. every checkpoint write first asks the backend whether the lock is still ours (`Lock.is_held`), and
   refuses with `LockLostError` when it is not — the cheap, early check;
2. every write carries the lock's **epoch** (`Checkpoint.epoch`, the fencing token), and the checkpoint store
   refuses a write whose epoch is below the greatest it has stored for the task (`FencedOffError`), in the
   same transaction or conditional write as the write itself. A task's new holder *claims* it when it starts
   (`FencedCheckpointWriter.claim`: the checkpoint it starts from, written again with its epoch), so from
   then on any write of a former holder is refused — even one that passed check 1 just before the lock moved.

`before_write` is a hook between the two checks for tests that put a delay (or another holder's write) there.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from weirflow.base import telemetry
from weirflow.base.errors import LockLostError
from weirflow.interfaces.checkpoint import Checkpoint, CheckpointManager
from weirflow.interfaces.coordination import Lock

# Tests only: called with (task name, checkpoint) after the lock check and before the store's write.
before_write: Callable[[str, Checkpoint], None] | None = None


class FencedCheckpointWriter:
    """Writes one task's checkpoints through ``manager`` only while ``lock`` is held, stamped with its epoch."""

    def __init__(self, task_name: str, manager: CheckpointManager, lock: Lock) -> None:
        self.task_name = task_name
        self._manager = manager
        self._lock = lock

    @property
    def epoch(self) -> int:
        return int(getattr(self._lock, "epoch", 0) or 0)

    def write(self, checkpoint: Checkpoint) -> None:
        """Both checks, then the write; a write that succeeded is timed for ``GET /metrics``
        (`weirflow.base.telemetry.CHECKPOINT_WRITE_SECONDS`: the lock check and the store's write)."""
        began = time.monotonic()
        if not self._lock.is_held():
            raise LockLostError(self._lock.name, self._lock.owner)
        if before_write is not None:
            before_write(self.task_name, checkpoint)
        self._manager.write_checkpoint(self.task_name, dataclasses.replace(checkpoint, epoch=self.epoch))
        telemetry.observe(telemetry.CHECKPOINT_WRITE_SECONDS, time.monotonic() - began)

    def claim(self, checkpoint: Checkpoint | None) -> None:
        """Write the checkpoint the task starts from (None: nothing yet) again with this holder's epoch, so that
        the store refuses every later write of an earlier holder. Call it when the task starts."""
        start = checkpoint or Checkpoint(offsets={})
        self.write(Checkpoint(offsets=dict(start.offsets), control=dict(start.control)))
