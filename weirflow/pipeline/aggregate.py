"""Windowed aggregations the runtime can split across a stage boundary (docs/pipelines.md, "Aggregations").

``Stream.aggregate("page", window="1 minute", views=agg.count())`` is
``df.groupBy(F.window(<event time>, "1 minute"), "page").agg(F.count("*").alias("views"))``, declared so that
the runtime knows how it decomposes. Right after a ``partition_by`` of a row-wise stage, the producing stage
sends per micro-batch one partial row per input partition, window and key instead of every row (as Spark's
own map-side ``HashAggregate(partial)`` does) and the consuming stage merges the partials
(`weirflow.spark.partials`; docs/design/data-plane.md). Anywhere else it runs whole, on every row.

Each aggregation becomes partial columns that merge by one rule each (count and sum add, min and max keep
the least and the greatest), and the final value is computed from them: ``avg`` is a sum over a count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from weirflow.base.errors import PipelineError

ROWS = "__rows"  # every partial row's count of the input rows it stands for
WINDOW = "__window"  # the window's start: what partials are grouped by besides the keys


@dataclass(frozen=True)
class Aggregation:
    """One aggregate of `Stream.aggregate`: ``kind`` (count, sum, min, max, avg) of ``column`` (None: rows)."""

    kind: str
    column: str | None = None

    def partials(self, name: str) -> list[tuple[str, str]]:
        """The partial columns of the output column ``name``: (column, how two merge)."""
        if self.kind == "count":
            return [] if self.column is None else [(f"__c_{name}", "count")]
        if self.kind == "avg":
            return [(f"__s_{name}", "sum"), (f"__c_{name}", "count")]
        return [(f"__{self.kind[:2]}_{name}", self.kind)]


def count(column: str | None = None) -> Aggregation:
    """Rows (``count()``), or rows where ``column`` is not null, as Spark's ``count``."""
    return Aggregation("count", column)


def sum(column: str) -> Aggregation:
    """The sum of ``column`` (null when every value is null), as Spark's ``sum``."""
    return Aggregation("sum", _named(column, "sum"))


def min(column: str) -> Aggregation:
    """The least value of ``column``."""
    return Aggregation("min", _named(column, "min"))


def max(column: str) -> Aggregation:
    """The greatest value of ``column``."""
    return Aggregation("max", _named(column, "max"))


def avg(column: str) -> Aggregation:
    """The mean of ``column``'s non-null values, a double, as Spark's ``avg``."""
    return Aggregation("avg", _named(column, "avg"))


def _named(column: Any, kind: str) -> str:
    if not isinstance(column, str) or not column:
        raise PipelineError(f"agg.{kind} needs a column name, got {column!r}")
    return column


@dataclass(frozen=True)
class AggregateSpec:
    """What `Stream.aggregate` declared: grouping ``keys``, a tumbling ``window`` (Spark's duration text) over
    ``time`` (None: the stream's event time), and the output columns' aggregations, in order."""

    keys: tuple[str, ...]
    window: str
    time: str | None
    aggregations: tuple[tuple[str, Aggregation], ...]

    def partial_columns(self) -> list[tuple[str, str]]:
        """Every partial column (column, how two merge), the row count first."""
        columns = [(ROWS, "count")]
        for name, aggregation in self.aggregations:
            columns += aggregation.partials(name)
        return columns

    def whole(self, df: Any, time: str, extra: tuple[str, ...] = ()) -> Any:
        """The aggregation over every row of ``df`` (grouped by the ``extra`` columns too: a shared query's task,
        `weirflow.spark.shared_aggregation`)."""
        from pyspark.sql import functions as F

        outputs = []
        for name, a in self.aggregations:
            if a.kind == "count":
                outputs.append(F.count(F.lit(1) if a.column is None else F.col(a.column)).alias(name))
            else:
                outputs.append(getattr(F, a.kind)(F.col(str(a.column))).alias(name))
        return df.groupBy(F.window(time, self.window), *extra, *self.keys).agg(*outputs)

    def partial(self, df: Any, time: str) -> Any:
        """Each row of ``df`` as a partial of its own: the keys, the event time, the window's start, and the
        partial columns; positions pass through."""
        from pyspark.sql import functions as F

        columns = [F.col(k) for k in self.keys] + [F.col(time), F.window(time, self.window).start.alias(WINDOW)]
        columns.append(F.lit(1).cast("long").alias(ROWS))
        for name, a in self.aggregations:
            value = F.col(str(a.column))  # count() has no partial of its own: it is the row count
            for column, kind in a.partials(name):
                if kind == "count":
                    columns.append(F.when(value.isNotNull(), 1).otherwise(0).cast("long").alias(column))
                elif a.kind == "avg":
                    columns.append(value.cast("double").alias(column))
                else:
                    columns.append(value.alias(column))
        positions = [F.col(c) for c in ("__pss", "__pos") if c in df.columns]
        return df.select(*columns, *positions)

    def final(self, df: Any, time: str, extra: tuple[str, ...] = ()) -> Any:
        """The aggregation over partial rows (`partial`'s columns): the same columns `whole` gives."""
        from pyspark.sql import functions as F

        merge = {"count": F.sum, "sum": F.sum, "min": F.min, "max": F.max}
        outputs = []
        for name, a in self.aggregations:
            merged = [merge[kind](column) for column, kind in a.partials(name)] or [F.sum(ROWS)]  # count()
            outputs.append((merged[0] / merged[1] if a.kind == "avg" else merged[0]).alias(name))
        return df.groupBy(F.window(time, self.window), *extra, *self.keys).agg(*outputs)


def aggregate_spec(keys: tuple[Any, ...], window: Any, time: Any, aggregations: dict[str, Any]) -> AggregateSpec:
    """`Stream.aggregate`'s arguments checked, each mistake named."""
    for key in keys:
        if not isinstance(key, str) or not key:
            raise PipelineError(f"aggregate: keys are column names, got {key!r}")
    if not isinstance(window, str) or not window.strip():
        raise PipelineError(f"aggregate needs window= a duration such as '1 minute', got {window!r}")
    if time is not None and (not isinstance(time, str) or not time):
        raise PipelineError(f"aggregate: time= is a timestamp column's name, got {time!r}")
    if not aggregations:
        raise PipelineError("aggregate needs at least one aggregation, e.g. views=agg.count()")
    for name, aggregation in aggregations.items():
        if not isinstance(aggregation, Aggregation):
            raise PipelineError(
                f"aggregate: {name}= must be one of agg.count, agg.sum, agg.min, agg.max, agg.avg, "
                f"got {aggregation!r}"
            )
        if name.startswith("__") or name in keys or name == "window":
            raise PipelineError(f"aggregate: output column {name!r} clashes with a key or a reserved name")
    return AggregateSpec(tuple(keys), window, time, tuple(aggregations.items()))
