"""How a ``delta`` system signs in to Azure Storage: the storage options delta-rs (object_store) is given for
every operation, built from the keys the Azure suite uses, scoped to the system (`weirflow_delta.keys`).

In order, as the Azure suite decides (docs/azure.md, "Auth"):

1. ``systems.<name>.storage.connection.string``: parsed into the account name, its key (or SAS) and its blob
   endpoint. A ``BlobEndpoint`` (Azurite's ``http://127.0.0.1:10000/devstoreaccount1``, a private endpoint) is
   passed as object_store's ``endpoint``, path-style with the account in it, which is how delta-rs reaches
   the emulator; ``http`` endpoints are allowed only when the connection string says so.
2. ``systems.<name>.storage.account`` (or the account an ``abfss://`` path names): Microsoft Entra ID through
   azure-identity's `DefaultAzureCredential` (managed identity, workload identity, ``az login``). Its token is
   handed to delta-rs as ``bearer_token`` and replaced `REFRESH_MARGIN_S` before it expires: every operation
   asks `EntraIdAccess.options` anew, so a long-running writer never sends an expired token.
3. The environment variable ``AZURE_STORAGE_CONNECTION_STRING``.

A local ``path`` needs none of this (`LocalAccess`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlparse

from weirflow.base.errors import ConfigError
from weirflow.interfaces.config import ConfigView
from weirflow_delta.errors import DeltaAccessError
from weirflow_delta.keys import CONNECTION_STRING_ENV
from weirflow_delta.locations import TableRoot

# The audience of Azure Storage tokens.
STORAGE_SCOPE = "https://storage.azure.com/.default"
# A token is replaced this long before it expires (Entra ID tokens last an hour or more): a commit that starts
# with it finishes long before it expires.
REFRESH_MARGIN_S = 300.0


class StorageAccess(Protocol):
    """What delta-rs needs to reach a system's tables: its storage options, asked before every operation (a
    token may have been refreshed since), and where they lead, for messages."""

    @property
    def where(self) -> str: ...

    def options(self) -> dict[str, str]: ...


@dataclass(frozen=True)
class LocalAccess:
    """Tables on a local (or mounted) file system: no options."""

    where: str = "the local file system"

    def options(self) -> dict[str, str]:
        return {}


@dataclass(frozen=True)
class SharedKeyAccess:
    """An account reached with its key or a SAS, as a connection string gives them."""

    account: str
    where: str
    settings: Mapping[str, str] = field(default_factory=dict)

    def options(self) -> dict[str, str]:
        return dict(self.settings)


class Credential(Protocol):
    """What azure-identity's credentials offer (``get_token(*scopes)`` → an ``AccessToken``)."""

    def get_token(self, *scopes: str, **kwargs: Any) -> Any: ...


def default_credential() -> Credential:
    """azure-identity's `DefaultAzureCredential`, which the ``azure`` extra installs."""
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError as exc:
        raise DeltaAccessError(
            "signing in to Azure Storage with Entra ID (systems.<name>.storage.account) needs azure-identity: "
            "install weirflow[delta,azure], or set systems.<name>.storage.connection.string"
        ) from exc
    return DefaultAzureCredential()


class EntraIdAccess:
    """An account reached with Entra ID tokens. The token is fetched on first use and again whenever it expires
    within ``margin_s`` (on ``clock``'s time, epoch seconds, as ``AccessToken.expires_on``). Thread-safe."""

    def __init__(
        self,
        account: str,
        endpoint: str,
        credential: Credential | Callable[[], Credential] = default_credential,
        margin_s: float = REFRESH_MARGIN_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.account = account
        self.endpoint = endpoint
        self._credential = credential
        self._margin_s = margin_s
        self._clock = clock
        self._lock = threading.Lock()
        self._token: Any = None

    @property
    def where(self) -> str:
        return self.endpoint

    def _signer(self) -> Credential:
        if callable(self._credential) and not hasattr(self._credential, "get_token"):
            self._credential = self._credential()
        return self._credential

    def token(self) -> str:
        """A bearer token valid for at least ``margin_s`` more, when the identity can get one."""
        with self._lock:
            if self._token is None or self._token.expires_on - self._clock() < self._margin_s:
                try:
                    self._token = self._signer().get_token(STORAGE_SCOPE)
                except DeltaAccessError:
                    raise
                except Exception as exc:  # azure-identity's ClientAuthenticationError and kin
                    raise DeltaAccessError(
                        f"no Entra ID identity could sign in to storage account '{self.account}' "
                        f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); sign in "
                        "(managed identity, workload identity, az login) or set "
                        "systems.<name>.storage.connection.string"
                    ) from exc
            return str(self._token.token)

    def options(self) -> dict[str, str]:
        options = {"account_name": self.account, "bearer_token": self.token(), "endpoint": self.endpoint}
        if self.endpoint.startswith("http://"):
            options["allow_http"] = "true"
        return options


def parse_connection_string(text: str) -> dict[str, str]:
    """``Key=Value;...`` → keys lower-cased (values may hold ``=``, as keys and SAS tokens do)."""
    parts = (part.strip() for part in text.split(";"))
    return {k.strip().lower(): v.strip() for k, _, v in (p.partition("=") for p in parts if "=" in p)}


def shared_key_access(text: str, suffix: str, key: str, config: ConfigView) -> SharedKeyAccess:
    """The options of connection string ``text`` (read from config ``key``, named in errors)."""
    fields = parse_connection_string(text)
    if fields.get("usedevelopmentstorage", "").lower() == "true":
        # object_store knows the emulator's well-known account, key and address (AZURITE_BLOB_STORAGE_URL).
        return SharedKeyAccess("devstoreaccount1", "Azurite (UseDevelopmentStorage)", {"use_emulator": "true"})
    account = fields.get("accountname")
    if not account:
        raise config.error(key, "the connection string has no AccountName")
    protocol = fields.get("defaultendpointsprotocol", "https")
    endpoint = (
        fields.get("blobendpoint") or f"{protocol}://{account}.blob.{fields.get('endpointsuffix', suffix)}"
    ).rstrip("/")
    options = {"account_name": account, "endpoint": endpoint}
    if fields.get("accountkey"):
        options["account_key"] = fields["accountkey"]
    elif fields.get("sharedaccesssignature"):
        options["sas_token"] = fields["sharedaccesssignature"].lstrip("?")
    else:
        raise config.error(key, "the connection string has neither an AccountKey nor a SharedAccessSignature")
    if endpoint.startswith("http://"):
        options["allow_http"] = "true"
    return SharedKeyAccess(account, endpoint, options)


def account_endpoint(value: str, suffix: str) -> tuple[str, str] | None:
    """``storage.account`` → (account name, blob endpoint): a name, an account URL
    (``https://<account>.blob.<suffix>``, ``.dfs.`` too) or a path-style URL of an emulator
    (``https://127.0.0.1:10000/devstoreaccount1``); None for a URL that names no account."""
    if "://" not in value:
        return value, f"https://{value}.blob.{suffix}"
    url = urlparse(value)
    host = url.hostname or ""
    name, _, rest = host.partition(".")
    service, _, url_suffix = rest.partition(".")
    if service in ("blob", "dfs") and url_suffix:
        return name, f"{url.scheme}://{name}.blob.{url_suffix}"
    account = url.path.strip("/").split("/", 1)[0]
    return (account, f"{url.scheme}://{url.netloc}/{account}") if account else None


def storage_access(system: str, config: ConfigView, root: TableRoot) -> StorageAccess:
    """How the system reaches ``root``: `LocalAccess` for a local path, else the first of the module's ways
    that its config gives."""
    if root.azure is None:
        return LocalAccess()
    prefix = f"systems.{system}.storage."
    suffix = str(config.get(prefix + "endpoint.suffix"))
    text = config.get(prefix + "connection.string")
    account = config.get(prefix + "account")
    if text:
        access: StorageAccess = shared_key_access(str(text), suffix, prefix + "connection.string", config)
    elif account or root.azure.account:
        found = account_endpoint(str(account or root.azure.account), suffix)
        if found is None:
            raise config.error(
                prefix + "account", f"'{account}' names no account: https://<account>.blob.<suffix>, or a name"
            )
        access = EntraIdAccess(*found)
    else:
        text = os.environ.get(CONNECTION_STRING_ENV)
        if not text:
            raise config.error(
                prefix + "connection.string",
                f"Delta system '{system}' keeps its tables in Azure Storage ({root.uri}) and needs its account: "
                f"set this key (for example '${{{CONNECTION_STRING_ENV}}}'), or {prefix}account to sign in with "
                f"Entra ID, or the environment variable {CONNECTION_STRING_ENV}",
            )
        access = shared_key_access(text, suffix, prefix + "connection.string", config)
    _check_account(system, config, root, access)
    return access


def _check_account(system: str, config: ConfigView, root: TableRoot, access: StorageAccess) -> None:
    """An ``abfss://`` path names an account; the credentials must be that account's (delta-rs would send
    them to the account they name, whatever the URL says)."""
    named = root.azure.account if root.azure else None
    account = getattr(access, "account", None)
    if named and account and named != account:
        raise ConfigError(
            f"systems.{system}.path names storage account '{named}' but the system's credentials are account "
            f"'{account}'s: make them agree",
            key=f"systems.{system}.path",
            source=config.source_of(f"systems.{system}.path"),
        )
