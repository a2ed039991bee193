"""Event Hubs checkpoints in the Azure SDKs' **Blob** layout, which every released Event Hubs SDK (.NET, Java,
Python, JavaScript, Go) and KEDA's Event Hubs scaler read.

One empty block blob per partition, in one container::

    <fully qualified namespace>/<event hub>/<consumer group>/checkpoint/<partition id>   (lowercased)
    metadata: offset, sequencenumber   — the last event processed

exactly as ``azure-eventhub-checkpointstoreblob``'s `BlobCheckpointStore.update_checkpoint` writes them, so an
SDK consumer given the same container resumes at the event after the job's last one
(``task.checkpoint.azure.eventhubs.layout: blob | both``), and a job can start where an SDK consumer app
stopped (``streams.<id>.start: sdk-checkpoint``).

The blobs mirror weirflow's own checkpoint (the Table rows, written first and fenced): they are written after
it, only for partitions whose position changed, and a crash between the two leaves the mirror one checkpoint
behind, never ahead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from azure.core.exceptions import ResourceNotFoundError

from weirflow.interfaces.config import ConfigView
from weirflow_azure.coordinator.storage import CONTAINER_NAME_RULE, Storage, valid_container_name
from weirflow_azure.eventhubs.checkpoint_layout import SdkCheckpoint

T = TypeVar("T")

log = logging.getLogger("weirflow.checkpoint")


def blob_name(fully_qualified_namespace: str, eventhub: str, consumer_group: str, partition: str | int) -> str:
    """The blob of one partition's checkpoint, lowercased as the SDKs write and list it."""
    return f"{fully_qualified_namespace}/{eventhub}/{consumer_group}/checkpoint/{partition}".lower()


class BlobCheckpoints:
    """The SDK-layout checkpoint blobs in ``container`` of the job's storage account (created on first use)."""

    def __init__(self, storage: Storage, container: str) -> None:
        self._storage = storage
        self.container = container
        self._written: dict[str, tuple[str, str]] = {}

    def _call(self, operation: str, resource: str, fn: Callable[[], T]) -> T:
        return self._storage.call(operation, resource, self._storage.blob_endpoint, fn)

    def write(self, checkpoints: Iterable[SdkCheckpoint]) -> int:
        """Write the checkpoints whose position changed since this object last wrote them; returns how many."""
        client = self._storage.container_named(self.container)
        written = 0
        for cp in checkpoints:
            name = blob_name(cp.fully_qualified_namespace, cp.eventhub, cp.consumer_group, cp.partition_id)
            position = (cp.offset, cp.sequence_number)
            if self._written.get(name) == position:
                continue
            metadata = {"offset": cp.offset, "sequencenumber": cp.sequence_number}
            blob = client.get_blob_client(name)

            def put(blob: Any = blob, metadata: dict[str, str] = metadata) -> None:
                try:
                    blob.set_blob_metadata(metadata)
                except ResourceNotFoundError:
                    blob.upload_blob(b"", overwrite=True, metadata=metadata)

            self._call("write Event Hubs checkpoint blob", f"{self.container}/{name}", put)
            self._written[name] = position
            written += 1
        return written

    def read(self, fully_qualified_namespace: str, eventhub: str, consumer_group: str) -> dict[str, SdkCheckpoint]:
        """Every partition's checkpoint of one hub and consumer group, by partition id (as the SDKs list them)."""
        client = self._storage.container_named(self.container)
        prefix = blob_name(fully_qualified_namespace, eventhub, consumer_group, "")

        def listing() -> list[Any]:
            return list(client.list_blobs(name_starts_with=prefix, include=["metadata"]))

        found: dict[str, SdkCheckpoint] = {}
        for blob in self._call("list Event Hubs checkpoint blobs in", f"{self.container}/{prefix}", listing):
            metadata = blob.metadata or {}
            if "sequencenumber" not in metadata:
                log.warning("checkpoint blob %s/%s has no sequencenumber; ignored", self.container, blob.name)
                continue
            partition = blob.name.rsplit("/", 1)[-1]
            found[partition] = SdkCheckpoint(
                fully_qualified_namespace,
                eventhub,
                consumer_group,
                partition,
                str(metadata.get("offset", "")),
                str(metadata["sequencenumber"]),
            )
        return found


CONTAINER_KEY = "task.checkpoint.azure.eventhubs.container"


def open_blob_checkpoints(config: ConfigView, storage: Storage | None = None) -> BlobCheckpoints:
    """The SDK-layout checkpoint blobs of this job: container ``task.checkpoint.azure.eventhubs.container``
    (default the job's container) in the job's storage account (``azure.storage.*``)."""
    storage = storage or Storage.from_config(config)
    container = config.get(CONTAINER_KEY) or storage.settings.container
    if not valid_container_name(container):
        raise config.error(CONTAINER_KEY, f"'{container}' is not a valid container name: {CONTAINER_NAME_RULE}")
    return BlobCheckpoints(storage, container)
