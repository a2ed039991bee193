"""Importing the job's own code (`task.function`, `app.pipeline`): ``module:callable`` with the config file's
directory importable, and errors that name the key and the file."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

from weirflow.interfaces.config import ConfigView


def make_importable(config: ConfigView) -> None:
    """Put the config file's directory on ``sys.path``, where the job's code lives."""
    base = str(config.base_dir)
    if base not in sys.path:
        sys.path.insert(0, base)


def load_callable(config: ConfigView, key: str) -> Callable[..., Any]:
    target = config.get(key)
    if not target or ":" not in target:
        raise config.error(key, f"must be 'module:callable', got {target!r}")
    module_name, attr = target.split(":", 1)
    make_importable(config)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise config.error(key, f"cannot import module '{module_name}': {exc}") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise config.error(key, f"'{module_name}' has no callable '{attr}'")
    return fn
