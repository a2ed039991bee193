"""`azure-table` checkpoints against Azure Storage: the factory path, control state too big for one property,
writes wider than one transaction, and the Event Hubs SDK layout read back field by field."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from azure.data.tables import TableServiceClient
from azure.storage.blob import BlobServiceClient

from tests.conftest import unique_job_name
from weirflow.config.loader import Config
from weirflow.interfaces.checkpoint import Checkpoint
from weirflow.interfaces.plugins import checkpoint_factory
from weirflow.interfaces.system import SystemStreamPartition
from weirflow_azure.checkpoint.table import MAX_BATCH, TableCheckpointManager, batches

pytestmark = pytest.mark.integration

NAMESPACE = "weirflow-test.servicebus.windows.net"
EH_CONNECTION = f"Endpoint=sb://{NAMESPACE}/;SharedAccessKeyName=listen;SharedAccessKey=c2VjcmV0"


def make_config(connection_string: str, **extra: object) -> Config:
    return Config.from_dict(
        {
            "job.name": unique_job_name("ckpt"),
            "task.checkpoint.factory": "azure-table",
            "azure.storage.connection.string": connection_string,
            "systems.eh.factory": "eventhub",
            "systems.eh.connection.string": EH_CONNECTION,
            "systems.eh.consumer.group": "analytics",
            **extra,
        }
    )


@pytest.fixture
def config(azure_storage: str) -> Config:
    return make_config(azure_storage)


@contextmanager
def opened(config: Config) -> Iterator[TableCheckpointManager]:
    """The job's checkpoint manager through the configured factory, started, stopped after."""
    manager = checkpoint_factory(config).get_checkpoint_manager(config)
    assert isinstance(manager, TableCheckpointManager)
    manager.start()
    try:
        yield manager
    finally:
        manager.stop()


@pytest.fixture
def manager(config: Config) -> Iterator[TableCheckpointManager]:
    with opened(config) as manager:
        yield manager


def write_one(manager: TableCheckpointManager) -> SystemStreamPartition:
    """A checkpoint of task main-0 at offset 42 of eh.clicks.0, whose last event has offset 4096."""
    eh0 = SystemStreamPartition("eh", "clicks", 0)
    manager.write_checkpoint("main-0", Checkpoint({eh0: "42"}, positions={eh0: {"offset": "4096"}}))
    return eh0


def table_rows(connection_string: str, table: str, partition_key: str) -> list[dict]:
    with TableServiceClient.from_connection_string(connection_string) as service:
        client = service.get_table_client(table)
        rows = client.query_entities("PartitionKey eq @pk", parameters={"pk": partition_key})
        return sorted((dict(r) for r in rows), key=lambda r: r["RowKey"])


def test_round_trip_through_the_configured_factory_with_control_larger_than_one_property(manager) -> None:
    ssp = SystemStreamPartition("local", "views", 3)
    control = {"watermarks": {f"producer-{i}": 1_700_000_000_000 + i for i in range(4000)}, "finished": True}
    assert len(str(control)) > 64_000
    manager.write_checkpoint("stage/with#odd?chars-0", Checkpoint({ssp: "1042"}, control))
    checkpoint = manager.read_last_checkpoint("stage/with#odd?chars-0")
    assert checkpoint.offsets == {ssp: "1042"}
    assert checkpoint.control == control


def test_a_write_wider_than_one_transaction_is_split_and_read_back_whole(manager, azure_storage) -> None:
    offsets = {SystemStreamPartition("local", "wide", p): str(p * 11) for p in range(250)}
    manager.write_checkpoint("main-0", Checkpoint(offsets, {"v": 1}))
    assert manager.read_last_checkpoint("main-0") == Checkpoint(offsets, {"v": 1})
    rows = table_rows(azure_storage, manager.table_name, "main-0")
    assert len(rows) == 252  # 250 offsets, the control row and the fence row
    control = next(r for r in rows if r["RowKey"] == "~control")
    assert control["control"] == '{"v": 1}'
    assert next(r for r in rows if r["RowKey"] == "~fence")["epoch"] == "0"
    # Table Storage refuses transactions over 100 rows (Azurite too), so the write above had to be split (the
    # first transaction holds the fence row and 99 rows):
    groups = list(batches({"PartitionKey": "main-0", "RowKey": str(i)} for i in range(251)))
    assert [len(g) for g in groups] == [MAX_BATCH, MAX_BATCH, 51]


def test_batches_never_mix_partition_keys() -> None:
    rows = [{"PartitionKey": pk, "RowKey": str(i)} for pk in ("a", "b") for i in range(150)]
    groups = list(batches(rows))
    assert [len(g) for g in groups] == [100, 50, 100, 50]
    assert all(len({r["PartitionKey"] for r in g}) == 1 for g in groups)


def _container(connection_string: str, config: Config):
    from weirflow_azure.coordinator.storage import StorageSettings

    name = config.get("task.checkpoint.azure.eventhubs.container") or StorageSettings.from_config(config).container
    return BlobServiceClient.from_connection_string(connection_string).get_container_client(name)


def checkpoint_blobs(connection_string: str, config: Config) -> dict[str, dict[str, str]]:
    """Every blob of the SDK layout, as `BlobCheckpointStore.list_checkpoints` reads them: name -> metadata."""
    with _container(connection_string, config) as container:
        if not container.exists():
            return {}
        listed = container.list_blobs(include=["metadata"])
        return {b.name: dict(b.metadata) for b in listed if "/checkpoint/" in b.name}


def blob_etags(connection_string: str, config: Config) -> dict[str, str]:
    with _container(connection_string, config) as container:
        return {b.name: b.etag for b in container.list_blobs() if "/checkpoint/" in b.name}


def test_event_hubs_positions_are_also_written_in_the_sdk_layout(manager, config, azure_storage) -> None:
    eh0, eh1, eh2 = (SystemStreamPartition("eh", "clicks", p) for p in range(3))
    local = SystemStreamPartition("local", "views", 0)
    manager.write_checkpoint(
        "main-0",
        Checkpoint(
            {eh0: "42", eh1: "7", eh2: "5", local: "9"},
            positions={eh0: {"offset": "4096", "sequence_number": "41"}, eh1: {"offset": "512"}},
        ),
    )
    rows = table_rows(azure_storage, manager.eventhubs_table_name, f"{NAMESPACE} clicks analytics Checkpoint")
    assert [(r["RowKey"], r["offset"], r["sequencenumber"]) for r in rows] == [
        ("0", "4096", "41"),
        ("1", "512", "6"),
    ]
    assert all(isinstance(r["offset"], str) and isinstance(r["sequencenumber"], str) for r in rows)
    # eh2's event offset is unknown: no row, rather than one that would send SDK readers to the start.
    assert len(manager.read_sdk_rows()) == 2
    # weirflow's own view is untouched by the rows beside it
    assert manager.read_last_checkpoint("main-0").offsets == {eh0: "42", eh1: "7", eh2: "5", local: "9"}
    assert set(manager.read_all()) == {"main-0"}

    # and as blobs, named and stamped exactly as the SDKs' BlobCheckpointStore writes them (the default: both)
    blobs = checkpoint_blobs(azure_storage, config)
    assert blobs == {
        f"{NAMESPACE}/clicks/analytics/checkpoint/0": {"offset": "4096", "sequencenumber": "41"},
        f"{NAMESPACE}/clicks/analytics/checkpoint/1": {"offset": "512", "sequencenumber": "6"},
    }
    etag_of_1 = blob_etags(azure_storage, config)[f"{NAMESPACE}/clicks/analytics/checkpoint/1"]

    manager.write_checkpoint(
        "main-0", Checkpoint({eh0: "50", eh1: "7"}, positions={eh0: {"offset": "5000"}, eh1: {"offset": "512"}})
    )
    rows = table_rows(azure_storage, manager.eventhubs_table_name, f"{NAMESPACE} clicks analytics Checkpoint")
    assert rows[0]["offset"] == "5000" and rows[0]["sequencenumber"] == "49"
    assert checkpoint_blobs(azure_storage, config)[f"{NAMESPACE}/clicks/analytics/checkpoint/0"] == {
        "offset": "5000",
        "sequencenumber": "49",
    }
    # a partition whose position did not move is not written again
    assert blob_etags(azure_storage, config)[f"{NAMESPACE}/clicks/analytics/checkpoint/1"] == etag_of_1


def test_the_sdk_layout_can_be_switched_off(azure_storage) -> None:
    config = make_config(azure_storage, **{"task.checkpoint.azure.eventhubs.layout": "none"})
    with opened(config) as manager:
        eh0 = write_one(manager)
        assert manager.read_sdk_rows() == []
        assert checkpoint_blobs(azure_storage, config) == {}
        assert manager.read_last_checkpoint("main-0").offsets == {eh0: "42"}


def test_the_blob_layout_alone_writes_blobs_in_the_configured_container_and_no_rows(azure_storage) -> None:
    config = make_config(
        azure_storage,
        **{
            "task.checkpoint.azure.eventhubs.layout": "blob",
            "task.checkpoint.azure.eventhubs.container": "ckpts-b",
        },
    )
    with opened(config) as manager:
        write_one(manager)
        assert manager.read_sdk_rows() == []
        assert checkpoint_blobs(azure_storage, config) == {
            f"{NAMESPACE}/clicks/analytics/checkpoint/0": {"offset": "4096", "sequencenumber": "41"}
        }
