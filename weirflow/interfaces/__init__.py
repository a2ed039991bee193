"""The plugin boundary: every backend implements these and depends on nothing else of weirflow."""

from weirflow.interfaces.checkpoint import Checkpoint, CheckpointManager, CheckpointManagerFactory
from weirflow.interfaces.config import ConfigKey, ConfigView
from weirflow.interfaces.coordination import (
    CoordinationUtils,
    JobCoordinatorFactory,
    Latch,
    LatchState,
    LeaderElector,
    Lock,
    ProcessorInfo,
    ProcessorRegistry,
)
from weirflow.interfaces.leases import Lease, LeaseLeaderElector, LeaseLock
from weirflow.interfaces.metadata import Document, MetadataStore, MetadataStoreFactory
from weirflow.interfaces.system import (
    IncomingRecord,
    OutgoingRecord,
    PartitionMetadata,
    Retention,
    StreamSpec,
    SystemAdmin,
    SystemConsumer,
    SystemFactory,
    SystemProducer,
    SystemStream,
    SystemStreamPartition,
)
from weirflow.interfaces.timings import CoordinationTimings

__all__ = [
    "Checkpoint",
    "CheckpointManager",
    "CheckpointManagerFactory",
    "ConfigKey",
    "ConfigView",
    "CoordinationTimings",
    "CoordinationUtils",
    "Document",
    "IncomingRecord",
    "JobCoordinatorFactory",
    "Latch",
    "LatchState",
    "LeaderElector",
    "Lease",
    "LeaseLeaderElector",
    "LeaseLock",
    "Lock",
    "MetadataStore",
    "MetadataStoreFactory",
    "OutgoingRecord",
    "PartitionMetadata",
    "ProcessorInfo",
    "ProcessorRegistry",
    "Retention",
    "StreamSpec",
    "SystemAdmin",
    "SystemConsumer",
    "SystemFactory",
    "SystemProducer",
    "SystemStream",
    "SystemStreamPartition",
]
