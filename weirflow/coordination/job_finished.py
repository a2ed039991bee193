"""Cheap "job finished" detection for bounded jobs: the leader checks, everyone else reads one small document.

A bounded job is finished when every task of the job model checkpointed ``finished`` (its inputs ended and
end-of-stream went downstream) or ``drained`` in this deployment (its run id; docs/drain.md): a drained job
stops the same way. Scanning the checkpoint table on every poll of every processor costs
O(processors x tasks) storage reads per poll; instead:

* **the leader** (`FinishedWatch`, at most every `job.coordinator.finished.check.interval.ms`) reads the
  checkpoint of the first task it has not yet seen finished, and of the next one only when that one is
  finished (a finished task stays finished), so a check costs one point read while the job runs and the whole
  job costs about (tasks + checks) reads. When every task is finished it writes the metadata document
  ``job-finished``::

      {"tasks": ["main-0", "main-1"], "model_version": 7, "finished_ms": 1763820000000, "run_id": "default",
       "drained": false}

  A drained job's leader then removes the drain notifications of its run (`DrainUtils.cleanup`).

  While a drain is under way both checks run every poll (`job.coordinator.poll.interval.ms`) instead.

* **every processor** (`read_job_finished`, at most once per check interval) reads that one document and stops
  once its ``tasks`` are exactly the tasks of the model it runs and its ``run_id`` is the processor's: the
  document a drained deployment left does not stop the next one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from weirflow.base import clock as wall_clock
from weirflow.base import malformed
from weirflow.base.errors import MalformedDocumentError
from weirflow.interfaces.checkpoint import CheckpointManager
from weirflow.interfaces.metadata import MetadataStore
from weirflow.job.drain_notice import DEFAULT_RUN_ID, DrainUtils
from weirflow.job.model import JobModel
from weirflow.job.runs import RunBook
from weirflow.runtime.control import TaskControl

log = logging.getLogger("weirflow.processor")

JOB_FINISHED_KEY = "job-finished"


def _done(checkpoints: CheckpointManager, task: str, run_id: str) -> tuple[bool, bool]:
    """(finished or drained in ``run_id``, drained) per the task's last checkpoint."""
    try:
        checkpoint = checkpoints.read_last_checkpoint(task)
        if checkpoint is None:
            return False, False
        control = TaskControl.from_json(checkpoint.control)
    except MalformedDocumentError as exc:  # not finished: its processor does not run it until it is repaired
        malformed.report(f"checkpoint/{task}", exc, action="the task does not count as finished")
        return False, False
    return control.done_in(run_id), control.drained == run_id


class FinishedWatch:
    """The leader's check; a new one is made with each tenure (it only caches what it read)."""

    def __init__(
        self,
        checkpoints: CheckpointManager,
        metadata: MetadataStore,
        interval_ms: int,
        run_id: str = DEFAULT_RUN_ID,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._checkpoints = checkpoints
        self._run_id = run_id
        self._drained = False
        self._metadata = metadata
        self._interval_s = interval_ms / 1000
        self._clock = clock
        self._next_check = 0.0
        self._finished: set[str] = set()
        self._published: frozenset[str] | None = None

    def hurry(self, interval_ms: int) -> None:
        """Check at least every ``interval_ms`` from now on: a drain is under way, and every second between its
        last task drained and ``job-finished`` is a second the drain takes (docs/drain.md)."""
        self._interval_s = min(self._interval_s, interval_ms / 1000)
        self._next_check = min(self._next_check, self._clock() + self._interval_s)

    def check(self, model: JobModel) -> bool:
        """Check (when due) whether every task of ``model`` finished; write ``job-finished`` once they have."""
        if not model.tasks:
            return False
        tasks = frozenset(model.tasks)
        if self._published == tasks:
            return True
        now = self._clock()
        if now < self._next_check:
            return False
        self._next_check = now + self._interval_s
        for task in sorted(tasks - self._finished):
            done, drained = _done(self._checkpoints, task, self._run_id)
            if not done:
                return False
            self._finished.add(task)
            self._drained = self._drained or drained
        self._metadata.put(
            JOB_FINISHED_KEY,
            {
                "tasks": sorted(tasks),
                "model_version": model.version,
                "finished_ms": wall_clock.now_ms(),
                "run_id": self._run_id,
                "drained": self._drained,
            },
        )
        self._published = tasks
        how = "drained" if self._drained else "finished"
        log.info("every task of job model v%d %s; wrote %s", model.version, how, JOB_FINISHED_KEY)
        RunBook(self._metadata).mark_ended(self._run_id, how)  # the next deployment starts a new run
        if self._drained:
            removed = DrainUtils(self._metadata).cleanup(run_id=self._run_id)
            log.info("removed %d drain notification(s) of run %r", removed, self._run_id)
        return True


def read_job_finished(metadata: MetadataStore, model: JobModel, run_id: str = DEFAULT_RUN_ID) -> bool:
    """Whether the leader recorded every task of ``model`` as finished or drained in run ``run_id`` (one small
    read)."""
    if not model.tasks:
        return False
    try:
        document = metadata.get(JOB_FINISHED_KEY)
    except MalformedDocumentError as exc:  # not JSON
        malformed.report(JOB_FINISHED_KEY, exc, action="ignored")
        return False
    if document is None:
        return False
    value = document.value
    tasks = value.get("tasks", []) if isinstance(value, dict) else None
    if not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks):
        malformed.report(JOB_FINISHED_KEY, f"not a job-finished document: {value!r:.200}", value, action="ignored")
        return False
    return sorted(tasks) == sorted(model.tasks) and str(value.get("run_id", DEFAULT_RUN_ID)) == run_id
