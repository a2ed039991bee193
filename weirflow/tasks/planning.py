"""Planning a job's tasks: which SSPs exist and how they are grouped (the leader does this for each model).

A record-task job reads the streams in `task.inputs`; they form one stage, ``main``, whose tasks are
``main-<n>`` holding partition n of every input (Samza's GroupByPartition).
"""

from __future__ import annotations

from weirflow.interfaces.config import ConfigView
from weirflow.interfaces.system import SystemStreamPartition
from weirflow.job.grouper import group_by_partition
from weirflow.job.model import TaskModel
from weirflow.job.systems import Systems

RECORD_STAGE = "main"


def plan_record_tasks(config: ConfigView, systems: Systems) -> dict[str, TaskModel]:
    """Tasks of a `task.inputs` job. Raises `StreamNotFoundError` naming a missing input stream."""
    inputs = config.get("task.inputs")
    if not inputs:
        raise config.error("task.inputs", "names no input stream; list the stream ids this job reads")
    ssps: list[SystemStreamPartition] = []
    prefix = ""
    for stream_id in inputs:
        ref = systems.resolve(stream_id)
        admin = systems.admin(ref.system)
        count = admin.partition_count(ref.physical)
        ssps.extend(SystemStreamPartition(ref.system, ref.physical, p) for p in range(count))
        prefix = prefix or admin.task_prefix
    return group_by_partition(RECORD_STAGE, ssps, prefix)
