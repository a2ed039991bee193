"""The keys of ``kinesis`` systems (``systems.<name>.*`` with ``systems.<name>.factory: kinesis``).

Registered under ``weirflow.config_keys`` as ``kinesis`` (pyproject.toml); each applies only to systems whose
factory is this plugin. This module imports nothing of boto3: config loading and the reference read it
without the extra.
"""

from __future__ import annotations

from weirflow.interfaces.config import ConfigKey

# The plugin's alias in the `weirflow.job.systems` entry-point group.
SYSTEM = "kinesis"
# Most virtual tasks a stream may have: slices stay wide enough that a 1,024-task job's partition keys spread.
MAX_VIRTUAL_TASKS = 1024
# The retention periods Kinesis accepts, in hours (24 is the one a stream is created with).
MIN_RETENTION_HOURS, MAX_RETENTION_HOURS = 24, 8760

SECTION = "Kinesis systems (`kinesis`)"

KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        "systems.<name>.virtual.tasks",
        "int",
        16,
        "Fixed number of tasks per stream, each owning one equal slice of the 128-bit MD5 hash space of "
        f"partition keys (1 to {MAX_VIRTUAL_TASKS}). Resharding never changes it, so state never moves; "
        "changing it re-keys every task (a new deployment, docs/kinesis.md).",
        SECTION,
        system=SYSTEM,
    ),
    ConfigKey(
        "systems.<name>.region",
        "str",
        None,
        "AWS region; unset uses boto3's own chain (`AWS_REGION`, `AWS_DEFAULT_REGION`, ~/.aws/config).",
        SECTION,
        system=SYSTEM,
    ),
    ConfigKey(
        "systems.<name>.endpoint",
        "str",
        None,
        "Endpoint URL of a Kinesis-compatible service (kinesalite, LocalStack); unset reaches AWS. "
        "Credentials always come from boto3's usual chain.",
        SECTION,
        system=SYSTEM,
    ),
    ConfigKey(
        "systems.<name>.shards",
        "int",
        4,
        "Shards of a stream weirflow creates (`weirflow streams create`, intermediate streams). The stream's "
        "partition count is its virtual task count, whatever its shards.",
        SECTION,
        system=SYSTEM,
    ),
    ConfigKey(
        "systems.<name>.retention.hours",
        "int",
        MIN_RETENTION_HOURS,
        f"Retention of the streams weirflow creates, in hours ({MIN_RETENTION_HOURS}, Kinesis's default, to "
        f"{MAX_RETENTION_HOURS}): Kinesis deletes a record this long after it arrived, read or not. Streams that "
        "exist keep theirs (`aws kinesis increase-stream-retention-period`). Intermediate streams and table "
        'changelogs on Kinesis also need `systems.<name>.retention.loss.allowed` (docs/guarantees.md, "Streams '
        'read back whole").',
        SECTION,
        system=SYSTEM,
    ),
    ConfigKey(
        "systems.<name>.read.interval.ms",
        "int",
        200,
        "Least time between two `GetRecords` calls on one shard by one processor: 200 keeps within the "
        "service's 5 calls per second per shard, shared by every reader (docs/kinesis.md).",
        SECTION,
        system=SYSTEM,
    ),
    ConfigKey(
        "systems.<name>.shard.refresh.ms",
        "int",
        5000,
        "How often a running reader lists the stream's shards, to find the children of a split or merge "
        "(a shard read to its end triggers a listing at once).",
        SECTION,
        system=SYSTEM,
    ),
    ConfigKey(
        "systems.<name>.spool.dir",
        "str",
        None,
        "Where a processor keeps the records it read from each shard for its tasks' slices (a SQLite cache; "
        "default `<job.state.dir>/kinesis-spool`). Losing it costs reads, never records.",
        SECTION,
        system=SYSTEM,
    ),
    ConfigKey(
        "systems.<name>.spool.retention.ms",
        "int",
        600_000,
        "How long records stay in the spool after being read from Kinesis once every reader has passed "
        "them (a record a reader still needs stays, within spool.max.bytes); a task further behind reads its "
        "shards again.",
        SECTION,
        system=SYSTEM,
    ),
    ConfigKey(
        "systems.<name>.spool.max.bytes",
        "int",
        256 * 1024 * 1024,
        "Most bytes of record data a processor's spool of one stream holds (256 MiB: about two minutes of "
        "one shard at its 2 MB/s read limit); the file is somewhat larger (keys, index). At the bound the "
        "prefetcher stops reading ahead and drops what every reader has passed; a task's own reads go on "
        "(docs/kinesis.md).",
        SECTION,
        system=SYSTEM,
    ),
    ConfigKey(
        "systems.<name>.read.failures",
        "int",
        5,
        "Failed reads ahead of one shard in a row (each `GetRecords` call already retried by boto3; tries "
        "1 s apart, doubling up to 10 s) after which the task reading the shard fails with the last error, "
        "instead of planning nothing while it lasts. Each failure is logged at WARNING with the shard.",
        SECTION,
        system=SYSTEM,
    ),
    ConfigKey(
        "systems.<name>.record.id.field",
        "str",
        "weirflow_id",
        "Field that a record written to an output stream gets in its JSON object: the record's id, the same "
        "for a replay of it, with which a consumer drops replays (Kinesis records carry no properties; "
        "docs/guarantees.md). Empty: no field.",
        SECTION,
        system=SYSTEM,
    ),
    ConfigKey(
        "systems.<name>.send.attempts",
        "int",
        8,
        "Tries of one `PutRecords` round on throttling and failed entries (exponential backoff) before the "
        "micro-batch fails.",
        SECTION,
        system=SYSTEM,
    ),
)
