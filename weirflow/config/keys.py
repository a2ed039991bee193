"""Every configuration key weirflow knows: name, type, default and meaning.

This module is the single source of truth. `docs/configuration.md` is generated from it
(``weirflow config-reference``) and a test keeps the two identical. Keys containing ``<name>`` or ``<id>``
are patterns: the placeholder matches one dotted segment (``systems.<name>.factory`` matches
``systems.local.factory``). Keys under a `FREE_PREFIXES` prefix (``spark.``) are passed through unchecked.

Plugins declare their own keys here too (in their own section), so that one table documents everything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

KeyType = Literal["str", "int", "bool", "list", "duration_ms"]


@dataclass(frozen=True)
class ConfigKey:
    """One key. ``default`` None with ``required`` False means "unset unless given"."""

    name: str
    type: KeyType
    default: Any
    doc: str
    section: str
    required: bool = False
    secret: bool = False


# Prefixes whose keys are passed through to another component without validation.
FREE_PREFIXES: tuple[str, ...] = ("spark.",)

_J = "Job"
_C = "Coordination"
_T = "Tasks and checkpoints"
_S = "Systems and streams"
_L = "Embedded default (`local`)"
_A = "Azure suite (`azure`, `azure-table`)"

KEYS: tuple[ConfigKey, ...] = (
    # --- Job -------------------------------------------------------------------------------------------
    ConfigKey(
        "job.name", "str", None, "Name of the job; with `job.id` it names every store resource.", _J, required=True
    ),
    ConfigKey("job.id", "str", "1", "Instance of the job, to run several copies of one job side by side.", _J),
    ConfigKey(
        "job.state.dir",
        "str",
        ".weirflow",
        "Directory for local state (embedded databases, Spark checkpoints). Relative paths are resolved "
        "against the directory of the config file.",
        _J,
    ),
    ConfigKey("job.default.system", "str", "local", "System of streams that name no `streams.<id>.system`.", _J),
    ConfigKey(
        "processor.id",
        "str",
        None,
        "Identity of this processor; default `<host>-<pid>-<random>`. Must be unique among live "
        "processors of the job.",
        _J,
    ),
    ConfigKey(
        "job.coordinator.factory",
        "str",
        "local",
        "Job coordinator: alias (`local`, `azure`) or `module:Class` implementing `JobCoordinatorFactory`.",
        _C,
    ),
    ConfigKey(
        "metadata.store.factory",
        "str",
        None,
        "Metadata store (job model, drain notices): alias (`local`, `azure`) or `module:Class` implementing "
        "`MetadataStoreFactory`; default: the alias of `job.coordinator.factory`.",
        _C,
    ),
    # --- Coordination timings -----------------------------------------------------------------------------
    ConfigKey(
        "job.coordinator.lease.duration.ms",
        "duration_ms",
        15000,
        "Lease of the leader and of each task lock. A killed leader is replaced after at most this "
        "long; a killed processor's tasks can start elsewhere after at most this long. The `azure` "
        "coordinator's blob leases take 15000 to 60000, in whole seconds.",
        _C,
    ),
    ConfigKey(
        "job.coordinator.lease.renew.interval.ms",
        "duration_ms",
        5000,
        "How often held leases (leader, task locks) are renewed. Must be well under the lease duration.",
        _C,
    ),
    ConfigKey(
        "job.coordinator.heartbeat.interval.ms",
        "duration_ms",
        3000,
        "How often a processor writes its heartbeat row.",
        _C,
    ),
    ConfigKey(
        "job.coordinator.liveness.timeout.ms",
        "duration_ms",
        10000,
        "A processor silent for longer is considered dead and its tasks are reassigned.",
        _C,
    ),
    ConfigKey(
        "job.debounce.time.ms",
        "duration_ms",
        2000,
        "The leader waits until membership has been stable this long before publishing a new job "
        "model, so a burst of joins causes one rebalance.",
        _C,
    ),
    ConfigKey(
        "job.coordinator.latch.timeout.ms",
        "duration_ms",
        15000,
        "How long the leader waits for every processor to join a job model's latch before it gives "
        "up on that version and publishes a new one.",
        _C,
    ),
    ConfigKey(
        "job.coordinator.poll.interval.ms",
        "duration_ms",
        500,
        "How often a processor checks leadership, membership, the job model and latches.",
        _C,
    ),
    ConfigKey(
        "job.coordinator.lock.timeout.ms",
        "duration_ms",
        60000,
        "How long a processor keeps trying to take a gained task's lock (the previous owner's lease "
        "must expire first) before it reports the task as failed to start.",
        _C,
    ),
    # --- Tasks and checkpoints ----------------------------------------------------------------------------
    ConfigKey(
        "app.pipeline",
        "str",
        None,
        "`module:function` building the job's pipeline (`fn(app: weirflow.App)`); the config file's directory "
        "is importable. Selects the Spark data plane; without it the job runs `task.class` per record.",
        _T,
    ),
    ConfigKey("app.run.id", "str", None, "Identifies one deployment; carried by control messages.", _T),
    ConfigKey(
        "task.inputs",
        "list",
        [],
        "Input streams (stream ids) of a record-task job, grouped by partition into tasks "
        "`<stage>-<n>` (stage `main`). Pipelines declare their inputs in code instead.",
        _T,
    ),
    ConfigKey(
        "task.class",
        "str",
        None,
        "`module:callable` processing one record of a record-task job: "
        "`fn(record: dict) -> list[dict]`; each returned dict has `stream`, `value`, optional `key`.",
        _T,
    ),
    ConfigKey(
        "task.checkpoint.factory",
        "str",
        "local",
        "Checkpoint manager: alias (`local`, `azure-table`) or `module:Class` implementing "
        "`CheckpointManagerFactory`.",
        _T,
    ),
    ConfigKey(
        "task.trigger.interval.ms",
        "duration_ms",
        500,
        "Spark data plane: how often each task's streaming query starts a micro-batch when data is waiting.",
        _T,
    ),
    ConfigKey(
        "task.max.records.per.trigger",
        "int",
        50000,
        "Spark data plane: most records one micro-batch reads per input stream of a task.",
        _T,
    ),
    ConfigKey(
        "task.output.mode",
        "str",
        "append",
        "Spark output mode of every task query (`append` emits a window once the watermark passes it; `update`).",
        _T,
    ),
    ConfigKey(
        "task.spark.checkpoint.dir",
        "str",
        None,
        "Root of the tasks' Spark checkpoint dirs (operator state), one subdir per task; default "
        "`<job.state.dir>/spark/<job.name>-<job.id>`. Point it at shared storage for stateful tasks that move "
        "between machines; input positions always come from the checkpoint store.",
        _T,
    ),
    ConfigKey(
        "task.stateless.merge",
        "bool",
        True,
        "Spark data plane: run the tasks a processor holds of a stateless stage (no aggregation, join or "
        "deduplication) as one query, restarted when its tasks change; off: one query per task.",
        _T,
    ),
    ConfigKey("task.commit.ms", "duration_ms", 1000, "How often a running task checkpoints its offsets.", _T),
    ConfigKey("task.poll.max.records", "int", 500, "Most records a record task reads per SSP per poll.", _T),
    # --- Systems and streams ------------------------------------------------------------------------------
    ConfigKey(
        "systems.<name>.factory",
        "str",
        None,
        "System plugin: alias (`local`) or `module:Class` implementing `SystemFactory`. The system "
        "named `local` defaults to the embedded log.",
        _S,
    ),
    ConfigKey("streams.<id>.system", "str", None, "System holding the stream; default `job.default.system`.", _S),
    ConfigKey("streams.<id>.physical.name", "str", None, "Name of the stream on its system; default `<id>`.", _S),
    ConfigKey(
        "streams.<id>.partitions",
        "int",
        None,
        "Partition count used when weirflow creates the stream (inputs of the example, intermediate "
        "and output streams).",
        _S,
    ),
    ConfigKey(
        "streams.<id>.schema",
        "str",
        None,
        "Spark DDL of a `json` stream's values, e.g. `user string, page string, event_time timestamp`.",
        _S,
    ),
    ConfigKey(
        "streams.<id>.serde",
        "str",
        None,
        "How values decode: `json` (needs `schema`; default when a schema is set), `string` or `bytes` "
        "(columns `key`, `value`). Undecodable values go to the dead-letter stream `<physical>.dlq`.",
        _S,
    ),
    ConfigKey(
        "streams.<id>.event-time.field",
        "str",
        None,
        "Timestamp column holding each event's time; default: the time the record was appended, "
        "as column `event_time`.",
        _S,
    ),
    ConfigKey(
        "streams.<id>.lateness",
        "duration_ms",
        0,
        "How far behind the newest event time an event may arrive and still count (Spark's watermark delay).",
        _S,
    ),
    ConfigKey(
        "streams.<id>.bounded",
        "bool",
        False,
        "The stream is read up to its end (as of when the task catches up), then ends with end-of-stream; "
        "the job finishes when all its tasks have.",
        _S,
    ),
    ConfigKey(
        "streams.<id>.start",
        "str",
        "earliest",
        "Where a task without a checkpoint starts reading: `earliest`, `latest`, or an ISO 8601 time such as "
        "`2026-11-20T08:00:00Z` (per partition, the first record stamped at or after it; no zone means UTC).",
        _S,
    ),
    ConfigKey(
        "streams.<id>.system-columns",
        "str",
        "none",
        "Spark data plane: the system's own record columns to add beside the decoded ones: `none`, `all`, or "
        "a comma-separated list (Event Hubs: `properties`, `partition_key`, `enqueued_time`, "
        "`sequence_number`, `offset`). Off by default so a job's schema does not change with its system.",
        _S,
    ),
    ConfigKey(
        "streams.<id>.max-events-per-trigger",
        "int",
        None,
        "Spark data plane: most records one micro-batch reads from this stream per task; default "
        "`task.max.records.per.trigger`.",
        _S,
    ),
    ConfigKey(
        "job.intermediate.system",
        "str",
        None,
        "System of the pipeline's intermediate streams (`partition_by`); default `job.default.system`.",
        _S,
    ),
    ConfigKey(
        "job.intermediate.partitions",
        "int",
        None,
        "Partitions of intermediate streams weirflow creates; default the most partitions of any input.",
        _S,
    ),
    # --- Embedded default --------------------------------------------------------------------------------
    ConfigKey(
        "systems.<name>.path",
        "str",
        None,
        "SQLite file of a `local` system; default `<job.state.dir>/<name>.streams.db`. Jobs sharing "
        "the file share the streams.",
        _L,
    ),
    ConfigKey(
        "local.db.busy.timeout.ms",
        "duration_ms",
        10000,
        "How long an embedded-database statement waits for another process's write lock.",
        _L,
    ),
)


# Azure keys are declared here, in the one registry, although the Azure packages read them.
KEYS += (
    ConfigKey(
        "azure.storage.connection.string",
        "str",
        None,
        "Connection string of the job's storage account, e.g. `${AZURE_STORAGE_CONNECTION_STRING}`. "
        "Without it and without `azure.storage.account`, the environment variable "
        "`AZURE_STORAGE_CONNECTION_STRING` is used.",
        _A,
        secret=True,
    ),
    ConfigKey(
        "azure.storage.account",
        "str",
        None,
        "Storage account name or URL (`https://<account>.blob.core.windows.net`), to sign in with "
        "`DefaultAzureCredential` (managed identity, workload identity, `az login`) instead of a connection "
        "string.",
        _A,
    ),
    ConfigKey(
        "azure.storage.endpoint.suffix",
        "str",
        "core.windows.net",
        "DNS suffix of `azure.storage.account`'s endpoints (sovereign clouds).",
        _A,
    ),
    ConfigKey(
        "azure.storage.container",
        "str",
        None,
        "Blob container of the job's leases (`leases/...`) and metadata documents (`metadata/...`); "
        "default `weirflow-<job.name>-<job.id>-<hash>`, sanitised. Created when missing.",
        _A,
    ),
    ConfigKey(
        "azure.storage.table.prefix",
        "str",
        None,
        "Prefix of the job's tables `<prefix>processors`, `<prefix>latches`, `<prefix>checkpoints`; default "
        "`wf<job.name><job.id><hash>` (letters and digits). Created when missing.",
        _A,
    ),
    ConfigKey(
        "azure.storage.request.timeout.ms",
        "duration_ms",
        10000,
        "Connect and read timeout of one storage request (a timed-out request is retried).",
        _A,
    ),
    ConfigKey(
        "azure.retry.attempts",
        "int",
        5,
        "Tries of one storage call on transient failures (connection errors, timeouts, 408, 429, 5xx) before "
        "it fails naming the endpoint. Other errors are not retried.",
        _A,
    ),
    ConfigKey(
        "azure.retry.initial.backoff.ms",
        "duration_ms",
        200,
        "Wait before the first retry; doubles on each retry, with jitter.",
        _A,
    ),
    ConfigKey("azure.retry.max.backoff.ms", "duration_ms", 5000, "Longest wait between two retries.", _A),
    ConfigKey(
        "task.checkpoint.azure.eventhubs.layout",
        "bool",
        True,
        "`azure-table` checkpoints also write Event Hubs positions in the Azure SDKs' table layout "
        "(PartitionKey `<namespace> <hub> <consumer group> Checkpoint`), so SDK processors can resume there.",
        _A,
    ),
    ConfigKey(
        "task.checkpoint.azure.eventhubs.table",
        "str",
        None,
        "Table of the Event Hubs SDK-layout rows; default the job's checkpoint table `<prefix>checkpoints`.",
        _A,
    ),
    ConfigKey(
        "systems.<name>.connection.string",
        "str",
        None,
        "Event Hubs systems: namespace connection string (`Endpoint=sb://...;SharedAccessKeyName=...`).",
        _S,
        secret=True,
    ),
    ConfigKey(
        "systems.<name>.fully.qualified.namespace",
        "str",
        None,
        "Event Hubs systems: `<namespace>.servicebus.windows.net`, to sign in with `DefaultAzureCredential`.",
        _S,
    ),
    ConfigKey(
        "systems.<name>.partition.method",
        "str",
        "hash",
        "Event Hubs systems: how a keyed record picks its partition: `hash` (the key is the Event Hubs "
        "partition key, routed by the service), `round_robin` (keys ignored), `key_as_partition` (the key is "
        "the partition number).",
        _S,
    ),
    ConfigKey(
        "systems.<name>.receive.batch.size",
        "int",
        300,
        "Event Hubs systems: most events one receive call of a partition reader asks the SDK for.",
        _S,
    ),
    ConfigKey(
        "systems.<name>.send.attempts",
        "int",
        5,
        "Event Hubs systems: tries of one batch send on transient errors (connection lost, timeout, busy) "
        "before the micro-batch fails.",
        _S,
    ),
    ConfigKey(
        "systems.<name>.prefetch",
        "int",
        20,
        "Event Hubs systems: events a partition reader lets the service send ahead (AMQP link credit). The "
        "SDK hands events over only after this many arrive or the stream pauses, so it bounds read latency "
        "on a busy partition (about prefetch / events per second); larger values save round trips.",
        _S,
    ),
    ConfigKey(
        "systems.<name>.catch-up.prefetch",
        "int",
        300,
        "Event Hubs systems: link credit of a reader opened to read a backlog of at least this many events "
        "(catching up: round trips matter, latency does not); once it reads near the partition's end it is "
        "reopened with `systems.<name>.prefetch`. 0 turns it off.",
        _S,
    ),
    ConfigKey(
        "systems.<name>.consumer.group",
        "str",
        "$Default",
        "Event Hubs systems: consumer group the job reads with.",
        _S,
    ),
)


def by_name() -> dict[str, ConfigKey]:
    return {k.name: k for k in KEYS}
