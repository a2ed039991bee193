"""`MetadataStore`: small JSON documents with etag compare-and-set (job model, drain notices, endpoints).

Documents are JSON objects up to a few hundred KB. Every write can be conditional, so two leaders that both
believe they lead cannot both publish: the one holding a stale etag gets `EtagMismatchError`.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from weirflow.base.errors import MalformedDocumentError
from weirflow.interfaces.config import ConfigView


def decode_value(key: str, raw: str | bytes) -> Any:
    """A stored document's JSON; `MalformedDocumentError` naming ``key`` when it is not JSON. A store's ``get``
    raises it; its ``list`` leaves the document out and reports it (`weirflow.base.malformed`), so one unreadable
    document does not hide the others."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise MalformedDocumentError(f"metadata document {key} is not JSON ({exc})") from exc


@dataclass(frozen=True)
class LeaseHolder:
    """A coordination lease and who must hold it for a write to happen: ``name`` as the coordination backend
    names it (``leader`` for leadership), held by the pair (``owner``, ``instance``)."""

    name: str
    owner: str
    instance: str = ""


@dataclass(frozen=True)
class Document:
    """A stored document: ``value`` is the decoded JSON object, ``etag`` an opaque version string that changes
    on every write."""

    key: str
    value: dict[str, Any]
    etag: str


class MetadataStore(ABC):
    """Contract:
    * ``get`` returns None for a missing key.
    * ``put(key, value)`` with neither condition overwrites unconditionally.
      ``if_match=etag`` writes only if the stored etag equals it; ``if_none_match=True`` only if the key is
      absent. A failed condition raises `EtagMismatchError` and changes nothing.
    * ``put`` returns the new etag; etags of one key never repeat.
    * ``delete`` of a missing key is a no-op unless ``if_match`` is given (then `EtagMismatchError`).
    * ``list(prefix)`` returns documents whose key starts with ``prefix``, sorted by key.
    * Keys are ``[A-Za-z0-9._/-]+``. Safe for concurrent use by several processes.
    """

    def start(self) -> None:
        """Create tables or containers if missing. Idempotent."""

    @abstractmethod
    def get(self, key: str) -> Document | None: ...

    @abstractmethod
    def put(
        self, key: str, value: dict[str, Any], *, if_match: str | None = None, if_none_match: bool = False
    ) -> str: ...

    def put_as_holder(
        self,
        key: str,
        value: dict[str, Any],
        holder: LeaseHolder,
        *,
        if_match: str | None = None,
        if_none_match: bool = False,
    ) -> str:
        """`put`, only while ``holder`` holds its lease: the leader publishes the job model this way. A store
        that keeps the coordination backend's leases beside its documents checks the lease in the write's own
        transaction and raises `LockLostError` (changing nothing) when it is not held. This default cannot
        see leases and writes as `put` does; the caller's self-fence (a write begins only well inside the
        lease, and one store call ends before the lease can) is then what keeps a deposed writer out."""
        return self.put(key, value, if_match=if_match, if_none_match=if_none_match)

    @abstractmethod
    def delete(self, key: str, *, if_match: str | None = None) -> None: ...

    @abstractmethod
    def list(self, prefix: str = "") -> list[Document]: ...

    def stop(self) -> None:
        """Release connections. Idempotent."""


class MetadataStoreFactory(ABC):
    """Named by `metadata.store.factory`; constructed with no arguments."""

    @abstractmethod
    def get_metadata_store(self, config: ConfigView) -> MetadataStore: ...
