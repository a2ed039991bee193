"""The Azure SDKs' Table Storage checkpoint layout for Event Hubs, written beside weirflow's own rows.

Event Hubs processors in every language (`EventProcessorClient`, `EventHubConsumerClient` with a table
checkpoint store) keep one row per partition::

    PartitionKey = "<fully qualified namespace> <event hub> <consumer group> Checkpoint"
    RowKey       = "<partition id>"
    offset, sequencenumber   (strings) — the last event processed

A weirflow job that reads Event Hubs writes these rows too (``task.checkpoint.azure.eventhubs.layout``, on by
default), so a processor written with the SDK — in any language — can resume exactly where the job stopped,
and the job's progress shows up in tools that read that layout.

Which SSPs are Event Hubs: those of a system whose ``systems.<name>.factory`` is ``eventhub`` (or a class of
the `eventhub_system` package). Its namespace comes from ``systems.<name>.fully.qualified.namespace`` or the
``Endpoint`` of ``systems.<name>.connection.string``, its consumer group from
``systems.<name>.consumer.group`` (default ``$Default``); the event hub is the stream's physical name.
The row needs the last event's ``offset``, which only the reader knows: it comes from the checkpoint's
``positions``. An SSP whose offset is unknown gets no row (a row without it would send SDK readers back to
the start of the partition).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from weirflow.interfaces.checkpoint import Checkpoint

log = logging.getLogger("weirflow.checkpoint")

DEFAULT_CONSUMER_GROUP = "$Default"


@dataclass(frozen=True)
class EventHubsSystem:
    """Where one weirflow system's Event Hubs live, as the SDK names them."""

    fully_qualified_namespace: str
    consumer_group: str = DEFAULT_CONSUMER_GROUP

    def partition_key(self, eventhub: str) -> str:
        return f"{self.fully_qualified_namespace} {eventhub} {self.consumer_group} Checkpoint"


def namespace_of_connection_string(connection_string: str) -> str:
    """``Endpoint=sb://<namespace>/;...`` -> ``<namespace>`` (host and port, as the SDK reports it)."""
    for part in connection_string.split(";"):
        name, _, value = part.partition("=")
        if name.strip().lower() == "endpoint":
            parsed = urlparse(value.strip())
            if parsed.netloc:
                return parsed.netloc
    raise ValueError("the connection string has no 'Endpoint=sb://<namespace>/' part")


def _is_eventhub_factory(value: Any) -> bool:
    text = str(value or "")
    return text == "eventhub" or text.startswith("eventhub_system")


def eventhubs_systems(config: Any) -> dict[str, EventHubsSystem]:
    """Every configured system backed by Event Hubs, by system name."""
    found: dict[str, EventHubsSystem] = {}
    for name in config.names("systems"):
        if not _is_eventhub_factory(config.get(f"systems.{name}.factory")):
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


def sdk_checkpoint_rows(checkpoint: Checkpoint, systems: Mapping[str, EventHubsSystem]) -> list[dict[str, str]]:
    """The SDK-layout rows for the Event Hubs SSPs of ``checkpoint`` whose last event is known."""
    rows = []
    for ssp, next_offset in checkpoint.offsets.items():
        system = systems.get(ssp.system)
        if system is None:
            continue
        position = checkpoint.positions.get(ssp, {})
        offset = position.get("offset")
        if offset is None or offset == "":
            log.debug("no event offset for %s: no SDK checkpoint row", ssp)
            continue
        sequence_number = position.get("sequence_number")
        if sequence_number is None:
            sequence_number = str(int(next_offset) - 1)
        rows.append(
            {
                "PartitionKey": system.partition_key(ssp.stream),
                "RowKey": str(ssp.partition),
                "offset": str(offset),
                "sequencenumber": str(sequence_number),
            }
        )
    return rows

