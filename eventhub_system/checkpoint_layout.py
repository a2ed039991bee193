"""Where an Event Hubs consumer written with the Azure SDKs looks for its checkpoints. The layouts are Event
Hubs knowledge, so this plugin owns them: the checkpoint manager (`weirflow_azure.checkpoint`) writes them
beside its own rows (which of them: ``task.checkpoint.azure.eventhubs.layout``), and this plugin's admin reads
them (``streams.<id>.start: sdk-checkpoint``).

* **Blob** (`weirflow_azure.eventhubs.checkpoint_blobs`): what every released SDK (``BlobCheckpointStore``,
  ``EventProcessorClient``) and KEDA's Event Hubs scaler read — one blob per partition,
  ``<namespace>/<hub>/<consumer group>/checkpoint/<partition>`` with metadata ``offset`` and
  ``sequencenumber``.
* **Table**: the layout of the Python table checkpoint store — one row per partition::

    PartitionKey = "<fully qualified namespace> <event hub> <consumer group> Checkpoint"
    RowKey       = "<partition id>"
    offset, sequencenumber   (strings) — the last event processed

Either way a consumer written with the SDK, in any language, resumes exactly where the job stopped, and the
job's progress shows in tools that read the layout.

Which SSPs are Event Hubs: those of a system whose factory is this plugin's
(`weirflow_azure.eventhubs.configured`). A system's namespace and consumer group come from its settings
(`EventHubsSettings`, the one reading of ``systems.<name>.*``): the ``fully.qualified.namespace``, else the
``Endpoint`` of the ``connection.string``; the event hub is the stream's physical name.
The row needs the last event's ``offset``, which only the reader knows: it comes from the checkpoint's
``positions``. An SSP whose offset is unknown gets no row (a row without it would send SDK readers back to
the start of the partition).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlparse

from weirflow.interfaces.checkpoint import Checkpoint
from weirflow.interfaces.config import ConfigView
from weirflow_azure.eventhubs.keys import DEFAULT_CONSUMER_GROUP
from weirflow_azure.eventhubs.offsets import sequence_number_before
from weirflow_azure.eventhubs.settings import EventHubsSettings

log = logging.getLogger("weirflow.checkpoint")


@dataclass(frozen=True)
class SdkCheckpoint:
    """One partition's checkpoint as the SDKs keep it: the last event processed (``offset`` and
    ``sequence_number`` as strings, as the SDKs store them)."""

    fully_qualified_namespace: str
    eventhub: str
    consumer_group: str
    partition_id: str
    offset: str
    sequence_number: str

    def table_row(self) -> dict[str, str]:
        return {
            "PartitionKey": f"{self.fully_qualified_namespace} {self.eventhub} {self.consumer_group} Checkpoint",
            "RowKey": self.partition_id,
            "offset": self.offset,
            "sequencenumber": self.sequence_number,
        }


@dataclass(frozen=True)
class EventHubsSystem:
    """Where one weirflow system's Event Hubs live, as the SDK names them."""

    fully_qualified_namespace: str
    consumer_group: str = DEFAULT_CONSUMER_GROUP


def namespace_of_connection_string(connection_string: str) -> str:
    """``Endpoint=sb://<namespace>/;...`` -> ``<namespace>`` (host and port, as the SDK reports it)."""
    for part in connection_string.split(";"):
        name, _, value = part.partition("=")
        if name.strip().lower() == "endpoint":
            parsed = urlparse(value.strip())
            if parsed.netloc:
                return parsed.netloc
    raise ValueError("the connection string has no 'Endpoint=sb://<namespace>/' part")


def eventhubs_system(name: str, config: ConfigView) -> EventHubsSystem:
    """Where system ``name``'s event hubs live, as the SDKs name them: its namespace (the
    ``fully.qualified.namespace``, else the ``Endpoint`` of its ``connection.string``) and consumer group."""
    settings = EventHubsSettings.from_config(name, config)
    namespace = settings.fully_qualified_namespace
    if not namespace:
        try:
            namespace = namespace_of_connection_string(settings.connection_string or "")
        except ValueError as exc:
            raise config.error(f"systems.{name}.connection.string", str(exc)) from None
    return EventHubsSystem(namespace, settings.consumer_group)


def sdk_checkpoints(checkpoint: Checkpoint, systems: Mapping[str, EventHubsSystem]) -> list[SdkCheckpoint]:
    """The SDK checkpoints of the Event Hubs SSPs of ``checkpoint`` whose last event is known."""
    found = []
    for ssp, next_offset in checkpoint.offsets.items():
        system = systems.get(ssp.system)
        if system is None:
            continue
        position = checkpoint.positions.get(ssp, {})
        offset = position.get("offset")
        if offset is None or offset == "":
            log.debug("no event offset for %s: no SDK checkpoint", ssp)
            continue
        sequence_number = position.get("sequence_number")
        if sequence_number is None:
            sequence_number = sequence_number_before(next_offset)
        found.append(
            SdkCheckpoint(
                system.fully_qualified_namespace,
                ssp.stream,
                system.consumer_group,
                str(ssp.partition),
                str(offset),
                str(sequence_number),
            )
        )
    return found
