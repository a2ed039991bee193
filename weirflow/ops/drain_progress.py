"""Where a drain stands (docs/drain.md): each task's drain state from its checkpoint, and whether the
deployment's processors have exited. Read by `weirflow drain --wait` and `weirflow status`."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from weirflow.base import malformed
from weirflow.base.errors import MalformedDocumentError
from weirflow.coordination.state import ProcessorState
from weirflow.interfaces.checkpoint import CheckpointManager
from weirflow.interfaces.coordination import ProcessorInfo
from weirflow.job.model import JobModel
from weirflow.runtime.control import TaskControl

# a task's drain state: what `weirflow status` shows per task
RUNNING, DRAINING, DRAINED, FINISHED, MALFORMED = "running", "draining", "drained", "finished", "malformed"
_EXITED = {ProcessorState.STOPPED.value, ProcessorState.FAILED.value}


def task_drain_states(
    checkpoints: CheckpointManager, tasks: Iterable[str], run_id: str, draining: bool
) -> dict[str, str]:
    """Per task: ``drained`` (checkpointed drained in ``run_id``), ``finished`` (its bounded inputs ended), else
    ``draining`` while a drain of the run is requested, or ``running``; ``malformed`` when its checkpoint cannot
    be read (reported: `weirflow.base.malformed`; such a task is not run, so it never drains). One checkpoint read
    per task."""
    states = {}
    for task in sorted(tasks):
        try:
            checkpoint = checkpoints.read_last_checkpoint(task)
            control = TaskControl.from_json(checkpoint.control if checkpoint else None)
        except MalformedDocumentError as exc:
            malformed.report(f"checkpoint/{task}", exc, action="its drain state is unknown")
            states[task] = MALFORMED
            continue
        if control.drained == run_id:
            states[task] = DRAINED
        elif control.finished:
            states[task] = FINISHED
        else:
            states[task] = DRAINING if draining else RUNNING
    return states


def exited(row: ProcessorInfo, now_ms: int, liveness_timeout_ms: int) -> bool:
    """Whether the processor of ``row`` is gone: it wrote its final row (stopped or failed), or went silent for
    longer than the liveness timeout (killed)."""
    return row.state in _EXITED or now_ms - row.heartbeat_ms > liveness_timeout_ms


_PYTHON_ERROR = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)(?::.*)?$")


def brief_error(text: str, limit: int = 300) -> str:
    """The line of a processor's error that says why, for one line of a command's output: a Spark query's error
    carries the JVM's exception and the Python worker's whole traceback, whose cause is the traceback's last
    exception line (``ValueError: ...``); other errors are their first line. At most ``limit`` characters."""
    reason = text.strip().split("\n", 1)[0].strip()
    if "Traceback (most recent call last):" in text:
        tail = text.split("Traceback (most recent call last):")[-1].splitlines()
        found = [line.strip() for line in tail if _PYTHON_ERROR.match(line.strip())]
        if found:
            prefix = text.split(":", 1)[0] if text.startswith("task ") else ""
            reason = f"{prefix}: {found[-1]}" if prefix else found[-1]
    return reason if len(reason) <= limit else reason[: limit - 3] + "..."


@dataclass
class DrainProgress:
    """One look at a drain: task states and the processors still running."""

    tasks: dict[str, str] = field(default_factory=dict)
    running_processors: list[str] = field(default_factory=list)
    failed_processors: list[str] = field(default_factory=list)
    # processor -> the last error it reports (a task that failed and is retried, a failing loop), in brief
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def done_tasks(self) -> int:
        return sum(1 for state in self.tasks.values() if state in (DRAINED, FINISHED))

    @property
    def complete(self) -> bool:
        """Every task drained (or finished) and every processor exited."""
        return bool(self.tasks) and self.done_tasks == len(self.tasks) and not self.running_processors

    def summary(self) -> str:
        waiting = [name for name, state in self.tasks.items() if state not in (DRAINED, FINISHED)]
        parts = [f"{self.done_tasks} of {len(self.tasks)} tasks drained"]
        if waiting:
            parts.append("still draining: " + ", ".join(waiting[:8]) + (" ..." if len(waiting) > 8 else ""))
        if self.running_processors:
            parts.append("processors still running: " + ", ".join(self.running_processors))
        if self.failed_processors:
            parts.append("processors failed: " + ", ".join(self.failed_processors))
        if self.errors:
            parts.append("errors: " + "; ".join(f"{p}: {e}" for p, e in sorted(self.errors.items())))
        return "; ".join(parts)


def read_progress(ctx: Any, run_id: str, liveness_timeout_ms: int, draining: bool = True) -> DrainProgress:
    """The drain of deployment ``run_id`` as the job's stores show it now (``ctx``: an open `JobContext`)."""
    from weirflow.base import clock
    from weirflow.coordination.job_model_store import read_job_model_or_report

    model, _ = read_job_model_or_report(ctx.metadata)
    if model is None:
        model = JobModel.empty()
    rows = ctx.coordination.processor_registry().processors()
    now = clock.now_ms()
    return DrainProgress(
        tasks=task_drain_states(ctx.checkpoints, model.tasks, run_id, draining),
        running_processors=sorted(r.processor_id for r in rows if not exited(r, now, liveness_timeout_ms)),
        failed_processors=sorted(r.processor_id for r in rows if r.state == ProcessorState.FAILED.value),
        errors={r.processor_id: brief_error(r.error) for r in rows if r.error},
    )
