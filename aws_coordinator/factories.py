"""The AWS suite's aliases: `AwsJobCoordinatorFactory` (``job.coordinator.factory: aws``),
`S3MetadataStoreFactory` (``metadata.store.factory``, which follows the coordinator when unset) and
`DynamoCheckpointManagerFactory` (``task.checkpoint.factory: dynamodb``)."""

from __future__ import annotations

import logging

from weirflow_aws.checkpoints import DynamoCheckpointManager
from weirflow_aws.clients import COORDINATION, Aws, require_bucket
from weirflow_aws.latch import DynamoLatch
from weirflow_aws.leases import LEADER, LOCK_PREFIX, CounterLease, Observations
from weirflow_aws.metadata import S3MetadataStore
from weirflow_aws.registry import DynamoProcessorRegistry

from weirflow.interfaces.checkpoint import CheckpointManager, CheckpointManagerFactory
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

log = logging.getLogger("weirflow.aws")


class AwsCoordinationUtils(CoordinationUtils):
    """The primitives of one job in its coordination table, for one owner."""

    def __init__(self, aws: Aws, owner: str, lease_ms: int, instance: str = "") -> None:
        self.aws = aws
        self.owner = owner
        self.instance = instance
        self.lease_ms = lease_ms
        # one per process: what it saw of the leases' counters and of the heartbeats, on its own clock
        self._observations = Observations()
        self._registry = DynamoProcessorRegistry(aws)

    def _lease(self, name: str) -> CounterLease:
        return CounterLease(self.aws, name, self.owner, self.lease_ms, self.instance, self._observations)

    def leader_elector(self) -> LeaderElector:
        return LeaseLeaderElector(self._lease(LEADER))

    def lock(self, name: str) -> Lock:
        return LeaseLock(name, self._lease(LOCK_PREFIX + name))

    def latch(self, name: str) -> Latch:
        return DynamoLatch(self.aws, name)

    def processor_registry(self) -> ProcessorRegistry:
        return self._registry

    def close(self) -> None:
        self.aws.close()


class AwsJobCoordinatorFactory(JobCoordinatorFactory):
    def get_coordination_utils(
        self, config: ConfigView, owner: str, instance: str = "", timings: CoordinationTimings | None = None
    ) -> CoordinationUtils:
        aws = Aws.from_config(config)
        timings = timings or CoordinationTimings.from_config(config)
        # a call must end, retries included, before the self-fence acts on a renewal that did not come
        timings.check_call_deadline(
            config, "aws.retry.deadline.ms", aws.settings.retry_deadline_s, "aws.request.timeout.ms"
        )
        log.info(
            "aws coordination: table %s on %s",
            aws.settings.table_name(COORDINATION),
            aws.settings.endpoint_url or f"AWS ({aws.settings.region or 'the default region'})",
        )
        return AwsCoordinationUtils(aws, owner, timings.lease_ms, instance)


class S3MetadataStoreFactory(MetadataStoreFactory):
    def get_metadata_store(self, config: ConfigView) -> MetadataStore:
        aws = Aws.from_config(config)
        require_bucket(config, aws.settings)
        return S3MetadataStore(aws)


class DynamoCheckpointManagerFactory(CheckpointManagerFactory):
    def get_checkpoint_manager(self, config: ConfigView) -> CheckpointManager:
        return DynamoCheckpointManager(Aws.from_config(config))
