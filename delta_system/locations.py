"""Where a ``delta`` system's tables live: ``systems.<name>.path`` parsed once, and a stream's physical name
joined to it (`TableRoot.table_uri`).

A path is a local directory or an Azure Storage URL that delta-rs reads: ``abfss://<container>@<account>.dfs.
<suffix>/<dir>`` and ``abfs://`` (ADLS Gen2; the account is in the host), or ``az://<container>/<dir>`` (Blob
Storage; the account comes from the storage keys, `weirflow_delta.azure_auth`). delta-rs talks to either
through the Blob API, so both work on accounts with or without a hierarchical namespace.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlparse

from weirflow.base.errors import InvalidArgumentError
from weirflow.interfaces.config import ConfigView

AZURE_SCHEMES = ("abfss", "abfs", "az")
PATH_FORMS = (
    "a local directory, abfss://<container>@<account>.dfs.core.windows.net/<dir> or az://<container>/<dir>"
)


_TABLE_NAME_RULE = (
    "a stream's physical name is one directory under systems.<name>.path (no '/', not '.' or '..'); set "
    "streams.<id>.physical.name"
)


@dataclass(frozen=True)
class AzurePath:
    """An Azure ``path``: its container, the account its URL names (``abfss://``; None for ``az://``) and the
    directory of the tables inside the container (no leading or trailing slash; may be empty)."""

    container: str
    account: str | None
    directory: str


@dataclass(frozen=True)
class TableRoot:
    """The directory holding a system's tables: ``uri`` as delta-rs takes it (an absolute local path or the
    URL, without a trailing slash), and its Azure parts when it is in Azure Storage."""

    uri: str
    azure: AzurePath | None = None

    def table_uri(self, table: str) -> str:
        """The location of the table of the stream whose physical name is ``table``: ``<path>/<table>``."""
        check_table_name(table)
        return f"{self.uri}/{table}"


def check_table_name(table: str) -> None:
    """A physical name is one directory below the path: no separators, not ``.`` or ``..``, not empty."""
    if not table or table in (".", "..") or "/" in table or "\\" in table:
        raise InvalidArgumentError(f"'{table}' cannot name a Delta table: " + _TABLE_NAME_RULE)


def table_root(system: str, config: ConfigView) -> TableRoot:
    """``systems.<system>.path`` parsed; a config error naming the key when it is missing or not a path of
    `PATH_FORMS`."""
    key = f"systems.{system}.path"
    text = str(config.get(key) or "").strip()
    if not text:
        raise config.error(key, f"Delta system '{system}' needs a path for its tables: {PATH_FORMS}")
    if "://" not in text:
        return TableRoot(str(config.path(key)).rstrip("/") or "/")
    url = urlparse(text)
    if url.scheme == "file":
        return TableRoot(url.path.rstrip("/") or "/")
    if url.scheme not in AZURE_SCHEMES:
        raise config.error(key, f"'{text}' is not a path weirflow's Delta system reads: {PATH_FORMS}")
    directory = url.path.strip("/")
    if url.scheme == "az":
        container, account = url.netloc, None
    else:
        container, _, host = url.netloc.rpartition("@")
        account = host.split(".", 1)[0] if "." in host else None
        if not container or not account:
            raise config.error(
                key, f"'{text}' names no container and account: write {url.scheme}://<container>@<account>.dfs..."
            )
    if not container:
        raise config.error(key, f"'{text}' names no container: write az://<container>/<dir>")
    return TableRoot(text.rstrip("/"), AzurePath(container, account, directory))
