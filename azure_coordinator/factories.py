"""The ``azure`` aliases: `AzureJobCoordinatorFactory` (`job.coordinator.factory: azure`) and
`AzureMetadataStoreFactory` (`metadata.store.factory`, which follows the coordinator when unset)."""

from __future__ import annotations

import logging

from weirflow.interfaces.config import ConfigView
from weirflow.interfaces.coordination import (
    CoordinationUtils,
    JobCoordinatorFactory,
    Latch,
    LeaderElector,
    Lock,
    ProcessorRegistry,
)
from weirflow.interfaces.leases import LeaseLeaderElector, LeaseLock
from weirflow.interfaces.metadata import MetadataStore, MetadataStoreFactory
from weirflow.interfaces.timings import CoordinationTimings
from weirflow_azure.coordinator.latch import TableLatch
from weirflow_azure.coordinator.leases import LEADER_BLOB, LOCK_PREFIX, BlobLease, lease_seconds
from weirflow_azure.coordinator.metadata import BlobMetadataStore
from weirflow_azure.coordinator.registry import TableProcessorRegistry
from weirflow_azure.coordinator.storage import Storage

log = logging.getLogger("weirflow.azure")


class AzureCoordinationUtils(CoordinationUtils):
    """The primitives of one job on one storage account, for one owner."""

    def __init__(self, storage: Storage, owner: str, lease_ms: int, instance: str = "") -> None:
        lease_seconds(lease_ms)  # fail now, not at the first lease
        self.storage = storage
        self.owner = owner
        self.instance = instance
        self.lease_ms = lease_ms
        # one registry per process: it carries what it learned of the store's clock from its own writes
        self._registry = TableProcessorRegistry(storage)

    def leader_elector(self) -> LeaderElector:
        return LeaseLeaderElector(BlobLease(self.storage, LEADER_BLOB, self.owner, self.lease_ms, self.instance))

    def lock(self, name: str) -> Lock:
        lease = BlobLease(self.storage, f"{LOCK_PREFIX}{name}", self.owner, self.lease_ms, self.instance)
        return LeaseLock(name, lease)

    def latch(self, name: str) -> Latch:
        return TableLatch(self.storage, name)

    def processor_registry(self) -> ProcessorRegistry:
        return self._registry

    def close(self) -> None:
        self.storage.close()


def _lease_ms(config: ConfigView) -> int:
    key = "job.coordinator.lease.duration.ms"
    lease_ms = int(config.get(key))
    try:
        lease_seconds(lease_ms)
    except ValueError as exc:
        raise config.error(key, f"{exc} (the azure coordinator uses blob leases)") from None
    return lease_ms


class AzureJobCoordinatorFactory(JobCoordinatorFactory):
    def get_coordination_utils(
        self, config: ConfigView, owner: str, instance: str = "", timings: CoordinationTimings | None = None
    ) -> CoordinationUtils:
        storage = Storage.from_config(config)
        log.info(
            "azure coordination: container %s, tables %s{processors,latches} on %s",
            storage.settings.container,
            storage.settings.table_prefix,
            storage.settings.account or "the connection string's account",
        )
        lease_ms = _lease_ms(config)
        timings = timings or CoordinationTimings.from_config(config)
        # a storage call must end, retries included, before the self-fence acts on a renewal that did not come
        timings.check_call_deadline(
            config,
            "azure.retry.deadline.ms",
            storage.settings.retry_deadline_s,
            "azure.storage.request.timeout.ms",
        )
        return AzureCoordinationUtils(storage, owner, lease_ms, instance)


class AzureMetadataStoreFactory(MetadataStoreFactory):
    def get_metadata_store(self, config: ConfigView) -> MetadataStore:
        return BlobMetadataStore(Storage.from_config(config))
