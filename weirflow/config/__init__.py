"""Job configuration: loading, typed access and the registry of every key (`keys.py`)."""

from weirflow.base.errors import ConfigError
from weirflow.config.loader import Config, load_config

__all__ = ["Config", "ConfigError", "load_config"]
