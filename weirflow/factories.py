"""Resolving `*.factory` config values to plugin instances.

A value is either an alias registered as an entry point (``local``; later ``azure``, ``eventhub``, ...) or a
``package.module:Class`` path. A wrong value fails at start, naming the key, the file and the known aliases.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any, TypeVar

from weirflow.errors import ConfigError, FactoryError
from weirflow.interfaces.checkpoint import CheckpointManagerFactory
from weirflow.interfaces.coordination import JobCoordinatorFactory
from weirflow.interfaces.metadata import MetadataStoreFactory
from weirflow.interfaces.system import SystemFactory

T = TypeVar("T")

COORDINATORS = "weirflow.coordinators"
CHECKPOINTS = "weirflow.checkpoints"
METADATA = "weirflow.metadata"
SYSTEMS = "weirflow.systems"


def known_aliases(group: str) -> list[str]:
    return sorted({ep.name for ep in entry_points(group=group)})


def _load(value: str, group: str, base: type[T], key: str, source: str) -> T:
    if ":" in value:
        module_name, attr = value.split(":", 1)
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise FactoryError(f"cannot import module '{module_name}' ({exc})", key=key, source=source) from exc
        cls = getattr(module, attr, None)
        if cls is None:
            raise FactoryError(f"module '{module_name}' has no attribute '{attr}'", key=key, source=source)
    else:
        matches = [ep for ep in entry_points(group=group) if ep.name == value]
        if not matches:
            aliases = ", ".join(known_aliases(group)) or "(none installed)"
            raise FactoryError(
                f"unknown alias '{value}'; known aliases: {aliases} (or give a 'package.module:Class' path)",
                key=key,
                source=source,
            )
        try:
            cls = matches[0].load()
        except ImportError as exc:
            raise FactoryError(
                f"alias '{value}' is registered but cannot be imported ({exc}); is its extra installed?",
                key=key,
                source=source,
            ) from exc
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise FactoryError(f"'{value}' must be a class implementing {base.__name__}", key=key, source=source)
    return cls()


def _resolve(config: Any, key: str, group: str, base: type[T]) -> T:
    return _load(str(config.get(key)), group, base, key, config.source_of(key))


def coordinator_factory(config: Any) -> JobCoordinatorFactory:
    return _resolve(config, "job.coordinator.factory", COORDINATORS, JobCoordinatorFactory)


def checkpoint_factory(config: Any) -> CheckpointManagerFactory:
    return _resolve(config, "task.checkpoint.factory", CHECKPOINTS, CheckpointManagerFactory)


def metadata_store_factory(config: Any) -> MetadataStoreFactory:
    """`metadata.store.factory`, or when unset the coordinator's alias: a job switches backends with one key."""
    key = "metadata.store.factory"
    if config.get(key) is None:
        key = "job.coordinator.factory"
    return _load(str(config.get(key)), METADATA, MetadataStoreFactory, key, config.source_of(key))


def system_factory(config: Any, system_name: str) -> SystemFactory:
    key = f"systems.{system_name}.factory"
    value = config.get(key)
    if value is None:
        if system_name != "local":
            raise ConfigError(
                f"system '{system_name}' has no factory; set it to an alias ({', '.join(known_aliases(SYSTEMS))}) "
                "or a 'package.module:Class' path",
                key=key,
                source=config.source,
            )
        value = "local"
    return _load(str(value), SYSTEMS, SystemFactory, key, config.source_of(key))


def validate_factories(config: Any) -> None:
    """Resolve every configured factory so that a wrong value fails before anything starts."""
    coordinator_factory(config)
    checkpoint_factory(config)
    metadata_store_factory(config)
    for system in sorted({config.get("job.default.system"), *config.names("systems")}):
        system_factory(config, system)
