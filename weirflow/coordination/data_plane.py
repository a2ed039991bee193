"""The job's own data plane, the default of a `StreamProcessor`: the task runner and the leader's planner.

A pipeline job (`JobMode.PIPELINE`) runs on the Spark data plane (`weirflow.spark.plane`), built once and
shared by the runner and the planner; a record job runs the record runner (`weirflow.tasks.record_task`) and
plans one task per input partition (`weirflow.tasks.planning`). Both are imported only when used: a record
job never loads Spark.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from weirflow.job.context import JobContext
from weirflow.job.mode import JobMode
from weirflow.job.model import TaskModel
from weirflow.tasks.runner import TaskRunner

if TYPE_CHECKING:
    from weirflow.spark.plane import SparkDataPlane


class JobDataPlane:
    """Builds the runner and the planner of one processor's job; a pipeline's Spark plane only once."""

    def __init__(self) -> None:
        self._spark: SparkDataPlane | None = None

    def _spark_plane(self, ctx: JobContext) -> SparkDataPlane:
        if self._spark is None:
            from weirflow.spark.plane import SparkDataPlane

            self._spark = SparkDataPlane(ctx)
        return self._spark

    def runner(self, ctx: JobContext) -> TaskRunner:
        if ctx.mode is JobMode.PIPELINE:
            return self._spark_plane(ctx).runner
        from weirflow.tasks.record_task import RecordTaskRunner

        return RecordTaskRunner.from_config(ctx.config, ctx.systems, ctx.checkpoints)

    def planner(self, ctx: JobContext) -> Callable[[], dict[str, TaskModel]]:
        if ctx.mode is JobMode.PIPELINE:
            return self._spark_plane(ctx).planner()
        from weirflow.tasks.planning import plan_record_tasks

        return lambda: plan_record_tasks(ctx.config, ctx.systems)
