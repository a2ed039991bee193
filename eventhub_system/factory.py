"""The ``eventhub`` alias: `systems.<name>.factory: eventhub`."""

from __future__ import annotations

from typing import Any

from weirflow.interfaces.system import SystemAdmin, SystemConsumer, SystemFactory, SystemProducer
from weirflow_azure.eventhubs.clients import EventHubSystemAdmin, EventHubSystemConsumer, EventHubSystemProducer
from weirflow_azure.eventhubs.settings import EventHubsSettings


def _hubs_of(system: str, config: Any) -> dict[str, int]:
    """Physical hubs of the streams configured on ``system`` (what `list_streams` can know of)."""
    hubs = {}
    for stream in config.names("streams"):
        if (config.get(f"streams.{stream}.system") or config.get("job.default.system")) == system:
            hubs[config.get(f"streams.{stream}.physical.name") or stream] = config.get(
                f"streams.{stream}.partitions"
            )
    return hubs


class EventHubSystemFactory(SystemFactory):
    def get_admin(self, system_name: str, config: Any) -> SystemAdmin:
        return EventHubSystemAdmin(
            EventHubsSettings.from_config(system_name, config), _hubs_of(system_name, config)
        )

    def get_consumer(self, system_name: str, config: Any) -> SystemConsumer:
        return EventHubSystemConsumer(EventHubsSettings.from_config(system_name, config))

    def get_producer(self, system_name: str, config: Any) -> SystemProducer:
        return EventHubSystemProducer(EventHubsSettings.from_config(system_name, config))
