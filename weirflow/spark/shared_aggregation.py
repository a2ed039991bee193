"""Which stages run their tasks on a processor as one query, and the aggregation such a query runs.

A stage whose whole work is one `Stream.aggregate` of an intermediate stream (the shape ``partition_by`` then
``aggregate`` gives) keeps nothing in Spark's state that its tasks cannot rebuild by reading their partitions
again (`weirflow.spark.rebuild`). So the tasks a processor holds of it run as one query (``task.aggregate.merge``,
on by default), as a stateless stage's do: one micro-batch loop, one plan and one state store per batch instead
of one per task. The query groups by the task too (``__task``, the index of the task whose partition a row came
from): every key already lives in one partition, so the groups are the user's, and each result knows its task
for the sink's bookkeeping (`weirflow.spark.sink`). Any other stateful stage runs one query per task, and the
processor says why once (`SharedAggregation.reason`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from weirflow.pipeline.aggregate import AggregateSpec
from weirflow.pipeline.plan import PipelinePlan, Stage
from weirflow.spark.rebuild import duration_ms
from weirflow.spark.source_spec import TASK_COLUMN

log = logging.getLogger("weirflow.spark")


@dataclass(frozen=True)
class SharedAggregation:
    """How a stage's tasks share one query: its ``spec`` and window ``length_ms``, or, when they cannot,
    ``reason`` (said once per stage at start)."""

    spec: AggregateSpec | None = None
    length_ms: int = 0
    reason: str = ""

    @property
    def shared(self) -> bool:
        return self.spec is not None


def shared_aggregation(plan: PipelinePlan, stage: Stage, stateless: bool, time: str) -> SharedAggregation:
    """Whether ``stage``'s tasks on one processor can run as one query; a stateful stage that cannot is named in
    the log with why (`task.stateless.merge` covers a stateless one). ``time``: its input's event-time column."""
    found = _shared(plan, stage, stateless, time)
    if not found.shared and not stateless:
        log.info("stage %s: its tasks run one query each, not one per processor: %s", stage.name, found.reason)
    return found


def _shared(plan: PipelinePlan, stage: Stage, stateless: bool, time: str) -> SharedAggregation:
    if stateless:
        return SharedAggregation(reason="it keeps no state")
    if not plan.config.get("task.aggregate.merge"):
        return SharedAggregation(reason="task.aggregate.merge is off")
    aggregates = [n for n in stage.nodes if n.op == "aggregate"]
    if len(aggregates) != 1 or len(stage.nodes) != 2 or len(stage.inputs) != 1:
        return SharedAggregation(reason="its work is not one aggregate of its input alone")
    node, source = aggregates[0], stage.inputs[0]
    if node.parents != [source] or not plan.is_intermediate(str(source.stream_id)):
        return SharedAggregation(
            reason="its aggregate does not read an intermediate stream (a partition_by) directly"
        )
    if not plan.systems.admin(plan.ref(str(source.stream_id)).system).dense_offsets:
        return SharedAggregation(reason="its input is on a system without dense offsets (Kinesis)")
    if stage.serves or any(sink.node is not node for sink in stage.sinks):
        return SharedAggregation(reason="it serves a table or writes other rows than the aggregate's")
    if any(plan.systems.table_writer(plan.ref(s.stream_id).system) is not None for s in stage.sinks):
        return SharedAggregation(reason="it writes to a table")
    assert node.aggregate is not None
    if node.aggregate.time not in (None, time):
        return SharedAggregation(reason=f"its window is over {node.aggregate.time}, not the event time {time}")
    length = duration_ms(node.aggregate.window)
    if length is None:
        return SharedAggregation(reason=f"its window {node.aggregate.window!r} has no fixed length")
    return SharedAggregation(node.aggregate, length)


def per_task(spec: AggregateSpec, rows: DataFrame, time: str, partials: bool, closed: Mapping[int, int]) -> Any:
    """The stage's aggregation grouped by task as well, without the windows each task had written before the
    query started (those ending at or before its ``closed``, which its rebuild brings back: `weirflow.spark.
    rebuild`)."""
    aggregated = (spec.final if partials else spec.whole)(rows, time, extra=(TASK_COLUMN,))
    floors = [v for i, c in sorted(closed.items()) if c >= 0 for v in (F.lit(i), F.lit(c))]
    if not floors:
        return aggregated
    floor = F.coalesce(F.element_at(F.create_map(*floors), F.col(TASK_COLUMN)), F.lit(-1))
    return aggregated.filter(F.unix_millis(F.col("window.end")) > floor)
