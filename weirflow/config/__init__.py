"""Job configuration: loading, typed access and the registry of every key (`keys.py`)."""

from weirflow.config.loader import Config, load_config
from weirflow.errors import ConfigError

__all__ = ["Config", "ConfigError", "load_config"]
