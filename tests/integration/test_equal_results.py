"""Equal results of one stateful task are all written, also across a SIGKILL (docs/guarantees.md, "Stateful
stages"): one page viewed 5 times in each of three minutes, counted per minute without the window in the
output (as an alert or a "top pages" feed would), is three equal results ``{"page": "/a", "views": 5}``. Plain
Spark writes three rows; so must the job, on the embedded default, when one processor is killed after the first
result reached the output stream and before Spark committed the batch that wrote it, and the next after Spark
committed the second result's batch and before the processor's checkpoint of it."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from tests.support.processors import KILLED, run_to_exit
from weirflow.config import load_config
from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.job.systems import Systems
from weirflow.results.ids import ResultId, parse
from weirflow.runtime.fault_points import ENV as FAULT_POINT

pytestmark = [pytest.mark.integration, pytest.mark.spark]

FINISH_S = 240

JOB = """
job:
  name: equal-results
app:
  pipeline: alerts:pipeline
streams:
  views:
    partitions: 1
    schema: "page string, event_time timestamp"
    event-time:
      field: event_time
    bounded: true
  counts:
    partitions: 1
spark:
  master: "local[2]"
"""

PIPELINE = """
from pyspark.sql import functions as F


def per_minute(views):
    return views.groupBy(F.window("event_time", "1 minute"), "page").count().select(
        "page", F.col("count").alias("views")
    )


def pipeline(app):
    app.input("views").partition_by("page").transform(per_minute).send_to("counts", key="page")
"""


def _written(systems: Systems) -> list[tuple[str | None, dict[str, object]]]:
    ref = systems.resolve("counts")
    records = systems.consumer(ref.system).read(SystemStreamPartition(ref.system, ref.physical, 0), "0", 1000)
    return [(r.id, json.loads(r.value)) for r in records]


def test_three_equal_windows_are_three_rows_also_when_processors_die_between_them(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(JOB)
    (tmp_path / "alerts.py").write_text(PIPELINE)
    # a batch per minute of views in the first stage, so that each window closes in a batch of its own
    overrides = [f"job.state.dir={tmp_path / 'state'}", "task.max.records.per.trigger=5"]
    config = load_config(tmp_path / "job.yaml", overrides)
    systems = Systems(config)
    try:
        for stream in ("views", "counts"):
            ref = systems.resolve(stream)
            systems.admin(ref.system).create_stream(StreamSpec(ref.physical, 1))
        start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
        views = [
            {"page": "/a", "event_time": (start + dt.timedelta(minutes=m, seconds=10 * i)).isoformat()}
            for m in range(3)
            for i in range(5)
        ]
        ref = systems.resolve("views")
        systems.producer(ref.system).send([OutgoingRecord(ref.physical, json.dumps(v).encode()) for v in views])

        # p0 dies right after the counting stage's first result reached `counts`, before Spark's commit
        job, logs = tmp_path / "job.yaml", tmp_path / "logs"
        fault = {FAULT_POINT: "before-spark-commit:partition_by_0-:1"}
        run_to_exit(job, "p0", overrides, logs, FINISH_S, KILLED, env=fault)
        before = _written(systems)
        assert [value for _, value in before] == [{"page": "/a", "views": 5}], before

        # p1 leaves p0's result out, writes the second window's and dies after Spark committed that batch,
        # before its checkpoint (the second batch with results: the first is the replay of p0's)
        fault = {FAULT_POINT: "before-checkpoint-of-rows:partition_by_0-:2"}
        second = run_to_exit(job, "p1", overrides, logs, FINISH_S, KILLED, env=fault)
        assert "1 replayed results not written again" in second.log_text(), "p1 recognised p0's result"
        assert [value for _, value in _written(systems)] == [{"page": "/a", "views": 5}] * 2

        # p2 catches up with the batch Spark committed (its tails from the batch's ledger, not the checkpoint's:
        # from those the second window would be taken for a replay still to come and the third left out)
        third = run_to_exit(job, "p2", overrides, logs, FINISH_S)
        assert "control state caught up with Spark's batch" in third.log_text()
        after = _written(systems)
        assert [value for _, value in after] == [{"page": "/a", "views": 5}] * 3, after
        ids = [parse(record_id) for record_id, _ in after]
        assert all(isinstance(i, ResultId) for i in ids) and len(set(ids)) == 3, after
    finally:
        systems.close()
