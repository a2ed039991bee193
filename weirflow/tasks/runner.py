"""`TaskRunner`: what the coordination protocol asks of whatever executes tasks.

The protocol decides *which* tasks run here; a runner executes them. Today's runner is the record runner
(`weirflow.tasks.record_task`); the Spark data plane provides one query per task behind the same interface.

Contract:
* ``start_task(task, lock)`` is called only after ``lock`` was acquired; it returns quickly and the task runs
  in the background. Every checkpoint the task writes goes through `FencedCheckpointWriter` with this lock.
* ``stop_task(name)`` returns only when the task has stopped and written its final checkpoint (or failed
  to): after it returns, nothing more is written for the task, so the caller may release the lock.
  ``stop_tasks(names)`` does the same for several at once, stopping them in parallel.
* ``abandon_tasks(names)`` is the self-fence (the lock's renewal was not confirmed in time, or a stop got
  stuck): stop the tasks *now* and write nothing more for them — no output, no checkpoint, no waiting for a
  graceful stop. When it returns, no further output or checkpoint of those tasks begins; they resume from
  their last checkpoint wherever they run next. The default falls back to ``stop_tasks`` (which may write a
  final checkpoint: still fenced by the lock's epoch); a runner overrides it to be prompt.
* ``running()`` lists tasks started (or being started) and not yet stopped or failed; ``starting()`` the ones
  whose start is still under way.
* ``failures()`` maps task name -> error text for tasks that died (lock lost, bad input, ...); the processor
  reports them and clears them with ``forget``.
* ``table_routes`` and ``intermediate_streams`` declare what the job serves beyond its tasks (served tables,
  streams a tap may read), so the endpoints (docs/endpoints.md) ask the runner instead of guessing its type.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

from weirflow.interfaces.coordination import Lock
from weirflow.job.model import TaskModel
from weirflow.runtime.served_tables import ServedTable
from weirflow.runtime.trim_points import TrimScope


class TableRoutes(Protocol):
    """Which task holds a key of each served table: what routes ``GET /tables/...`` to the processor running
    that task (docs/endpoints.md). A pipeline's plan (`weirflow.pipeline.plan.PipelinePlan`) and a record job's
    ``task.tables`` (`weirflow.tasks.record_tables.RecordTables`) are the two kinds."""

    @property
    def tables(self) -> Mapping[str, object]:
        """The served tables, by name (empty: the job serves none)."""
        ...

    def table_task(self, table: str, key: str) -> str:
        """The task holding ``key`` of ``table``."""
        ...

    def table_tasks(self, table: str) -> list[str]:
        """Every task holding a part of ``table``."""
        ...


class TaskRunner(ABC):
    #: Called (from any thread) when a task started in the background begins running, so the processor
    #: reports it at once instead of at its next heartbeat. Set by the processor; None: nobody listens.
    on_started: Callable[[], None] | None = None
    #: Set by the processor: whether the task's lock is still confirmed by the processor's own monotonic
    #: deadline (`weirflow.coordination.keeper`). A runner asks it right before each output write and each
    #: checkpoint, and abandons the task when it answers False: that catches a process that was paused (GC,
    #: SIGSTOP) past its lease and wakes up before the keeper has fenced the task. None: nobody answers.
    lease_valid: Callable[[str], bool] | None = None
    #: Set by the processor: the monotonic time (`time.monotonic`) until which the task's lock is confirmed,
    #: the keeper's ``deadline - margin``, or None when it is not kept. A runner whose writes happen in other
    #: processes of the machine (Spark's workers) hands it to them (`leases_renewed`). None: nobody answers.
    lease_valid_until: Callable[[str], float | None] | None = None

    @abstractmethod
    def start_task(self, task: TaskModel, lock: Lock) -> None: ...

    def leases_renewed(self) -> None:
        """Called by the processor's keeper after each round (from its thread; must return promptly): the
        values of `lease_valid_until` may have moved on. The default does nothing."""

    @contextmanager
    def starting_together(self) -> Iterator[None]:
        """The processor starts a round of tasks inside this: a runner that starts them in the background
        waits for the round's end, so a stage whose tasks share one query starts that query once, with all of
        them, rather than once with the first few and again with the rest. The default does nothing."""
        yield

    @abstractmethod
    def stop_task(self, task_name: str) -> None: ...

    def stop_tasks(self, task_names: Iterable[str]) -> None:
        """Stop several tasks (a rebalance moving them away). A runner that starts tasks in the background
        overrides it to drop all of them first, so none of them is still started while the others stop."""
        for name in task_names:
            self.stop_task(name)

    def abandon_tasks(self, task_names: Iterable[str]) -> None:
        """Stop several tasks at once without writing anything more for them (see the module docstring).
        Called from the processor's lease keeper; must return promptly."""
        self.stop_tasks(task_names)

    def drain(self, run_id: str) -> None:
        """The processor saw a drain notification for run ``run_id`` (docs/drain.md); called on every poll from
        then on, so it must be idempotent. A runner whose tasks read in this process stops each at a cut,
        flushes its outputs and checkpoints it drained in ``run_id``. The default does nothing: the Spark data
        plane's sources learn of the drain from the host's drain flag
        (`weirflow.job.drain_notice.drain_flag_path`)."""

    @abstractmethod
    def running(self) -> set[str]: ...

    def starting(self) -> set[str]:
        """Tasks of `running` whose start is still under way (the runner starts them in the background)."""
        return set()

    def task_stats(self) -> dict[str, dict[str, Any]]:
        """Per running task: ``batches``, ``records_in``, ``records_out`` (output stream -> records written for
        this task), ``last_batch_ms``, ``batch_seconds`` (a histogram,
        `weirflow.base.telemetry.Histogram.to_json`),
        ``last_checkpoint_ms``, ``dead_letters``, ``offsets`` (SSP key -> next offset) and ``query`` (the name of
        the query running it), for ``GET /metrics`` and the status page; a runner that keeps none returns {}.
        Each count is the task's own: summed over tasks, nothing is counted twice."""
        return {}

    def query_stats(self) -> dict[str, dict[str, Any]]:
        """Per query running here (a runner that runs several tasks in one query): ``tasks`` (how many it
        runs) and ``records_out`` (output stream -> records written); {} for a runner without queries."""
        return {}

    def table(self, task_name: str, table: str) -> ServedTable | None:
        """The task's copy of served table ``table`` (`weirflow.runtime.served_tables`), once the task runs here
        and
        the copy is current (restored, its query started); None otherwise."""
        return None

    @property
    def table_routes(self) -> TableRoutes | None:
        """How the job's served tables route to its tasks; None when this runner serves no tables."""
        return None

    @property
    def intermediate_streams(self) -> list[str]:
        """The job's intermediate streams (a pipeline's ``partition_by`` streams), which ``WS /tap`` reads
        besides the declared ones; [] when it has none."""
        return []

    def trim_scope(self) -> TrimScope | None:
        """What of the streams the job writes for itself the leader may trim once no task will read it again
        (`weirflow.coordination.trimming`); None when there is nothing (the default)."""
        return None

    @abstractmethod
    def failures(self) -> dict[str, str]: ...

    @abstractmethod
    def forget(self, task_name: str) -> None: ...

    def close(self) -> None:
        """Stop every task. Idempotent."""
        for name in sorted(self.running()):
            self.stop_task(name)
