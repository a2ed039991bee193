"""Azure suite plumbing: resource names, key escaping, config errors, and the retry policy (on a real,
closed port: no SDK behaviour is faked)."""

from __future__ import annotations

import pytest
from azure.core.exceptions import HttpResponseError, ServiceRequestError

from tests.support.azurite import free_port
from weirflow.base.errors import ConfigError, ServiceUnavailableError
from weirflow.config.loader import Config
from weirflow.interfaces.plugins import metadata_store_factory
from weirflow_azure.coordinator.errors import AzureStorageError
from weirflow_azure.coordinator.factories import AzureJobCoordinatorFactory
from weirflow_azure.coordinator.metadata import BlobMetadataStore
from weirflow_azure.coordinator.storage import (
    Storage,
    StorageSettings,
    default_container_name,
    default_table_prefix,
    escape_key,
    is_transient,
    unescape_key,
)
from weirflow_azure.eventhubs.checkpoint_layout import namespace_of_connection_string

ACCOUNT = "DefaultEndpointsProtocol=http;AccountName=a;AccountKey=a2V5;"


def config(**values: object) -> Config:
    return Config.from_dict({"job.name": "page-views", **values}, source="job.yaml")


def test_default_names_are_valid_and_tell_jobs_apart() -> None:
    container = default_container_name("Page_Views!", "2")
    assert container.startswith("weirflow-page-views-2-") and len(container) <= 63
    assert default_container_name("a-b", "c") != default_container_name("a", "b-c")
    prefix = default_table_prefix("page-views", "1")
    assert prefix.startswith("wfpageviews1") and prefix.isalnum()
    assert default_table_prefix("ab", "1") != default_table_prefix("a", "b1")
    long = default_container_name("x" * 200, "1")
    assert len(long) <= 63 and "--" not in long
    assert len(default_table_prefix("y" * 200, "1") + "checkpoints") <= 63


def test_keys_with_forbidden_characters_round_trip() -> None:
    for key in ("main-0", "a/b#c?d\\e%f", "tab\tnew\nline"):
        escaped = escape_key(key)
        assert not any(ch in escaped for ch in "/#?\\\t\n")
        assert unescape_key(escaped) == key


def test_missing_storage_config_names_the_keys_and_the_environment_variable(monkeypatch) -> None:
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    with pytest.raises(ConfigError) as err:
        StorageSettings.from_config(config())
    message = str(err.value)
    assert "azure.storage.connection.string" in message and "job.yaml" in message
    assert "AZURE_STORAGE_CONNECTION_STRING" in message and "azure.storage.account" in message


def test_the_environment_connection_string_is_the_fallback(monkeypatch) -> None:
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", ACCOUNT)
    assert StorageSettings.from_config(config()).connection_string == ACCOUNT


def test_an_account_is_a_name_or_an_account_url() -> None:
    by_name = StorageSettings.from_config(config(**{"azure.storage.account": "acme"}))
    assert (by_name.account, by_name.endpoint_suffix) == ("acme", "core.windows.net")
    assert by_name.connection_string is None
    url = "https://acme.blob.core.chinacloudapi.cn/"
    by_url = StorageSettings.from_config(config(**{"azure.storage.account": url}))
    assert (by_url.account, by_url.endpoint_suffix) == ("acme", "core.chinacloudapi.cn")
    with pytest.raises(ConfigError, match="azure.storage.account"):
        StorageSettings.from_config(config(**{"azure.storage.account": "https://example.com"}))


def test_bad_names_and_lease_durations_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="azure.storage.container"):
        StorageSettings.from_config(
            config(**{"azure.storage.connection.string": ACCOUNT, "azure.storage.container": "Bad_Name"})
        )
    with pytest.raises(ConfigError, match="task.checkpoint.azure.eventhubs.container.*'Ckpts' is not a valid"):
        from weirflow_azure.eventhubs.checkpoint_blobs import open_blob_checkpoints

        open_blob_checkpoints(
            config(
                **{
                    "azure.storage.connection.string": ACCOUNT,
                    "task.checkpoint.azure.eventhubs.container": "Ckpts",
                }
            )
        )
    with pytest.raises(ConfigError, match="azure.storage.table.prefix"):
        StorageSettings.from_config(
            config(**{"azure.storage.connection.string": ACCOUNT, "azure.storage.table.prefix": "1abc"})
        )
    with pytest.raises(ConfigError, match="job.coordinator.lease.duration.ms.*15000 and 60000"):
        AzureJobCoordinatorFactory().get_coordination_utils(
            config(**{"azure.storage.connection.string": ACCOUNT, "job.coordinator.lease.duration.ms": 6000}), "p1"
        )


def test_the_metadata_store_follows_the_coordinator_unless_set() -> None:
    azure = config(**{"job.coordinator.factory": "azure", "azure.storage.connection.string": ACCOUNT})
    assert type(metadata_store_factory(azure)).__name__ == "AzureMetadataStoreFactory"
    assert isinstance(metadata_store_factory(azure).get_metadata_store(azure), BlobMetadataStore)
    pinned = config(**{"job.coordinator.factory": "azure", "metadata.store.factory": "local"})
    assert type(metadata_store_factory(pinned)).__name__ == "LocalMetadataStoreFactory"


def test_transient_errors_are_told_apart_from_permanent_ones() -> None:
    assert is_transient(ServiceRequestError("refused"))
    for status in (408, 429, 500, 503):
        error = HttpResponseError("x")
        error.status_code = status
        assert is_transient(error)
    for status in (400, 403, 404, 409, 412):
        error = HttpResponseError("x")
        error.status_code = status
        assert not is_transient(error)


def unreachable(**extra: object) -> Storage:
    port = free_port()  # nothing listens there
    connection = f"{ACCOUNT}BlobEndpoint=http://127.0.0.1:{port}/a;TableEndpoint=http://127.0.0.1:{port}/a;"
    return Storage.from_config(
        config(
            **{
                "azure.storage.connection.string": connection,
                "azure.retry.attempts": 3,
                "azure.retry.initial.backoff.ms": 10,
                **extra,
            }
        )
    )


def test_unreachable_storage_fails_after_bounded_retries_naming_the_endpoint(caplog) -> None:
    storage = unreachable()
    calls = []

    def operation() -> None:
        calls.append(1)
        storage.blob_service.get_container_client("c0c").get_container_properties()

    with pytest.raises(ServiceUnavailableError) as err:
        storage.call("read", "c0c", storage.blob_endpoint, operation)
    assert len(calls) == 3
    assert storage.blob_endpoint in str(err.value) and "after 3 attempts" in str(err.value)
    assert sum("retrying" in r.message for r in caplog.records) == 2


def test_a_call_to_a_blackholed_endpoint_gives_up_within_its_deadline_naming_the_endpoint(measure) -> None:
    """The endpoint accepts connections and never answers (a network blackhole): the call stops retrying
    when another attempt could overrun ``azure.retry.deadline.ms``, instead of running its 5 attempts."""
    import socket
    import time

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        port = server.getsockname()[1]
        connection = f"{ACCOUNT}BlobEndpoint=http://127.0.0.1:{port}/a;TableEndpoint=http://127.0.0.1:{port}/a;"
        storage = Storage.from_config(
            config(
                **{
                    "azure.storage.connection.string": connection,
                    "azure.retry.initial.backoff.ms": 10,
                    "azure.storage.request.timeout.ms": 500,
                    "azure.retry.deadline.ms": 1200,
                }
            )
        )
        calls = []

        def operation() -> None:
            calls.append(1)
            storage.blob_service.get_container_client("c0c").get_container_properties()

        started = time.monotonic()
        with pytest.raises(ServiceUnavailableError) as err:
            storage.call("renew lease on", "c0c/leases/leader", storage.blob_endpoint, operation)
        took = time.monotonic() - started
    assert storage.blob_endpoint in str(err.value) and "1.2 s at most" in str(err.value)
    assert len(calls) == 2, f"{len(calls)} attempts: each takes the 0.5 s request timeout, the third would overrun"
    measure(f"blackholed call gave up after {len(calls)} attempts in {took:.2f} s (deadline 1.2 s)")


def test_the_retry_deadline_must_fit_the_request_timeout_and_the_renew_margin() -> None:
    with pytest.raises(ConfigError, match="azure.retry.deadline.ms"):
        StorageSettings.from_config(
            config(
                **{
                    "azure.storage.account": "acme",
                    "azure.retry.deadline.ms": 2000,
                    "azure.storage.request.timeout.ms": 3000,
                }
            )
        )
    with pytest.raises(ConfigError, match="job.coordinator.lease.renew.margin.ms"):
        AzureJobCoordinatorFactory().get_coordination_utils(
            config(
                **{
                    "azure.storage.account": "acme",
                    "azure.retry.deadline.ms": 6000,
                    "job.coordinator.lease.renew.margin.ms": 5000,
                }
            ),
            "p1",
        )


def test_permanent_errors_surface_at_once_naming_the_resource() -> None:
    storage = unreachable()
    calls = []

    def operation() -> None:
        calls.append(1)
        error = HttpResponseError("forbidden")
        error.status_code = 403
        raise error

    with pytest.raises(AzureStorageError, match="write metadata/job-model .* HTTP 403"):
        storage.call("write", "metadata/job-model", storage.blob_endpoint, operation)
    assert len(calls) == 1


def test_event_hubs_namespace_comes_from_the_connection_string_as_the_sdk_reads_it() -> None:
    assert namespace_of_connection_string("Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k") == (
        "ns.servicebus.windows.net"
    )
    assert namespace_of_connection_string("Endpoint=sb://localhost:5672;SharedAccessKeyName=k") == "localhost:5672"
    with pytest.raises(ValueError, match="Endpoint"):
        namespace_of_connection_string("SharedAccessKeyName=k")
