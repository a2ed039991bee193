"""A ``delta`` system's settings, read once from ``systems.<name>.*`` and ``streams.<id>.table.partition.by``.

**Partitioning is per stream** (``streams.<id>.table.partition.by``), not per system: a system's tables hold
different columns, so one system-wide column list would fit some tables and not others. `StreamSpec.properties`
cannot carry it, since nothing in the runtime fills them from config and the table is not made when its stream
is "created" anyway (its columns come from the first commit's rows, docs/delta.md); the writer therefore looks
the stream up by its physical name (`weirflow.interfaces.stream_names`) when the first commit creates the table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from weirflow.interfaces.config import ConfigView
from weirflow.interfaces.stream_names import declared_streams
from weirflow_delta.azure_auth import StorageAccess, storage_access
from weirflow_delta.keys import DEFAULT_ID_COLUMN
from weirflow_delta.locations import TableRoot, table_root

PARTITION_KEY = "streams.{stream_id}.table.partition.by"


@dataclass(frozen=True)
class RetrySettings:
    """The retry policy of a system's table operations (`weirflow.base.service_calls.RetrySettings`)."""

    request_timeout_s: float = 30.0
    retry_deadline_s: float = 120.0
    retry_attempts: int = 5
    retry_initial_s: float = 0.2
    retry_max_s: float = 5.0


@dataclass(frozen=True)
class DeltaSettings:
    """Where a system's tables are, how to reach them, their id column, their partitioning and retries.
    ``partitions`` maps a table (a physical name) to its configured partition columns and the key that said so
    (a table no stream names is not partitioned)."""

    system: str
    root: TableRoot
    access: StorageAccess
    id_column: str = DEFAULT_ID_COLUMN
    partitions: Mapping[str, tuple[tuple[str, ...], str]] = field(default_factory=dict)
    retry: RetrySettings = RetrySettings()

    @classmethod
    def from_config(cls, system: str, config: ConfigView) -> DeltaSettings:
        prefix = f"systems.{system}."
        root = table_root(system, config)
        id_column = str(config.get(prefix + "record.id.field") or "").strip()
        if not id_column:
            raise config.error(
                prefix + "record.id.field",
                "must name a column: every row of a Delta table carries its output id (docs/guarantees.md)",
            )
        attempts = int(config.get(prefix + "retry.attempts"))
        if attempts < 1:
            raise config.error(prefix + "retry.attempts", "must be at least 1")
        timeout_ms = int(config.get(prefix + "request.timeout.ms"))
        deadline_ms = int(config.get(prefix + "retry.deadline.ms"))
        if timeout_ms < 1:
            raise config.error(prefix + "request.timeout.ms", "must be positive")
        if deadline_ms < timeout_ms:
            raise config.error(
                prefix + "retry.deadline.ms",
                f"{deadline_ms} ms is shorter than one request may take ({prefix}request.timeout.ms); raise it",
            )
        return cls(
            system=system,
            root=root,
            access=storage_access(system, config, root),
            id_column=id_column,
            partitions=_partitions(system, config),
            retry=RetrySettings(
                request_timeout_s=timeout_ms / 1000, retry_deadline_s=deadline_ms / 1000, retry_attempts=attempts
            ),
        )

    def partition_by(self, table: str) -> tuple[tuple[str, ...], str | None]:
        """The columns ``table`` is to be partitioned by, and the key that says so (None: not configured)."""
        columns, key = self.partitions.get(table, ((), ""))
        return columns, key or None

    def storage_options(self) -> dict[str, str]:
        """delta-rs's storage options for one operation: the access's (a fresh token) and, in Azure Storage,
        one request's timeout with object_store's own retries off, so that one policy, the plugin's, retries
        (as the Azure suite switches its SDK's off; docs/azure.md)."""
        options = self.access.options()
        if self.root.azure is not None:
            options.setdefault("timeout", f"{int(self.retry.request_timeout_s * 1000)}ms")
            options.setdefault("max_retries", "0")
        return options


def _partitions(system: str, config: ConfigView) -> dict[str, tuple[tuple[str, ...], str]]:
    found: dict[str, tuple[tuple[str, ...], str]] = {}
    for ref in declared_streams(config):
        key = PARTITION_KEY.format(stream_id=ref.stream_id)
        columns = tuple(config.get(key) or ())
        if ref.system == system and columns:
            found[ref.physical] = (columns, key)
    return found
