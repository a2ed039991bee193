"""The `local` aliases: the embedded default's factories, and where its files live.

* ``<job.state.dir>/<job.name>-<job.id>.db`` — the job database: coordination, checkpoints, metadata.
* ``systems.<name>.path`` or ``<job.state.dir>/<name>.streams.db`` — a local system's streams.
"""

from __future__ import annotations

from pathlib import Path

from weirflow.interfaces.checkpoint import CheckpointManager, CheckpointManagerFactory
from weirflow.interfaces.config import ConfigView
from weirflow.interfaces.coordination import CoordinationUtils, JobCoordinatorFactory
from weirflow.interfaces.metadata import MetadataStore, MetadataStoreFactory
from weirflow.interfaces.spark_state import MirrorReport, SparkStateStore, SparkStateStoreFactory
from weirflow.interfaces.stream_names import declared_streams
from weirflow.interfaces.system import SystemAdmin, SystemConsumer, SystemFactory, SystemProducer
from weirflow.interfaces.timings import CoordinationTimings
from weirflow.local.checkpoint import SqliteCheckpointManager
from weirflow.local.coordination import SqliteCoordinationUtils
from weirflow.local.metadata import SqliteMetadataStore
from weirflow.local.streams import (
    LocalSystemAdmin,
    LocalSystemConsumer,
    LocalSystemProducer,
    SqliteStreamStore,
    StreamRetention,
)


def job_database_path(config: ConfigView) -> Path:
    return config.state_dir() / f"{config.get('job.name')}-{config.get('job.id')}.db"


def stream_database_path(config: ConfigView, system_name: str) -> Path:
    key = f"systems.{system_name}.path"
    if config.get(key):
        return config.path(key)
    return config.state_dir() / f"{system_name}.streams.db"


def retentions(config: ConfigView, system_name: str) -> dict[str, StreamRetention]:
    """The retention of each declared stream of ``system_name`` that sets one, by physical name."""
    found = {}
    for ref in declared_streams(config):
        ms, size = (config.get(f"streams.{ref.stream_id}.retention{suffix}") for suffix in ("", ".bytes"))
        if ref.system == system_name and (ms is not None or size is not None):
            key = f"streams.{ref.stream_id}.retention" + ("" if ms is not None else ".bytes")
            found[ref.physical] = StreamRetention(
                int(ms) if ms is not None else None, int(size) if size is not None else None, key
            )
    return found


def _busy(config: ConfigView) -> int:
    return int(config.get("local.db.busy.timeout.ms"))


class LocalJobCoordinatorFactory(JobCoordinatorFactory):
    def get_coordination_utils(
        self, config: ConfigView, owner: str, instance: str = "", timings: CoordinationTimings | None = None
    ) -> CoordinationUtils:
        return SqliteCoordinationUtils(
            job_database_path(config),
            owner,
            timings.lease_ms if timings is not None else config.get("job.coordinator.lease.duration.ms"),
            _busy(config),
            instance=instance,
        )


class LocalCheckpointManagerFactory(CheckpointManagerFactory):
    def get_checkpoint_manager(self, config: ConfigView) -> CheckpointManager:
        return SqliteCheckpointManager(job_database_path(config), _busy(config))


class LocalMetadataStoreFactory(MetadataStoreFactory):
    def get_metadata_store(self, config: ConfigView) -> MetadataStore:
        return SqliteMetadataStore(job_database_path(config), _busy(config))


class LocalSystemFactory(SystemFactory):
    """Admin, consumer and producer of one local system share nothing but the file: each opens its own
    connections, so they can be used from different threads and closed independently."""

    def get_admin(self, system_name: str, config: ConfigView) -> SystemAdmin:
        return LocalSystemAdmin(
            SqliteStreamStore(stream_database_path(config, system_name), _busy(config)),
            retentions(config, system_name),
        )

    def get_consumer(self, system_name: str, config: ConfigView) -> SystemConsumer:
        return LocalSystemConsumer(SqliteStreamStore(stream_database_path(config, system_name), _busy(config)))

    def get_producer(self, system_name: str, config: ConfigView) -> SystemProducer:
        return LocalSystemProducer(SqliteStreamStore(stream_database_path(config, system_name), _busy(config)))


class _LocalDiskOnly(SparkStateStore):
    """The embedded job's processors share one disk, so the Spark checkpoint directory is its own copy."""

    def mirror(self, task: str, local: Path, batch: int, epoch: int) -> MirrorReport:
        return MirrorReport()

    def restore(self, task: str, local: Path) -> int | None:
        return None

    def discard(self, task: str) -> None:
        pass


class LocalSparkStateStoreFactory(SparkStateStoreFactory):
    def get_spark_state_store(self, config: ConfigView) -> SparkStateStore:
        return _LocalDiskOnly()
