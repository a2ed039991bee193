"""Cheap "job finished" detection for bounded jobs: the leader checks, everyone else reads one small document.

A bounded job is finished when every task of the job model checkpointed ``finished`` (its inputs ended and
end-of-stream went downstream). Scanning the checkpoint table on every poll of every processor costs
O(processors x tasks) storage reads per poll; instead:

* **the leader** (`FinishedWatch`, at most every `job.coordinator.finished.check.interval.ms`) reads the
  checkpoint of the first task it has not yet seen finished, and of the next one only when that one is
  finished (a finished task stays finished), so a check costs one point read while the job runs and the whole
  job costs about (tasks + checks) reads. When every task is finished it writes the metadata document
  ``job-finished``::

      {"tasks": ["main-0", "main-1"], "model_version": 7, "finished_ms": 1763820000000}

* **every processor** (`read_job_finished`, at most once per check interval) reads that one document and stops
  once its ``tasks`` are exactly the tasks of the model it runs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from weirflow import clock as wall_clock
from weirflow.interfaces.checkpoint import CheckpointManager
from weirflow.interfaces.metadata import MetadataStore
from weirflow.job_model import JobModel

log = logging.getLogger("weirflow.processor")

JOB_FINISHED_KEY = "job-finished"


def _checkpointed_finished(checkpoints: CheckpointManager, task: str) -> bool:
    checkpoint = checkpoints.read_last_checkpoint(task)
    return checkpoint is not None and bool(dict(checkpoint.control).get("finished"))


class FinishedWatch:
    """The leader's check; a new one is made with each tenure (it only caches what it read)."""

    def __init__(
        self,
        checkpoints: CheckpointManager,
        metadata: MetadataStore,
        interval_ms: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._checkpoints = checkpoints
        self._metadata = metadata
        self._interval_s = interval_ms / 1000
        self._clock = clock
        self._next_check = 0.0
        self._finished: set[str] = set()
        self._published: frozenset[str] | None = None

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
            if not _checkpointed_finished(self._checkpoints, task):
                return False
            self._finished.add(task)
        self._metadata.put(
            JOB_FINISHED_KEY,
            {"tasks": sorted(tasks), "model_version": model.version, "finished_ms": wall_clock.now_ms()},
        )
        self._published = tasks
        log.info("every task of job model v%d finished; wrote %s", model.version, JOB_FINISHED_KEY)
        return True


def read_job_finished(metadata: MetadataStore, model: JobModel) -> bool:
    """Whether the leader recorded every task of ``model`` as finished (one small read)."""
    document = metadata.get(JOB_FINISHED_KEY)
    return (
        bool(model.tasks)
        and document is not None
        and sorted(document.value.get("tasks", [])) == sorted(model.tasks)
    )
