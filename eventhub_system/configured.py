"""Which of a job's systems are Event Hubs: those whose factory (``systems.<name>.factory``, resolved as the
runtime resolves every factory) is this plugin's `EventHubSystemFactory` or a subclass of it, whichever alias or
``package.module:Class`` path names it: the class is asked, not the spelling in config. The checkpoint manager
writes the SDKs' checkpoint layouts for them (`weirflow_azure.eventhubs.checkpoint_layout`)."""

from __future__ import annotations

from weirflow.interfaces.config import ConfigView
from weirflow_azure.eventhubs.checkpoint_layout import EventHubsSystem, eventhubs_system


def _event_hubs_factory_class() -> type | None:
    """This plugin's system factory class, or None when the Event Hubs SDK is not installed (then no system can
    be Event Hubs: one naming that factory fails at start, naming the missing extra)."""
    try:
        from weirflow_azure.eventhubs.factory import EventHubSystemFactory
    except ImportError:
        return None
    return EventHubSystemFactory


def eventhubs_systems(config: ConfigView) -> dict[str, EventHubsSystem]:
    """Every configured system backed by Event Hubs, by system name: a system whose factory, resolved as the
    runtime resolves it, is an `EventHubSystemFactory` (an alias, a path to the class or a subclass)."""
    from weirflow.interfaces.plugins import system_factory

    factory_class = _event_hubs_factory_class()
    if factory_class is None:
        return {}
    return {
        name: eventhubs_system(name, config)
        for name in config.names("systems")
        if isinstance(system_factory(config, name), factory_class)
    }
