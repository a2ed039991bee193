"""`JobMode`: which data plane a job runs, decided from its config by one rule.

A job either sets ``app.pipeline`` (a pipeline: stages of Spark queries, `weirflow.spark`) or runs a record
function (``task.function``: the record runner, `weirflow.tasks`). Every place that behaves differently for
the two asks `JobMode.of` (or `JobContext.mode`, computed once when the context opens) instead of reading the
key itself, so the rule lives here only.
"""

from __future__ import annotations

from enum import Enum

from weirflow.interfaces.config import ConfigView


class JobMode(Enum):
    PIPELINE = "pipeline"  # `app.pipeline` is set: the Spark data plane runs the job's stages
    RECORD = "record"  # no pipeline: record tasks run the job's `task.function`

    @classmethod
    def of(cls, config: ConfigView) -> JobMode:
        """The mode of the job ``config`` describes: a pipeline when it names one in ``app.pipeline``."""
        return cls.PIPELINE if config.get("app.pipeline") else cls.RECORD
