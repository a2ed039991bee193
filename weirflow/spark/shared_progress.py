"""A shared aggregation query's start and per-batch bookkeeping (`weirflow.spark.rebuild`).

* At start, each task reads its partition from its rebuild point (`rebuild_starts`) and, until its reads pass
  its checkpoint, holds the query's watermark at its ``closed``.
* The source injects the least watermark over the query's tasks (`write_injected`): Spark keeps one watermark
  per query, and a task's windows must not close on another task's time. On intermediate streams only injected
  watermarks move Spark's (data rows carry none: `weirflow.spark.source`), so this is each task's own rule,
  applied to all of them at once: a window closes once every task of the query is past it, which may delay a
  result, never drop a row a query of the task alone would have taken.
* After each batch, each task's ``closed`` and rebuild marks go into its checkpoint (`note_batch`).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from weirflow.interfaces.system import SystemStreamPartition
from weirflow.spark.rebuild import RebuildState, add_mark, prune, rebuild_point

if TYPE_CHECKING:
    from weirflow.pipeline.plan import Stage
    from weirflow.spark.query_host import QueryHost
    from weirflow.spark.task_state import TaskState


class SharedQuery(Protocol):
    """What these functions use of a shared aggregation query (`weirflow.spark.stage_query.StageQuery`)."""

    runner: QueryHost
    stage: Stage
    tasks: list[TaskState]
    inputs: list[str]
    inject_file: Path | None

    def _start_offset(self, t: TaskState, ssp: SystemStreamPartition) -> str: ...


log = logging.getLogger("weirflow.spark")

NOTHING_BEFORE = -(1 << 62)  # a mark's latest event time when no row before it belongs to this run's windows
MARK_STEPS = 16  # rebuild marks per window length, at most (`weirflow.spark.rebuild.add_mark`)


def rebuildable(t: TaskState) -> bool:
    """Whether ``t`` can join a shared aggregation query, which keeps no state of its own: its checkpoint says
    which windows it wrote (``closed``), or it has read nothing yet, and it keeps its replays itself. A task whose
    checkpoint an older version wrote runs one query of its own, whose state it restores, until a checkpoint
    says so (every stateful query's checkpoints do)."""
    fresh = t.control.closed is not None or not t.offsets
    return fresh and "ledger" not in t.control.replays


def rebuild_starts(query: SharedQuery) -> dict[SystemStreamPartition, str]:
    """Where each task of ``query`` reads each of its partitions from: its rebuild point. A task that never read
    a partition starts where any task would; one whose checkpoint names no window written yet in this
    deployment (``closed`` -1) at its offsets; one without a rebuild mark early enough at the partition's oldest
    record. Sets each task's `RebuildState` (None when it starts at its offsets) and its reads' running latest
    event time (``seen``)."""
    length = query.runner.builder.shared(query.stage).length_ms
    starts: dict[SystemStreamPartition, str] = {}
    for t in query.tasks:
        t.rebuild = None
        until: dict[str, int] = {}
        if t.control.closed is None:  # it has read nothing (`rebuildable`): no window written
            t.control.closed = -1
        closed = t.control.closed
        for ssp in t.task.ssps:
            key = ssp.key()
            if ssp not in t.offsets:
                starts[ssp] = query._start_offset(t, ssp)
                t.seen[key] = NOTHING_BEFORE
                t.control.rebuild[key] = [[starts[ssp], NOTHING_BEFORE]]
                continue
            if closed < 0:
                starts[ssp] = t.offsets[ssp]
                t.seen[key] = NOTHING_BEFORE
                t.control.rebuild[key] = [[starts[ssp], NOTHING_BEFORE]]
                continue
            marks = t.control.rebuild.get(key, [])
            point = rebuild_point(marks, closed, length)
            if point is None:
                meta = query.runner.plan.systems.admin(ssp.system).partition_metadata_of(
                    ssp.stream, [ssp.partition]
                )
                point = meta[ssp.partition].oldest
                log.warning(
                    "task %s: no rebuild mark of %s is early enough (its checkpoint was written by an older "
                    "version, or one query per task); its open windows are rebuilt from the oldest record, %s",
                    t.name,
                    key,
                    point,
                )
                t.seen[key] = NOTHING_BEFORE
                t.control.rebuild[key] = [[point, NOTHING_BEFORE]]
            else:
                t.seen[key] = int(next(m[1] for m in marks if str(m[0]) == point))
            point = str(min(int(point), int(t.offsets[ssp])))
            starts[ssp] = point
            if int(point) < int(t.offsets[ssp]):
                until[key] = int(t.offsets[ssp])
        if until:
            t.rebuild = RebuildState(closed, until)
            log.info(
                "task %s: rebuilding its windows open after %d from %s (checkpointed at %s)",
                t.name,
                closed,
                {k: starts[SystemStreamPartition.parse(k)] for k in until},
                until,
            )
    return starts


def injected(query: SharedQuery) -> dict[str, int]:
    """Per intermediate input, the watermark the query's source is to inject: the least over its tasks (each
    held at its ``closed`` while it rebuilds); none while a task has no watermark yet."""
    values: dict[str, int] = {}
    for stream_id in query.inputs or query.stage.input_ids:
        least: int | None = None
        for t in query.tasks:
            own = t.control.injected.get(stream_id)
            if t.rebuild is not None:
                own = t.rebuild.cap(own)
            if own is None:
                least = None
                break
            least = own if least is None else min(least, own)
        if least is not None:
            values[stream_id] = least
    return values


def write_injected(query: SharedQuery) -> None:
    """Write `injected` to the query's file, which its source reads as it plans each batch (replaced whole, so
    a reader never sees half of it)."""
    path = query.inject_file
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(injected(query)))
    tmp.replace(path)


def note_batch(t: TaskState, offsets: dict[SystemStreamPartition, str], watermark: int, length_ms: int) -> None:
    """After a batch of a shared query: the task's ``closed`` (Spark's watermark of the batch: every window ending
    at or before it was written), its rebuild marks at the batch's end offsets, and whether its rebuild is over."""
    closed = max(-1 if t.control.closed is None else t.control.closed, watermark)
    t.control.closed = closed
    for ssp, offset in offsets.items():
        key = ssp.key()
        marks = add_mark(
            t.control.rebuild.get(key, []), offset, t.seen.get(key, NOTHING_BEFORE), length_ms // MARK_STEPS
        )
        t.control.rebuild[key] = prune(marks, closed, length_ms)
    if t.rebuild is not None and t.rebuild.over({ssp.key(): o for ssp, o in offsets.items()}):
        log.info("task %s: its windows are rebuilt (its reads passed %s)", t.name, t.rebuild.until)
        t.rebuild = None
