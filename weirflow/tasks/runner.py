"""`TaskRunner`: what the coordination protocol asks of whatever executes tasks.

The protocol decides *which* tasks run here; a runner executes them. Today's runner is the record runner
(`weirflow.tasks.record_task`); the Spark data plane provides one query per task behind the same interface.

Contract:
* ``start_task(task, lock)`` is called only after ``lock`` was acquired; it returns quickly and the task runs
  in the background. Every checkpoint the task writes goes through `FencedCheckpointWriter` with this lock.
* ``stop_task(name)`` returns only when the task has stopped and written its final checkpoint (or failed
  to): after it returns, nothing more is written for the task, so the caller may release the lock.
* ``running()`` lists tasks started (or being started) and not yet stopped or failed; ``starting()`` the ones
  whose start is still under way.
* ``failures()`` maps task name -> error text for tasks that died (lock lost, bad input, ...); the processor
  reports them and clears them with ``forget``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from weirflow.interfaces.coordination import Lock
from weirflow.job_model import TaskModel


class TaskRunner(ABC):
    @abstractmethod
    def start_task(self, task: TaskModel, lock: Lock) -> None: ...

    @abstractmethod
    def stop_task(self, task_name: str) -> None: ...

    @abstractmethod
    def running(self) -> set[str]: ...

    def starting(self) -> set[str]:
        """Tasks of `running` whose start is still under way (the runner starts them in the background)."""
        return set()

    @abstractmethod
    def failures(self) -> dict[str, str]: ...

    @abstractmethod
    def forget(self, task_name: str) -> None: ...

    def close(self) -> None:
        """Stop every task. Idempotent."""
        for name in sorted(self.running()):
            self.stop_task(name)
