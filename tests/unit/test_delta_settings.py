"""How a ``delta`` system is configured and signs in (no storage is reached here): paths, the storage options
delta-rs is handed for a connection string or an Entra ID token and when that token is replaced, config errors
naming the key and the file, and storage failures told apart (docs/delta.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from azure.core.credentials import AccessToken
from azure.core.exceptions import ClientAuthenticationError
from azure.identity import DefaultAzureCredential
from deltalake import DeltaTable
from deltalake.exceptions import SchemaMismatchError, TableNotFoundError

from tests.support.azurite import free_port
from weirflow.base.errors import ConfigError, InvalidArgumentError, ServiceUnavailableError, StreamNotFoundError
from weirflow.config.loader import Config
from weirflow_delta.azure_auth import STORAGE_SCOPE, EntraIdAccess, LocalAccess, SharedKeyAccess
from weirflow_delta.errors import (
    DeltaAccessError,
    DeltaSchemaError,
    DeltaTableError,
    classify,
    delta_errors,
    is_transient,
    short,
)
from weirflow_delta.settings import DeltaSettings

AZURITE = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5PT0=;"
    "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;TableEndpoint=http://127.0.0.1:10002/devstoreaccount1;"
)


def settings(path: str = "lake", tmp: Path | None = None, **keys: Any) -> DeltaSettings:
    values = {"job.name": "j", "systems.lake.factory": "delta", "systems.lake.path": path}
    values.update({f"systems.lake.{k}": v for k, v in keys.items() if not k.startswith("streams.")})
    values.update({k: v for k, v in keys.items() if k.startswith("streams.")})
    config = Config.from_dict(values, source="job.yaml", base_dir=tmp or Path("/jobs/one"))
    return DeltaSettings.from_config("lake", config)


def test_a_local_path_is_resolved_against_the_config_file_and_joined_with_the_stream(tmp_path: Path) -> None:
    local = settings("tables", tmp_path)
    assert isinstance(local.access, LocalAccess) and local.storage_options() == {}
    assert local.root.table_uri("page-views.dlq") == f"{tmp_path}/tables/page-views.dlq"
    for bad in ("", "a/b", "..", "."):
        with pytest.raises(InvalidArgumentError, match="physical name"):
            local.root.table_uri(bad)


def test_paths_and_ids_that_cannot_work_are_config_errors_naming_the_key_and_file(monkeypatch: Any) -> None:
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    cases = [
        ({"path": ""}, "systems.lake.path", "needs a path"),
        ({"path": "s3://bucket/lake"}, "systems.lake.path", "abfss://"),
        ({"path": "abfss://lake/tables"}, "systems.lake.path", "names no container and account"),
        ({"path": "az://lake/t"}, "systems.lake.storage.connection.string", "AZURE_STORAGE_CONNECTION_STRING"),
        ({"record.id.field": " "}, "systems.lake.record.id.field", "must name a column"),
        (
            {"path": "az://lake/t", "storage.account": "https://127.0.0.1:10000/"},
            "systems.lake.storage.account",
            "names no account",
        ),
        ({"retry.deadline.ms": 10, "request.timeout.ms": 1000}, "systems.lake.retry.deadline.ms", "shorter"),
        (
            {"path": "abfss://c@other.dfs.core.windows.net/t", "storage.connection.string": AZURITE},
            "systems.lake.path",
            "'other' but the system's credentials are account 'devstoreaccount1'",
        ),
    ]
    for keys, key, said in cases:
        path = str(keys.pop("path", "lake"))
        with pytest.raises(ConfigError, match=rf"key '{key}' in job.yaml: .*{said}"):
            settings(path, **keys)


def test_a_system_s_key_on_another_system_is_refused() -> None:
    with pytest.raises(ConfigError, match="'storage.account' is a key of the delta system plugin"):
        Config.from_dict({"job.name": "j", "systems.kin.factory": "kinesis", "systems.kin.storage.account": "a"})


def test_a_connection_string_gives_the_account_its_key_and_its_blob_endpoint() -> None:
    azurite = settings("az://lake/tables", **{"storage.connection.string": AZURITE})
    assert isinstance(azurite.access, SharedKeyAccess)
    assert azurite.storage_options() == {
        "account_name": "devstoreaccount1",
        "account_key": "a2V5PT0=",  # values keep their '='
        "endpoint": "http://127.0.0.1:10000/devstoreaccount1",  # path-style: how delta-rs reaches the emulator
        "allow_http": "true",
        "timeout": "30000ms",
        "max_retries": "0",  # one retry policy, the plugin's
    }
    real = settings(
        "abfss://lake@prod.dfs.core.windows.net/t",
        **{
            "storage.connection.string": (
                "AccountName=prod;SharedAccessSignature=?sv=1&sig=x%3D;EndpointSuffix=x.cn"
            )
        },
    )
    options = real.storage_options()
    assert (options["endpoint"], options["sas_token"]) == ("https://prod.blob.x.cn", "sv=1&sig=x%3D")
    assert "allow_http" not in options and "account_key" not in options
    emulator = settings("az://lake/t", **{"storage.connection.string": "UseDevelopmentStorage=true"})
    assert emulator.storage_options()["use_emulator"] == "true"


def test_the_environment_s_connection_string_is_the_last_resort(monkeypatch: Any) -> None:
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", AZURITE)
    assert settings("az://lake/t").storage_options()["account_name"] == "devstoreaccount1"


def test_an_account_without_a_connection_string_signs_in_with_entra_id() -> None:
    for account, endpoint in [
        ("prod", "https://prod.blob.core.windows.net"),
        ("https://prod.dfs.core.windows.net", "https://prod.blob.core.windows.net"),
        ("https://127.0.0.1:10000/devstoreaccount1", "https://127.0.0.1:10000/devstoreaccount1"),
    ]:
        access = settings("az://lake/t", **{"storage.account": account}).access
        assert isinstance(access, EntraIdAccess) and access.endpoint == endpoint
    named = settings(
        "abfss://lake@prod.dfs.core.chinacloudapi.cn/t", **{"storage.endpoint.suffix": "core.chinacloudapi.cn"}
    )
    assert isinstance(named.access, EntraIdAccess), "an abfss path names its account"
    assert named.access.endpoint == "https://prod.blob.core.chinacloudapi.cn"
    from weirflow_delta.azure_auth import default_credential

    assert isinstance(default_credential(), DefaultAzureCredential)


class Tokens:
    """An azure-identity credential's interface, handing out numbered tokens valid ``lifetime`` seconds from
    the clock's time."""

    def __init__(self, clock: list[float], lifetime: float = 3600, fail: Exception | None = None) -> None:
        self.clock, self.lifetime, self.fail = clock, lifetime, fail
        self.calls: list[tuple[str, ...]] = []

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        self.calls.append(scopes)
        if self.fail is not None:
            raise self.fail
        return AccessToken(f"token-{len(self.calls)}", int(self.clock[0] + self.lifetime))


def test_a_token_is_replaced_once_it_expires_within_the_margin() -> None:
    clock = [1_000_000.0]
    tokens = Tokens(clock)
    access = EntraIdAccess(
        "prod", "https://prod.blob.core.windows.net", tokens, margin_s=300, clock=lambda: clock[0]
    )
    assert access.options() == {
        "account_name": "prod",
        "bearer_token": "token-1",
        "endpoint": "https://prod.blob.core.windows.net",
    }
    clock[0] += 3300 - 1  # 301 s left
    assert access.options()["bearer_token"] == "token-1"
    clock[0] += 2  # 299 s left
    assert access.options()["bearer_token"] == "token-2"
    assert tokens.calls == [(STORAGE_SCOPE,), (STORAGE_SCOPE,)]
    refused = EntraIdAccess("prod", "x", Tokens(clock, fail=ClientAuthenticationError("no identity")))
    with pytest.raises(DeltaAccessError, match="no Entra ID identity could sign in to storage account 'prod'"):
        refused.options()


# --- storage failures ------------------------------------------------------------------------------------------
# object_store's reports as delta-rs raises them (an OSError; nested causes on lines of their own, in colour)
REPLY = (
    "Kernel error -> Generic MicrosoftAzure error\n"
    "  \x1b[31m\u21b3\x1b[0m Error performing GET {url} - Server returned non-2xx status code\n"
    "   \x1b[31m\u21b3\x1b[0m {status}\n"
    ' <?xml version="1.0"?><Error><Code>{code}</Code></Error>'
)


def test_storage_failures_are_told_apart_by_the_status_the_service_answered() -> None:
    url = "http://127.0.0.1:1/devstoreaccount1/lake/t/_delta_log/_last_checkpoint"
    for status, code, target in [
        ("503 Service Unavailable", "ServerBusy", ServiceUnavailableError),
        ("429 Too Many Requests", "TooManyRequests", ServiceUnavailableError),
        ("403 Forbidden", "AuthorizationFailure", DeltaAccessError),
        ("404 Not Found", "ContainerNotFound", DeltaTableError),
    ]:
        error = OSError(REPLY.format(url=url, status=status, code=code))
        assert classify(error) is target, status
        assert is_transient(error) is (target is ServiceUnavailableError)
        assert short(error) == f"HTTP {status[:3]} {code} (OSError)"
    assert classify(SchemaMismatchError("x")) is DeltaSchemaError
    assert classify(TableNotFoundError("x")) is StreamNotFoundError
    assert classify(FileNotFoundError("x")) is DeltaTableError and not is_transient(FileNotFoundError("x"))
    assert classify(ValueError("ours")) is None


def test_storage_that_does_not_answer_is_transient_and_said_in_one_line() -> None:
    port = free_port()  # nothing listens there
    options = {"account_name": "a", "account_key": "a2V5", "endpoint": f"http://127.0.0.1:{port}/a"}
    with pytest.raises(OSError) as raised:
        DeltaTable("az://lake/t", storage_options={**options, "allow_http": "true", "max_retries": "0"})
    assert is_transient(raised.value) and classify(raised.value) is ServiceUnavailableError
    assert "\n" not in short(raised.value) and "Connection refused" in short(raised.value)
    with pytest.raises(
        ServiceUnavailableError, match=r"commit to Delta table 't' at az://lake/t: storage unavailable"
    ):
        with delta_errors("commit to", "Delta table 't'", "az://lake/t"):
            raise raised.value
