"""Cutting a pipeline graph into stages and tasks, and naming the streams between them.

**Stages.** Operators connected by ``transform`` / ``merge`` / ``join`` belong to one stage; ``partition_by``
ends a stage (its rows go to an intermediate stream) and the stream's reader starts another. A stage is named
after its first input in declaration order, with characters outside [A-Za-z0-9_] as ``_``: the stage reading
``page-views`` is ``page_views``, the stage after ``partition_by("page")`` is ``partition_by_0`` (or the
``name=`` given, likewise rewritten). Tasks are
``<stage>-<n>``, holding partition n of every input of the stage (Samza's GroupByPartition).

**Intermediate streams.** Stream id = the ``partition_by`` name; physical name
``<job.name>-<job.id>-<name>`` on system `job.intermediate.system` (default `job.default.system`) with
`job.intermediate.partitions` partitions (default: the most partitions of any input of the pipeline).
They are created through the system's `SystemAdmin` when missing, once a processor has checked that their
system keeps every record, or that the job accepts it may not (`weirflow.job.retention`). Their messages carry the
in-band control framing of `weirflow.runtime.control`.

**Dead letters.** Each input stream ``<id>`` has a dead-letter stream ``<physical>.dlq`` on the same system,
with as many partitions, created when missing. Both names come from `weirflow.job.systems` (`stream_ref`,
`dead_letter_stream`), the one home of stream naming.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from weirflow.base.errors import StreamNotFoundError
from weirflow.interfaces.config import ConfigView
from weirflow.interfaces.system import StreamSpec, SystemStreamPartition
from weirflow.job.grouper import group_by_partition, partition_task
from weirflow.job.model import TaskModel
from weirflow.job.retention import ReadBackStream
from weirflow.job.systems import StreamRef, Systems, dead_letter_stream, stream_id_of, stream_ref
from weirflow.job.user_code import load_callable
from weirflow.pipeline.api import App, Node, PipelineError, Sink


def load_pipeline(config: ConfigView) -> App:
    """Import `app.pipeline` (``module:function``; the config file's directory is importable) and record it."""
    target = config.get("app.pipeline")
    fn = load_callable(config, "app.pipeline")
    app = App(config)
    try:
        fn(app)
    except PipelineError as exc:
        raise config.error("app.pipeline", f"{target} builds an invalid pipeline: {exc}") from exc
    if not app.sinks:
        raise config.error("app.pipeline", f"{target} writes nothing: call send_to (or serve) on some stream")
    return app


def intermediate_partitions(config: ConfigView, input_counts: Callable[[], list[int]]) -> int:
    """Partitions of the pipeline's intermediate streams: `job.intermediate.partitions`, else the most of any
    input of the pipeline (``input_counts`` is asked only then)."""
    configured = config.get("job.intermediate.partitions")
    return int(configured) if configured else max(input_counts(), default=1)


@dataclass(frozen=True)
class ServedTable:
    """A table served by ``Stream.serve``: its name, key column, stage, and the stream partitioning its keys."""

    name: str
    key: str
    stage: str
    stream_id: str


@dataclass
class Stage:
    name: str
    inputs: list[Node] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    sinks: list[Sink] = field(default_factory=list)

    @property
    def input_ids(self) -> list[str]:
        return [n.stream_id for n in self.inputs if n.stream_id is not None]

    @property
    def serves(self) -> bool:
        """Whether the stage keeps a served table: its tasks then run one query each (never merged), and
        their Spark checkpoints, where the table lives, move with them."""
        return any(s.serve is not None for s in self.sinks)


def stage_name(stream_id: str) -> str:
    """A stage is named after its first input, with every character outside [A-Za-z0-9_] as ``_``."""
    return re.sub(r"[^A-Za-z0-9_]", "_", stream_id)


class PipelinePlan:
    """The stages of one pipeline, in an order where every stage comes after the stages feeding it."""

    def __init__(self, app: App, config: ConfigView, systems: Systems) -> None:
        self.app = app
        self.config = config
        self.systems = systems
        self.stages = self._cut()
        self.stage_of_node = {id(n): s for s in self.stages for n in s.nodes}
        self._partitions: dict[str, int] = {}
        self.tables = {t.serve: self._served(t) for t in app.tables if t.serve is not None}

    # --- stages -----------------------------------------------------------------------------------------
    def _cut(self) -> list[Stage]:
        """Stages are the connected parts of the node graph (intermediate streams cut it), in dependency
        order."""
        stages: dict[int, Stage] = {}
        for root, nodes in _connected_groups(self.app.nodes).items():
            inputs = [n for n in nodes if n.op == "input"]
            stages[root] = Stage(name=stage_name(str(inputs[0].stream_id)), inputs=inputs, nodes=nodes)
        root_of = {n.index: root for root, st in stages.items() for n in st.nodes}
        for sink in self.app.sinks:
            stages[root_of[sink.node.index]].sinks.append(sink)
        for stage in stages.values():
            if not stage.sinks:
                raise PipelineError(f"stage '{stage.name}' writes nothing: send its rows somewhere (send_to)")
        return _in_dependency_order(list(stages.values()))

    def stage(self, name: str) -> Stage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)

    def is_intermediate(self, stream_id: str) -> bool:
        return stream_id in self.app.intermediates

    def writer_stage(self, stream_id: str) -> Stage:
        for stage in self.stages:
            if any(s.intermediate and s.stream_id == stream_id for s in stage.sinks):
                return stage
        raise KeyError(stream_id)

    # --- served tables ----------------------------------------------------------------------------------
    def _served(self, sink: Sink) -> ServedTable:
        """A served table's stage must read its rows partitioned by the table's key, so that the task owning
        a key follows from the key alone (`table_task`)."""
        stage = self.stage_of_node[id(sink.node)]
        name, key = str(sink.serve), str(sink.key)
        for stream_id in stage.input_ids:
            writers = [s for st in self.stages for s in st.sinks if s.intermediate and s.stream_id == stream_id]
            if not writers or writers[0].key != key:
                raise PipelineError(
                    f"serve('{name}', key='{key}') in stage '{stage.name}': the stage reads '{stream_id}', which "
                    f"is not partitioned by '{key}'; call .partition_by('{key}') before the transforms that feed "
                    "it, so every row of a key is in one task"
                )
        return ServedTable(name, key, stage.name, stage.input_ids[0])

    def table_task(self, table: str, key: str) -> str:
        """The task holding ``key`` of served table ``table``: the partition the intermediate stream's
        partitioner (crc32 of the key's text, `StageBuilder.sink_frame`) puts it in."""
        served = self.tables[table]
        partition = zlib.crc32(key.encode("utf-8")) % self.partition_count(served.stream_id)
        return partition_task(served.stage, partition, self.task_prefix(self.stage(served.stage)))

    def table_tasks(self, table: str) -> list[str]:
        served = self.tables[table]
        stage = self.stage(served.stage)
        return [partition_task(stage.name, n, self.task_prefix(stage)) for n in range(self.task_count(stage))]

    def task_prefix(self, stage: Stage) -> str:
        """What the stage's task names put before their partition number: its inputs' systems' (Kinesis's
        virtual tasks are ``v<k>``); none for a plan built without systems (validating a pipeline)."""
        if self.systems is None:
            return ""
        for stream_id in stage.input_ids:
            prefix = self.systems.admin(self.ref(stream_id).system).task_prefix
            if prefix:
                return prefix
        return ""

    # --- streams ----------------------------------------------------------------------------------------
    def ref(self, stream_id: str) -> StreamRef:
        if self.is_intermediate(stream_id):
            return stream_ref(self.config, stream_id, intermediate=True)
        return self.systems.resolve(stream_id)

    def read_back(self) -> list[ReadBackStream]:
        """The intermediate streams, which the job must read back whole (`weirflow.job.retention`)."""
        placed_by = (
            "job.intermediate.system" if self.config.get("job.intermediate.system") else "job.default.system"
        )
        return [
            ReadBackStream(
                self.ref(stream_id),
                f"intermediate stream '{stream_id}'",
                placed_by,
                "the next stage then computes without those rows",
            )
            for stream_id in self.app.intermediates
        ]

    def stream_id_of(self, system: str, physical: str) -> str:
        """The id of the stage input called ``physical`` on ``system`` (intermediate streams included)."""
        refs = (self.ref(stream_id) for stage in self.stages for stream_id in stage.input_ids)
        return stream_id_of(refs, system, physical)

    def partition_count(self, stream_id: str) -> int:
        if stream_id not in self._partitions:
            ref = self.ref(stream_id)
            self._partitions[stream_id] = self.systems.admin(ref.system).partition_count(ref.physical)
        return self._partitions[stream_id]

    def _intermediate_partitions(self) -> int:
        return intermediate_partitions(self.config, lambda: [self.partition_count(s) for s in self.app.inputs])

    def ensure_streams(self) -> None:
        """Create intermediate and dead-letter streams, and inputs and outputs that set
        `streams.<id>.partitions`. Each stream's partition count is asked once and kept (`partition_count`): on
        Event Hubs every ask is a management round trip, and asking again for each check took seconds of a
        processor's start."""
        for stage in self.stages:
            for stream_id in stage.input_ids:
                if self.is_intermediate(stream_id):
                    continue
                ref = self.ref(stream_id)
                admin = self.systems.admin(ref.system)
                self._create_if_configured(stream_id)
                admin.create_stream(StreamSpec(dead_letter_stream(ref.physical), self.partition_count(stream_id)))
        count = None
        for stream_id in self.app.intermediates:
            ref = self.ref(stream_id)
            if not self._exists(stream_id):
                count = count or self._intermediate_partitions()
                self.systems.admin(ref.system).create_stream(StreamSpec(ref.physical, count))
                self._partitions[stream_id] = count  # made with them, or refused if it has others
        for sink in self.app.sinks:
            if sink.intermediate or sink.serve is not None:
                continue
            self._create_if_configured(sink.stream_id)

    def _create_if_configured(self, stream_id: str) -> None:
        """Create an input or output stream with `streams.<id>.partitions` when missing; without that key a
        missing stream is a `StreamNotFoundError` naming it."""
        ref = self.ref(stream_id)
        partitions = self.config.get(f"streams.{stream_id}.partitions")
        if partitions and not self._exists(stream_id):
            self.systems.admin(ref.system).create_stream(StreamSpec(ref.physical, int(partitions)))
            self._partitions[stream_id] = int(partitions)
        self.partition_count(stream_id)

    def _exists(self, stream_id: str) -> bool:
        """Whether the stream exists, asked of that stream alone (its partition count, kept): listing the
        system's streams would need the right to see every stream of the account (and, on Kinesis, to read each
        one's tags)."""
        try:
            self.partition_count(stream_id)
        except StreamNotFoundError:
            return False
        return True

    # --- tasks ------------------------------------------------------------------------------------------
    def stage_ssps(self, stage: Stage) -> list[SystemStreamPartition]:
        ssps: list[SystemStreamPartition] = []
        for stream_id in stage.input_ids:
            ref = self.ref(stream_id)
            count = self.partition_count(stream_id)
            ssps.extend(SystemStreamPartition(ref.system, ref.physical, p) for p in range(count))
        return ssps

    def check_joins(self, stage: Stage) -> None:
        for node in stage.nodes:
            if node.op != "join":
                continue
            counts = {self.partition_count(str(i.stream_id)) for i in _inputs_of(node)}
            if len(counts) > 1:
                names = sorted(str(i.stream_id) for i in _inputs_of(node))
                raise PipelineError(
                    f"join in stage '{stage.name}' needs co-partitioned inputs, but {names} have "
                    f"{sorted(counts)} partitions; partition_by both sides first"
                )

    def plan_tasks(self) -> dict[str, TaskModel]:
        self.ensure_streams()
        tasks: dict[str, TaskModel] = {}
        for stage in self.stages:
            self.check_joins(stage)
            tasks.update(group_by_partition(stage.name, self.stage_ssps(stage), self.task_prefix(stage)))
        return tasks

    def task_count(self, stage: Stage) -> int:
        return max(self.partition_count(s) for s in stage.input_ids)


def _inputs_of(node: Node) -> list[Node]:
    if node.op == "input":
        return [node]
    found: list[Node] = []
    for parent in node.parents:
        found.extend(i for i in _inputs_of(parent) if i not in found)
    return found


def _connected_groups(nodes: list[Node]) -> dict[int, list[Node]]:
    """Nodes grouped by connected component (union-find over parent links), keyed by the root's index."""
    parent: dict[int, int] = {n.index: n.index for n in nodes}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for node in nodes:
        for p in node.parents:
            parent[find(node.index)] = find(p.index)
    groups: dict[int, list[Node]] = {}
    for node in nodes:
        groups.setdefault(find(node.index), []).append(node)
    return groups


def _in_dependency_order(stages: list[Stage]) -> list[Stage]:
    """A stage reading intermediate stream X comes after the stage writing X; a cycle is an error."""
    writer = {s.stream_id: st for st in stages for s in st.sinks if s.intermediate}
    ordered: list[Stage] = []
    visiting: set[str] = set()

    def visit(stage: Stage) -> None:
        if stage in ordered:
            return
        if stage.name in visiting:
            raise PipelineError(f"stage '{stage.name}' feeds itself through an intermediate stream")
        visiting.add(stage.name)
        for stream_id in stage.input_ids:
            if stream_id in writer:
                visit(writer[stream_id])
        ordered.append(stage)

    for stage in sorted(stages, key=lambda s: s.inputs[0].index):
        visit(stage)
    return ordered
