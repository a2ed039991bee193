"""The keys of ``delta`` systems (``systems.<name>.*`` with ``systems.<name>.factory: delta``) and the one
per-stream key the plugin reads (``streams.<id>.table.partition.by``).

Registered under ``weirflow.config_keys`` as ``delta`` (pyproject.toml). The storage keys mirror the Azure
suite's (``azure.storage.connection.string`` and ``azure.storage.account`` become
``systems.<name>.storage.connection.string`` and ``systems.<name>.storage.account``), scoped to the system
because a lake often lives in another account than the job's coordination. This module imports nothing of
deltalake: config loading and the reference read it without the extra.
"""

from __future__ import annotations

from weirflow.interfaces.config import ConfigKey

# The plugin's alias in the `weirflow.job.systems` entry-point group.
SYSTEM = "delta"
# The environment variable the Azure suite falls back to, read the same way here (docs/azure.md).
CONNECTION_STRING_ENV = "AZURE_STORAGE_CONNECTION_STRING"
DEFAULT_ID_COLUMN = "weirflow_id"

SECTION = "Delta Lake systems (`delta`)"

KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        "systems.<name>.path",
        "str",
        None,
        "Where the system's tables live; stream `s` is the Delta table `<path>/<physical name of s>`. A local "
        "directory (relative to the config file), or Azure Storage: "
        "`abfss://<container>@<account>.dfs.core.windows.net/<dir>` (ADLS Gen2) or `az://<container>/<dir>` "
        "(Blob Storage; the account comes from the storage keys). Required on a `delta` system; the container "
        "must exist (docs/delta.md).",
        SECTION,
        system=SYSTEM,
    ),
    ConfigKey(
        "systems.<name>.storage.connection.string",
        "str",
        None,
        "Connection string of the storage account of an Azure `path` (Azurite's works). Without it and "
        "without `systems.<name>.storage.account`, the environment variable "
        f"`{CONNECTION_STRING_ENV}` is used, as the Azure suite does.",
        SECTION,
        system=SYSTEM,
        secret=True,
    ),
    ConfigKey(
        "systems.<name>.storage.account",
        "str",
        None,
        "Storage account name or URL (`https://<account>.blob.core.windows.net`) of an Azure `path`, to sign "
        "in with Microsoft Entra ID (`DefaultAzureCredential`: managed identity, workload identity, "
        "`az login`; needs the `azure` extra) instead of a connection string. An `abfss://` path names its "
        "account itself.",
        SECTION,
        system=SYSTEM,
    ),
    ConfigKey(
        "systems.<name>.storage.endpoint.suffix",
        "str",
        "core.windows.net",
        "DNS suffix of the account's endpoints (sovereign clouds).",
        SECTION,
        system=SYSTEM,
    ),
    ConfigKey(
        "systems.<name>.record.id.field",
        "str",
        DEFAULT_ID_COLUMN,
        "Column holding each row's output id (docs/guarantees.md): written with every row, read back as "
        "`IncomingRecord.id`, with which a reader drops replays. Must name a column.",
        SECTION,
        system=SYSTEM,
    ),
    ConfigKey(
        "systems.<name>.request.timeout.ms",
        "duration_ms",
        30_000,
        "Longest one storage request of a table may take (a commit uploads a micro-batch's Parquet files, "
        "one request each).",
        SECTION,
        system=SYSTEM,
    ),
    ConfigKey(
        "systems.<name>.retry.attempts",
        "int",
        5,
        "Tries of one table operation (a commit, a snapshot, a read) on transient storage failures "
        "(connection errors, timeouts, HTTP 408, 429, 5xx) before it fails naming the table's location.",
        SECTION,
        system=SYSTEM,
    ),
    ConfigKey(
        "systems.<name>.retry.deadline.ms",
        "duration_ms",
        120_000,
        "Longest one table operation may take, retries included; no attempt starts that could end past it.",
        SECTION,
        system=SYSTEM,
    ),
    ConfigKey(
        "streams.<id>.table.partition.by",
        "list",
        None,
        "Columns the stream's Delta table is partitioned by, for a stream on a `delta` system (ignored on "
        "others). Applied when the first commit creates the table; a table's partitioning never changes "
        "afterwards, and a table partitioned otherwise is refused naming both. Unset: not partitioned.",
        SECTION,
    ),
)
