"""The scripts of examples/reading_results as the tests load them: what a downstream application starts from,
run against the emulators exactly as written."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "reading_results"


def example(name: str) -> ModuleType:
    """examples/reading_results/<name>.py (``eventhubs``, ``kinesis``) as a module."""
    spec = importlib.util.spec_from_file_location(f"reading_results_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
