"""The pipeline API: what a job's ``app.pipeline`` function is given, and what it builds.

.. code-block:: python

    from pyspark.sql import functions as F

    def pipeline(app: weirflow.App) -> None:
        views = app.input("page-views")                     # event time and lateness come from config
        counts = (views.partition_by("page")                # stage boundary: an intermediate stream
                       .transform(lambda df: df.groupBy(F.window("event_time", "1 minute"), "page").count()))
        counts.send_to("page-counts", key=F.concat_ws("|", "page", "window.start"))

Calling the function only *records* a graph: no Spark runs. The runtime cuts the graph into stages at each
``partition_by`` (`weirflow.pipeline.plan`), and for each task builds the stage's DataFrames over that task's
partitions and runs them as one Spark streaming query. Every ``transform`` is therefore applied to a
streaming DataFrame holding one task's partitions: stateful operators are correct per task once their keys
were partitioned (that is what ``partition_by`` is for, as in Samza).

Declaration order matters for names: stages and intermediate streams get stable names from it (documented
in `weirflow.pipeline.plan`), so reordering ``partition_by`` calls without naming them renames their streams.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from weirflow.base.errors import PipelineError
from weirflow.interfaces.config import ConfigView
from weirflow.job.systems import is_http_stream
from weirflow.pipeline.aggregate import AggregateSpec, aggregate_spec

Transform = Callable[[Any], Any]  # pyspark DataFrame -> DataFrame
ColumnLike = Any  # a column name or a pyspark Column


@dataclass(eq=False)
class Node:
    """One operator of the graph. ``op`` is input | transform | aggregate | merge | join; ``parents`` feed it."""

    app: App
    op: str
    parents: list[Node] = field(default_factory=list)
    stream_id: str | None = None  # input
    fn: Transform | None = None  # transform
    keeps_order: bool = False  # transform: declared to keep each partition's rows in order (`Stream.transform`)
    aggregate: AggregateSpec | None = None  # aggregate: what `Stream.aggregate` declared
    join_on: Any = None
    join_how: str = "inner"
    index: int = 0


@dataclass(eq=False)
class Sink:
    """A write of ``node``'s rows to ``stream_id``: an output (``send_to``) or an intermediate stream."""

    node: Node
    stream_id: str
    key: ColumnLike | None
    intermediate: bool
    serve: str | None = None  # a served table's name (``Stream.serve``): kept per task, not sent anywhere


class Stream:
    """A stream of rows in the pipeline; each method returns a new `Stream` (the graph is immutable)."""

    def __init__(self, node: Node) -> None:
        self._node = node

    @property
    def node(self) -> Node:
        return self._node

    def transform(self, fn: Transform, *, keeps_order: bool = False) -> Stream:
        """Apply any DataFrame -> DataFrame function (filters, projections, aggregations, UDFs).

        ``keeps_order=True`` declares that ``fn``'s maps over partitions (``mapInPandas``, ``mapInArrow``) keep
        each partition's rows in their input order, a row's outputs together, and pass ``__pss`` and ``__pos``
        through unchanged. Only then does a row-wise stage with such
        a map keep the row positions that make its output exactly once (docs/guarantees.md, "When rows carry no
        positions"); undeclared, the stage is written at least once and a warning at start names it.
        """
        if not callable(fn):
            raise PipelineError(f"transform needs a function DataFrame -> DataFrame, got {fn!r}")
        return Stream(self._node.app._add("transform", [self._node], fn=fn, keeps_order=bool(keeps_order)))

    def aggregate(self, *keys: str, window: str, time: str | None = None, **aggregations: Any) -> Stream:
        """Aggregate per tumbling ``window`` of ``time`` (default: the stream's event time) and ``keys``:
        ``aggregate("page", window="1 minute", views=agg.count())`` gives the columns ``window`` (a struct of
        ``start`` and ``end``), ``page`` and ``views``, as
        ``groupBy(F.window("event_time", "1 minute"), "page").agg(F.count("*").alias("views"))`` would.
        Aggregations come from `weirflow.agg`: ``count()``, ``count(col)``, ``sum(col)``, ``min(col)``,
        ``max(col)``, ``avg(col)``.

        Right after a ``partition_by`` whose stage is row-wise, the producing stage sends per micro-batch one
        partial per window and key instead of every row (docs/pipelines.md, "Aggregations"); elsewhere the
        aggregation runs on every row, and the processor says why at start.
        """
        spec = aggregate_spec(keys, window, time, aggregations)
        return Stream(self._node.app._add("aggregate", [self._node], aggregate=spec))

    def partition_by(self, key: ColumnLike, *, name: str | None = None) -> Stream:
        """Repartition by ``key`` (column name or expression) through an intermediate stream.

        Ends the current stage: rows are written to the intermediate stream keyed by ``key`` and the next
        stage reads them, so all rows with one key meet in one task. ``name`` names the intermediate stream
        (default ``partition-by-<n>``, n counting ``partition_by`` calls in declaration order).
        """
        return self._node.app._partition_by(self._node, key, name)

    def send_to(self, stream_id: str, *, key: ColumnLike | None = None) -> None:
        """Write every row to output stream ``stream_id`` as JSON, keyed by ``key`` (column or expression)."""
        self._node.app._sink(self._node, stream_id, key, intermediate=False)

    def serve(self, name: str, *, key: str) -> None:
        """Keep the latest row per ``key`` of this stream as the table ``name``, queryable over HTTP while the
        job runs (``GET /tables/<name>/<key>`` on any processor; docs/endpoints.md).

        ``key`` is a column name, and the stage must hold its keys whole: read from ``partition_by(key)``, so
        that the task owning a key is known from the key alone. The table is kept with the task's Spark
        checkpoint (`weirflow.runtime.served_tables`) and moves with it.
        """
        if not isinstance(key, str) or not key:
            raise PipelineError(f"serve('{name}') needs key= a column name, got {key!r}")
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name or ""):
            raise PipelineError(f"table name {name!r}: use 1-64 letters, digits, '_' or '-' (it is part of URLs)")
        self._node.app._serve(self._node, name, key)

    def merge(self, *others: Stream) -> Stream:
        """Union with other streams of the same stage (same columns, by name)."""
        if not others:
            return self
        return Stream(self._node.app._add("merge", [self._node, *(o.node for o in others)]))

    def join(self, other: Stream, on: Any, how: str = "inner") -> Stream:
        """Join with a co-partitioned stream of the same stage (same partition count; keys partitioned alike).

        ``on`` and ``how`` are those of `pyspark.sql.DataFrame.join`; stream-stream joins follow Spark's rules
        (inner joins need no watermark bound; outer joins need event-time conditions).
        """
        return Stream(self._node.app._add("join", [self._node, other.node], join_on=on, join_how=how))


class App:
    """Handed to the job's pipeline function; records inputs, operators and sinks.

    ``config`` is the job's configuration, for pipelines that read their own settings.
    """

    def __init__(self, config: ConfigView | None = None) -> None:
        self.config = config
        self.nodes: list[Node] = []
        self.sinks: list[Sink] = []
        self.intermediates: dict[str, Node] = {}  # intermediate stream id -> the input node reading it
        self._inputs: dict[str, Node] = {}

    @property
    def inputs(self) -> list[str]:
        """The pipeline's input streams (declared streams it reads; intermediate streams are not inputs)."""
        return list(self._inputs)

    def input(self, stream_id: str) -> Stream:
        """The stream ``stream_id`` (declared under ``streams.<id>``) as an input of the pipeline."""
        if stream_id in self.intermediates:
            raise PipelineError(f"'{stream_id}' is an intermediate stream of this pipeline, not an input")
        if stream_id not in self._inputs:
            self._inputs[stream_id] = self._add("input", [], stream_id=stream_id)
        return Stream(self._inputs[stream_id])

    # --- graph building (used by Stream) ----------------------------------------------------------------
    def _add(self, op: str, parents: list[Node], **kwargs: Any) -> Node:
        for parent in parents:
            if parent.app is not self:
                raise PipelineError("streams of two different App objects cannot be combined")
        node = Node(self, op, parents, index=len(self.nodes), **kwargs)
        self.nodes.append(node)
        return node

    def _sink(self, node: Node, stream_id: str, key: ColumnLike | None, *, intermediate: bool) -> None:
        if not intermediate and (
            stream_id in self.intermediates
            or (stream_id in self._inputs and not is_http_stream(self.config, stream_id))
        ):
            raise PipelineError(f"'{stream_id}' is read by this pipeline; a job cannot also write it")
        self.sinks.append(Sink(node, stream_id, key, intermediate))

    def _serve(self, node: Node, name: str, key: str) -> None:
        if any(s.serve == name for s in self.sinks):
            raise PipelineError(f"table '{name}' is served twice in this pipeline")
        self.sinks.append(Sink(node, f"table:{name}", key, intermediate=False, serve=name))

    @property
    def tables(self) -> list[Sink]:
        """The served tables' sinks (``Stream.serve``)."""
        return [s for s in self.sinks if s.serve is not None]

    def _partition_by(self, node: Node, key: ColumnLike, name: str | None) -> Stream:
        stream_id = name or f"partition-by-{len(self.intermediates)}"
        if stream_id in self.intermediates or stream_id in self._inputs:
            raise PipelineError(f"partition_by name '{stream_id}' is already used in this pipeline")
        self._sink(node, stream_id, key, intermediate=True)
        reader = self._add("input", [], stream_id=stream_id)
        self.intermediates[stream_id] = reader
        return Stream(reader)
