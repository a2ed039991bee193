"""weirflow: Samza-grade coordination and operations for PySpark streaming jobs."""

from weirflow.pipeline.api import App, PipelineError, Stream

__all__ = ["App", "PipelineError", "Stream", "__version__"]

__version__ = "0.1.0"
