"""The Azure suite's storage keys (``azure.*``), shared by the ``azure`` coordinator and metadata store and the
``azure-table`` checkpoint manager; registered under ``weirflow.config_keys`` as ``azure`` (pyproject.toml)."""

from __future__ import annotations

from weirflow.interfaces.config import ConfigKey

SECTION = "Azure suite (`azure`, `azure-table`)"

KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        "azure.storage.connection.string",
        "str",
        None,
        "Connection string of the job's storage account, e.g. `${AZURE_STORAGE_CONNECTION_STRING}`. "
        "Without it and without `azure.storage.account`, the environment variable "
        "`AZURE_STORAGE_CONNECTION_STRING` is used.",
        SECTION,
        secret=True,
    ),
    ConfigKey(
        "azure.storage.account",
        "str",
        None,
        "Storage account name or URL (`https://<account>.blob.core.windows.net`), to sign in with "
        "`DefaultAzureCredential` (managed identity, workload identity, `az login`) instead of a connection "
        "string.",
        SECTION,
    ),
    ConfigKey(
        "azure.storage.endpoint.suffix",
        "str",
        "core.windows.net",
        "DNS suffix of `azure.storage.account`'s endpoints (sovereign clouds).",
        SECTION,
    ),
    ConfigKey(
        "azure.storage.container",
        "str",
        None,
        "Blob container of the job's leases (`leases/...`) and metadata documents (`metadata/...`); "
        "default `weirflow-<job.name>-<job.id>-<hash>`, sanitised. Created when missing.",
        SECTION,
    ),
    ConfigKey(
        "azure.storage.table.prefix",
        "str",
        None,
        "Prefix of the job's tables `<prefix>processors`, `<prefix>latches`, `<prefix>checkpoints`; default "
        "`wf<job.name><job.id><hash>` (letters and digits). Created when missing.",
        SECTION,
    ),
    ConfigKey(
        "azure.storage.request.timeout.ms",
        "duration_ms",
        3000,
        "Connect and read timeout of one storage request (a timed-out request is retried within "
        "`azure.retry.deadline.ms`, which must not be shorter).",
        SECTION,
    ),
    ConfigKey(
        "azure.retry.deadline.ms",
        "duration_ms",
        4000,
        "Longest time one storage call may take, retries included; then it fails naming the endpoint. It must be "
        "shorter than `job.coordinator.lease.renew.margin.ms`, so that a lease renewal answers, or fails, while "
        "the processor can still fence itself in time.",
        SECTION,
    ),
    ConfigKey(
        "azure.retry.attempts",
        "int",
        5,
        "Tries of one storage call on transient failures (connection errors, timeouts, 408, 429, 5xx) before "
        "it fails naming the endpoint. Other errors are not retried.",
        SECTION,
    ),
    ConfigKey(
        "azure.retry.initial.backoff.ms",
        "duration_ms",
        200,
        "Wait before the first retry; doubles on each retry, with jitter.",
        SECTION,
    ),
    ConfigKey("azure.retry.max.backoff.ms", "duration_ms", 5000, "Longest wait between two retries.", SECTION),
)
