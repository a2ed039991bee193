"""Drain notifications (`weirflow.job.drain_notice`): serde, write / read / cleanup in the job's metadata store on
both backends (SQLite, and Blob Storage on Azurite), and the run-id check a processor applies."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import unique_job_name
from weirflow.base.errors import InvalidArgumentError, MalformedDocumentError
from weirflow.config.loader import Config
from weirflow.interfaces.metadata import MetadataStore
from weirflow.job.drain_notice import DEFAULT_RUN_ID, DrainMode, DrainNotification, DrainUtils, run_id_of
from weirflow.local.metadata import SqliteMetadataStore


@pytest.fixture(params=["local", "azure"])
def metadata(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MetadataStore]:
    if request.param == "local":
        store: MetadataStore = SqliteMetadataStore(tmp_path / "job.db")
    else:
        from weirflow_azure.coordinator.factories import AzureMetadataStoreFactory

        config = Config.from_dict(
            {
                "job.name": unique_job_name("drain"),
                "job.coordinator.factory": "azure",
                "azure.storage.connection.string": request.getfixturevalue("azure_storage"),
            }
        )
        store = AzureMetadataStoreFactory().get_metadata_store(config)
    store.start()
    yield store
    store.stop()


def test_a_notification_round_trips_through_json() -> None:
    notification = DrainNotification.create("run-7")
    assert notification.mode is DrainMode.DEFAULT and notification.created_ms > 0
    assert DrainNotification.from_json(notification.to_json()) == notification
    assert notification.to_json()["run-id"] == "run-7"


def test_a_malformed_document_is_refused_with_what_it_was() -> None:
    with pytest.raises(MalformedDocumentError, match="not a drain notification"):
        DrainNotification.from_json({"uuid": "x"})
    with pytest.raises(MalformedDocumentError, match="not a drain notification"):
        DrainNotification.from_json({"uuid": "x", "run-id": "r", "mode": "SOMETIMES"})
    with pytest.raises(InvalidArgumentError, match="run id"):
        DrainNotification.create("")


def test_write_read_and_clean_up(metadata: MetadataStore) -> None:
    utils = DrainUtils(metadata)
    assert utils.all() == [] and utils.for_run("run-1") is None
    first = utils.write("run-1")
    other = utils.write("run-2")
    again = utils.write("run-1")
    assert {n.uuid for n in utils.all()} == {first.uuid, other.uuid, again.uuid}
    assert utils.for_run("run-1") in (first, again)
    assert utils.for_run("run-2") == other

    assert utils.cleanup(other) == 1
    assert utils.for_run("run-2") is None
    assert utils.cleanup(run_id="run-1") == 2
    assert utils.all() == []
    # notifications live under their own prefix: the job model beside them is untouched
    metadata.put("job-model", {"version": 3})
    assert utils.all() == [] and metadata.get("job-model").value == {"version": 3}


def test_a_notification_for_another_run_is_not_this_runs(metadata: MetadataStore) -> None:
    utils = DrainUtils(metadata)
    utils.write("yesterday")
    assert utils.for_run("today") is None


def test_the_run_id_is_the_jobs_app_run_id_or_default() -> None:
    assert run_id_of(Config.from_dict({"job.name": "j", "app.run.id": "v42"})) == "v42"
    assert run_id_of(Config.from_dict({"job.name": "j"})) == DEFAULT_RUN_ID
