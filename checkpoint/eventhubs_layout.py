"""Where an Event Hubs consumer written with the Azure SDKs looks for its checkpoints, and what weirflow writes
there beside its own rows (``task.checkpoint.azure.eventhubs.layout``: ``table``, ``blob``, ``both`` (the
default) or ``none``).

* **Blob** (`weirflow_azure.checkpoint.eventhubs_blobs`): what every released SDK (``BlobCheckpointStore``,
  ``EventProcessorClient``) and KEDA's Event Hubs scaler read — one blob per partition,
  ``<namespace>/<hub>/<consumer group>/checkpoint/<partition>`` with metadata ``offset`` and
  ``sequencenumber``.
* **Table**: the layout of the Python table checkpoint store — one row per partition::

    PartitionKey = "<fully qualified namespace> <event hub> <consumer group> Checkpoint"
    RowKey       = "<partition id>"
    offset, sequencenumber   (strings) — the last event processed

Either way a consumer written with the SDK, in any language, resumes exactly where the job stopped, and the
job's progress shows in tools that read the layout.

Which SSPs are Event Hubs: those of a system whose factory (``systems.<name>.factory``, resolved like every
factory) is the Event Hubs plugin's `EventHubSystemFactory` or a subclass of it, whichever alias or
``package.module:Class`` path names it: the class is asked, not the spelling in config. Its namespace comes
from ``systems.<name>.fully.qualified.namespace`` or the ``Endpoint`` of ``systems.<name>.connection.string``,
its consumer group from ``systems.<name>.consumer.group`` (default ``$Default``); the event hub is the
stream's physical name.
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

log = logging.getLogger("weirflow.checkpoint")


LAYOUTS = ("table", "blob")
LAYOUT_KEY = "task.checkpoint.azure.eventhubs.layout"


def layouts_of(config: ConfigView) -> frozenset[str]:
    """``task.checkpoint.azure.eventhubs.layout`` as the set of layouts to write: ``table``, ``blob``, ``both``
    or ``none`` (``true`` / ``false``, its values when it was a switch, mean ``both`` / ``none``)."""
    value = str(config.get(LAYOUT_KEY)).strip().lower()
    chosen = {"both": LAYOUTS, "true": LAYOUTS, "none": (), "false": (), "table": ("table",), "blob": ("blob",)}
    if value not in chosen:
        raise config.error(LAYOUT_KEY, f"'{value}' is not one of table, blob, both, none")
    return frozenset(chosen[value])


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


def _event_hubs_factory_class() -> type | None:
    """The Event Hubs plugin's system factory class, or None when its SDK is not installed (then no system can
    be Event Hubs: one naming that factory fails at start, naming the missing extra)."""
    try:
        from weirflow_azure.eventhubs.factory import EventHubSystemFactory
    except ImportError:
        return None
    return EventHubSystemFactory


def eventhubs_systems(config: ConfigView) -> dict[str, EventHubsSystem]:
    """Every configured system backed by Event Hubs, by system name: a system whose factory, resolved as the
    runtime resolves it, is an `EventHubSystemFactory` (an alias, a path to the class or a subclass)."""
    from weirflow.factories import system_factory

    factory_class = _event_hubs_factory_class()
    if factory_class is None:
        return {}
    found: dict[str, EventHubsSystem] = {}
    for name in config.names("systems"):
        if not isinstance(system_factory(config, name), factory_class):
            continue
        namespace = config.get(f"systems.{name}.fully.qualified.namespace")
        if not namespace:
            connection_string = config.get(f"systems.{name}.connection.string")
            if not connection_string:
                raise config.error(
                    f"systems.{name}.fully.qualified.namespace",
                    f"Event Hubs system '{name}' needs a namespace: set this key or "
                    f"systems.{name}.connection.string",
                )
            try:
                namespace = namespace_of_connection_string(connection_string)
            except ValueError as exc:
                raise config.error(f"systems.{name}.connection.string", str(exc)) from None
        group = config.get(f"systems.{name}.consumer.group") or DEFAULT_CONSUMER_GROUP
        found[name] = EventHubsSystem(namespace, group)
    return found


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
