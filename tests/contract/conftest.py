"""Backends under contract. Each fixture is parametrized by backend name; adding the Azure suite means adding
``"azure"`` to `BACKENDS` and one branch to each ``build_*`` function (the tests themselves never change)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from weirflow.interfaces.checkpoint import CheckpointManager
from weirflow.interfaces.coordination import CoordinationUtils
from weirflow.interfaces.metadata import MetadataStore
from weirflow.interfaces.system import SystemAdmin, SystemConsumer, SystemProducer

BACKENDS = ["local"]
LEASE_MS = 600


def build_coordination(backend: str, location: str, owner: str, lease_ms: int = LEASE_MS) -> CoordinationUtils:
    if backend == "local":
        from weirflow.local.coordination import SqliteCoordinationUtils

        return SqliteCoordinationUtils(Path(location) / "job.db", owner, lease_ms)
    raise ValueError(backend)


def build_checkpoint_manager(backend: str, location: str) -> CheckpointManager:
    if backend == "local":
        from weirflow.local.checkpoint import SqliteCheckpointManager

        return SqliteCheckpointManager(Path(location) / "job.db")
    raise ValueError(backend)


def build_metadata_store(backend: str, location: str) -> MetadataStore:
    if backend == "local":
        from weirflow.local.metadata import SqliteMetadataStore

        return SqliteMetadataStore(Path(location) / "job.db")
    raise ValueError(backend)


@dataclass
class SystemUnderTest:
    name: str
    admin: SystemAdmin
    consumer: SystemConsumer
    producer: SystemProducer


def build_system(backend: str, location: str) -> SystemUnderTest:
    if backend == "local":
        from weirflow.local.streams import (
            LocalSystemAdmin,
            LocalSystemConsumer,
            LocalSystemProducer,
            SqliteStreamStore,
        )

        path = Path(location) / "local.streams.db"
        return SystemUnderTest(
            "local",
            LocalSystemAdmin(SqliteStreamStore(path)),
            LocalSystemConsumer(SqliteStreamStore(path)),
            LocalSystemProducer(SqliteStreamStore(path)),
        )
    raise ValueError(backend)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def location(tmp_path: Path) -> str:
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


@pytest.fixture
def system(backend: str, location: str) -> Iterator[SystemUnderTest]:
    sut = build_system(backend, location)
    yield sut
    for client in (sut.producer, sut.consumer, sut.admin):
        client.close()


@pytest.fixture
def lease_ms() -> int:
    return LEASE_MS
