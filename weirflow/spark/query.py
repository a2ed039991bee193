"""Building one task's streaming DataFrame, in the order docs/pipelines.md ("How a task runs") describes.

Per input stream of the task's stage:

1. the `weirflow` source over the task's SSPs of that stream (data, control and dead-letter rows);
2. the serde already decoded values into the user's columns (in the source's workers);
3. ``__wm_time``: the event time on input streams, the reconciled watermark (``inject`` rows) everywhere;
4. ``withWatermark("__wm_time", lateness)`` — applied here, never by the user;
5. ``observe(...)`` collecting the batch's control rows (``__ctl``). It is also a **barrier**: without it the
   optimizer pushes the data-row filter (``__ctl IS NULL``) below the watermark node and control rows stop
   moving the watermark (tests/integration/test_watermark_barrier.py keeps this true);
6. filter to data rows; the event-time column is re-declared as the watermarked column (Spark finds the
   event-time column of windows and state eviction by the ``spark.watermarkDelayMs`` metadata, so data
   rows keep their own event time while only ``__wm_time`` drives the watermark); internal columns dropped;
7. the stage's transforms, then one union of all its outputs into the `weirflow-sink`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from weirflow.base.errors import PipelineError
from weirflow.interfaces.system import SystemConsumer, SystemStreamPartition
from weirflow.job.drain_notice import drain_flag_path, run_id_of
from weirflow.job.grouper import partition_task
from weirflow.pipeline.aggregate import WINDOW, AggregateSpec
from weirflow.pipeline.api import Node, Sink
from weirflow.pipeline.plan import PipelinePlan, Stage
from weirflow.runtime.trim_points import TrimScope
from weirflow.spark.drain_cut import WrittenStream, encode_written
from weirflow.spark.input_settings import DEFAULT_EVENT_TIME, InputSettings, input_settings
from weirflow.spark.lane_marks import LaneSource, encode_sources
from weirflow.spark.plan_nodes import (
    MAP_OPERATORS,
    REORDERING_OPERATORS,
    STATELESS_OPERATORS,
    analyzed,
    count_operators,
    hashed_partition,
    self_union,
    walk,
)
from weirflow.spark.replay import POSITION_COLUMNS, input_codes
from weirflow.spark.shared_aggregation import SharedAggregation, per_task, shared_aggregation
from weirflow.spark.source import INTERNAL_COLUMNS, SOURCE_NAME
from weirflow.spark.source_spec import PART_COLUMN

log = logging.getLogger("weirflow.spark")

# An intermediate stream's record packs up to 4,096 rows (`weirflow.spark.packing`), so one batch reads at most
# limit/64 of them per task: as many rows as `task.max.records.per.trigger` when records are 1/64 full, at most
# 64 times as many when they are full (a stage that fell behind catches up in fewer, larger batches).
INTERMEDIATE_RECORDS_DIVISOR = 64
WATERMARK_DELAY_KEY = "spark.watermarkDelayMs"  # Spark's metadata key for the event-time column


def read_groups(spark: Any, consumer: SystemConsumer) -> int:
    """How many Spark tasks a batch's partitions are spread over: as many as Spark runs at once when the
    system warms reads (`SystemConsumer.warm`), else 0 (one Spark task per partition)."""
    if type(consumer).warm is SystemConsumer.warm:
        return 0
    return int(spark.sparkContext.defaultParallelism)


def observation_name(index: int) -> str:
    return f"wf_in_{index}"


@dataclass(frozen=True)
class QueryScope:
    """What one query reads: ``ssps`` (of one task, or of every task of a stateless stage on this processor),
    ``task_of`` (SSP key -> task name) and ``inject``, the task whose checkpoint holds the watermark its
    source feeds into Spark ("" for a stateless stage's query, which needs none)."""

    ssps: tuple[SystemStreamPartition, ...]
    task_of: dict[str, str]
    inject: str
    marks_dir: str = ""  # where reads of intermediate streams keep their marks (`weirflow.spark.replay`)
    fence: str = ""  # the query's fence (`weirflow.spark.fence.encode`), checked before dead letters are sent
    # a shared aggregation query (`weirflow.spark.shared_aggregation`); per intermediate partition the windows
    # its task wrote before (`weirflow.spark.rebuild`); the file of the watermark to inject
    shared: bool = False
    closed: dict[int, int] = field(default_factory=dict)
    rebuild_until: dict[str, list[int]] = field(default_factory=dict)  # SSP key -> [offset to pass, closed]
    inject_file: str = ""
    drain_floor_file: str = ""  # a stateful task's least drain cut, when it has one (`StageQuery._drain_floor`)


class StageBuilder:
    """Builds DataFrames of a plan's stages on one SparkSession; stage output schemas are memoized so an
    intermediate stream's schema is the schema its writer stage produces."""

    def __init__(self, spark: Any, plan: PipelinePlan, snapshot: str) -> None:
        self.spark = spark
        self.plan = plan
        self.config = plan.config
        self.snapshot = snapshot
        self.drain_flag = str(drain_flag_path(plan.config))
        self.run_id = run_id_of(plan.config)
        self._settings: dict[str, InputSettings] = {}
        self._stateless: dict[str, bool] = {}
        self._unordered: dict[str, tuple[str, str]] = {}  # stage -> why it has no positions, the remedy
        self._fell_back: set[str] = set()  # stages whose warning was logged
        self._warned: dict[str, list[Any]] = {}  # stage -> sinks whose rows lost their positions (said once)
        self._partials: dict[str, AggregateSpec | None] = {}  # intermediate stream -> the partials it carries
        self._partial_time: dict[str, str] = {}  # intermediate stream of partials -> its event time column
        self._whole: set[str] = set()  # stages told their aggregation runs on every row
        self._plans: dict[str, dict[int, DataFrame]] = {}  # stage -> its frames without a scope (`_planned`)
        self._shared: dict[str, SharedAggregation] = {}  # stage -> whether its tasks share a query (`shared`)

    # --- input settings ---------------------------------------------------------------------------------
    def settings(self, stream_id: str) -> InputSettings:
        if stream_id not in self._settings:
            self._settings[stream_id] = (
                self._intermediate_settings(stream_id)
                if self.plan.is_intermediate(stream_id)
                else input_settings(self.plan, stream_id)
            )
        return self._settings[stream_id]

    def _intermediate_settings(self, stream_id: str) -> InputSettings:
        writer = self.plan.writer_stage(stream_id)
        sink = next(s for s in writer.sinks if s.intermediate and s.stream_id == stream_id)
        sent = self._sent(writer, sink, self._planned(writer)).schema
        # nullable: the stream's control rows carry none of the rows' values
        schema = T.StructType([T.StructField(f.name, f.dataType, True, f.metadata) for f in sent.fields])
        event_field = self._event_time_of(writer, schema)
        return InputSettings(
            serde="json",
            user_schema=schema,
            event_time_field=event_field or DEFAULT_EVENT_TIME,
            event_time_from_record=event_field is None,
            delay_ms=0,
            intermediate=True,
            bounded=False,
        )

    def _event_time_of(self, stage: Stage, schema: T.StructType) -> str | None:
        for stream_id in stage.input_ids:
            name = self.settings(stream_id).event_time_field
            if name in schema.fieldNames() and isinstance(schema[name].dataType, T.TimestampType):
                return name
        return None

    def _planned(self, stage: Stage) -> dict[int, DataFrame]:
        """``stage``'s frames without a scope (`build`), built once: what its schemas and plans are read from."""
        if stage.name not in self._plans:
            self._plans[stage.name] = self.build(stage, scope=None, starts={})[1]
        return self._plans[stage.name]

    def stateless(self, stage: Stage) -> bool:
        """Whether ``stage`` keeps no state between micro-batches: every operator of its analyzed plan is one
        of `STATELESS_OPERATORS`."""
        if stage.name not in self._stateless:
            frames = self._planned(stage)
            plans = [analyzed(frames[id(sink.node)]) for sink in stage.sinks]
            names = [str(node.nodeName()) for plan in plans for node in walk(plan)]
            self._stateless[stage.name] = set(names) <= STATELESS_OPERATORS
            self._unordered[stage.name] = self._unordered_by(stage, frames, plans, names)
        return self._stateless[stage.name]

    def _unordered_by(
        self, stage: Stage, frames: dict[int, DataFrame], plans: list[Any], names: list[str]
    ) -> tuple[str, str]:
        """Why ``stage``'s rows may leave their input's order or share a position with other rows, so that
        positions cannot name them ("" when nothing does): a repartition; a union of rows of one input (a
        self-union: two branches write the same positions from two Spark partitions, each numbering its
        rows from 0, so the consumer would take one branch's rows for replays of the other's); a map over
        partitions that its transform did not declare order-keeping. ``plans``: the analyzed plan of each of
        its outputs, ``names`` their operators. Returns (why, what keeps exactly-once)."""
        if REORDERING_OPERATORS.intersection(names):
            return "a repartition reorders its rows", "use partition_by, which repartitions through a stream"
        if any(self_union(plan) for plan in plans):
            return (
                "a union of rows of one input (its branches would number their rows alike)",
                "make each row's copies with F.explode(F.array(...)) instead of a union",
            )
        added = sum(name in MAP_OPERATORS for name in names)
        declared = sum(
            max(
                0,
                count_operators(frames[id(node)], MAP_OPERATORS)
                - count_operators(frames[id(node.parents[0])], MAP_OPERATORS),
            )
            for node in stage.nodes
            if node.op == "transform" and node.keeps_order
        )
        if added > declared:
            return (
                "a map over partitions (mapInPandas, mapInArrow) may reorder its rows",
                "declare transform(fn, keeps_order=True) if fn keeps them in order",
            )
        return "", ""

    def partials_for(self, stream_id: str) -> AggregateSpec | None:
        """The aggregation whose partials the writer of intermediate stream ``stream_id`` sends instead of its
        rows (`weirflow.spark.partials`), or None: only when the stream's one reader is a `Stream.aggregate`
        over the stream's event time and the writing stage is row-wise over inputs of dense offsets. A
        reader that aggregates otherwise hears why at start, once, naming its stage."""
        if stream_id in self._partials:
            return self._partials[stream_id]
        self._partials[stream_id] = None
        reader = self.plan.app.intermediates[stream_id]
        readers = [n for n in self.plan.app.nodes if reader in n.parents]
        aggregates = [n for n in readers if n.op == "aggregate"]
        if not aggregates:
            return None
        spec = aggregates[0].aggregate
        assert spec is not None
        writer = self.plan.writer_stage(stream_id)
        sink = next(s for s in writer.sinks if s.intermediate and s.stream_id == stream_id)
        time = self._event_time_of(writer, self._planned(writer)[id(sink.node)].schema)
        why = ""
        if time is None:
            why = f"the rows stage {writer.name} sends have no event time column"
        elif len(readers) > 1:
            why = f"{stream_id} is also read by other operators, which need its rows"
        elif spec.time not in (None, time):
            why = f"its window is over {spec.time}, not the event time {time}"
        elif not self.carries_positions(writer):
            why = f"stage {writer.name}, which writes {stream_id}, does not give its rows positions"
        elif any(not self.plan.systems.admin(self.plan.ref(i).system).dense_offsets for i in writer.input_ids):
            why = f"stage {writer.name} reads a stream of records with lanes (Kinesis), not dense offsets"
        if why:
            log.info(
                "stage %s: its aggregation runs on every row sent through %s, not on partials: %s",
                self.plan.stage_of_node[id(aggregates[0])].name,
                stream_id,
                why,
            )
            return None
        assert time is not None
        self._partials[stream_id] = spec
        self._partial_time[stream_id] = time
        return spec

    def _sent(self, stage: Stage, sink: Sink, frames: dict[int, DataFrame]) -> DataFrame:
        """The rows ``stage`` sends to ``sink``: its node's, or for an intermediate stream of partials each row
        as a partial of its own (`AggregateSpec.partial`), which the sink merges per batch."""
        df = frames[id(sink.node)]
        spec = self.partials_for(sink.stream_id) if sink.intermediate else None
        if spec is None:
            return df
        return spec.partial(df, self._partial_time[sink.stream_id])

    def carries_positions(self, stage: Stage) -> bool:
        """Whether ``stage``'s transforms see (and may pass on) each row's position, ``__pss`` and ``__pos``
        (`weirflow.spark.replay`): in a stateless stage that keeps its rows in input order and reads systems of
        dense offsets or of records with ordinals. A stateful stage's rows are results, not input rows: its
        transforms never see positions."""
        if not self.stateless(stage):
            return False
        reason, remedy = self._unordered[stage.name]
        if not reason:
            unpositioned = [s for s in stage.input_ids if not self._positioned(s)]
            if unpositioned:
                reason = f"its input {', '.join(unpositioned)} has neither dense offsets nor record ordinals"
                remedy = "read the input from a system that gives them (the embedded log, Event Hubs, Kinesis)"
        if reason and stage.name not in self._fell_back:
            self._fell_back.add(stage.name)
            log.warning(
                "stage %s is not row-wise: %s. Its rows carry no positions, so a replay after a crash can write "
                "them twice (at least once, docs/guarantees.md). To keep exactly-once: %s",
                stage.name,
                reason,
                remedy,
            )
        return not reason

    def _positioned(self, stream_id: str) -> bool:
        """Whether rows read from ``stream_id`` carry positions: its system's offsets are dense, or its records
        come with lanes and ordinals (`SystemAdmin.record_ordinals`)."""
        admin = self.plan.systems.admin(self.plan.ref(stream_id).system)
        return admin.dense_offsets or admin.record_ordinals

    # --- frames -----------------------------------------------------------------------------------------
    def _source(
        self,
        index: int,
        stream_id: str,
        scope: QueryScope | None,
        starts: dict[str, Any],
        positions: bool,
        code: int,
        seen_rows: bool = False,
        written_to: str = "",
    ) -> DataFrame:
        settings = self.settings(stream_id)
        ref = self.plan.ref(stream_id)
        ssps = [
            s.key()
            for s in (scope.ssps if scope is not None else [])
            if (s.system, s.stream) == (ref.system, ref.physical)
        ]
        options = {
            "config": self.snapshot,
            "stream": stream_id,
            "tasks": json.dumps({k: scope.task_of[k] for k in ssps} if scope is not None else {}),
            "inject": scope.inject if scope is not None else "",
            "system": ref.system,
            "physical": ref.physical,
            "ssps": json.dumps(ssps),
            "start": json.dumps({k: starts.get(k, {"o": "0", "e": False}) for k in ssps}),
            "serde": settings.serde,
            "user_schema": json.dumps(settings.user_schema.jsonValue()),
            "event_time_field": settings.event_time_field,
            "event_time_from_record": str(settings.event_time_from_record).lower(),
            "delay_ms": str(settings.delay_ms),
            "intermediate": str(settings.intermediate).lower(),
            "bounded": str(settings.bounded).lower(),
            "drain_flag": self.drain_flag,
            "run_id": self.run_id,
            "system_schema": json.dumps(
                T.StructType(
                    [
                        T.StructField(name, T._parse_datatype_string(ddl), True)
                        for name, ddl in settings.system_fields
                    ]
                ).jsonValue()
            ),
            "max_records": str(self._read_limit(settings)),
            "dense": str(self.plan.systems.admin(ref.system).dense_offsets).lower(),
            "ordinals": str(self.plan.systems.admin(ref.system).record_ordinals).lower(),
            "read_groups": str(read_groups(self.spark, self.plan.systems.consumer(ref.system))),
            "stream_code": str(code),
            "marks_dir": scope.marks_dir if scope is not None and settings.intermediate else "",
            "lane_sources": self._lane_sources(stream_id) if settings.intermediate else "",
            "fence": scope.fence if scope is not None else "",
            "part_column": str(scope is not None and scope.shared and settings.intermediate).lower(),
            "rebuild_until": json.dumps(
                {k: v for k, v in scope.rebuild_until.items() if k in ssps} if scope else {}
            ),
            "inject_file": scope.inject_file if scope is not None else "",
            "seen_rows": str(settings.intermediate and seen_rows).lower(),
            "written_to": "" if settings.intermediate else written_to,
            "drain_floor_file": scope.drain_floor_file if scope is not None else "",
        }
        raw = self.spark.readStream.format(SOURCE_NAME).options(**options).load()
        timed = raw.withWatermark("__wm_time", f"{settings.delay_ms} milliseconds")
        # collect_list skips nulls: data rows (null ``__ctl``) cost the observation one null check each.
        observed = timed.observe(observation_name(index), F.collect_list("__ctl").alias("control"))
        metadata = {WATERMARK_DELAY_KEY: settings.delay_ms}
        columns = [
            F.col(f.name).alias(f.name, metadata=metadata)
            if f.name == settings.event_time_field
            else F.col(f.name)
            for f in raw.schema.fields
            if f.name not in INTERNAL_COLUMNS and (positions or f.name not in POSITION_COLUMNS)
        ]
        return observed.filter(F.col("__ctl").isNull()).select(*columns)

    def input_codes(self, input_ids: list[str]) -> dict[tuple[str, str], int]:
        """The code of each of a stage's inputs (``(system, physical name)`` -> its rows' ``__pss`` bits,
        `weirflow.spark.replay.input_codes`)."""
        return input_codes((self.plan.ref(s).system, self.plan.ref(s).physical) for s in input_ids)

    def _written_to(self, stage: Stage) -> str:
        """The intermediate streams of dense offsets ``stage`` writes its positioned rows to, with the tasks
        reading each partition: where a drain finds how far an earlier holder wrote
        (`weirflow.spark.drain_cut`)."""
        streams: list[WrittenStream] = []
        for sink in stage.sinks:
            ref = self.plan.ref(sink.stream_id)
            if not sink.intermediate or not self.plan.systems.admin(ref.system).dense_offsets:
                continue
            readers = [s for s in self.plan.stages if sink.stream_id in s.input_ids]
            streams.append(
                WrittenStream(
                    ref.system,
                    ref.physical,
                    {
                        p: [partition_task(r.name, p, self.plan.task_prefix(r)) for r in readers]
                        for p in range(self.plan.partition_count(sink.stream_id))
                    },
                )
            )
        return encode_written(stage.name, streams)

    def _lane_sources(self, stream_id: str) -> str:
        """The inputs with lanes of the stage writing intermediate stream ``stream_id``, by input code: where a
        consumer learns which lanes' marks it may forget (`weirflow.spark.lane_marks`)."""
        writer = self.plan.writer_stage(stream_id)
        inputs = list(writer.input_ids)
        codes = self.input_codes(inputs)
        sources: dict[tuple[str, int], LaneSource] = {}
        for input_id in inputs:
            ref = self.plan.ref(input_id)
            if self.plan.systems.admin(ref.system).record_ordinals:
                source = LaneSource(ref.system, ref.physical, self.plan.task_prefix(writer))
                sources[(writer.name, codes[(ref.system, ref.physical)])] = source
        return encode_sources(sources) if sources else ""

    def _read_limit(self, settings: InputSettings) -> int:
        """Records one batch reads per task from a stream: `max-events-per-trigger`, else
        `task.max.records.per.trigger`. An intermediate stream's records each pack up to
        `packing.MAX_ROWS` rows, so there the limit is divided by `INTERMEDIATE_RECORDS_DIVISOR`."""
        limit = int(settings.max_records or self.config.get("task.max.records.per.trigger"))
        if settings.intermediate:
            return max(1, -(-limit // INTERMEDIATE_RECORDS_DIVISOR))
        return limit

    def build(
        self, stage: Stage, scope: QueryScope | None, starts: dict[str, Any]
    ) -> tuple[list[str], dict[int, DataFrame]]:
        """Frames of every node of ``stage`` over ``scope`` (None: schema only, without positions). Returns
        (input stream ids in observation order, node id -> DataFrame)."""
        frames: dict[int, DataFrame] = {}
        inputs = stage.input_ids
        codes = self.input_codes(inputs)
        positions = scope is not None and self.carries_positions(stage)
        written_to = self._written_to(stage) if positions else ""

        def frame(node: Node) -> DataFrame:
            if id(node) in frames:
                return frames[id(node)]
            if node.op == "input":
                stream_id = str(node.stream_id)
                ref = self.plan.ref(stream_id)
                code = codes[(ref.system, ref.physical)]
                seen = scope is not None and self.shared(stage).shared  # rebuild marks (`weirflow.spark.rebuild`)
                index = inputs.index(stream_id)
                df = self._source(index, stream_id, scope, starts, positions, code, seen, written_to)
            elif node.op == "transform":
                assert node.fn is not None
                df = node.fn(frame(node.parents[0]))
                if not isinstance(df, DataFrame):
                    raise PipelineError(f"transform {node.fn!r} returned {type(df).__name__}, not a DataFrame")
                if scope is not None and scope.shared and PART_COLUMN not in df.columns:  # a select dropped it
                    df = df.withColumn(PART_COLUMN, self.shared(stage).partition_of_key())
            elif node.op == "aggregate":
                df = self._aggregated(stage, node, frame(node.parents[0]), scope)
            elif node.op == "merge":
                df = frame(node.parents[0])
                for other in node.parents[1:]:
                    df = df.unionByName(frame(other))
            elif node.op == "join":
                df = frame(node.parents[0]).join(frame(node.parents[1]), on=node.join_on, how=node.join_how)
            else:
                raise ValueError(f"unknown operator {node.op}")
            frames[id(node)] = df
            return df

        for node in stage.nodes:
            frame(node)
        return inputs, frames

    def _aggregated(self, stage: Stage, node: Node, rows: DataFrame, scope: QueryScope | None) -> DataFrame:
        """`Stream.aggregate` of ``rows``: the final merge of partials when its input is an intermediate stream
        of them (`partials_for`), else the aggregation of every row, said once per stage when it is not right
        after a ``partition_by``; grouped by task too in a shared query (`shared_aggregation.per_task`)."""
        spec, parent = node.aggregate, node.parents[0]
        assert spec is not None
        fed = parent.op == "input" and self.plan.is_intermediate(str(parent.stream_id))
        partials = fed and self.partials_for(str(parent.stream_id)) is not None
        if scope is not None and scope.shared:
            time = self.settings(str(parent.stream_id)).event_time_field
            return per_task(spec, rows, time, partials, scope.closed)
        if partials:
            return spec.final(rows, self.settings(str(parent.stream_id)).event_time_field)
        if not fed and stage.name not in self._whole:
            self._whole.add(stage.name)
            log.info(
                "stage %s: its aggregation runs on every row, not on partials: it does not follow a partition_by "
                "directly",
                stage.name,
            )
        return spec.whole(rows, spec.time or self.settings(stage.input_ids[0]).event_time_field)

    def shared(self, stage: Stage) -> SharedAggregation:
        """Whether the tasks of ``stage`` a processor holds run as one query (`shared_aggregation`)."""
        if stage.name not in self._shared:
            time = self.settings(stage.input_ids[0]).event_time_field if stage.input_ids else ""
            frames = self._planned(stage)
            self._shared[stage.name] = shared_aggregation(self.plan, stage, self.stateless(stage), time, frames)
        return self._shared[stage.name]

    def trim_scope(self) -> TrimScope:
        """What the leader may trim and forget of this pipeline's streams (`weirflow.coordination.trimming`)."""
        inputs = {
            stage.name: {code: ref for ref, code in self.input_codes(stage.input_ids).items()}
            for stage in self.plan.stages
        }
        refs = [self.plan.ref(stream_id) for stream_id in self.plan.app.intermediates]
        return TrimScope.of(refs, self.shared_known, inputs)

    def shared_known(self, stage_name: str) -> bool | None:
        """`shared` of a stage if this processor has worked it out already, else None: answered from any thread
        without building anything (the leader's trim asks, `SparkTaskRunner.trim_scope`)."""
        found = self._shared.get(stage_name)
        return None if found is None else found.shared

    def _is_table(self, stream_id: str) -> bool:
        """Whether ``stream_id`` is on a system whose streams are tables (`weirflow.interfaces.table`)."""
        return self.plan.systems.table_writer(self.plan.ref(stream_id).system) is not None

    def sink_frame(self, stage: Stage, frames: dict[int, DataFrame]) -> tuple[DataFrame, list[dict[str, Any]]]:
        """One DataFrame of all the stage's outputs, and the sink's description of its columns (`SinkSpec`
        entries, one per ``stage.sinks``), so the query has one sink and every row is copied once.

        Columns: ``__sink`` (the output's index, only when the stage has several), for output streams ``__key``
        and ``__value`` (the row as JSON; likewise for a served table, whose ``__key`` is the table's key), for
        intermediate streams ``__partition`` (chosen here: crc32 of the
        key, as the embedded log hashes keys, so all rows of a key meet in one downstream task; rows without
        a key go to partition 0) and the rows' own columns as ``__r<i>_<j>``, which the sink packs into Arrow
        records (`weirflow.spark.packing`); for an output stream that is a table (`weirflow.interfaces.table`)
        the rows' own columns alone, which the sink commits per batch (`weirflow.spark.table_commits`)."""
        parts, specs = [], []
        several = len(stage.sinks) > 1
        warned = self._warned.setdefault(stage.name, [])
        for index, sink in enumerate(stage.sinks):
            df = self._sent(stage, sink, frames)
            positions = all(c in df.columns for c in POSITION_COLUMNS)
            own = [c for c in df.columns if c not in (*POSITION_COLUMNS, PART_COLUMN)]  # the rows' own columns
            if not positions and self.carries_positions(stage) and sink.serve is None and sink.node not in warned:
                warned.append(sink.node)
                log.warning(
                    "stage %s: its transforms drop the row positions (%s), so a replay after a crash can write "
                    "rows to %s twice; keep the columns to get exactly-once (docs/guarantees.md)",
                    stage.name,
                    ", ".join(POSITION_COLUMNS),
                    sink.stream_id,
                )
            spec: dict[str, Any]
            if sink.serve is not None:
                spec = {"stream": sink.stream_id, "serve": sink.serve}
            else:
                ref = self.plan.ref(sink.stream_id)
                spec = {"stream": sink.stream_id, "system": ref.system, "physical": ref.physical}
            columns = [F.lit(index).cast("tinyint").alias("__sink")] if several else []
            key = None
            if sink.key is not None:
                key_col = F.col(sink.key) if isinstance(sink.key, str) else sink.key
                key = key_col.cast("string").cast("binary")
            table = sink.serve is None and not sink.intermediate and self._is_table(sink.stream_id)
            if table:  # the rows' own columns, committed per batch (`weirflow.spark.table_commits`)
                names = [f"__r{index}_{j}" for j in range(len(own))]
                columns += [df[name].alias(alias) for name, alias in zip(own, names, strict=True)]
                spec["rows"] = [[alias, name] for alias, name in zip(names, own, strict=True)]
                spec["table"] = True
            elif sink.intermediate:
                count = self.plan.partition_count(sink.stream_id)
                partition = F.lit(0) if key is None else hashed_partition(key, count)
                names = [f"__r{index}_{j}" for j in range(len(own))]
                columns.append(partition.cast("int").alias("__partition"))
                columns += [df[name].alias(alias) for name, alias in zip(own, names, strict=True)]
                spec["rows"] = [[alias, name] for alias, name in zip(names, own, strict=True)]
                aggregate = self.partials_for(sink.stream_id)
                if aggregate is not None and positions:
                    spec["partials"] = {
                        "keys": [*aggregate.keys, WINDOW],
                        "time": self._partial_time[sink.stream_id],
                        "partials": aggregate.partial_columns(),
                    }
            else:
                columns.append((key if key is not None else F.lit(None).cast("binary")).alias("__key"))
                columns.append(F.to_json(F.struct(*[df[c] for c in own])).cast("binary").alias("__value"))
            if positions:
                columns += [df[c] for c in POSITION_COLUMNS]
                spec["positions"] = True
            elif not self.stateless(stage):
                spec["results"] = True  # rows are results (`weirflow.spark.result_replays`)
            if PART_COLUMN in df.columns:  # a shared query's results: each names its partition, hence its task
                columns.append(df[PART_COLUMN])
                spec["task_column"] = True
            spec["stage"] = stage.name
            parts.append(df.select(*columns))
            specs.append(spec)
        out = parts[0]
        for other in parts[1:]:
            out = out.unionByName(other, allowMissingColumns=True)
        return out, specs
