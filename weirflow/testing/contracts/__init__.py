"""The contract classes: subclass one in a test module (``class TestMyLocks(LockContract): ...``) and define
a ``weirflow_backend`` fixture returning a `weirflow.testing.Backend`; every ``test_*`` method then runs
against that backend. Named ``*Contract`` so that pytest collects only the subclasses."""

from weirflow.testing.contracts.checkpoint import CheckpointManagerContract
from weirflow.testing.contracts.latch import LatchContract
from weirflow.testing.contracts.leader_elector import LeaderElectorContract
from weirflow.testing.contracts.lock import LockContract
from weirflow.testing.contracts.metadata_store import MetadataStoreContract
from weirflow.testing.contracts.processor_registry import ProcessorRegistryContract
from weirflow.testing.contracts.spark_state import SparkStateStoreContract
from weirflow.testing.contracts.system import SystemContract, SystemUnderTest


class JobCoordinatorContract(LeaderElectorContract, LockContract, LatchContract, ProcessorRegistryContract):
    """Everything a coordinator (`JobCoordinatorFactory`) provides: leader election, locks, latches and the
    processor registry, in one class."""


__all__ = [
    "CheckpointManagerContract",
    "JobCoordinatorContract",
    "LatchContract",
    "LeaderElectorContract",
    "LockContract",
    "MetadataStoreContract",
    "ProcessorRegistryContract",
    "SparkStateStoreContract",
    "SystemContract",
    "SystemUnderTest",
]
