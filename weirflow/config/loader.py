"""Loading a job's config: YAML or .properties, flattened to dotted keys, `${ENV}` interpolation, `--set`
overrides, typed access with declared defaults, and errors that name the key and the file."""

from __future__ import annotations

import difflib
import functools
import json
import logging
import os
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from weirflow.base.errors import ConfigError
from weirflow.config.keys import FREE_PREFIXES, ConfigKey
from weirflow.config.registry import registered_keys
from weirflow.interfaces.plugins import SYSTEMS, is_plugin_factory, system_factory_value

log = logging.getLogger("weirflow.config")

OVERRIDE_SOURCE = "--set"
DEFAULT_SOURCE = "<default>"
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h)?\s*$")
_DURATION_UNITS = {None: 1, "ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}
_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}
_SECRET_WORDS = ("password", "secret", "token", "sas", "credential", "connection.string", "connectionstring")
_SECRET_IN_VALUE = re.compile(r"((?:SharedAccessKey|AccountKey|SharedAccessSignature)=)[^;]*", re.IGNORECASE)


def _pattern_regex(name: str) -> re.Pattern[str]:
    parts = [r"[^.]+" if re.fullmatch(r"<[a-z]+>", p) else re.escape(p) for p in name.split(".")]
    return re.compile("^" + r"\.".join(parts) + "$")


class _Registry:
    """The registered keys (core's and every plugin's, `registered_keys`), indexed for lookups."""

    def __init__(self, keys: Sequence[ConfigKey]) -> None:
        self.keys = tuple(keys)
        self.exact: dict[str, ConfigKey] = {}
        for key in self.keys:
            if "<" not in key.name:
                self.exact.setdefault(key.name, key)
        self.patterns = [(_pattern_regex(k.name), k) for k in self.keys if "<" in k.name]
        # Deprecated name -> current name.
        self.aliases: dict[str, str] = {alias: k.name for k in self.keys for alias in k.aliases}

    def matches(self, name: str) -> list[ConfigKey]:
        """Every declaration of ``name``: the exact key, or each pattern matching it (one per owning plugin)."""
        if name in self.exact:
            return [self.exact[name]]
        return [key for regex, key in self.patterns if regex.match(name)]


@functools.cache
def _registry() -> _Registry:
    return _Registry(registered_keys())


def known_key(name: str) -> ConfigKey | None:
    """The (first) declaration matching ``name`` (exact or pattern), or None."""
    found = _registry().matches(name)
    return found[0] if found else None


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def parse_properties(text: str) -> dict[str, str]:
    """Java .properties: `k=v`, `k: v`, `k v`, `#`/`!` comments, trailing-backslash continuations."""
    result: dict[str, str] = {}
    logical: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].lstrip()
        i += 1
        if not logical and (not line or line[0] in "#!"):
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            logical.append(line[:-1])
            continue
        logical.append(line)
        entry = "".join(logical)
        logical = []
        match = re.match(r"^((?:\\.|[^=:\s])+)\s*[=:\s]\s*(.*)$", entry)
        if match:
            key, value = match.group(1), match.group(2)
        else:
            key, value = entry.strip(), ""
        result[key.replace("\\", "")] = value.replace("\\\\", "\\")
    return result


def _read_file(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    text = path.read_text()
    suffix = path.suffix.lower()
    if suffix in (".yaml", ".yml"):
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"is not valid YAML: {exc}", source=str(path)) from exc
        if not isinstance(data, Mapping):
            raise ConfigError("must hold a mapping of keys at the top level", source=str(path))
        return _flatten(data)
    if suffix == ".properties":
        return parse_properties(text)
    raise ConfigError(f"config file {path} must end in .yaml, .yml or .properties")


def _interpolate(value: Any, key: str, source: str) -> Any:
    if isinstance(value, list):
        return [_interpolate(v, key, source) for v in value]
    if not isinstance(value, str) or "${" not in value:
        return value

    def replace(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise ConfigError(
            f"uses ${{{name}}} but the environment variable {name} is not set "
            f"(set it, or write ${{{name}:-default}})",
            key=key,
            source=source,
        )

    return _ENV.sub(replace, value)


def _to_str(value: Any, bad: Callable[[str], ConfigError]) -> str:
    return str(value)


def _to_int(value: Any, bad: Callable[[str], ConfigError]) -> int:
    if isinstance(value, bool):
        raise bad("an integer")
    try:
        return int(str(value).strip())
    except ValueError:
        raise bad("an integer") from None


def _to_bool(value: Any, bad: Callable[[str], ConfigError]) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise bad("a boolean (true/false)")


def _to_list(value: Any, bad: Callable[[str], ConfigError]) -> list[str]:
    if isinstance(value, list):
        return [str(v).strip() for v in value if str(v).strip()]
    return [v.strip() for v in str(value).split(",") if v.strip()]


def _to_duration_ms(value: Any, bad: Callable[[str], ConfigError]) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = _DURATION.match(str(value))
    if not match:
        raise bad("a duration (milliseconds, or like 500ms, 15s, 2m, 1h)")
    return int(match.group(1)) * _DURATION_UNITS[match.group(2)]


# One converter per `KeyType`; each gets the value (never None) and makes the error naming key, file, value.
_CONVERTERS: dict[str, Callable[[Any, Callable[[str], ConfigError]], Any]] = {
    "str": _to_str,
    "int": _to_int,
    "bool": _to_bool,
    "list": _to_list,
    "duration_ms": _to_duration_ms,
}


def _convert(key: ConfigKey, name: str, value: Any, source: str) -> Any:
    def bad(expected: str) -> ConfigError:
        return ConfigError(f"value {value!r} is not {expected}", key=name, source=source)

    if value is None:
        return None
    converter = _CONVERTERS.get(key.type)
    if converter is None:
        raise AssertionError(key.type)
    return converter(value, bad)


def _is_secret(name: str) -> bool:
    key = known_key(name)
    if key is not None and key.secret:
        return True
    lowered = name.lower()
    segments = lowered.split(".")
    return (
        any(word in lowered for word in _SECRET_WORDS)
        or segments[-1] in ("key", "accountkey", "sharedaccesskey")
        or lowered.endswith("account.key")
    )


class Config:
    """An immutable, typed view of a job's configuration. See docs/configuration.md for every key."""

    def __init__(self, values: Mapping[str, Any], sources: Mapping[str, str], source: str, base_dir: Path) -> None:
        self._values = dict(values)
        self._sources = dict(sources)
        self.source = source
        self.base_dir = base_dir
        self.warnings: list[str] = []
        self._rename_deprecated()
        self._validate()

    # --- construction ---------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "<dict>", base_dir: Path | None = None) -> Config:
        flat = _flatten(data)
        values = {k: _interpolate(v, k, source) for k, v in flat.items()}
        return cls(values, {k: source for k in values}, source, base_dir or Path.cwd())

    def with_values(self, values: Mapping[str, Any], source: str) -> Config:
        """A copy of this config with ``values`` set (``source`` names where they came from, for `source_of`)."""
        config = Config.from_snapshot(self.snapshot())
        for key, value in values.items():
            config._values[key] = value
            config._sources[key] = source
        config._validate()
        return config

    def snapshot(self) -> str:
        """JSON of this config, to rebuild it in another process (Spark's data-source and worker processes)."""
        return json.dumps(
            {
                "values": self._values,
                "sources": self._sources,
                "source": self.source,
                "base_dir": str(self.base_dir),
            }
        )

    @classmethod
    def from_snapshot(cls, text: str) -> Config:
        data = json.loads(text)
        config = cls.__new__(cls)
        config._values = dict(data["values"])
        config._sources = dict(data["sources"])
        config.source = data["source"]
        config.base_dir = Path(data["base_dir"])
        config.warnings = []
        return config

    # --- access ---------------------------------------------------------------------------------------
    _MISSING = object()

    def get(self, key: str, default: Any = _MISSING) -> Any:
        key = _registry().aliases.get(key, key)
        declared = self._declaration(key)
        if key in self._values:
            value = self._values[key]
            return _convert(declared, key, value, self.source_of(key)) if declared else value
        if default is not Config._MISSING:
            return default
        if declared is None:
            return None
        if declared.required:
            raise ConfigError("is required but not set", key=key, source=self.source)
        return list(declared.default) if isinstance(declared.default, list) else declared.default

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def source_of(self, key: str) -> str:
        return self._sources.get(_registry().aliases.get(key, key), DEFAULT_SOURCE)

    def names(self, prefix: str) -> list[str]:
        start = prefix.rstrip(".") + "."
        return sorted({k[len(start) :].split(".", 1)[0] for k in self._values if k.startswith(start)})

    def subset(self, prefix: str) -> dict[str, Any]:
        start = prefix.rstrip(".") + "."
        return {k[len(start) :]: v for k, v in self._values.items() if k.startswith(start)}

    def effective(self) -> dict[str, Any]:
        values = {name: k.default for name, k in _registry().exact.items() if k.default not in (None, [])}
        values.update(self._values)
        return dict(sorted(values.items()))

    def masked(self) -> dict[str, Any]:
        masked: dict[str, Any] = {}
        for key, value in self.effective().items():
            if value not in (None, "") and _is_secret(key):
                masked[key] = "****"
            elif isinstance(value, str):
                masked[key] = _SECRET_IN_VALUE.sub(r"\1****", value)
            else:
                masked[key] = value
        return masked

    def path(self, key: str) -> Path:
        value = Path(os.path.expanduser(str(self.get(key))))
        return value if value.is_absolute() else (self.base_dir / value).resolve()

    def state_dir(self) -> Path:
        return self.path("job.state.dir")

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(message, key=key, source=self.source_of(key) if key in self._values else self.source)

    # --- plugin-owned keys ---------------------------------------------------------------------------------
    def _owner_verdict(self, name: str, key: ConfigKey) -> bool | None:
        """Whether ``key`` (a declaration of ``name``) applies here: True for a key no system plugin owns, else
        whether the system's factory is the owning plugin; None when that cannot be told (no factory set on
        the system, or its class does not import: resolving the factory reports that)."""
        if key.system is None:
            return True
        value = system_factory_value(self, name.split(".")[1])
        return None if value is None else is_plugin_factory(value, key.system, SYSTEMS)

    def _declaration(self, name: str) -> ConfigKey | None:
        """The declaration of ``name`` that applies to this config: with several (system plugins declaring the
        same ``systems.<name>.*`` key) the one owned by the system's factory; else the first."""
        candidates = _registry().matches(name)
        if len(candidates) > 1:
            for key in candidates:
                if self._owner_verdict(name, key):
                    return key
        return candidates[0] if candidates else None

    def _wrong_system(self, name: str, owned: list[ConfigKey]) -> ConfigError:
        system, setting = name.split(".", 2)[1:]
        owners = " or ".join(sorted({k.system or "" for k in owned}))
        factory = system_factory_value(self, system)
        how = " (the default of the system named 'local')" if f"systems.{system}.factory" not in self else ""
        return ConfigError(
            f"'{setting}' is a key of the {owners} system plugin (systems.<name>.{setting} applies only to "
            f"systems whose factory is {owners}), but system '{system}' uses factory '{factory}'{how}; remove "
            f"it, or set it on a system with factory: {owners}",
            key=name,
            source=self.source_of(name),
        )

    # --- deprecated names ---------------------------------------------------------------------------------
    def _rename_deprecated(self) -> None:
        """Read each deprecated alias (`ConfigKey.aliases`) as its key, warning (DeprecationWarning and log)."""
        for alias, current in _registry().aliases.items():
            if alias not in self._values:
                continue
            value, source = self._values.pop(alias), self._sources.pop(alias, self.source)
            if current in self._values and self._values[current] != value:
                raise ConfigError(
                    f"is the deprecated name of '{current}', which is also set (in {self.source_of(current)}) to "
                    f"another value; keep only '{current}'",
                    key=alias,
                    source=source,
                )
            self._values.setdefault(current, value)
            self._sources.setdefault(current, source)
            message = f"config key '{alias}' in {source} is deprecated: it is read as '{current}'; use '{current}'"
            self.warnings.append(message)
            log.warning(message)
            warnings.warn(message, DeprecationWarning, stacklevel=4)

    # --- validation -----------------------------------------------------------------------------------
    def _validate(self) -> None:
        for name, value in self._values.items():
            self._validate_value(name, value)
        for key in _registry().keys:
            if key.required and key.name not in self._values:
                raise ConfigError("is required but not set", key=key.name, source=self.source)

    def _validate_value(self, name: str, value: Any) -> None:
        candidates = _registry().matches(name)
        if not candidates:
            if not name.startswith(FREE_PREFIXES):
                self._warn_unknown(name)
            return
        applicable = [key for key in candidates if self._owner_verdict(name, key) is not False]
        if not applicable:
            raise self._wrong_system(name, candidates)
        _convert(applicable[0], name, value, self.source_of(name))

    def _warn_unknown(self, name: str) -> None:
        registry = _registry()
        candidates = list(registry.exact)
        segments = name.split(".")
        for _, key in registry.patterns:
            parts = key.name.split(".")
            if len(segments) > 1:
                parts = [
                    segments[i] if p.startswith("<") and i < len(segments) else p for i, p in enumerate(parts)
                ]
            candidates.append(".".join(parts))
        close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        message = f"unknown config key '{name}' in {self.source_of(name)}{hint}"
        self.warnings.append(message)
        log.warning(message)


def _parse_override(item: str) -> tuple[str, str]:
    if "=" not in item or not item.split("=", 1)[0].strip():
        raise ConfigError(f"--set {item!r} must look like key=value")
    key, value = item.split("=", 1)
    return key.strip(), value


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> Config:
    """Read a YAML or .properties file, apply ``key=value`` overrides, validate every known key's type."""
    file = Path(path).resolve()
    source = str(file)
    flat = _read_file(file)
    values = {k: _interpolate(v, k, source) for k, v in flat.items()}
    sources = {k: source for k in values}
    for item in overrides:
        key, value = _parse_override(item)
        values[key] = _interpolate(value, key, OVERRIDE_SOURCE)
        sources[key] = OVERRIDE_SOURCE
    return Config(values, sources, source, file.parent)
