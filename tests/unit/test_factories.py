"""Factory resolution: aliases from entry points, `module:Class` paths, and errors that list the aliases."""

from __future__ import annotations

from pathlib import Path

import pytest

from weirflow.base.errors import ConfigError, FactoryError
from weirflow.config import Config, load_config
from weirflow.interfaces.coordination import JobCoordinatorFactory
from weirflow.interfaces.plugins import (
    CHECKPOINTS,
    COORDINATORS,
    METADATA,
    SYSTEMS,
    checkpoint_factory,
    coordinator_factory,
    is_plugin_factory,
    known_aliases,
    metadata_store_factory,
    registered,
    system_factory,
    validate_factories,
)
from weirflow.local.factories import LocalCheckpointManagerFactory, LocalJobCoordinatorFactory, LocalSystemFactory


class CustomCoordinators(JobCoordinatorFactory):
    def get_coordination_utils(self, config, owner):  # pragma: no cover - never called here
        raise NotImplementedError


class NotAFactory:
    pass


def cfg(**values: str) -> Config:
    return Config.from_dict({"job.name": "x", **values})


@pytest.mark.parametrize("group", [COORDINATORS, CHECKPOINTS, METADATA, SYSTEMS])
def test_local_is_registered_in_every_group(group: str) -> None:
    assert "local" in known_aliases(group)


def test_the_local_aliases_resolve_to_the_embedded_backend() -> None:
    config = cfg()
    assert isinstance(coordinator_factory(config), LocalJobCoordinatorFactory)
    assert isinstance(checkpoint_factory(config), LocalCheckpointManagerFactory)
    assert metadata_store_factory(config) is not None
    assert isinstance(system_factory(config, "local"), LocalSystemFactory)


def test_a_module_class_path_is_imported() -> None:
    config = cfg(**{"job.coordinator.factory": "tests.unit.test_factories:CustomCoordinators"})
    assert isinstance(coordinator_factory(config), CustomCoordinators)


def test_an_unknown_alias_lists_the_known_ones_and_names_the_key_and_file(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("job: {name: x, coordinator.factory: zookeeper}\n")
    with pytest.raises(FactoryError) as err:
        coordinator_factory(load_config(path))
    message = str(err.value)
    assert "unknown alias 'zookeeper'" in message
    assert "known aliases: aws, azure, local" in message
    assert "job.coordinator.factory" in message and str(path) in message


def test_an_unimportable_module_is_named() -> None:
    with pytest.raises(FactoryError, match="cannot import module 'no_such_module'"):
        checkpoint_factory(cfg(**{"task.checkpoint.factory": "no_such_module:Thing"}))


def test_a_missing_attribute_is_named() -> None:
    with pytest.raises(FactoryError, match="has no attribute 'Nope'"):
        checkpoint_factory(cfg(**{"task.checkpoint.factory": "tests.unit.test_factories:Nope"}))


def test_a_class_that_does_not_implement_the_interface_is_rejected() -> None:
    with pytest.raises(FactoryError, match="implementing CheckpointManagerFactory"):
        checkpoint_factory(cfg(**{"task.checkpoint.factory": "tests.unit.test_factories:NotAFactory"}))


def test_only_the_local_system_has_a_default_factory() -> None:
    assert isinstance(system_factory(cfg(), "local"), LocalSystemFactory)
    with pytest.raises(ConfigError, match=r"systems\.events\.factory"):
        system_factory(cfg(), "events")


def test_validate_factories_fails_on_any_bad_system() -> None:
    with pytest.raises(FactoryError, match=r"systems\.eh\.factory"):
        validate_factories(cfg(**{"systems.eh.factory": "eventhubz"}))


class LocalSubclass(LocalSystemFactory):
    pass


def test_a_factory_is_a_plugin_s_by_alias_by_path_or_by_subclass() -> None:
    local_path = "weirflow.local.factories:LocalSystemFactory"
    assert is_plugin_factory("local", "local", SYSTEMS)
    assert is_plugin_factory(local_path, "local", SYSTEMS)
    assert is_plugin_factory(f"{__name__}:LocalSubclass", "local", SYSTEMS)
    assert is_plugin_factory(f"{__name__}:NotAFactory", "local", SYSTEMS) is False
    assert is_plugin_factory("eventhubz", "local", SYSTEMS) is False
    assert is_plugin_factory("local", "no-such-plugin", SYSTEMS) is False
    # A class that does not import cannot be told apart: resolving the factory reports it instead.
    assert is_plugin_factory("no_such_module_anywhere:Factory", "local", SYSTEMS) is None


def test_a_local_key_follows_a_subclass_of_the_local_factory() -> None:
    config = cfg(**{"systems.mine.factory": f"{__name__}:LocalSubclass", "systems.mine.path": "/tmp/mine.db"})
    assert config.get("systems.mine.path") == "/tmp/mine.db"


def test_entry_points_are_read_once_per_process_however_often_factories_are_resolved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A processor resolves the coordinator factory before every sink batch (the fence check): each read of the
    installed distributions' entry points costs milliseconds, so a group is read once and kept."""
    from weirflow.interfaces import plugins

    reads: list[str] = []
    real = plugins.entry_points

    def counted(*, group: str):  # type: ignore[no-untyped-def]
        reads.append(group)
        return real(group=group)

    registered.cache_clear()
    monkeypatch.setattr(plugins, "entry_points", counted)
    try:
        for _ in range(3):
            assert isinstance(
                coordinator_factory(cfg(**{"job.coordinator.factory": "local"})), LocalJobCoordinatorFactory
            )
        assert "local" in known_aliases(COORDINATORS)
        assert reads == [COORDINATORS]
    finally:
        registered.cache_clear()  # the next lookup reads the real entry points again
