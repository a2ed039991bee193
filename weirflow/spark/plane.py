"""The Spark data plane of one processor: its SparkSession, the job's pipeline plan and the task runner.

Built once per processor when the job is a pipeline (`JobMode.PIPELINE`): the leader's planner and the runner
share it (`weirflow.coordination.data_plane` holds it for the processor).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from weirflow.interfaces.plugins import spark_state_factory
from weirflow.job.context import JobContext
from weirflow.job.model import TaskModel
from weirflow.job.retention import check_retention
from weirflow.pipeline.api import PipelineError
from weirflow.pipeline.plan import PipelinePlan, load_pipeline
from weirflow.spark.query import StageBuilder
from weirflow.spark.runner import SparkTaskRunner
from weirflow.spark.session import build_spark_session

log = logging.getLogger("weirflow.spark")


class SparkDataPlane:
    def __init__(self, ctx: JobContext) -> None:
        config = ctx.config
        # Python workers import the job's modules (UDFs, transforms) from the config file's directory.
        base = str(config.base_dir)
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if base not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([base, *paths])
        # The session comes first: pipeline functions may build Columns (F.col, ...), which need it.
        self.spark = build_spark_session(config)
        app = load_pipeline(config)
        try:
            self.plan = PipelinePlan(app, config, ctx.systems)
        except PipelineError as exc:
            target = config.get("app.pipeline")
            raise config.error("app.pipeline", f"{target} builds an invalid pipeline: {exc}") from exc
        check_retention(config, ctx.systems, self.plan.read_back())  # before creating them
        self.plan.ensure_streams()
        self.builder = StageBuilder(self.spark, self.plan, config.snapshot())
        # Registering the data sources and analysing the stages (~2 s, each a Python process Spark starts)
        # happen in the runner's background, so the processor joins its group meanwhile: the leader's
        # debounce and this work overlap instead of adding up.
        state_store = spark_state_factory(config).get_spark_state_store(config)
        self.runner = SparkTaskRunner(
            self.spark, self.plan, ctx.checkpoints, self.builder, prepare=self._prepare, state_store=state_store
        )

    def _prepare(self) -> None:
        from weirflow.spark.sink import WeirflowSink
        from weirflow.spark.source import WeirflowSource

        self.spark.dataSource.register(WeirflowSource)
        self.spark.dataSource.register(WeirflowSink)
        if self.plan.config.get("task.stateless.merge"):
            for stage in self.plan.stages:
                self.builder.stateless(stage)

    def planner(self) -> Callable[[], dict[str, TaskModel]]:
        return self.plan.plan_tasks
