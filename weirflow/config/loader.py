"""Loading a job's config: YAML or .properties, flattened to dotted keys, `${ENV}` interpolation, `--set`
overrides, typed access with declared defaults, and errors that name the key and the file."""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from weirflow.config.keys import FREE_PREFIXES, KEYS, ConfigKey
from weirflow.errors import ConfigError

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


_EXACT: dict[str, ConfigKey] = {k.name: k for k in KEYS if "<" not in k.name}
_PATTERNS: list[tuple[re.Pattern[str], ConfigKey]] = [(_pattern_regex(k.name), k) for k in KEYS if "<" in k.name]


def known_key(name: str) -> ConfigKey | None:
    """The declaration matching ``name`` (exact or pattern), or None."""
    if name in _EXACT:
        return _EXACT[name]
    for regex, key in _PATTERNS:
        if regex.match(name):
            return key
    return None


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


def _convert(key: ConfigKey, name: str, value: Any, source: str) -> Any:
    def bad(expected: str) -> ConfigError:
        return ConfigError(f"value {value!r} is not {expected}", key=name, source=source)

    if value is None:
        return None
    if key.type == "str":
        return str(value)
    if key.type == "int":
        if isinstance(value, bool):
            raise bad("an integer")
        try:
            return int(str(value).strip())
        except ValueError:
            raise bad("an integer") from None
    if key.type == "bool":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise bad("a boolean (true/false)")
    if key.type == "list":
        if isinstance(value, list):
            return [str(v).strip() for v in value if str(v).strip()]
        return [v.strip() for v in str(value).split(",") if v.strip()]
    if key.type == "duration_ms":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        match = _DURATION.match(str(value))
        if not match:
            raise bad("a duration (milliseconds, or like 500ms, 15s, 2m, 1h)")
        return int(match.group(1)) * _DURATION_UNITS[match.group(2)]
    raise AssertionError(key.type)


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
        self._validate()

    # --- construction ---------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "<dict>", base_dir: Path | None = None) -> Config:
        flat = _flatten(data)
        values = {k: _interpolate(v, k, source) for k, v in flat.items()}
        return cls(values, {k: source for k in values}, source, base_dir or Path.cwd())

    def with_overrides(self, overrides: Mapping[str, Any]) -> Config:
        values = dict(self._values)
        sources = dict(self._sources)
        for key, value in overrides.items():
            values[key] = _interpolate(value, key, OVERRIDE_SOURCE)
            sources[key] = OVERRIDE_SOURCE
        return Config(values, sources, self.source, self.base_dir)

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
        declared = known_key(key)
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

    def raw(self, key: str) -> Any:
        return self._values.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def source_of(self, key: str) -> str:
        return self._sources.get(key, DEFAULT_SOURCE)

    def names(self, prefix: str) -> list[str]:
        start = prefix.rstrip(".") + "."
        return sorted({k[len(start) :].split(".", 1)[0] for k in self._values if k.startswith(start)})

    def subset(self, prefix: str) -> dict[str, Any]:
        start = prefix.rstrip(".") + "."
        return {k[len(start) :]: v for k, v in self._values.items() if k.startswith(start)}

    def effective(self) -> dict[str, Any]:
        values = {k.name: k.default for k in KEYS if "<" not in k.name and k.default not in (None, [])}
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

    # --- validation -----------------------------------------------------------------------------------
    def _validate(self) -> None:
        for name, value in self._values.items():
            declared = known_key(name)
            if declared is not None:
                _convert(declared, name, value, self.source_of(name))
            elif not name.startswith(FREE_PREFIXES):
                self._warn_unknown(name)
        for key in KEYS:
            if key.required and key.name not in self._values:
                raise ConfigError("is required but not set", key=key.name, source=self.source)

    def _warn_unknown(self, name: str) -> None:
        candidates = list(_EXACT)
        segments = name.split(".")
        for key in KEYS:
            if "<" in key.name:
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
