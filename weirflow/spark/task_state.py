"""What the processor keeps of one task its Spark queries run: `TaskState` (its lock and fence, control state, last
offsets and progress) and `TaskStats` (what it did here, for ``GET /metrics``, ``GET /tasks`` and the status
page)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from weirflow.base.telemetry import BATCH_BUCKETS, Histogram
from weirflow.interfaces.checkpoint import Checkpoint
from weirflow.interfaces.coordination import Lock
from weirflow.interfaces.system import SystemStreamPartition
from weirflow.job.model import TaskModel
from weirflow.runtime.control import TaskControl
from weirflow.runtime.fencing import FencedCheckpointWriter
from weirflow.spark.query_host import QueryHost
from weirflow.spark.rebuild import RebuildState


@dataclass
class TaskStats:
    """What a task did here since it started on this processor, for ``GET /metrics``, ``GET /tasks`` and the
    status page (docs/endpoints.md). Summed over a stage's tasks (and processors) each count is the stage's:
    nothing a query shares between its tasks is counted on each of them."""

    batches: int = 0
    # records read: an input stream's records (counted by its system's admin), an intermediate stream's rows
    # (the packed records hold many each; replays dropped are not counted, its dead letters are)
    records_in: int = 0
    last_batch_ms: int = 0  # duration of its query's last micro-batch
    last_checkpoint_ms: int = 0  # wall-clock time of its last checkpoint write
    replays_dropped: int = 0  # intermediate rows read here that a replay had written again (dropped)
    # rows written per output stream for this task: a stateful task's query's all; in a stateless stage's shared
    # query the rows of the task's partitions (by their position, `WeirflowStreamWriter`), when rows carry one
    records_out: dict[str, int] = field(default_factory=dict)
    batch_seconds: Histogram = field(default_factory=lambda: Histogram(BATCH_BUCKETS))  # its batches' durations

    def to_json(self) -> dict[str, Any]:
        return {
            "batches": self.batches,
            "records_in": self.records_in,
            "last_batch_ms": self.last_batch_ms,
            "last_checkpoint_ms": self.last_checkpoint_ms,
            "replays_dropped": self.replays_dropped,
            "records_out": dict(self.records_out),
            "batch_seconds": self.batch_seconds.to_json(),
        }


class TaskState:
    """One task this processor runs: its lock and fence, control state, last offsets and progress."""

    def __init__(self, runner: QueryHost, task: TaskModel, lock: Lock, checkpoint: Checkpoint | None) -> None:
        self.task = task
        self.lock = lock
        self.stage = runner.plan.stage(task.stage)
        self.writer = FencedCheckpointWriter(task.name, runner.checkpoints, lock)
        self.control = TaskControl.from_json(checkpoint.control if checkpoint else None)
        self.offsets: dict[SystemStreamPartition, str] = dict(checkpoint.offsets) if checkpoint else {}
        self.keys = {ssp.key() for ssp in task.ssps}
        self.seen: dict[str, int] = {}  # SSP key -> latest event time read (ms): stateless output watermark
        self.done = False  # finished: its inputs ended and end-of-stream went downstream
        self.error: str | None = None
        self.stats = TaskStats()
        self.read_to: dict[SystemStreamPartition, str] = {}  # where its query's last batch ended (records in)
        # whether a query of the task may have written past its checkpoint: an earlier holder claimed it, or
        # this one started a query of it before (`StageQuery._rows_until`)
        self.started_before = checkpoint is not None
        # in a shared aggregation query, while its reads have not passed its checkpoint (`weirflow.spark.rebuild`)
        self.rebuild: RebuildState | None = None

    @property
    def name(self) -> str:
        return self.task.name
