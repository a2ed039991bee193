"""The ``eventhub`` alias: `systems.<name>.factory: eventhub`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from weirflow.interfaces.config import ConfigView
from weirflow.interfaces.stream_names import declared_streams
from weirflow.interfaces.system import SystemAdmin, SystemConsumer, SystemFactory, SystemProducer
from weirflow_azure.eventhubs.clients import EventHubSystemAdmin, EventHubSystemConsumer
from weirflow_azure.eventhubs.producer import EventHubSystemProducer
from weirflow_azure.eventhubs.settings import EventHubsSettings


def _hubs_of(system: str, config: ConfigView) -> dict[str, int]:
    """Physical hubs of the streams configured on ``system`` (what `list_streams` can know of), named by
    core's own stream resolution so the hubs listed are the ones the job reads and writes."""
    return {
        ref.physical: config.get(f"streams.{ref.stream_id}.partitions")
        for ref in declared_streams(config)
        if ref.system == system
    }


def _sdk_checkpoints(system: str, config: ConfigView) -> Callable[[], tuple[Any, Any]]:
    """Opens, when first asked, the job's SDK-layout checkpoint blobs and this system as the SDKs name it (for
    ``start: sdk-checkpoint``). A job without a storage account gets the storage settings' own config error,
    naming the keys to set."""

    def open_() -> tuple[Any, Any]:
        from weirflow_azure.eventhubs.checkpoint_blobs import open_blob_checkpoints
        from weirflow_azure.eventhubs.checkpoint_layout import eventhubs_system

        return open_blob_checkpoints(config), eventhubs_system(system, config)

    return open_


class EventHubSystemFactory(SystemFactory):
    def get_admin(self, system_name: str, config: ConfigView) -> SystemAdmin:
        return EventHubSystemAdmin(
            EventHubsSettings.from_config(system_name, config),
            _hubs_of(system_name, config),
            _sdk_checkpoints(system_name, config),
        )

    def get_consumer(self, system_name: str, config: ConfigView) -> SystemConsumer:
        return EventHubSystemConsumer(EventHubsSettings.from_config(system_name, config))

    def get_producer(self, system_name: str, config: ConfigView) -> SystemProducer:
        return EventHubSystemProducer(EventHubsSettings.from_config(system_name, config))
