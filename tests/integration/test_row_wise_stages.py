"""Which stateless stages are row-wise (docs/guarantees.md, "When rows carry no positions"), and a job whose
first stage is not one loses nothing.

A row-wise stage's rows carry their input position, and the consumer drops a row at or below the largest
position it has taken. That holds only while a stage's writers send each input partition's rows in position
order, each position once: a union of one input's rows (both branches hold the same positions, written by
two Spark partitions) and a map over partitions that sorts its rows break it, and the consumer then takes
new rows for replays. Such a stage must fall back (no positions, a warning at start naming it)."""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.processors import run_to_exit
from weirflow.config import load_config
from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.job.systems import Systems

pytestmark = [pytest.mark.integration, pytest.mark.spark]

FINISH_S = 240

JOB = """
job:
  name: row-wise
app:
  pipeline: dims:pipeline
streams:
  views:
    partitions: 2
    schema: "page string, user string, event_time timestamp"
    event-time:
      field: event_time
    bounded: true
  clicks:
    partitions: 1
    schema: "page string, user string, event_time timestamp"
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


def both_dimensions(views):
    # a self-union: every view counted for its page and for its user
    by_page = views.select("*", F.concat(F.lit("page:"), "page").alias("dim"))
    by_user = views.select("*", F.concat(F.lit("user:"), "user").alias("dim"))
    return by_page.unionByName(by_user)


def per_minute(rows):
    return rows.groupBy(F.window("event_time", "1 minute"), "dim").count().select(
        "dim", F.col("window.start").cast("string").alias("minute"), "count"
    )


def pipeline(app):
    app.input("views").transform(both_dimensions).partition_by("dim").transform(per_minute).send_to("counts")
"""


def _views() -> list[dict[str, str]]:
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    return [
        {
            "page": f"/p{i % 5}",
            "user": f"u{i % 7}",
            "event_time": (start + dt.timedelta(seconds=i)).isoformat(),
        }
        for i in range(360)
    ]


def test_a_self_union_s_second_branch_is_written_with_no_fault(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(JOB)
    (tmp_path / "dims.py").write_text(PIPELINE)
    overrides = [f"job.state.dir={tmp_path / 'state'}", "task.max.records.per.trigger=50"]
    systems = Systems(load_config(tmp_path / "job.yaml", overrides))
    try:
        for stream in ("views", "counts"):
            ref = systems.resolve(stream)
            systems.admin(ref.system).create_stream(StreamSpec(ref.physical, 2 if stream == "views" else 1))
        views = _views()
        ref = systems.resolve("views")
        systems.producer(ref.system).send(
            [OutgoingRecord(ref.physical, json.dumps(v).encode(), key=v["page"].encode()) for v in views]
        )
        expected: Counter[tuple[str, str]] = Counter()
        for view in views:
            minute = dt.datetime.fromisoformat(view["event_time"]).strftime("%Y-%m-%d %H:%M:00")
            expected[(f"page:{view['page']}", minute)] += 1
            expected[(f"user:{view['user']}", minute)] += 1

        processor = run_to_exit(tmp_path / "job.yaml", "p0", overrides, tmp_path / "logs", FINISH_S)

        out = systems.resolve("counts")
        ssp = SystemStreamPartition(out.system, out.physical, 0)
        records = systems.consumer(out.system).read(ssp, "0", 10_000)
        written = [json.loads(r.value) for r in records]
        got = {(row["dim"], row["minute"][:19]): row["count"] for row in written}
        assert len(written) == len(got), "each window once"
        assert got == dict(expected), sorted(set(expected.items()) ^ set(got.items()))[:10]
        log_text = processor.log_text()
        assert "stage views is not row-wise: a union of rows of one input" in log_text, log_text[-4000:]
    finally:
        systems.close()


# --- which stages keep positions -------------------------------------------------------------------------


def _reversed(views: Any) -> Any:
    def reverse(batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            yield batch.iloc[::-1]

    return views.mapInPandas(reverse, views.schema)


def _same(views: Any) -> Any:
    def same(batches: Iterator[Any]) -> Iterator[Any]:
        yield from batches

    return views.mapInPandas(same, views.schema)


def _exploded(views: Any) -> Any:
    from pyspark.sql import functions as F

    return views.withColumn("dim", F.explode(F.array(F.col("page"), F.col("user"))))


def _self_union(views: Any) -> Any:
    return views.unionByName(views)


def _repartitioned(views: Any) -> Any:
    return views.repartition(3)


UNION = "a union of rows of one input"
SHAPES = {
    # name: (how the pipeline is built, whether the stage keeps positions, the warning's reason)
    "explode": (lambda app: app.input("views").transform(_exploded), True, ""),
    "merge of two inputs": (lambda app: app.input("views").merge(app.input("clicks")), True, ""),
    "self-union": (lambda app: app.input("views").transform(_self_union), False, UNION),
    "self-merge": (lambda app: app.input("views").merge(app.input("views")), False, UNION),
    "map": (lambda app: app.input("views").transform(_reversed), False, "a map over partitions"),
    "declared map": (lambda app: app.input("views").transform(_same, keeps_order=True), True, ""),
    "declared map after an undeclared one": (
        lambda app: app.input("views").transform(_reversed).transform(_same, keeps_order=True),
        False,
        "a map over partitions",
    ),
    "repartition": (lambda app: app.input("views").transform(_repartitioned), False, "a repartition"),
}


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from weirflow.spark.session import build_spark_session

    directory = tmp_path_factory.mktemp("shapes")
    (directory / "job.yaml").write_text(JOB)
    session = build_spark_session(load_config(directory / "job.yaml", [f"job.state.dir={directory / 'state'}"]))
    try:
        yield session, directory
    finally:
        session.stop()


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_stage_keeps_positions_only_where_order_and_numbering_hold(
    spark: Any, shape: str, caplog: pytest.LogCaptureFixture
) -> None:
    from weirflow.pipeline.api import App
    from weirflow.pipeline.plan import PipelinePlan
    from weirflow.spark.query import StageBuilder
    from weirflow.spark.sink import WeirflowSink
    from weirflow.spark.source import WeirflowSource

    session, directory = spark
    config = load_config(directory / "job.yaml", [f"job.state.dir={directory / 'state'}"])
    build, keeps, reason = SHAPES[shape]
    app = App(config)
    build(app).send_to("counts")
    systems = Systems(config)
    try:
        plan = PipelinePlan(app, config, systems)
        session.dataSource.register(WeirflowSource)
        session.dataSource.register(WeirflowSink)
        builder = StageBuilder(session, plan, config.snapshot())
        (stage,) = plan.stages
        with caplog.at_level(logging.WARNING, logger="weirflow.spark"):
            assert builder.carries_positions(stage) is keeps
            assert builder.carries_positions(stage) is keeps  # the warning is said once
        warnings = [r.getMessage() for r in caplog.records if "is not row-wise" in r.getMessage()]
        if keeps:
            assert not warnings
        else:
            assert len(warnings) == 1 and f"stage {stage.name} is not row-wise: {reason}" in warnings[0], warnings
    finally:
        systems.close()
