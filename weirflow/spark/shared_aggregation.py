"""Which stages run their tasks on a processor as one query, and the aggregation such a query runs.

A stage whose work is one `Stream.aggregate` of an intermediate stream (the shape ``partition_by`` then
``aggregate`` gives), maybe followed by stateless transforms of its results, keeps nothing in Spark's state that
its tasks cannot rebuild by reading their partitions again (`weirflow.spark.rebuild`). So the tasks a processor
holds of it run as one query (``task.aggregate.merge``, on by default), as a stateless stage's do: one
micro-batch loop, one plan and one state store per batch instead of one per task.

The query groups by the intermediate partition too (``__part``, the partition a row was read from): every key
already lives in one partition, so the groups are the user's, each task's state stays apart, and each result
knows its partition, hence its task, for the windows its task had written (`per_task`) and for the sink's
bookkeeping (`weirflow.spark.shared_results`). A transform after the aggregate that drops ``__part`` (a
``select``) gets it back from the column the stream is partitioned by, hashed as the stage that wrote the stream
did, provided the transform passes that column through unchanged. Any other stateful stage runs one query per
task, and the processor says why once (`SharedAggregation.reason`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from weirflow.pipeline.aggregate import AggregateSpec
from weirflow.pipeline.plan import PipelinePlan, Stage
from weirflow.spark.plan_nodes import STATELESS_OPERATORS, analyzed, hashed_partition, passes_through, walk
from weirflow.spark.rebuild import duration_ms
from weirflow.spark.source_spec import PART_COLUMN

log = logging.getLogger("weirflow.spark")


@dataclass(frozen=True)
class SharedAggregation:
    """How a stage's tasks share one query: its ``spec``, window ``length_ms``, and the ``key`` column its input is
    partitioned by over ``partitions`` (to find a result's partition after a transform); or, when they cannot,
    ``reason`` (said once per stage at start)."""

    spec: AggregateSpec | None = None
    length_ms: int = 0
    key: str | None = None
    partitions: int = 0
    reason: str = ""

    @property
    def shared(self) -> bool:
        return self.spec is not None

    def partition_of_key(self) -> Column:
        """A result's intermediate partition from its key column, as the writing stage's sink chose it
        (`weirflow.spark.query.StageBuilder.sink_frame`)."""
        key = F.col(str(self.key)).cast("string").cast("binary")
        return hashed_partition(key, self.partitions).cast("int")


def shared_aggregation(
    plan: PipelinePlan, stage: Stage, stateless: bool, time: str, frames: Mapping[int, DataFrame]
) -> SharedAggregation:
    """Whether ``stage``'s tasks on one processor can run as one query; a stateful stage that cannot is named in
    the log with why (`task.stateless.merge` covers a stateless one). ``time``: its input's event-time column;
    ``frames``: its frames without a scope, node id -> DataFrame."""
    found = _shared(plan, stage, stateless, time, frames)
    if not found.shared and not stateless:
        log.info("stage %s: its tasks run one query each, not one per processor: %s", stage.name, found.reason)
    return found


def _shared(
    plan: PipelinePlan, stage: Stage, stateless: bool, time: str, frames: Mapping[int, DataFrame]
) -> SharedAggregation:
    if stateless:
        return SharedAggregation(reason="it keeps no state")
    if not plan.config.get("task.aggregate.merge"):
        return SharedAggregation(reason="task.aggregate.merge is off")
    nodes = stage.nodes
    chained = all(n.op == "transform" and n.parents == [nodes[i + 1]] for i, n in enumerate(nodes[2:]))
    if len(stage.inputs) != 1 or len(nodes) < 2 or nodes[1].op != "aggregate" or not chained:
        return SharedAggregation(
            reason="its work is not one aggregate of its input, then transforms of its results"
        )
    node, source, last = nodes[1], nodes[0], nodes[-1]
    stream_id = str(source.stream_id)
    if node.parents != [source] or not plan.is_intermediate(stream_id):
        return SharedAggregation(
            reason="its aggregate does not read an intermediate stream (a partition_by) directly"
        )
    if not plan.systems.admin(plan.ref(stream_id).system).dense_offsets:
        return SharedAggregation(reason="its input is on a system without dense offsets (Kinesis)")
    if stage.serves or any(sink.node is not last for sink in stage.sinks):
        return SharedAggregation(reason="it serves a table, or writes other rows than its last transform's")
    if any(plan.systems.table_writer(plan.ref(s.stream_id).system) is not None for s in stage.sinks):
        return SharedAggregation(reason="it writes to a table")
    spec = node.aggregate
    assert spec is not None
    if spec.time not in (None, time):
        return SharedAggregation(reason=f"its window is over {spec.time}, not the event time {time}")
    length = duration_ms(spec.window)
    if length is None:
        return SharedAggregation(reason=f"its window {spec.window!r} has no fixed length")
    writer = plan.writer_stage(stream_id)
    key = next(s.key for s in writer.sinks if s.intermediate and s.stream_id == stream_id)
    why = _after_aggregate(frames[id(node)], frames[id(last)], key) if last is not node else ""
    if why:
        return SharedAggregation(reason=why)
    return SharedAggregation(spec, length, key if isinstance(key, str) else None, plan.partition_count(stream_id))


def _after_aggregate(aggregated: DataFrame, last: DataFrame, key: Any) -> str:
    """Why the transforms from the aggregate's results to ``last`` keep a stage from sharing a query ("" when
    they do not): state of their own, or the partitioning column not passed through (a result's partition, hence
    its task, could not be found again)."""
    names = [str(n.nodeName()) for n in walk(analyzed(last))]
    if names.count("Aggregate") != 1 or not set(names) <= STATELESS_OPERATORS | {"Aggregate"}:
        return "a transform after its aggregate keeps state of its own"
    if not isinstance(key, str) or not passes_through(aggregated, last, key):
        return f"a transform after its aggregate does not keep the column it is partitioned by ({key!r}) as it is"
    return ""


def per_task(spec: AggregateSpec, rows: DataFrame, time: str, partials: bool, closed: Mapping[int, int]) -> Any:
    """The stage's aggregation grouped by intermediate partition as well, without the windows each partition's
    task had written before the query started (those ending at or before its ``closed``, which its rebuild brings
    back: `weirflow.spark.rebuild`)."""
    aggregated = (spec.final if partials else spec.whole)(rows, time, extra=(PART_COLUMN,))
    floors = [v for p, c in sorted(closed.items()) if c >= 0 for v in (F.lit(p), F.lit(c))]
    if not floors:
        return aggregated
    floor = F.coalesce(F.element_at(F.create_map(*floors), F.col(PART_COLUMN)), F.lit(-1))
    return aggregated.filter(F.unix_millis(F.col("window.end")) > floor)
