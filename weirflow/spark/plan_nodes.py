"""Reading a stage's analyzed Spark plans: which logical operators keep state, reorder rows or map whole
partitions (`weirflow.spark.query.StageBuilder` decides with them whether a stage's tasks share a query and
whether its rows keep their positions), and which columns pass through a transform untouched."""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame

# Stateless operators after which a partition's rows are no longer in their input's order: a stage with one
# of them carries no row positions (`weirflow.spark.replay` needs rows written in position order).
REORDERING_OPERATORS = frozenset({"Repartition", "RepartitionByExpression", "RebalancePartitions"})
# Maps over whole partitions: user code that may reorder, hold back or regroup rows. A stage with one keeps
# positions only when the transform that adds it declared it order-keeping (`Stream.transform(keeps_order=)`).
MAP_OPERATORS = frozenset(
    {
        "MapInPandas",
        "PythonMapInArrow",
        "MapInArrow",
        "MapPartitionsInPandas",
        "MapElements",
        "MapPartitions",
        "AppendColumns",
    }
)
# Logical operators of a streaming query that keep no state between micro-batches. A stage made only of these
# may run its tasks in one query (`SparkTaskRunner`); anything else (aggregations, joins, deduplication,
# limits, stateful map functions, operators added by later Spark versions) counts as stateful.
STATELESS_OPERATORS = (
    frozenset(
        {
            "StreamingRelationV2",
            "StreamingDataSourceV2Relation",
            "StreamingDataSourceV2ScanRelation",
            "StreamingRelation",
            "EventTimeWatermark",
            "CollectMetrics",
            "Project",
            "Filter",
            "Union",
            "SubqueryAlias",
            "Generate",
            "Sample",
            "ResolvedHint",
            "SerializeFromObject",
            "DeserializeToObject",
            "Expand",
        }
    )
    | REORDERING_OPERATORS
    | MAP_OPERATORS
)


def children(node: Any) -> list[Any]:
    found = node.children()
    return [found.apply(i) for i in range(found.size())]


def walk(node: Any) -> list[Any]:
    """Every node of an analyzed plan (a JVM ``LogicalPlan``), ``node`` first."""
    found, pending = [], [node]
    while pending:
        current = pending.pop()
        found.append(current)
        pending.extend(children(current))
    return found


def analyzed(frame: DataFrame) -> Any:
    return frame._jdf.queryExecution().analyzed()


def count_operators(frame: DataFrame, operators: frozenset[str]) -> int:
    return sum(str(n.nodeName()) in operators for n in walk(analyzed(frame)))


def self_union(plan: Any) -> bool:
    """Whether a ``Union`` in ``plan`` has two branches reading one input: an input's source is observed once
    (`weirflow.spark.query.observation_name`), so two branches holding one observation's node read the same
    rows."""
    for node in walk(plan):
        if str(node.nodeName()) != "Union":
            continue
        seen: set[str] = set()
        for child in children(node):
            inputs = {str(n.name()) for n in walk(child) if str(n.nodeName()) == "CollectMetrics"}
            if inputs & seen:
                return True
            seen |= inputs
    return False


def hashed_partition(key: Any, count: int) -> Any:
    """The intermediate partition of a row keyed ``key`` (binary) among ``count``: crc32 of the key, as the
    embedded log hashes keys; a null key goes to partition 0. The sink places rows by it and a shared aggregate
    query finds a result's partition again by it (`weirflow.spark.shared_aggregation`): one expression for both."""
    from pyspark.sql import functions as F

    return F.coalesce(F.pmod(F.crc32(key), F.lit(count)), F.lit(0))


def passes_through(before: DataFrame, after: DataFrame, column: str) -> bool:
    """Whether ``after`` (a transform of ``before``) has ``before``'s ``column`` as it is: the same attribute of
    the analyzed plan (a ``select`` or ``withColumn`` of other columns keeps it; an alias or a new value does
    not)."""

    def ids(frame: DataFrame) -> dict[str, int]:
        output = analyzed(frame).output()
        attributes = [output.apply(i) for i in range(output.size())]
        return {str(a.name()): int(a.exprId().id()) for a in attributes}

    was, now = ids(before), ids(after)
    return column in was and was[column] == now.get(column)
