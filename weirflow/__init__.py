"""weirflow: Samza-grade coordination and operations for PySpark streaming jobs.

The pipeline API (`App`, `Stream`, `PipelineError`) is loaded on first use: a plugin that imports one of the
public helpers (`weirflow.base.clock`, `weirflow.base.errors`, ...) loads the package, and with this it loads
no core code (and no PySpark) with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from weirflow.pipeline import aggregate as agg
    from weirflow.pipeline.api import App, PipelineError, Stream

__all__ = ["App", "PipelineError", "Stream", "__version__", "agg"]

from weirflow.base.version import __version__

_API = frozenset({"App", "PipelineError", "Stream"})


def __getattr__(name: str) -> Any:
    if name in _API:
        from weirflow.pipeline import api

        return getattr(api, name)
    if name == "agg":  # the aggregations of `Stream.aggregate`
        from weirflow.pipeline import aggregate

        return aggregate
    raise AttributeError(f"module 'weirflow' has no attribute {name!r}")
