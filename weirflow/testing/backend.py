"""The hook between the contract suite and a backend: `Backend`, and `FactoryBackend` for plugins' factories.

A contract test never names an implementation. It asks the ``weirflow_backend`` fixture (which the user of
the suite defines) for a `Backend`, and the backend builds the objects under test: coordination primitives
and checkpoint managers and metadata stores for a job name the suite chooses (a fresh one per test), and the
clients of one system.

Backends are **pickled into spawned processes** by the cross-process contracts (lock contention, concurrent
producers): what a backend holds must be enough to reach the same state from another process (a directory,
a connection string), and its class must be importable by its module name. A backend that cannot be shared
between processes (an in-memory fake) sets ``processes = False``; those contracts are then skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from weirflow.interfaces.checkpoint import CheckpointManager, CheckpointManagerFactory
from weirflow.interfaces.coordination import CoordinationUtils, JobCoordinatorFactory
from weirflow.interfaces.metadata import MetadataStore, MetadataStoreFactory
from weirflow.interfaces.spark_state import SparkStateStore, SparkStateStoreFactory
from weirflow.interfaces.system import StreamSpec, SystemAdmin, SystemConsumer, SystemFactory, SystemProducer


@dataclass
class SystemClients:
    """The admin, consumer and producer of one system, named ``name`` (the ``system`` of its SSPs)."""

    name: str
    admin: SystemAdmin
    consumer: SystemConsumer
    producer: SystemProducer

    def close(self) -> None:
        for client in (self.producer, self.consumer, self.admin):
            client.close()


class Backend:
    """What the contract suite asks of a backend. Override the hooks of the interfaces you implement; a
    contract whose hook is not overridden fails with `NotImplementedError` naming it.

    * ``coordination(job, owner, lease_ms)`` — the `CoordinationUtils` of job ``job`` for ``owner``, with
      leases of ``lease_ms`` (LockContract, LeaderElectorContract, LatchContract, ProcessorRegistryContract).
    * ``checkpoint_manager(job)`` — a `CheckpointManager` of job ``job`` (CheckpointManagerContract).
    * ``metadata_store(job)`` — a `MetadataStore` of job ``job`` (MetadataStoreContract).
    * ``spark_state_store(job)`` — a `SparkStateStore` of job ``job`` (SparkStateStoreContract). A store
      whose processors all share one disk keeps no copy (the embedded default): it sets
      ``spark_state_copies = False``, and the contract checks that it leaves the local directory alone.
    * ``system()`` — `SystemClients` of one system with no streams yet (SystemContract).
    * ``declare_stream(admin, stream, partitions)`` — make a stream exist as a job's deployment would; by
      default ``admin.create_stream``. A system whose streams are infrastructure (Event Hubs) sets
      ``creates_streams = False`` and overrides this to create the stream outside the system's clients.

    Several calls with the same ``job`` reach the same state (that is how the contracts model several
    processors of one job); different jobs share nothing. The contracts call ``start()`` and ``stop()`` /
    ``close()`` on what the hooks return.

    ``lease_ms`` is the lease the coordination contracts use: lease-expiry tests wait about that long, so keep
    it short (the shortest lease the backend supports: 15 s for blob leases).
    """

    lease_ms: int = 600
    processes: bool = True
    creates_streams: bool = True
    spark_state_copies: bool = True

    def coordination(self, job: str, owner: str, lease_ms: int, instance: str = "") -> CoordinationUtils:
        """The primitives of job ``job`` for the holder (``owner``, ``instance``)."""
        raise self._missing("coordination")

    def checkpoint_manager(self, job: str) -> CheckpointManager:
        raise self._missing("checkpoint_manager")

    def metadata_store(self, job: str) -> MetadataStore:
        raise self._missing("metadata_store")

    def spark_state_store(self, job: str) -> SparkStateStore:
        raise self._missing("spark_state_store")

    def system(self) -> SystemClients:
        raise self._missing("system")

    def declare_stream(self, admin: SystemAdmin, stream: str, partitions: int) -> None:
        admin.create_stream(StreamSpec(stream, partitions))

    def _missing(self, hook: str) -> NotImplementedError:
        return NotImplementedError(
            f"{type(self).__name__} does not implement Backend.{hook}(): override it to run this contract"
        )


@dataclass
class FactoryBackend(Backend):
    """A backend built the way the runtime builds a plugin: through its factory classes and a job config.

    ``config`` is the configuration every object is built from (a connection string, ``job.state.dir``...);
    the suite adds ``job.name`` and, for coordination, ``job.coordinator.lease.duration.ms``. Give the
    factories of the interfaces the plugin implements (instances, as the runtime constructs them, with no
    arguments). ``system_name`` is the system's config name (`systems.<name>`); put its
    ``systems.<name>.*`` keys in ``config``.
    """

    config: Mapping[str, Any] = field(default_factory=dict)
    coordinator: JobCoordinatorFactory | None = None
    checkpoints: CheckpointManagerFactory | None = None
    metadata: MetadataStoreFactory | None = None
    systems: SystemFactory | None = None
    system_name: str = "sut"
    lease_ms: int = 600
    processes: bool = True
    creates_streams: bool = True
    spark_state: SparkStateStoreFactory | None = None
    spark_state_copies: bool = True

    def job_config(self, job: str, **overrides: Any) -> Any:
        """The `weirflow.config.Config` of job ``job``: ``config`` with ``job.name`` and ``overrides``."""
        from weirflow.config.loader import Config

        return Config.from_dict({**self.config, "job.name": job, **overrides})

    def coordination(self, job: str, owner: str, lease_ms: int, instance: str = "") -> CoordinationUtils:
        if self.coordinator is None:
            raise self._missing("coordination")
        config = self.job_config(job, **{"job.coordinator.lease.duration.ms": lease_ms})
        return self.coordinator.get_coordination_utils(config, owner, instance=instance)

    def checkpoint_manager(self, job: str) -> CheckpointManager:
        if self.checkpoints is None:
            raise self._missing("checkpoint_manager")
        return self.checkpoints.get_checkpoint_manager(self.job_config(job))

    def metadata_store(self, job: str) -> MetadataStore:
        if self.metadata is None:
            raise self._missing("metadata_store")
        return self.metadata.get_metadata_store(self.job_config(job))

    def spark_state_store(self, job: str) -> SparkStateStore:
        if self.spark_state is None:
            raise self._missing("spark_state_store")
        return self.spark_state.get_spark_state_store(self.job_config(job))

    def system(self) -> SystemClients:
        if self.systems is None:
            raise self._missing("system")
        config = self.job_config(str(self.config.get("job.name", "contract")))
        name = self.system_name
        return SystemClients(
            name,
            self.systems.get_admin(name, config),
            self.systems.get_consumer(name, config),
            self.systems.get_producer(name, config),
        )

    def _missing(self, hook: str) -> NotImplementedError:
        factory = _FACTORY_OF_HOOK[hook]
        return NotImplementedError(
            f"this FactoryBackend has no `{factory}` factory: give one to run this contract"
        )


# FactoryBackend's field holding the factory each hook uses.
_FACTORY_OF_HOOK = {
    "coordination": "coordinator",
    "checkpoint_manager": "checkpoints",
    "metadata_store": "metadata",
    "spark_state_store": "spark_state",
    "system": "systems",
}
