"""Resolving `*.factory` config values to plugin instances.

A value is either an alias registered as an entry point (``local``, ``azure``, ``eventhub``, ...) or a
``package.module:Class`` path. A wrong value fails at start, naming the key, the file and the known aliases.
"""

from __future__ import annotations

import functools
import importlib
from importlib.metadata import EntryPoint, entry_points
from typing import TypeVar

from weirflow.base.errors import ConfigError, FactoryError
from weirflow.interfaces.checkpoint import CheckpointManagerFactory
from weirflow.interfaces.config import ConfigView
from weirflow.interfaces.coordination import JobCoordinatorFactory
from weirflow.interfaces.metadata import MetadataStoreFactory
from weirflow.interfaces.spark_state import SparkStateStoreFactory
from weirflow.interfaces.system import SystemFactory

T = TypeVar("T")

COORDINATORS = "weirflow.coordinators"
CHECKPOINTS = "weirflow.checkpoints"
METADATA = "weirflow.metadata"
SYSTEMS = "weirflow.job.systems"
SPARK_STATE = "weirflow.spark_state"


@functools.cache
def registered(group: str) -> tuple[EntryPoint, ...]:
    """The entry points of ``group``, read once per process. Python reads every installed distribution's
    metadata on each `entry_points` call (about 6 ms in a venv of the project's extras), and a processor
    resolves factories many times a second: a fence check before each sink batch, each config validation of a
    status read. A plugin installed later is seen by the next process, as with any import."""
    return tuple(entry_points(group=group))


def known_aliases(group: str) -> list[str]:
    return sorted({ep.name for ep in registered(group)})


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
        matches = [ep for ep in registered(group) if ep.name == value]
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


def _import_class(path: str) -> object | None:
    module_name, _, attr = path.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr, None)
    except Exception:
        return None


@functools.cache
def is_plugin_factory(value: str, alias: str, group: str) -> bool | None:
    """Whether the factory ``value`` (an alias or a ``package.module:Class`` path) is the plugin registered as
    ``alias`` in ``group``: the same alias or class, or a subclass of it. None when that cannot be told
    because ``value``'s class cannot be imported (resolving it then fails, naming the key)."""
    registered_values = {ep.name: ep.value for ep in registered(group)}
    if alias not in registered_values:
        return False
    target = registered_values.get(value, value)
    if value == alias or target == registered_values[alias]:
        return True
    if ":" not in target:
        return False  # an unknown alias: not the plugin
    cls = _import_class(target)
    if cls is None:
        return None
    owner = _import_class(registered_values[alias])
    return isinstance(cls, type) and isinstance(owner, type) and issubclass(cls, owner)


def _resolve(config: ConfigView, key: str, group: str, base: type[T]) -> T:
    return _load(str(config.get(key)), group, base, key, config.source_of(key))


def coordinator_factory(config: ConfigView) -> JobCoordinatorFactory:
    return _resolve(config, "job.coordinator.factory", COORDINATORS, JobCoordinatorFactory)


def checkpoint_factory(config: ConfigView) -> CheckpointManagerFactory:
    return _resolve(config, "task.checkpoint.factory", CHECKPOINTS, CheckpointManagerFactory)


def metadata_store_factory(config: ConfigView) -> MetadataStoreFactory:
    """`metadata.store.factory`, or when unset the coordinator's alias: a job switches backends with one key."""
    key = "metadata.store.factory"
    if config.get(key) is None:
        key = "job.coordinator.factory"
    return _load(str(config.get(key)), METADATA, MetadataStoreFactory, key, config.source_of(key))


def spark_state_factory(config: ConfigView) -> SparkStateStoreFactory:
    """`task.spark.checkpoint.store`, or when unset the coordinator's alias when a store is registered under it
    (``azure``), else ``local`` (a coordinator without one keeps Spark state on local disk, as before)."""
    key = "task.spark.checkpoint.store"
    if config.get(key) is not None:
        return _resolve(config, key, SPARK_STATE, SparkStateStoreFactory)
    coordinator = str(config.get("job.coordinator.factory"))
    value = coordinator if coordinator in known_aliases(SPARK_STATE) else "local"
    return _load(value, SPARK_STATE, SparkStateStoreFactory, key, config.source_of(key))


def system_factory_value(config: ConfigView, system_name: str) -> str | None:
    """The factory of system ``system_name``: ``systems.<name>.factory``, or ``local`` for the system named
    ``local`` when unset (the embedded log); None when unset on any other system."""
    value = config.get(f"systems.{system_name}.factory")
    if value is None:
        return "local" if system_name == "local" else None
    return str(value)


def system_factory(config: ConfigView, system_name: str) -> SystemFactory:
    key = f"systems.{system_name}.factory"
    value = system_factory_value(config, system_name)
    if value is None:
        raise ConfigError(
            f"system '{system_name}' has no factory; set it to an alias ({', '.join(known_aliases(SYSTEMS))}) "
            "or a 'package.module:Class' path",
            key=key,
            source=config.source,
        )
    return _load(value, SYSTEMS, SystemFactory, key, config.source_of(key))


def validate_factories(config: ConfigView) -> None:
    """Resolve every configured factory so that a wrong value fails before anything starts."""
    coordinator_factory(config)
    checkpoint_factory(config)
    metadata_store_factory(config)
    spark_state_factory(config)
    for system in sorted({config.get("job.default.system"), *config.names("systems")}):
        system_factory(config, system)
