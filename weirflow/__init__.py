"""weirflow: Samza-grade coordination and operations for PySpark streaming jobs."""

__version__ = "0.1.0"
