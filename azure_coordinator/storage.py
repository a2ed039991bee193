"""One job's Azure Storage: how to authenticate, what its container and tables are called, and how every call
is retried.

The Azure suite (`azure_coordinator`, `checkpoint`) keeps all of a job's state in one storage account:

* blob container ``azure.storage.container`` (default ``weirflow-<job.name>-<job.id>-<hash>``, sanitised):
  lease blobs ``leases/leader`` and ``leases/locks/<task lock>``, metadata documents ``metadata/<key>``;
* tables ``<prefix>processors`` (registry), ``<prefix>latches`` and ``<prefix>checkpoints``, where
  ``<prefix>`` is ``azure.storage.table.prefix`` (default ``wf<job.name><job.id><hash>``, letters and digits).

The ``<hash>`` (6 hex digits of the exact job name and id) keeps two jobs apart even when sanitising maps
their names to the same characters. All of them are created when missing.

Auth, in order: ``azure.storage.connection.string``; else ``azure.storage.account`` with
`DefaultAzureCredential` (managed identity, workload identity, ``az login``...); else the environment variable
``AZURE_STORAGE_CONNECTION_STRING``.

Retries: the SDK's own retry policy is switched off so that one policy, ours, governs every call. Transient
failures (connection errors, timeouts, 408, 429, 5xx) are retried with exponential backoff and jitter,
``azure.retry.attempts`` times at most and never past ``azure.retry.deadline.ms`` in all (no new attempt
starts when a request timing out could overrun it), so that a lease renewal answers, or fails, while the
processor can still fence itself (docs/coordination.md, "The self-fence"); when they keep failing,
`ServiceUnavailableError` names the endpoint and the resource. Any other error surfaces at once as
`AzureStorageError` naming the resource (the one table of `weirflow_azure.coordinator.errors`, `STORAGE_ERRORS`).
Each retry and each call failing with one of those errors is counted, by operation, for ``GET /metrics``
(`weirflow.base.telemetry`: ``weirflow_storage_retries_total``, ``weirflow_storage_errors_total``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeVar
from urllib.parse import urlparse

from azure.core.exceptions import ResourceExistsError

from weirflow.base.service_calls import ServiceCalls
from weirflow.interfaces.config import ConfigView
from weirflow_azure.coordinator.errors import AzureStorageError, is_transient, short, storage_errors

log = logging.getLogger("weirflow.azure")

T = TypeVar("T")

CONNECTION_STRING_ENV = "AZURE_STORAGE_CONNECTION_STRING"
TABLE_SUFFIXES = ("processors", "latches", "checkpoints")


def _job_hash(name: str, job_id: str) -> str:
    return hashlib.sha256(f"{name}\0{job_id}".encode()).hexdigest()[:6]


def default_container_name(job_name: str, job_id: str) -> str:
    """``weirflow-<name>-<id>-<hash>``: lowercase letters, digits and single hyphens, at most 63 characters."""
    slug = re.sub(r"[^a-z0-9]+", "-", f"{job_name}-{job_id}".lower()).strip("-")
    slug = slug[: 63 - len("weirflow--") - 6].strip("-")
    return f"weirflow-{slug}-{_job_hash(job_name, job_id)}" if slug else f"weirflow-{_job_hash(job_name, job_id)}"


def default_table_prefix(job_name: str, job_id: str) -> str:
    """``wf<name><id><hash>``: letters and digits, short enough for the longest table suffix."""
    slug = re.sub(r"[^A-Za-z0-9]+", "", f"{job_name}{job_id}").lower()
    room = 63 - max(len(s) for s in TABLE_SUFFIXES) - len("wf") - 6
    return f"wf{slug[:room]}{_job_hash(job_name, job_id)}"


_CONTAINER_RE = re.compile(r"^[a-z0-9](?!.*--)[a-z0-9-]{1,61}[a-z0-9]$")
CONTAINER_NAME_RULE = (
    "3-63 lowercase letters, digits and single hyphens, starting and ending with a letter or digit"
)


def valid_container_name(name: str) -> bool:
    """Whether Blob Storage accepts ``name`` as a container name (`CONTAINER_NAME_RULE`)."""
    return bool(_CONTAINER_RE.match(name))


_TABLE_PREFIX_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]{0,51}$")


def escape_key(value: str) -> str:
    """Table PartitionKey/RowKey values may not hold ``/ \\ # ?`` or control characters: percent-encode them
    (and ``%`` itself, so that the mapping is reversible)."""
    return re.sub(r"[%/\\#?\x00-\x1f\x7f]", lambda m: f"%{ord(m.group()):02X}", value)


def unescape_key(value: str) -> str:
    return re.sub(r"%([0-9A-F]{2})", lambda m: chr(int(m.group(1), 16)), value)


@dataclass(frozen=True)
class StorageSettings:
    """Everything needed to reach one job's storage; built from config by `from_config`."""

    container: str
    table_prefix: str
    connection_string: str | None = None
    account: str | None = None
    endpoint_suffix: str = "core.windows.net"
    request_timeout_s: float = 3.0
    retry_deadline_s: float = 4.0
    retry_attempts: int = 5
    retry_initial_s: float = 0.2
    retry_max_s: float = 5.0

    @classmethod
    def from_config(cls, config: ConfigView) -> StorageSettings:
        name, job_id = str(config.get("job.name")), str(config.get("job.id"))
        container = config.get("azure.storage.container") or default_container_name(name, job_id)
        if not valid_container_name(container):
            raise config.error(
                "azure.storage.container", f"'{container}' is not a valid container name: {CONTAINER_NAME_RULE}"
            )
        prefix = config.get("azure.storage.table.prefix") or default_table_prefix(name, job_id)
        if not _TABLE_PREFIX_RE.match(prefix):
            raise config.error(
                "azure.storage.table.prefix",
                f"'{prefix}' is not a valid table prefix: a letter, then letters and digits (52 at most)",
            )
        connection_string = config.get("azure.storage.connection.string")
        account = config.get("azure.storage.account")
        if not connection_string and not account:
            connection_string = os.environ.get(CONNECTION_STRING_ENV)
            if not connection_string:
                raise config.error(
                    "azure.storage.connection.string",
                    "the Azure suite needs a storage account: set azure.storage.connection.string "
                    f"(for example '${{{CONNECTION_STRING_ENV}}}'), or azure.storage.account to sign in with "
                    f"DefaultAzureCredential, or the environment variable {CONNECTION_STRING_ENV}",
                )
        suffix = config.get("azure.storage.endpoint.suffix")
        if account and "://" in account:
            account, suffix = _account_of_url(account, config)
        attempts = int(config.get("azure.retry.attempts"))
        if attempts < 1:
            raise config.error("azure.retry.attempts", "must be at least 1")
        deadline_ms = int(config.get("azure.retry.deadline.ms"))
        if deadline_ms < int(config.get("azure.storage.request.timeout.ms")):
            raise config.error(
                "azure.retry.deadline.ms",
                f"{deadline_ms} ms is shorter than one request may take (azure.storage.request.timeout.ms); "
                "raise it or lower the request timeout",
            )
        return cls(
            container=container,
            table_prefix=prefix,
            connection_string=connection_string or None,
            account=account or None,
            endpoint_suffix=suffix,
            request_timeout_s=config.get("azure.storage.request.timeout.ms") / 1000,
            retry_deadline_s=deadline_ms / 1000,
            retry_attempts=attempts,
            retry_initial_s=config.get("azure.retry.initial.backoff.ms") / 1000,
            retry_max_s=config.get("azure.retry.max.backoff.ms") / 1000,
        )

    def table_name(self, suffix: str) -> str:
        return f"{self.table_prefix}{suffix}"


def _account_of_url(url: str, config: ConfigView) -> tuple[str, str]:
    """``https://<account>.blob.<suffix>`` (or ``.table.``) -> (account, suffix)."""
    host = urlparse(url).netloc
    match = re.fullmatch(r"([a-z0-9]{3,24})\.(?:blob|table)\.(.+)", host)
    if not match:
        raise config.error(
            "azure.storage.account",
            f"'{url}' is neither an account name nor an account URL like https://<account>.blob.core.windows.net",
        )
    return match.group(1), match.group(2)


class Storage:
    """Clients of one job's container and tables, plus `call`, the one retry policy.

    Clients are created lazily and shared by the threads of a process (the SDK clients are thread-safe).
    """

    def __init__(self, settings: StorageSettings) -> None:
        self.settings = settings
        self._created: set[str] = set()

    @classmethod
    def from_config(cls, config: ConfigView) -> Storage:
        return cls(StorageSettings.from_config(config))

    def _client_kwargs(self) -> dict[str, Any]:
        timeout = self.settings.request_timeout_s
        return {"retry_total": 0, "connection_timeout": timeout, "read_timeout": timeout}

    @cached_property
    def _credential(self) -> Any:
        from azure.identity import DefaultAzureCredential

        return DefaultAzureCredential()

    @cached_property
    def blob_service(self) -> Any:
        from azure.storage.blob import BlobServiceClient

        s = self.settings
        if s.connection_string:
            return BlobServiceClient.from_connection_string(s.connection_string, **self._client_kwargs())
        url = f"https://{s.account}.blob.{s.endpoint_suffix}"
        return BlobServiceClient(url, credential=self._credential, **self._client_kwargs())

    @cached_property
    def table_service(self) -> Any:
        from azure.data.tables import TableServiceClient

        s = self.settings
        if s.connection_string:
            return TableServiceClient.from_connection_string(s.connection_string, **self._client_kwargs())
        url = f"https://{s.account}.table.{s.endpoint_suffix}"
        return TableServiceClient(url, credential=self._credential, **self._client_kwargs())

    @property
    def blob_endpoint(self) -> str:
        return str(self.blob_service.url)

    @property
    def table_endpoint(self) -> str:
        return str(self.table_service.url)

    @cached_property
    def container(self) -> Any:
        client = self.blob_service.get_container_client(self.settings.container)
        if "container" not in self._created:
            self.call("create container", self.settings.container, self.blob_endpoint, _create_container(client))
            self._created.add("container")
        return client

    def container_named(self, name: str) -> Any:
        """The container ``name`` of the account, created on first use."""
        client = self.blob_service.get_container_client(name)
        if f"container:{name}" not in self._created:
            self.call("create container", name, self.blob_endpoint, _create_container(client))
            self._created.add(f"container:{name}")
        return client

    def table(self, suffix: str) -> Any:
        """The table ``<prefix><suffix>``, created on first use."""
        return self.table_named(self.settings.table_name(suffix))

    def table_named(self, name: str) -> Any:
        """The table ``name``, created on first use."""
        client = self.table_service.get_table_client(name)
        if name not in self._created:
            self.call("create table", name, self.table_endpoint, _create_table(client))
            self._created.add(name)
        return client

    @cached_property
    def _calls(self) -> ServiceCalls:
        return ServiceCalls(
            store="azure",
            settings=self.settings,
            is_transient=is_transient,
            short=short,
            errors=storage_errors,
            mapped=(AzureStorageError,),
            hint="Is the storage account reachable (and Azurite running, in development)?",
            log=log,
        )

    def call(self, operation: str, resource: str, endpoint: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` under the retry policy (`weirflow.base.service_calls`). ``fn`` handles the errors it
        expects (a
        409 on a taken lease, say) and returns; transient ones are retried; the rest are raised naming
        ``resource``, as the one table of `weirflow_azure.coordinator.errors` (`STORAGE_ERRORS`) maps them."""
        return self._calls.call(operation, resource, endpoint, fn)

    def close(self) -> None:
        for name in ("blob_service", "table_service"):
            client = self.__dict__.pop(name, None)
            if client is not None:
                client.close()
        self.__dict__.pop("container", None)


def _create_container(client: Any) -> Callable[[], None]:
    def create() -> None:
        try:
            client.create_container()
        except ResourceExistsError:
            pass

    return create


def _create_table(client: Any) -> Callable[[], None]:
    def create() -> None:
        try:
            client.create_table()
        except ResourceExistsError:
            pass

    return create
