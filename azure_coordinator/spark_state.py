"""Tasks' Spark checkpoint directories kept in Blob Storage (``task.spark.checkpoint.store: azure``, the default
on the Azure coordinator), so a stateful task that moves to another machine keeps its operator state.

The mirror, the restore, the layout (``spark-state/<task>/...`` in the job's container) and the fence are
`weirflow.interfaces.spark_state_mirror`'s, written once for every object store; this module is only its
`ObjectStore` on the job's container: one block blob per object, each call under the suite's retry policy
(`Storage.call`). The manifest is replaced with If-Match on its ETag, or created only while there is none
(``overwrite=False``); Blob Storage gives every write a new ETag, so the manifest needs no write id.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from azure.core import MatchConditions
from azure.core.exceptions import ResourceExistsError, ResourceModifiedError, ResourceNotFoundError

from weirflow.base.errors import FencedOffError
from weirflow.interfaces.config import ConfigView
from weirflow.interfaces.spark_state import SparkStateStore, SparkStateStoreFactory
from weirflow.interfaces.spark_state_mirror import ObjectSparkStateStore, ObjectStore
from weirflow_azure.coordinator.storage import Storage

T = TypeVar("T")

_IF_MATCH = MatchConditions.IfNotModified


class BlobObjects(ObjectStore):
    """The job's container as the mirror's `ObjectStore`: names are blob names."""

    where = "Blob Storage"

    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    def _call(self, operation: str, name: str, fn: Callable[[], T]) -> T:
        return self._storage.call(operation, name, self._storage.blob_endpoint, fn)

    def read(self, operation: str, name: str) -> tuple[bytes | None, str | None]:
        blob = self._storage.container.get_blob_client(name)

        def read() -> tuple[bytes | None, str | None]:
            try:
                downloader = blob.download_blob()
            except ResourceNotFoundError:
                return None, None
            return downloader.readall(), downloader.properties.etag

        return self._call(operation, name, read)

    def fetch(self, operation: str, name: str) -> bytes:
        blob = self._storage.container.get_blob_client(name)
        return self._call(operation, name, lambda: blob.download_blob().readall())

    def put(self, operation: str, name: str, data: bytes) -> None:
        blob = self._storage.container.get_blob_client(name)
        self._call(operation, name, lambda: blob.upload_blob(data, overwrite=True))

    def replace(self, operation: str, name: str, data: bytes, tag: str | None, fenced: FencedOffError) -> str:
        blob = self._storage.container.get_blob_client(name)

        def replace() -> str:
            try:
                if tag is None:
                    result = blob.upload_blob(data, overwrite=False)
                else:
                    result = blob.upload_blob(data, overwrite=True, etag=tag, match_condition=_IF_MATCH)
            except (ResourceModifiedError, ResourceExistsError) as exc:
                raise fenced from exc
            return str(result["etag"])

        return self._call(operation, name, replace)

    def delete(self, operation: str, name: str) -> None:
        blob = self._storage.container.get_blob_client(name)

        def remove() -> None:
            try:
                blob.delete_blob()
            except ResourceNotFoundError:
                pass

        self._call(operation, name, remove)

    def delete_folder(self, operation: str, folder: str) -> None:
        container = self._storage.container

        def remove_all() -> None:
            for blob in container.list_blobs(name_starts_with=folder):
                try:
                    container.delete_blob(blob.name)
                except ResourceNotFoundError:
                    pass

        self._call(operation, folder, remove_all)

    def close(self) -> None:
        self._storage.close()


class BlobSparkStateStore(ObjectSparkStateStore):
    """The mirror on the job's container (`BlobObjects` over ``storage``)."""

    def __init__(self, storage: Storage) -> None:
        super().__init__(BlobObjects(storage))
        self._storage = storage  # the account and container it uses, for another store of the same job


class BlobSparkStateStoreFactory(SparkStateStoreFactory):
    def get_spark_state_store(self, config: ConfigView) -> SparkStateStore:
        return BlobSparkStateStore(Storage.from_config(config))
