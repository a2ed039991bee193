"""`MetadataStore` on block blobs: ``metadata/<key>`` in the job's container, JSON bodies, the blob's ETag as
the document's etag.

Conditions map onto HTTP preconditions that Blob Storage evaluates atomically: ``if_match`` is
``If-Match: <etag>``, ``if_none_match`` is ``If-None-Match: *``. A failed precondition (412, or 409 when the
blob appeared meanwhile) becomes `EtagMismatchError`. Blob ETags change on every write and are not reused.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from azure.core import MatchConditions
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.storage.blob import ContentSettings

from weirflow.base import malformed
from weirflow.base.errors import EtagMismatchError, MalformedDocumentError
from weirflow.interfaces.metadata import Document, MetadataStore, decode_value
from weirflow_azure.coordinator.storage import Storage

T = TypeVar("T")

PREFIX = "metadata/"
_JSON = ContentSettings(content_type="application/json")


class BlobMetadataStore(MetadataStore):
    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    def start(self) -> None:
        self._storage.container  # noqa: B018 - creates the container when missing

    def _call(self, operation: str, key: str, fn: Callable[[], T]) -> T:
        resource = f"{self._storage.settings.container}/{PREFIX}{key}"
        return self._storage.call(operation, resource, self._storage.blob_endpoint, fn)

    def _blob(self, key: str) -> Any:
        return self._storage.container.get_blob_client(PREFIX + key)

    def get(self, key: str) -> Document | None:
        def read() -> Document | None:
            try:
                downloader = self._blob(key).download_blob()
            except ResourceNotFoundError:
                return None
            return Document(key, decode_value(key, downloader.readall()), downloader.properties.etag)

        return self._call("read", key, read)

    def put(
        self, key: str, value: dict[str, Any], *, if_match: str | None = None, if_none_match: bool = False
    ) -> str:
        body = json.dumps(value).encode()
        kwargs: dict[str, Any] = {"overwrite": not if_none_match, "content_settings": _JSON}
        if if_match is not None:
            kwargs.update(etag=if_match, match_condition=MatchConditions.IfNotModified)

        def write() -> str:
            try:
                result = self._blob(key).upload_blob(body, **kwargs)
            except (ResourceExistsError, ResourceModifiedError) as exc:
                raise EtagMismatchError(key, if_match) from exc
            except ResourceNotFoundError as exc:
                if if_match is not None:  # the document was deleted since it was read
                    raise EtagMismatchError(key, if_match) from exc
                raise
            except HttpResponseError as exc:
                if exc.status_code in (409, 412):
                    raise EtagMismatchError(key, if_match) from exc
                raise
            return str(result["etag"])

        return self._call("write", key, write)

    def delete(self, key: str, *, if_match: str | None = None) -> None:
        kwargs: dict[str, Any] = {}
        if if_match is not None:
            kwargs.update(etag=if_match, match_condition=MatchConditions.IfNotModified)

        def remove() -> None:
            try:
                self._blob(key).delete_blob(**kwargs)
            except ResourceNotFoundError as exc:
                if if_match is not None:
                    raise EtagMismatchError(key, if_match) from exc
            except (ResourceModifiedError, HttpResponseError) as exc:
                if isinstance(exc, ResourceModifiedError) or exc.status_code == 412:
                    raise EtagMismatchError(key, if_match) from exc
                raise

        self._call("delete", key, remove)

    def list(self, prefix: str = "") -> list[Document]:
        def names() -> list[str]:
            blobs = self._storage.container.list_blobs(name_starts_with=PREFIX + prefix)
            return sorted(b.name[len(PREFIX) :] for b in blobs)

        documents = []
        for key in self._call("list", prefix + "*", names):
            try:
                doc = self.get(key)
            except MalformedDocumentError as exc:  # one unreadable document does not hide the others
                malformed.report(key, exc, action="skipped")
                continue
            if doc is not None:  # deleted between the listing and the read
                documents.append(doc)
        return documents
