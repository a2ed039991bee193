"""A job's streams at start (`PipelinePlan.ensure_streams`, docs/pipelines.md): every stream it needs exists
afterwards, and each one's partition count was asked of its system once (a stream made here: once, to find it
missing). On Event Hubs every such ask is a
management round trip: asking again for each check took seconds of every processor's start."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from weirflow.config.loader import Config
from weirflow.interfaces.system import StreamSpec
from weirflow.job.systems import Systems
from weirflow.pipeline.api import App
from weirflow.pipeline.plan import PipelinePlan


def test_a_two_stage_job_s_streams_are_made_and_each_one_s_partitions_asked_once(tmp_path: Path) -> None:
    config = Config.from_dict(
        {
            "job.name": "j",
            "job.id": "7",
            "job.state.dir": str(tmp_path),
            "streams.views.partitions": 3,  # created here
            "streams.counts.partitions": 2,
        },
        base_dir=tmp_path,
    )
    systems = Systems(config)
    admin = systems.admin("local")
    admin.create_stream(StreamSpec("counts", 2))  # exists already
    asked: Counter[str] = Counter()
    count = admin.partition_count

    def counting(stream: str) -> int:
        asked[stream] += 1
        return count(stream)

    admin.partition_count = counting  # type: ignore[method-assign]
    app = App(config)
    app.input("views").partition_by("page", name="by-page").send_to("counts")
    try:
        plan = PipelinePlan(app, config, systems)
        plan.ensure_streams()
        tasks = plan.plan_tasks()
        assert admin.list_streams() == {
            "views": 3,
            "views.dlq": 3,
            "j-7-by-page": 3,
            "counts": 2,
        }
        assert len(tasks) == 6  # both stages from the counts already asked
        assert max(asked.values()) == 1, asked
    finally:
        systems.close()
