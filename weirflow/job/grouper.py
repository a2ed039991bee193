"""Grouping SSPs into tasks by partition (Samza's GroupByPartition).

Task ``<stage>-<n>`` holds partition n of every input stream of the stage that has a partition n, so a
stage's co-partitioned inputs meet in one task (what joins and `partition_by` rely on). A stage reading a
system whose partitions are virtual tasks (`SystemAdmin.task_prefix`, Kinesis: ``v``) names them
``<stage>-v<n>``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from weirflow.base.errors import InvalidArgumentError
from weirflow.interfaces.system import SystemStreamPartition
from weirflow.job.model import TaskModel

_STAGE = re.compile(r"^[A-Za-z0-9_]+$")


def partition_task(stage: str, partition: int, prefix: str = "") -> str:
    """The name of the task of ``stage`` holding partition ``partition`` of its inputs."""
    return f"{stage}-{prefix}{partition}"


def group_by_partition(
    stage: str, ssps: Iterable[SystemStreamPartition], prefix: str = ""
) -> dict[str, TaskModel]:
    if not _STAGE.match(stage):
        raise InvalidArgumentError(f"stage name {stage!r} must match [A-Za-z0-9_]+ (task names are '<stage>-<n>')")
    by_partition: dict[int, list[SystemStreamPartition]] = {}
    for ssp in ssps:
        by_partition.setdefault(ssp.partition, []).append(ssp)
    return {
        name: TaskModel(name, stage, tuple(sorted(set(group))))
        for n, group in sorted(by_partition.items())
        for name in [partition_task(stage, n, prefix)]
    }
