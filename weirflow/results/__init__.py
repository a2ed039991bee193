"""Reading a job's results once: the formats of output record ids (`weirflow.results.ids`) and the filter that
tells a replayed record from a new one by its id (`weirflow.results.replay_filter`; docs/guarantees.md)."""

from weirflow.results.replay_filter import ReplayFilter

__all__ = ["ReplayFilter"]
