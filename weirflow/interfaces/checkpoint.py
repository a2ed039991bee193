"""`CheckpointManager`: where a task's input positions live, outside Spark and outside any processor.

Positions are what makes tasks movable: the processor that takes a task over reads the task's checkpoint
and resumes exactly there. Record shape (the same in every backend)::

    Checkpoint(offsets={SystemStreamPartition("local", "page-views", 3): "1042"}, control={...})

* ``offsets`` — per SSP, the **next offset to read** (not the last one processed), as the system's string.
* ``control`` — JSON-serialisable control-message state (watermarks, end-of-stream per producer task) that
  must move with the offsets; ``{}`` when unused.
* ``positions`` — optional, per SSP, the system's own description of the last message processed (Event Hubs:
  ``offset`` and ``sequence_number``), for stores that also write a system's native checkpoint layout so
  that tools outside weirflow can resume where a job stopped. Write-only: weirflow resumes from ``offsets``,
  and a backend need not read ``positions`` back.
* ``epoch`` — the **fencing token** of the writer: the epoch of the task's lock it held
  (`weirflow.interfaces.coordination.Lock.epoch`); 0 for an unfenced write (tools, tests).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from weirflow.interfaces.config import ConfigView
from weirflow.interfaces.system import SystemStreamPartition


@dataclass(frozen=True)
class Checkpoint:
    offsets: Mapping[SystemStreamPartition, str]
    control: Mapping[str, Any] = field(default_factory=dict)
    positions: Mapping[SystemStreamPartition, Mapping[str, str]] = field(default_factory=dict)
    epoch: int = 0


class CheckpointManager(ABC):
    """Stores one `Checkpoint` per task.

    Contract:
    * ``write_checkpoint`` replaces the task's offsets for the SSPs it names (other SSPs of the task keep
      their stored offsets) and replaces ``control`` when it is non-empty. It is atomic per call: a reader
      sees all of a write or none of it.
    * ``read_last_checkpoint`` returns None for a task never checkpointed.
    * Safe to call from several processes. **The fence is atomic with the write**: the store keeps the
      greatest ``epoch`` written per task, and a write with a smaller one raises `FencedOffError` and changes
      nothing, decided in the same transaction or conditional write that stores it — so a late write of a
      task's former lock holder can neither move offsets backwards nor revert ``finished``. Reads return the
      stored epoch. Callers write through `weirflow.runtime.fencing.FencedCheckpointWriter`, which stamps the
      lock's
      epoch and *claims* the task when it starts.
    * Raise on failure: a write that returns normally is durable.
    """

    def start(self) -> None:
        """Create tables or containers if missing. Idempotent."""

    @abstractmethod
    def write_checkpoint(self, task_name: str, checkpoint: Checkpoint) -> None: ...

    @abstractmethod
    def read_last_checkpoint(self, task_name: str) -> Checkpoint | None: ...

    def read_all(self) -> dict[str, Checkpoint]:
        """Every task's checkpoint (for `weirflow status` and tests). Backends may override for speed."""
        raise NotImplementedError

    def stop(self) -> None:
        """Release connections. Idempotent."""


class CheckpointManagerFactory(ABC):
    """Named by `task.checkpoint.factory`; constructed with no arguments."""

    @abstractmethod
    def get_checkpoint_manager(self, config: ConfigView) -> CheckpointManager: ...
