"""The project's own backends, built through the same hook as anyone's (`weirflow.testing.FactoryBackend`):
their registered factories and a job config, as the runtime builds them.

* ``local`` — the embedded default: one SQLite database per job under the test's directory, and the local
  system's log beside it; Spark state stays on the local disk (no copies). 600 ms leases.
* ``azure`` — the Azure suite on the storage account of the session (Azurite, or a real account through
  ``WEIRFLOW_TEST_AZURE_STORAGE``): blob leases, Table latches and registry, blob metadata, Table
  checkpoints, Blob copies of Spark state. Blob leases last at least 15 s, so leases are 15 s.
* ``eventhub`` — the Event Hubs system on the emulator. Event hubs are infrastructure, so the test plays the
  part of Bicep: `declare_stream` adds the hub to the emulator, then the admin checks it.

They are importable (not defined in a conftest) because the cross-process contracts pickle them into
spawned processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weirflow.interfaces.system import SystemAdmin
from weirflow.testing import FactoryBackend

LOCAL_LEASE_MS = 600
AZURE_LEASE_MS = 15_000


def local_backend(state_dir: Path) -> FactoryBackend:
    from weirflow.local.factories import (
        LocalCheckpointManagerFactory,
        LocalJobCoordinatorFactory,
        LocalMetadataStoreFactory,
        LocalSparkStateStoreFactory,
        LocalSystemFactory,
    )

    return FactoryBackend(
        {"job.state.dir": str(state_dir)},
        coordinator=LocalJobCoordinatorFactory(),
        checkpoints=LocalCheckpointManagerFactory(),
        metadata=LocalMetadataStoreFactory(),
        systems=LocalSystemFactory(),
        system_name="local",
        lease_ms=LOCAL_LEASE_MS,
        spark_state=LocalSparkStateStoreFactory(),
        spark_state_copies=False,
    )


def azure_backend(connection_string: str) -> FactoryBackend:
    from weirflow_azure.checkpoint.factories import TableCheckpointManagerFactory
    from weirflow_azure.coordinator.factories import AzureJobCoordinatorFactory, AzureMetadataStoreFactory
    from weirflow_azure.coordinator.spark_state import BlobSparkStateStoreFactory

    return FactoryBackend(
        {"azure.storage.connection.string": connection_string},
        coordinator=AzureJobCoordinatorFactory(),
        checkpoints=TableCheckpointManagerFactory(),
        metadata=AzureMetadataStoreFactory(),
        lease_ms=AZURE_LEASE_MS,
        spark_state=BlobSparkStateStoreFactory(),
    )


@dataclass
class EventHubsOnEmulator(FactoryBackend):
    """The ``eventhub`` system on an `EventHubsEmulator`. The emulator stays in the test's process: a spawned
    process gets the connection string only, and declares nothing."""

    emulator: Any = field(default=None, repr=False)

    def declare_stream(self, admin: SystemAdmin, stream: str, partitions: int) -> None:
        assert self.emulator is not None, "only the test's own process declares hubs"
        self.emulator.add_hub(stream, partitions)
        super().declare_stream(admin, stream, partitions)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "emulator": None}


AWS_LEASE_MS = 2_000


def aws_backend(endpoint: str, bucket: str) -> FactoryBackend:
    """The AWS suite on a moto server: counter leases, latches and registry in DynamoDB, DynamoDB checkpoints,
    S3 metadata and Spark state copies. Counter leases have no floor, so leases are short; the timings that
    must fit inside them (renewals, the self-fence margin, one call's retry deadline) are set to match."""
    from weirflow_aws.factories import (
        AwsJobCoordinatorFactory,
        DynamoCheckpointManagerFactory,
        S3MetadataStoreFactory,
    )
    from weirflow_aws.spark_state import S3SparkStateStoreFactory

    return FactoryBackend(
        {
            "aws.endpoint.url": endpoint,
            "aws.region": "us-east-1",
            "aws.s3.bucket": bucket,
            "aws.request.timeout.ms": 1000,
            "aws.retry.deadline.ms": 1200,
            "job.coordinator.lease.renew.interval.ms": 400,
            "job.coordinator.lease.renew.margin.ms": 1500,
        },
        coordinator=AwsJobCoordinatorFactory(),
        checkpoints=DynamoCheckpointManagerFactory(),
        metadata=S3MetadataStoreFactory(),
        lease_ms=AWS_LEASE_MS,
        spark_state=S3SparkStateStoreFactory(),
    )


def eventhub_backend(emulator: Any) -> EventHubsOnEmulator:
    from weirflow_azure.eventhubs.factory import EventHubSystemFactory

    return EventHubsOnEmulator(
        {"systems.eh.factory": "eventhub", "systems.eh.connection.string": emulator.connection_string()},
        systems=EventHubSystemFactory(),
        system_name="eh",
        creates_streams=False,
        emulator=emulator,
    )


def kinesis_backend(kinesalite: Any, state_dir: Path) -> FactoryBackend:
    """The ``kinesis`` system on a kinesalite of its own (the contract needs a system holding no streams); the
    spool under the test's directory. Streams get 2 shards, so a partition (virtual task) may span two."""
    from weirflow_kinesis.factory import KinesisSystemFactory

    return FactoryBackend(
        {**kinesalite.config("kin"), "systems.kin.shards": 2, "job.state.dir": str(state_dir)},
        systems=KinesisSystemFactory(),
        system_name="kin",
    )
