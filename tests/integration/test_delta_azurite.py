"""The ``delta`` system on Azure Storage (Azurite, or the account of ``WEIRFLOW_TEST_AZURE_STORAGE``): commits
and marks, a conflict refused, rows read back by `rows_since`, by the consumer and by deltalake itself with
pandas; Entra ID bearer tokens against an Azurite that checks them (HTTPS, ``--oauth basic``); storage that is
down, reported naming the table's location (docs/delta.md)."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from azure.core.credentials import AccessToken
from azure.storage.blob import BlobServiceClient
from deltalake import DeltaTable, QueryBuilder

from tests.support.azurite import ACCOUNT, ACCOUNT_KEY, Azurite
from weirflow.base.errors import ServiceUnavailableError
from weirflow.config.loader import Config
from weirflow.interfaces.system import SystemStreamPartition
from weirflow.interfaces.table import TableConflictError
from weirflow_delta.azure_auth import EntraIdAccess
from weirflow_delta.errors import DeltaAccessError
from weirflow_delta.factory import DeltaSystemFactory
from weirflow_delta.settings import DeltaSettings
from weirflow_delta.tables import DeltaTables
from weirflow_delta.writer import DeltaTableWriter

pytestmark = pytest.mark.integration


def container(connection_string: str, **client: Any) -> str:
    """A new container of the account (weirflow does not create containers)."""
    name = f"lake-{uuid.uuid4().hex[:12]}"
    BlobServiceClient.from_connection_string(connection_string, **client).create_container(name)
    return name


def lake_config(path: str, **keys: Any) -> Config:
    return Config.from_dict(
        {"job.name": "lakejob", "systems.lake.factory": "delta", "systems.lake.path": path, **keys}
    )


def views(*pages: str, first: int = 0) -> pa.Table:
    return pa.table(
        {
            "page": list(pages),
            "views": pa.array(range(first, first + len(pages)), pa.int64()),
            "weirflow_id": [f"id-{first + i}" for i in range(len(pages))],
        }
    )


def read_back(writer: DeltaTableWriter, table: str) -> pd.DataFrame:
    """The table as deltalake reads it (its query engine; `to_pandas` lists files in Python, which in deltalake
    1.6 leaves the interpreter aborting at exit), as pandas."""
    loaded = DeltaTable(writer.tables.uri(table), storage_options=writer.tables.settings.storage_options())
    rows = pa.table(QueryBuilder().register("t", loaded).execute("select * from t order by views").read_all())
    return rows.to_pandas()


@pytest.mark.parametrize("form", ["az", "abfss"])
def test_commits_conflicts_and_reading_back_on_azure_storage(azure_storage: str, form: str) -> None:
    name = container(azure_storage)
    path = f"az://{name}/tables" if form == "az" else f"abfss://{name}@{ACCOUNT}.dfs.core.windows.net/tables"
    if form == "abfss" and f"AccountName={ACCOUNT};" not in azure_storage:
        pytest.skip("the abfss form names Azurite's account")
    config = lake_config(path, **{"systems.lake.storage.connection.string": azure_storage})
    factory = DeltaSystemFactory()
    first, second = factory.get_table_writer("lake", config), factory.get_table_writer("lake", config)
    assert isinstance(first, DeltaTableWriter) and isinstance(second, DeltaTableWriter)

    base = first.commit("views", views("/a", "/b"), {"s0/0": 1, "s0/1": 1}, -1)
    assert dict(first.snapshot("views", ["s0/0", "s0/1"]).marks) == {"s0/0": 1, "s0/1": 1}
    winner = first.commit("views", views("/c", first=2), {"s0/0": 2}, base)
    with pytest.raises(TableConflictError, match=rf"'views' at \w+://{name}.*set mark 's0/0'"):
        second.commit("views", views("/x", first=9), {"s0/0": 2}, base)
    other = second.commit("views", views("/d", first=3), {"s0/1": 2}, base)
    assert other == winner + 1, "another task's mark went through on top of the winner"

    expected = pd.DataFrame(
        {"page": ["/a", "/b", "/c", "/d"], "views": [0, 1, 2, 3], "weirflow_id": [f"id-{i}" for i in range(4)]}
    )
    pd.testing.assert_frame_equal(read_back(first, "views"), expected, check_dtype=False)
    since = [t.to_pylist() for t in first.rows_since("views", base)]
    assert since == [views("/c", first=2).to_pylist(), views("/d", first=3).to_pylist()]

    admin, consumer = factory.get_admin("lake", config), factory.get_consumer("lake", config)
    assert admin.list_streams() == {"views": 1}
    records = consumer.read(SystemStreamPartition("lake", "views", 0), "0:0", 100)
    assert [(json.loads(r.value)["page"], r.id) for r in records] == [
        ("/a", "id-0"),
        ("/b", "id-1"),
        ("/c", "id-2"),
        ("/d", "id-3"),
    ]


def test_storage_that_stays_down_is_reported_naming_the_table_location(own_azurite: Azurite) -> None:
    name = container(own_azurite.connection_string)
    config = lake_config(
        f"az://{name}/tables",
        **{
            "systems.lake.storage.connection.string": own_azurite.connection_string,
            "systems.lake.retry.attempts": 2,
            "systems.lake.request.timeout.ms": 1000,
            "systems.lake.retry.deadline.ms": 3000,
        },
    )
    writer = DeltaSystemFactory().get_table_writer("lake", config)
    assert writer is not None
    writer.commit("views", views("/a"), {"m": 1}, -1)
    own_azurite.stop()
    started = time.monotonic()
    with pytest.raises(
        ServiceUnavailableError, match=rf"commit to Delta table 'views' on az://{name}/tables/views"
    ):
        writer.commit("views", views("/b", first=1), {"m": 2}, 1)
    assert time.monotonic() - started < 30, "bounded by the system's retry settings"


# --- Entra ID ------------------------------------------------------------------------------------------------
def _certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA, and a certificate it signed for 127.0.0.1 (object_store's TLS refuses a self-signed CA as a
    server's certificate): the CA's file, the server's certificate and key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.UTC)

    def certificate(subject: str, key: Any, issuer: str, signer: Any, ca: bool) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            import ipaddress

            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
            ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = certificate("weirflow test CA", ca_key, "weirflow test CA", ca_key, True)
    server = certificate("127.0.0.1", server_key, "weirflow test CA", ca_key, False)
    paths = folder / "ca.pem", folder / "server.pem", folder / "server-key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        server_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return paths


def _jwt(expires_on: int) -> str:
    """An Entra ID access token for Azure Storage as Azurite's ``--oauth basic`` checks one: issuer, audience,
    lifetime (it does not check the signature)."""

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    claims = {
        "aud": "https://storage.azure.com",
        "iss": "https://sts.windows.net/00000000-0000-0000-0000-000000000000/",
        "iat": int(time.time()) - 60,
        "nbf": int(time.time()) - 60,
        "exp": expires_on,
        "oid": "00000000-0000-0000-0000-000000000001",
    }
    return f"{part({'alg': 'RS256', 'typ': 'JWT'})}.{part(claims)}.c2lnbmF0dXJl"


class IssuedTokens:
    """A credential (azure-identity's ``get_token``) handing out the tokens it is given, in order: what
    `DefaultAzureCredential` does with a real identity, without Entra ID."""

    def __init__(self, *lifetimes_s: int) -> None:
        self.tokens = [AccessToken(_jwt(int(time.time()) + s), int(time.time()) + s) for s in lifetimes_s]
        self.scopes: list[tuple[str, ...]] = []

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        self.scopes.append(scopes)
        return self.tokens[len(self.scopes) - 1]


@pytest.fixture
def oauth_azurite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Azurite]:
    """An Azurite serving HTTPS that checks bearer tokens, trusted by delta-rs (``SSL_CERT_FILE``)."""
    ca, cert, key = _certificates(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    azurite = Azurite(
        tmp_path / "azurite", extra_args=["--oauth", "basic", "--cert", str(cert), "--key", str(key)]
    )
    azurite.start()
    try:
        yield azurite
    finally:
        azurite.stop(timeout_s=0.5)  # its data is of no further use


def test_entra_id_tokens_reach_storage_and_are_refreshed_before_they_expire(
    oauth_azurite: Azurite, tmp_path: Path
) -> None:
    endpoint = f"https://127.0.0.1:{oauth_azurite.blob_port}/{ACCOUNT}"
    shared_key = (
        f"DefaultEndpointsProtocol=https;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};BlobEndpoint={endpoint};"
    )
    name = container(shared_key, connection_verify=str(tmp_path / "ca.pem"))
    config = lake_config(f"az://{name}/tables", **{"systems.lake.storage.account": endpoint})
    settings = DeltaSettings.from_config("lake", config)
    assert isinstance(settings.access, EntraIdAccess), "an account without a connection string signs in"
    assert (settings.access.account, settings.access.endpoint) == (ACCOUNT, endpoint)

    now = time.time()
    clock = [now]
    credential = IssuedTokens(120, 3600)
    access = EntraIdAccess(ACCOUNT, endpoint, credential, margin_s=60, clock=lambda: clock[0])
    writer = DeltaTableWriter(DeltaTables(dataclasses.replace(settings, access=access)))
    first = writer.commit("views", views("/a"), {"m": 1}, -1)
    assert len(credential.scopes) == 1 and credential.scopes[0] == ("https://storage.azure.com/.default",)
    clock[0] = now + 70  # the first token has 50 s left: less than the margin
    second = writer.commit("views", views("/b", first=1), {"m": 2}, first)
    assert len(credential.scopes) == 2, "the token was replaced before it expired"
    assert access.options()["bearer_token"] == credential.tokens[1].token
    assert dict(writer.snapshot("views", ["m"]).marks) == {"m": 2} and second == first + 1

    expired = EntraIdAccess(ACCOUNT, endpoint, IssuedTokens(-30), margin_s=0)
    stale = DeltaTableWriter(DeltaTables(dataclasses.replace(settings, access=expired)))
    with pytest.raises(DeltaAccessError, match="refused the credentials"):
        stale.snapshot("views", ["m"])
