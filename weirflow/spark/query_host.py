"""What a query's start and its per-batch work ask of the runner that holds them (`weirflow.spark.runner`).

`StageQuery` and `TaskProgress` are the runner's helpers: one starts and stops a query, the other turns each
finished micro-batch into checkpoints. They need a few of the runner's services (the plan, the stage builder,
the checkpoint store, where Spark checkpoints go, the lease callbacks, a way to wake its launcher), and this is
the whole list, so that they depend on it and not on the runner, which imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from weirflow.interfaces.spark_state import SparkStateStore
from weirflow.interfaces.system import SystemStreamPartition

if TYPE_CHECKING:
    from weirflow.pipeline.plan import PipelinePlan
    from weirflow.spark.query import StageBuilder


class QueryHost(Protocol):
    """The runner's services its queries use."""

    plan: PipelinePlan
    builder: StageBuilder
    checkpoints: Any  # the job's `CheckpointManager`
    state_store: SparkStateStore | None
    job: str
    run_id: str
    trigger_ms: int
    output_mode: str
    checkpoint_root: Path
    lease_valid: Callable[[str], bool] | None

    def spark_checkpoint_dir(self, task_name: str) -> Path: ...

    def stream_id_of(self, ssp: SystemStreamPartition) -> str: ...

    def leases_file(self) -> str: ...

    def wake(self) -> None: ...
