"""What a plugin sees of configuration: the keys it declares (`ConfigKey`) and the job's config (`ConfigView`).

**Declaring keys.** A plugin owns its keys: it lists them as `ConfigKey`s in its own package and registers
that sequence (or a no-argument callable returning one) under the ``weirflow.config_keys`` entry-point
group::

    [project.entry-points."weirflow.config_keys"]
    kinesis = "weirflow_kinesis.keys:KEYS"

Every installed plugin's keys are then validated at load (type, unknown-key suggestions) and rendered in the
one reference (``weirflow config-reference``, docs/configuration.md). A key under ``systems.<name>.`` that
belongs to a system plugin sets ``system`` to that plugin's alias in ``weirflow.job.systems``: it then applies
only to systems whose factory (``systems.<name>.factory``) is that plugin (the alias, a path to its class, or
a subclass); set on any other system it is a config error.

**Reading config.** Every factory receives a `ConfigView` (`weirflow.config.loader.Config` implements it):
typed values with declared defaults, where each value came from, and errors that name the key and file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from weirflow.base.errors import ConfigError

KeyType = Literal["str", "int", "bool", "list", "duration_ms"]

CONFIG_KEYS_GROUP = "weirflow.config_keys"


@dataclass(frozen=True)
class ConfigKey:
    """One key. ``default`` None with ``required`` False means "unset unless given".

    A name part written ``<name>`` or ``<id>`` is a placeholder for one dotted segment. ``system`` (only for
    ``systems.<name>.*`` keys) is the alias, in ``weirflow.job.systems``, of the system plugin owning the key.
    ``aliases`` are deprecated names still accepted for this key (each warns, naming this key)."""

    name: str
    type: KeyType
    default: Any
    doc: str
    section: str
    required: bool = False
    secret: bool = False
    system: str | None = None
    aliases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.system is not None and not self.name.startswith("systems.<name>."):
            raise ValueError(f"config key {self.name!r} names a system owner but is not a systems.<name>.* key")


@runtime_checkable
class ConfigView(Protocol):
    """The job's configuration as factories and plugins read it.

    * ``get(key)`` — the value converted to the key's declared type, or its declared default (``default``
      when given wins over the declared one); a required key that is unset raises `ConfigError`.
    * ``source_of(key)`` — the file the value came from, ``--set``, or ``<default>``.
    * ``names(prefix)`` — the distinct next segments under ``prefix`` (``names("systems")`` → system names).
    * ``path(key)`` — the value as a path, relative ones resolved against ``base_dir``; ``state_dir()`` is
      ``path("job.state.dir")``.
    * ``error(key, message)`` — a `ConfigError` naming the key and the file it came from, to raise.
    * ``source`` — the config file; ``base_dir`` — its directory.
    """

    source: str
    base_dir: Path

    def get(self, key: str, default: Any = ...) -> Any: ...

    def source_of(self, key: str) -> str: ...

    def names(self, prefix: str) -> list[str]: ...

    def path(self, key: str) -> Path: ...

    def state_dir(self) -> Path: ...

    def error(self, key: str, message: str) -> ConfigError: ...
