"""What the `weirflow` source and its readers share: the options of one source (`SourceSpec`), the columns it
adds to the user's (internal and position columns, docs/pipelines.md), and the clients a worker process keeps
across micro-batches."""

from __future__ import annotations

import json
import threading
from typing import Any

from pyspark.sql import types as T

from weirflow.spark.drain_cut import decode_written
from weirflow.spark.fence import decode as decode_fence
from weirflow.spark.lane_marks import decode_sources
from weirflow.spark.replay import POS, PSS

CONTROL_TYPE = T.StructType(
    [
        T.StructField("kind", T.StringType(), False),
        T.StructField("ssp", T.StringType(), True),
        T.StructField("producer", T.StringType(), True),
        T.StructField("task_count", T.IntegerType(), True),
        T.StructField("ctl_ms", T.LongType(), True),
        T.StructField("detail", T.StringType(), True),
    ]
)
INTERNAL_FIELDS = [
    T.StructField("__wm_time", T.TimestampType(), True),
    T.StructField("__ctl", CONTROL_TYPE, True),
]
INTERNAL_COLUMNS = [f.name for f in INTERNAL_FIELDS]
# Every data row's position (`weirflow.spark.replay`); null where the system's offsets are not dense numbers
# and its records have no ordinals (`SystemAdmin.record_ordinals`).
POSITION_FIELDS = [
    T.StructField(PSS, T.LongType(), True),
    T.StructField(POS, T.LongType(), True),
]
# A shared aggregation query's rows: the partition each was read from (`weirflow.spark.shared_aggregation`)
PART_COLUMN = "__part"

# Clients per worker process, reused across micro-batches (Spark reuses Python workers).
_clients: dict[str, Any] = {}
_checkpoint_managers: dict[str, Any] = {}
_clients_lock = threading.Lock()


def systems_for(snapshot: str) -> Any:
    """This worker's `Systems` for a job config snapshot, built once and reused across micro-batches."""
    with _clients_lock:
        systems = _clients.get(snapshot)
        if systems is None:
            from weirflow.config.loader import Config
            from weirflow.job.systems import Systems

            systems = _clients[snapshot] = Systems(Config.from_snapshot(snapshot))
        return systems


def checkpoints_for(snapshot: str) -> Any:
    """This worker's started `CheckpointManager` for a job config snapshot, built once."""
    with _clients_lock:
        manager = _checkpoint_managers.get(snapshot)
        if manager is None:
            from weirflow.config.loader import Config
            from weirflow.interfaces.plugins import checkpoint_factory

            config = Config.from_snapshot(snapshot)
            manager = checkpoint_factory(config).get_checkpoint_manager(config)
            manager.start()
            _checkpoint_managers[snapshot] = manager
        return manager


def release(snapshot: str) -> None:
    """Close and forget this process's clients of a job snapshot (`systems_for`, `checkpoints_for`): for a
    process that runs one job after another (a test driving the sink's writers over many jobs), whose clients
    would otherwise keep their connections, and files, open to the end."""
    with _clients_lock:
        systems = _clients.pop(snapshot, None)
        manager = _checkpoint_managers.pop(snapshot, None)
    if systems is not None:
        systems.close()
    if manager is not None:
        manager.stop()


def partition_of(ssp_key: str) -> int:
    return int(ssp_key.rsplit(".", 1)[1])


class SourceSpec:
    """The source's options, parsed once (they are all strings on the wire)."""

    def __init__(self, options: Any) -> None:
        self.snapshot: str = options["config"]
        self.stream_id: str = options["stream"]
        # the task of each SSP (dead letters name it) and the task whose checkpoint holds the watermark to
        # inject ("" for queries of stateless stages, which need none)
        self.tasks: dict[str, str] = json.loads(options.get("tasks") or "{}")
        self.inject: str = options.get("inject", "")
        self.system: str = options["system"]
        self.physical: str = options["physical"]
        self.ssps: list[str] = json.loads(options["ssps"])
        self.start: dict[str, Any] = json.loads(options["start"])
        self.serde: str = options["serde"]
        self.user_schema = T.StructType.fromJson(json.loads(options["user_schema"]))
        self.event_time_field: str = options["event_time_field"]
        self.event_time_from_record: bool = options["event_time_from_record"] == "true"
        self.delay_ms = int(options["delay_ms"])
        self.intermediate = options["intermediate"] == "true"
        self.bounded = options["bounded"] == "true"
        self.max_records = int(options["max_records"])
        # Spark tasks a batch's partitions are spread over when the system warms reads (0: one per partition)
        self.read_groups = int(options.get("read_groups") or 0)
        # the local file whose existence means "this deployment drains" ("" where nothing drains), and the run id
        # whose drain messages count (docs/drain.md)
        self.drain_flag: str = options.get("drain_flag", "")
        self.run_id: str = options.get("run_id", "")
        # whether the system's offsets are dense sequence numbers (`SystemAdmin.dense_offsets`); positions are
        # planned and compared only through the system's admin
        self.dense: bool = options.get("dense", "true") == "true"
        # for a system of positions: whether its records come with lanes and ordinals (rows then carry positions)
        self.ordinals: bool = options.get("ordinals", "false") == "true"
        # the system's record columns asked for (streams.<id>.system-columns)
        self.system_schema = T.StructType.fromJson(json.loads(options.get("system_schema") or '{"fields": []}'))
        # the stream's code among the stage's inputs (its rows' ``__pss``), and the directory of the marks that
        # drop replayed intermediate rows ("" where none are kept), `weirflow.spark.replay`
        self.stream_code = int(options.get("stream_code") or 0)
        self.marks_dir: str = options.get("marks_dir", "")
        # per (producer stage, input code): the input with lanes its rows come from (`weirflow.spark.lane_marks`)
        self.lane_sources = decode_sources(options.get("lane_sources", ""))
        # the query's fence: its readers send dead letters only while the processor holds the tasks' locks
        self.fence = decode_fence(options.get("fence"))
        # a shared aggregation query (`weirflow.spark.rebuild`): each data row's partition as ``__part``; the file
        # the processor keeps the watermark to inject in (the least over the query's tasks, which no read of one
        # partition can know); ``seen`` rows for intermediate reads too
        self.part_column: bool = options.get("part_column", "false") == "true"
        # ... and per SSP of a task rebuilding its windows, the offset its reads must pass and its ``closed``
        self.rebuild_until: dict[str, tuple[int, int]] = {
            k: (int(v[0]), int(v[1])) for k, v in json.loads(options.get("rebuild_until") or "{}").items()
        }
        self.inject_file: str = options.get("inject_file", "")
        # an input of a row-wise stage: the stage, and the intermediate streams its positioned rows go to, whose
        # consumers' marks say how far an earlier holder wrote (a drain's cut, `weirflow.spark.drain_cut`)
        self.producer, self.written_to = decode_written(options.get("written_to", ""))
        # a stateful task's: the file of the least cut a drain may take (SSP key -> offset), when there is one
        self.drain_floor_file: str = options.get("drain_floor_file", "")
        self.seen_rows: bool = options.get("seen_rows", "false") == "true"

    @property
    def keeps_marks(self) -> bool:
        return self.intermediate and bool(self.marks_dir)

    @property
    def positioned(self) -> bool:
        """Whether this stream's rows carry positions (`weirflow.spark.replay`)."""
        return self.dense or self.ordinals

    @property
    def schema(self) -> T.StructType:
        fields = list(INTERNAL_FIELDS) + list(POSITION_FIELDS) + list(self.user_schema.fields)
        fields += list(self.system_schema.fields)
        if self.event_time_from_record:
            fields.append(T.StructField(self.event_time_field, T.TimestampType(), True))
        if self.part_column:
            fields.append(T.StructField(PART_COLUMN, T.IntegerType(), True))
        return T.StructType(fields)
