"""The job's live picture, read from its coordination, metadata and checkpoint stores: one document for
`weirflow status` and for a processor's ``GET /status`` (docs/endpoints.md)."""

from __future__ import annotations

import os
from typing import Any


def job_status(cfg: Any, ctx: Any = None) -> dict[str, Any]:
    """The job's live picture: leader, job model and every registered processor (what `weirflow status --json`
    prints and a processor serves at ``GET /status``), and under ``malformed`` each document of the job's
    stores these reads could not decode (``{"document", "reason"}``; skipped, never an error here). ``ctx``: an
    open `JobContext` to read through (a running processor's own); without one a context is opened for the call
    and closed after it.

    A processor silent past the liveness timeout without having said it stopped (`went_silent`) shows as
    ``state: SILENT`` with ``tasks`` the ones the job model still assigns to it and ``moved_to`` (task -> its
    owner now, null: unassigned) for the tasks its row last reported; ``reported_state`` and
    ``reported_tasks`` keep what its row says, for every processor."""
    from weirflow.base import clock, malformed
    from weirflow.coordination.job_model_store import read_job_model_or_report
    from weirflow.coordination.model_history import read_history_or_report
    from weirflow.coordination.state import is_live, went_silent
    from weirflow.coordination.timings import CoordinationTimings
    from weirflow.job.context import JobContext
    from weirflow.job.drain_notice import DrainUtils
    from weirflow.job.model import JobModel
    from weirflow.job.runs import current_run_id
    from weirflow.ops.drain_progress import task_drain_states

    own = ctx is None
    if own:
        ctx = JobContext.open(cfg, owner=f"status-{os.getpid()}")
    try:
        with malformed.collect() as found:  # every document these reads could not decode, each skipped
            run_id = current_run_id(cfg, ctx.metadata)
            timings = CoordinationTimings.from_config(cfg)
            leader = ctx.coordination.leader_elector().current_leader()
            stored, _ = read_job_model_or_report(ctx.metadata)
            history, _ = read_history_or_report(ctx.metadata)
            model = JobModel.empty() if stored is None else stored
            rows = ctx.coordination.processor_registry().processors()
            notice = DrainUtils(ctx.metadata).for_run(run_id)
            tasks = task_drain_states(ctx.checkpoints, model.tasks, run_id, draining=notice is not None)
    finally:
        if own:
            ctx.close()
    now = clock.now_ms()
    processors = []
    for row in rows:
        age = now - row.heartbeat_ms
        assigned = list(model.tasks_of(row.processor_id))
        entry = {
            **row.to_json(),
            "heartbeat_age_s": round(age / 1000, 1),
            "live": is_live(row, now, timings.liveness_timeout_ms),  # what the leader counts
            "leader": row.processor_id == leader,
            "assigned": assigned,
            "silent": False,
            "reported_state": row.state,
            "reported_tasks": list(row.tasks),
        }
        if went_silent(row, now, timings.liveness_timeout_ms):
            # its row shows what it did before it fell silent: show what it is now, and where its tasks went
            entry["silent"] = True
            entry["state"] = "SILENT"
            entry["tasks"] = assigned
            entry["moved_to"] = {t: model.owner_of(t) for t in row.tasks if t not in assigned}
        processors.append(entry)
    return {
        "job": f"{cfg.get('job.name')}-{cfg.get('job.id')}",
        "leader": leader,
        "now_ms": now,
        "job_model_version": model.version,
        "task_count": len(model.tasks),
        "assignment": {p: list(t) for p, t in model.assignment.items()},
        "processors": processors,
        "run_id": run_id,
        # the drain of this run, when one was requested: its notification and each task's drain state
        "drain": notice.to_json() if notice is not None else None,
        "tasks": tasks,
        # the leader's last job model publications, newest first: why, and which tasks moved where
        # (weirflow.coordination.model_history), and how many were failovers since the job began
        "job_model_changes": [change.to_json() for change in reversed(history.changes)],
        "failovers": history.failovers,
        # documents in the job's stores that this weirflow cannot read, skipped (weirflow.base.malformed)
        "malformed": [entry.to_json() for entry in found],
    }
