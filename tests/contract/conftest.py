"""Backends under contract. Each fixture is parametrized by backend name (`BACKENDS`); each ``build_*``
function has one branch per backend, and the tests themselves never mention one.

``location`` says where one test's state lives: a directory for ``local``; for ``azure`` a job name and the
storage connection string (``<job>|<connection string>``), so that a spawned subprocess can reach the same
job. Blob leases last at least 15 s, so the Azure backend runs with 15-second leases (`lease_ms`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from weirflow.interfaces.checkpoint import CheckpointManager
from weirflow.interfaces.coordination import CoordinationUtils
from weirflow.interfaces.metadata import MetadataStore
from weirflow.interfaces.system import StreamSpec, SystemAdmin, SystemConsumer, SystemProducer

BACKENDS = ["local", "azure"]
LEASE_MS = 600
AZURE_LEASE_MS = 15_000


def _azure_config(location: str, **extra: object):
    from weirflow.config.loader import Config

    job, connection_string = location.split("|", 1)
    return Config.from_dict({"job.name": job, "azure.storage.connection.string": connection_string, **extra})


def _azure_storage(location: str):
    from weirflow_azure.coordinator.storage import Storage

    return Storage.from_config(_azure_config(location))


def build_coordination(backend: str, location: str, owner: str, lease_ms: int = LEASE_MS) -> CoordinationUtils:
    if backend == "local":
        from weirflow.local.coordination import SqliteCoordinationUtils

        return SqliteCoordinationUtils(Path(location) / "job.db", owner, lease_ms)
    if backend == "azure":
        from weirflow_azure.coordinator.factories import AzureCoordinationUtils

        return AzureCoordinationUtils(_azure_storage(location), owner, max(lease_ms, AZURE_LEASE_MS))
    raise ValueError(backend)


def build_checkpoint_manager(backend: str, location: str) -> CheckpointManager:
    if backend == "local":
        from weirflow.local.checkpoint import SqliteCheckpointManager

        return SqliteCheckpointManager(Path(location) / "job.db")
    if backend == "azure":
        from weirflow_azure.checkpoint.table import TableCheckpointManager

        return TableCheckpointManager(_azure_storage(location))
    raise ValueError(backend)


def build_metadata_store(backend: str, location: str) -> MetadataStore:
    if backend == "local":
        from weirflow.local.metadata import SqliteMetadataStore

        return SqliteMetadataStore(Path(location) / "job.db")
    if backend == "azure":
        from weirflow_azure.coordinator.metadata import BlobMetadataStore

        return BlobMetadataStore(_azure_storage(location))
    raise ValueError(backend)


@dataclass
class SystemUnderTest:
    name: str
    admin: SystemAdmin
    consumer: SystemConsumer
    producer: SystemProducer
    # Makes a stream exist. The local system creates its own; event hubs are infrastructure, so the test
    # plays the part of Bicep and adds the hub to the emulator, then the admin checks it.
    declare: Callable[[str, int], None]
    creates_streams: bool = True


def build_system(backend: str, location: str, emulator: object | None = None) -> SystemUnderTest:
    """``location``: a directory (``local``) or the emulator's connection string (``eventhub``)."""
    if backend == "local":
        from weirflow.local.streams import (
            LocalSystemAdmin,
            LocalSystemConsumer,
            LocalSystemProducer,
            SqliteStreamStore,
        )

        path = Path(location) / "local.streams.db"
        admin = LocalSystemAdmin(SqliteStreamStore(path))
        return SystemUnderTest(
            "local",
            admin,
            LocalSystemConsumer(SqliteStreamStore(path)),
            LocalSystemProducer(SqliteStreamStore(path)),
            lambda stream, partitions: admin.create_stream(StreamSpec(stream, partitions)) and None,
        )
    if backend == "eventhub":
        from weirflow.config.loader import Config
        from weirflow_azure.eventhubs.factory import EventHubSystemFactory

        config = Config.from_dict(
            {"job.name": "contract", "systems.eh.factory": "eventhub", "systems.eh.connection.string": location}
        )
        factory = EventHubSystemFactory()
        admin = factory.get_admin("eh", config)

        def declare(stream: str, partitions: int) -> None:
            assert emulator is not None, "only the test's own process declares hubs"
            emulator.add_hub(stream, partitions)  # type: ignore[attr-defined]
            admin.create_stream(StreamSpec(stream, partitions))

        return SystemUnderTest(
            "eh", admin, factory.get_consumer("eh", config), factory.get_producer("eh", config), declare, False
        )
    raise ValueError(backend)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def location(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "azure":
        from tests.conftest import unique_job_name

        return f"{unique_job_name('contract')}|{request.getfixturevalue('azure_storage')}"
    return str(tmp_path)


@pytest.fixture
def coordination(backend: str, location: str) -> Iterator[Callable[[str], CoordinationUtils]]:
    """``coordination(owner)`` -> the primitives of one shared job for that owner."""
    opened: list[CoordinationUtils] = []

    def make(owner: str) -> CoordinationUtils:
        utils = build_coordination(backend, location, owner)
        opened.append(utils)
        return utils

    yield make
    for utils in opened:
        utils.close()


@pytest.fixture
def checkpoint_manager(backend: str, location: str) -> Iterator[CheckpointManager]:
    manager = build_checkpoint_manager(backend, location)
    manager.start()
    yield manager
    manager.stop()


@pytest.fixture
def metadata_store(backend: str, location: str) -> Iterator[MetadataStore]:
    store = build_metadata_store(backend, location)
    store.start()
    yield store
    store.stop()


SYSTEMS = ["local", "eventhub"]


@pytest.fixture(params=SYSTEMS)
def system_backend(request: pytest.FixtureRequest) -> str:
    """Systems under the system contract: the embedded log, and Event Hubs on the emulator."""
    return request.param


@pytest.fixture
def system_location(system_backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, object]:
    """(location for `build_system`, the emulator or None): spawned producers reach the same system."""
    if system_backend == "eventhub":
        emulator = request.getfixturevalue("eventhubs_emulator")({})
        return emulator.connection_string(), emulator
    return str(tmp_path), None


@pytest.fixture
def system(system_backend: str, system_location: tuple[str, object]) -> Iterator[SystemUnderTest]:
    sut = build_system(system_backend, *system_location)
    yield sut
    for client in (sut.producer, sut.consumer, sut.admin):
        client.close()


@pytest.fixture
def lease_ms(backend: str) -> int:
    return AZURE_LEASE_MS if backend == "azure" else LEASE_MS
