"""Every installed configuration key: core's (`weirflow.config.keys.KEYS`), then each plugin's, read from the
``weirflow.config_keys`` entry points (`weirflow.interfaces.config` says how a plugin declares them). The loader
validates a job's config against `registered_keys` and `docs/configuration.md` is rendered from it."""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from importlib.metadata import EntryPoint

from weirflow.config.keys import KEYS
from weirflow.interfaces.config import CONFIG_KEYS_GROUP, ConfigKey
from weirflow.interfaces.plugins import registered

log = logging.getLogger("weirflow.config")


def _entry_point_order(ep: EntryPoint) -> tuple[bool, str]:
    """Core's own packages first (the embedded default), then the plugins by alias: a stable reference."""
    return (not ep.value.startswith("weirflow."), ep.name)


def _keys_of(ep: EntryPoint) -> list[ConfigKey]:
    """The keys one ``weirflow.config_keys`` entry point declares: a sequence of `ConfigKey`, or a callable
    returning one. A plugin that cannot be loaded is skipped with a warning (its keys then warn as unknown)."""
    try:
        declared = ep.load()
        if callable(declared):
            declared = declared()
        keys = list(declared)
    except Exception as exc:
        log.warning("config keys of plugin '%s' (%s) cannot be loaded: %s", ep.name, ep.value, exc)
        return []
    bad = [k for k in keys if not isinstance(k, ConfigKey)]
    if bad:
        log.warning(
            "config keys of plugin '%s' (%s) are not all ConfigKey (%r): skipped", ep.name, ep.value, bad[0]
        )
        return []
    return keys


def plugin_keys(eps: Iterable[EntryPoint] | None = None) -> tuple[ConfigKey, ...]:
    """Every key the ``weirflow.config_keys`` entry points (or ``eps``) declare, in a stable order. A key
    declared twice for the same owner (same name, same ``system``) keeps its first declaration, core's first."""
    seen = {(k.name, k.system) for k in KEYS}
    found: list[ConfigKey] = []
    points = registered(CONFIG_KEYS_GROUP) if eps is None else eps
    for ep in sorted(points, key=_entry_point_order):
        for key in _keys_of(ep):
            if (key.name, key.system) in seen:
                log.warning("config key '%s' of plugin '%s' is declared already: ignored", key.name, ep.name)
                continue
            seen.add((key.name, key.system))
            found.append(key)
    return tuple(found)


@functools.cache
def registered_keys() -> tuple[ConfigKey, ...]:
    """Core's keys, then every installed plugin's (read once per process)."""
    return KEYS + plugin_keys()
