"""Cutting pipelines into stages and tasks: names, order, intermediate streams, errors. No Spark needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from weirflow.config.loader import Config
from weirflow.interfaces.system import StreamSpec
from weirflow.job.systems import Systems
from weirflow.pipeline.api import App, PipelineError
from weirflow.pipeline.plan import PipelinePlan, stage_name


def _plan(tmp_path: Path, build, partitions: dict[str, int]) -> PipelinePlan:
    config = Config.from_dict({"job": {"name": "j", "state": {"dir": str(tmp_path)}}}, base_dir=tmp_path)
    systems = Systems(config)
    for stream, count in partitions.items():
        systems.admin("local").create_stream(StreamSpec(stream, count))
    app = App(config)
    build(app)
    return PipelinePlan(app, config, systems)


def test_partition_by_cuts_two_stages_with_stable_names_and_tasks(tmp_path: Path) -> None:
    def build(app: App) -> None:
        app.input("page-views").partition_by("page").transform(lambda df: df).send_to("out")

    plan = _plan(tmp_path, build, {"page-views": 3, "out": 1})
    assert [s.name for s in plan.stages] == ["page_views", "partition_by_0"]
    assert plan.ref("partition-by-0").physical == "j-1-partition-by-0"
    tasks = plan.plan_tasks()
    assert sorted(tasks) == [f"{s}-{n}" for s in ("page_views", "partition_by_0") for n in range(3)]
    assert plan.partition_count("partition-by-0") == 3  # default: the most partitions of any input
    streams = plan.systems.admin("local").list_streams()
    assert streams["page-views.dlq"] == 3 and streams["j-1-partition-by-0"] == 3
    assert plan.task_count(plan.stage("page_views")) == 3


def test_merge_keeps_one_stage_and_stages_are_ordered_by_their_feeds(tmp_path: Path) -> None:
    def build(app: App) -> None:
        late = app.input("b").partition_by("k", name="by-k")
        late.merge(app.input("a").partition_by("k", name="a-by-k")).send_to("out")

    plan = _plan(tmp_path, build, {"a": 2, "b": 2, "out": 1})
    names = [s.name for s in plan.stages]
    assert names.index("b") < names.index("by_k") and names.index("a") < names.index("by_k")
    assert plan.stage("by_k").input_ids == ["by-k", "a-by-k"]


def test_join_of_streams_with_different_partition_counts_is_refused(tmp_path: Path) -> None:
    def build(app: App) -> None:
        app.input("a").join(app.input("b"), on="k").send_to("out")

    plan = _plan(tmp_path, build, {"a": 2, "b": 3, "out": 1})
    with pytest.raises(PipelineError, match="co-partitioned"):
        plan.plan_tasks()


def test_invalid_graphs_are_explained() -> None:
    app = App()
    views = app.input("v")
    with pytest.raises(PipelineError, match="read by this pipeline"):
        views.send_to("v")
    views.partition_by("k", name="x")
    with pytest.raises(PipelineError, match="already used"):
        views.partition_by("k", name="x")
    with pytest.raises(PipelineError, match="DataFrame -> DataFrame"):
        views.transform("not a function")  # type: ignore[arg-type]
    with pytest.raises(PipelineError, match="two different App"):
        views.merge(App().input("w"))
    assert stage_name("a.b-c") == "a_b_c"


def test_an_aggregate_is_an_operator_of_the_stage_after_its_partition_by(tmp_path: Path) -> None:
    from weirflow import agg

    def build(app: App) -> None:
        views = app.input("page-views").partition_by("page", name="by-page")
        views.aggregate("page", window="1 minute", views=agg.count(), mean=agg.avg("spent")).send_to("out")

    plan = _plan(tmp_path, build, {"page-views": 2, "out": 1})
    counting = plan.stage("by_page")
    (node,) = [n for n in counting.nodes if n.op == "aggregate"]
    assert node.aggregate is not None and node.aggregate.keys == ("page",)
    # each output column's partials, merged by their kind; the row count first (what count() reads)
    assert node.aggregate.partial_columns() == [("__rows", "count"), ("__s_mean", "sum"), ("__c_mean", "count")]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda s, agg: s.aggregate("page", views=agg.count()), "window"),
        (lambda s, agg: s.aggregate("page", window="1 minute"), "at least one aggregation"),
        (lambda s, agg: s.aggregate("page", window="1 minute", views=3), "must be one of agg.count"),
        (lambda s, agg: s.aggregate(1, window="1 minute", views=agg.count()), "keys are column names"),
        (lambda s, agg: s.aggregate("page", window="1 minute", page=agg.count()), "clashes"),
        (lambda s, agg: s.aggregate("page", window="1 minute", t=agg.sum("")), "agg.sum needs a column"),
        (lambda s, agg: s.aggregate("page", window="", views=agg.count()), "window"),
    ],
)
def test_aggregate_names_each_mistake(call, message: str) -> None:
    from weirflow import agg

    stream = App().input("page-views")
    with pytest.raises((PipelineError, TypeError), match=message):
        call(stream, agg)
