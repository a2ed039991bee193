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
from weirflow.interfaces.metadata import Document, MetadataStore, MetadataStoreFactory
from weirflow.interfaces.system import (
    IncomingRecord,
    OutgoingRecord,
    PartitionMetadata,
    StreamSpec,
    SystemAdmin,
    SystemConsumer,
    SystemFactory,
    SystemProducer,
    SystemStream,
    SystemStreamPartition,
)

__all__ = [
    "Checkpoint",
    "CheckpointManager",
    "CheckpointManagerFactory",
    "ConfigKey",
    "ConfigView",
    "CoordinationUtils",
    "Document",
    "IncomingRecord",
    "JobCoordinatorFactory",
    "Latch",
    "LatchState",
    "LeaderElector",
    "Lock",
    "MetadataStore",
    "MetadataStoreFactory",
    "OutgoingRecord",
    "PartitionMetadata",
    "ProcessorInfo",
    "ProcessorRegistry",
    "StreamSpec",
    "SystemAdmin",
    "SystemConsumer",
    "SystemFactory",
    "SystemProducer",
    "SystemStream",
    "SystemStreamPartition",
]
