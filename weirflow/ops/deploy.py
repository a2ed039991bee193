"""What a deployment must provide for a job: the streams it reads and writes on one system, with their partition
counts, so infrastructure code (infra/, docs/deploy.md) creates the hubs the job will find.

Systems like Event Hubs are infrastructure: weirflow checks their streams and never creates them
(`SystemAdmin.create_stream`), so a deployment must create every one of them beforehand — the inputs, their
dead-letter streams (`weirflow.job.systems.dead_letter_stream`), the pipeline's intermediate streams and its
outputs —
with the partition counts the job expects. `hubs_to_create` lists them by the planner's own rules
(`weirflow.pipeline.plan.intermediate_partitions`, `weirflow.job.systems`), from config alone (nothing is
contacted). `weirflow deploy hubs CONFIG` prints them.
"""

from __future__ import annotations

from dataclasses import dataclass

from weirflow.interfaces.config import ConfigView
from weirflow.job.mode import JobMode
from weirflow.job.systems import StreamRef, dead_letter_stream, declared_streams, stream_ref


@dataclass(frozen=True, order=True)
class Hub:
    """A stream to create: its physical name on the system and its partition count."""

    name: str
    partitions: int


def _partitions(config: ConfigView, stream_id: str) -> int:
    key = f"streams.{stream_id}.partitions"
    count = config.get(key)
    if not count:
        raise config.error(key, "is not set: a deployment creates the stream, so it needs the partition count")
    return int(count)


def hubs_to_create(config: ConfigView, system: str) -> list[Hub]:
    """Every stream of the job on ``system``: streams declared under ``streams.<id>`` and, for a pipeline job
    (`app.pipeline`), each input's dead-letter stream and every intermediate stream. Loading a pipeline needs an
    active SparkSession (its code builds Spark columns); `weirflow deploy hubs` starts one."""
    found: dict[str, Hub] = {}

    def add(ref: StreamRef, partitions: int) -> None:
        if ref.system == system:
            found[ref.physical] = Hub(ref.physical, partitions)

    for ref in declared_streams(config):
        if config.get(f"streams.{ref.stream_id}.partitions"):
            add(ref, _partitions(config, ref.stream_id))
    if JobMode.of(config) is JobMode.PIPELINE:
        from weirflow.pipeline.plan import intermediate_partitions, load_pipeline

        app = load_pipeline(config)
        counts = {stream_id: _partitions(config, stream_id) for stream_id in app.inputs}
        for stream_id, count in counts.items():
            ref = stream_ref(config, stream_id)
            add(ref, count)
            add(StreamRef(stream_id, ref.system, dead_letter_stream(ref.physical)), count)
        intermediate = intermediate_partitions(config, lambda: list(counts.values()))
        for stream_id in app.intermediates:
            add(stream_ref(config, stream_id, intermediate=True), intermediate)
        for sink in app.sinks:
            if not sink.intermediate and sink.serve is None:
                add(stream_ref(config, sink.stream_id), _partitions(config, sink.stream_id))
    return sorted(found.values())
