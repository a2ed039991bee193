"""Core's keys of each declared stream, ``streams.<id>.*`` (see `weirflow.config.keys`, which adds them to `KEYS`):
where a stream lives, how its records are read, and how long the embedded log keeps them."""

from __future__ import annotations

from weirflow.interfaces.config import ConfigKey

_S = "Systems and streams"

STREAM_KEYS: tuple[ConfigKey, ...] = (
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
        "streams.<id>.retention",
        "duration_ms",
        None,
        "Only for a stream on the embedded log (`local`): how long it keeps a record after it was appended, "
        "read or not (Kafka's `retention.ms`; Event Hubs and Kinesis set theirs on the stream). The leader "
        "deletes older records every `job.trim.interval.ms`; a task whose next record was deleted fails, naming "
        'the stream, the partition and the first offset held (docs/operations.md, "Running for months"). '
        "Unset: kept for ever.",
        _S,
    ),
    ConfigKey(
        "streams.<id>.retention.bytes",
        "int",
        None,
        "Only for a stream on the embedded log (`local`): the most bytes (keys and values) each partition keeps; "
        "the oldest records past it are deleted, read or not (Kafka's `retention.bytes`). Unset: no bound.",
        _S,
    ),
    ConfigKey(
        "streams.<id>.on-deleted",
        "str",
        "fail",
        "What a task does when its checkpoint resumes at a record the stream no longer holds (the embedded log's "
        "`streams.<id>.retention` deleted it): `fail`, naming the stream, the partition and the first offset "
        "held, or `earliest`: resume there, logging how many records it skips.",
        _S,
    ),
    ConfigKey(
        "streams.<id>.start",
        "str",
        "earliest",
        "Where a task without a checkpoint starts reading: `earliest`, `latest`, or an ISO 8601 time such as "
        "`2026-11-20T08:00:00Z` (per partition, the first record stamped at or after it; no zone means UTC), or "
        "`sdk-checkpoint`: after the checkpoint a consumer written with the system's own SDK left (Event Hubs: "
        "the blobs in `task.checkpoint.azure.eventhubs.container`; a partition without one starts at earliest).",
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
)
