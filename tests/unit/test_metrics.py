"""``GET /metrics`` tells the truth when summed (docs/endpoints.md, "Status page and metrics"): a shared query's
output is split by task, never repeated on each; records in of an intermediate stream are rows, not the packed
records holding them; labels are stable names; batch durations are a histogram. Each count is driven through
the code that makes it (the sink over a real embedded log, the source's reads, the runner's bookkeeping) and
read back with prometheus-client's own parser."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.test_source_replays import KEY, TASK, _read, config  # noqa: F401 (config: a fixture)
from weirflow.base.telemetry import Telemetry
from weirflow.config.loader import Config
from weirflow.endpoints.metrics import ProcessorSnapshot, metrics_exposition
from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.job.systems import Systems
from weirflow.runtime.control import TaskControl
from weirflow.spark.progress import ProgressView
from weirflow.spark.query import observation_name
from weirflow.spark.replay import POS, PSS, pss
from weirflow.spark.sink import WeirflowStreamWriter
from weirflow.spark.stage_query import StageQuery
from weirflow.spark.task_progress import TaskProgress
from weirflow.spark.task_state import TaskStats

STAGE, TASKS = "views", 3
OUT = {"stream": "out", "system": "local", "physical": "out", "positions": True, "stage": STAGE}


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> (labels, value) of every sample of the exposition, as Prometheus parses it."""
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return found


def scrape(
    tasks: dict[str, dict[str, Any]],
    queries: dict[str, dict[str, Any]] | None = None,
    telemetry: Telemetry | None = None,
) -> dict[str, list[tuple[dict[str, str], float]]]:
    snapshot = ProcessorSnapshot("p1", "RUNNING", 1, len(tasks), True, tasks, query_reports=queries or {})
    return samples(metrics_exposition(lambda: snapshot, telemetry or Telemetry())().decode())


def _rows(partitions: list[int], first: int) -> pa.RecordBatch:
    """Output rows of a shared query, one per input row of the given partitions (their ``__pss``)."""
    n = len(partitions)
    return pa.record_batch(
        {
            "__key": pa.array([f"k{first + i}".encode() for i in range(n)], pa.binary()),
            "__value": pa.array([b"{}"] * n, pa.binary()),
            PSS: pa.array([pss(0, p) for p in partitions], pa.int64()),
            POS: pa.array([(first + i) << 12 for i in range(n)], pa.int64()),
        }
    )


def _progress(tasks: list[Any], counts_dir: Path, merged: bool) -> TaskProgress:
    """The runner's side of a query of ``tasks`` reading the sink's counts from ``counts_dir``."""
    progress = TaskProgress.__new__(TaskProgress)
    progress.tasks, progress.merged, progress.counts_dir, progress.records_out = tasks, merged, counts_dir, {}
    return progress


def _report(t: Any, query: str) -> dict[str, Any]:
    return {**t.stats.to_json(), "query": query}


def test_a_shared_query_s_records_out_are_split_by_task_and_sum_to_what_it_wrote(tmp_path: Path) -> None:
    job = Config.from_dict({"job.name": "metrics", "job.state.dir": str(tmp_path / "state")})
    systems = Systems(job)
    systems.admin("local").create_stream(StreamSpec("out", 1))
    tasks = [SimpleNamespace(name=f"{STAGE}-{n}", stats=TaskStats()) for n in range(TASKS)]
    owners = {pss(0, n): f"{STAGE}-{n}" for n in range(TASKS)}
    counts_dir = tmp_path / "counts"
    try:
        writer = WeirflowStreamWriter(
            job.snapshot(), [OUT], counts_dir=str(counts_dir), tasks=[t.name for t in tasks], owners=owners
        )
        # two Spark partitions of one batch, each with rows of several tasks' input partitions
        first = writer.write(iter([_rows([0, 0, 1, 0, 2], 0), _rows([2, 2], 5)]))
        second = writer.write(iter([_rows([1, 0, 2, 2, 2, 2], 7)]))
        writer.commit([first, second], 0)
        written = len(systems.consumer("local").read(SystemStreamPartition("local", "out", 0), "0", 1000))
    finally:
        systems.close()
    progress = _progress(tasks, counts_dir, merged=True)
    progress._count_written(0)

    got = scrape(
        {t.name: _report(t, STAGE) for t in tasks}, {STAGE: {"tasks": TASKS, "records_out": progress.records_out}}
    )
    per_task = {s["task"]: v for s, v in got["weirflow_task_records_out_total"] if s["stream"] == "out"}
    assert written == 13
    assert per_task == {f"{STAGE}-0": 4, f"{STAGE}-1": 2, f"{STAGE}-2": 7}, "each row counted for its own task"
    assert sum(per_task.values()) == written, "summed over tasks: what the query wrote, once"
    assert got["weirflow_query_records_out_total"] == [({"processor": "p1", "query": STAGE, "stream": "out"}, 13)]


def test_rows_a_shared_query_cannot_attribute_are_counted_for_the_query_only(tmp_path: Path) -> None:
    """Rows without positions (the stage's transforms dropped them) are in the query's count, in no task's."""
    job = Config.from_dict({"job.name": "metrics", "job.state.dir": str(tmp_path / "state")})
    systems = Systems(job)
    systems.admin("local").create_stream(StreamSpec("out", 1))
    tasks = [SimpleNamespace(name=f"{STAGE}-{n}", stats=TaskStats()) for n in range(TASKS)]
    counts_dir = tmp_path / "counts"
    try:
        sink = {k: v for k, v in OUT.items() if k != "positions"}
        writer = WeirflowStreamWriter(
            job.snapshot(),
            [sink],
            counts_dir=str(counts_dir),
            tasks=[t.name for t in tasks],
            owners={pss(0, n): f"{STAGE}-{n}" for n in range(TASKS)},
        )
        rows = _rows([0, 1, 2, 2], 0).drop_columns([PSS, POS])
        writer.commit([writer.write(iter([rows]))], 0)
    finally:
        systems.close()
    progress = _progress(tasks, counts_dir, merged=True)
    progress._count_written(0)
    assert progress.records_out == {"out": 4}
    assert all(t.stats.records_out == {} for t in tasks), "never repeated on each task"


def test_a_query_of_one_task_counts_all_its_rows_for_that_task(tmp_path: Path) -> None:
    counts_dir = tmp_path / "counts"
    counts_dir.mkdir()
    (counts_dir / "4.json").write_text(json.dumps({"counts": {"out": 9, "mid": 2}, "by_task": {}}))
    task = SimpleNamespace(name="counts-0", stats=TaskStats())
    progress = _progress([task], counts_dir, merged=False)
    progress._count_written(4)
    assert task.stats.records_out == progress.records_out == {"out": 9, "mid": 2}


class _Plan:
    """Input ``views`` (records) and intermediate ``mid`` (packed rows), both on the embedded log."""

    def __init__(self, systems: Systems) -> None:
        self.systems = systems

    def is_intermediate(self, stream_id: str) -> bool:
        return stream_id == "mid"

    def ref(self, stream_id: str) -> Any:
        return SimpleNamespace(system="local", physical=stream_id)


def test_records_in_of_an_intermediate_stream_counts_the_rows_its_packed_records_hold(
    config: Config,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    """`mid` holds 5 packed records: 15 rows, 7 of them replays. A task reading all of it and 10 records of an
    input stream read 8 + 10 records: the rows it took, not the 5 records; the input's records by its admin."""
    rows, controls = _read(config, tmp_path / "marks", 0, 5)
    assert len(rows) == 8
    assert [c["task_count"] for c in controls if c["kind"] == "rows"] == [8], "the rows the read took"

    systems = Systems(config)
    try:
        systems.admin("local").create_stream(StreamSpec("views", 1))
        systems.producer("local").send([OutgoingRecord("views", b"{}", partition=0) for _ in range(10)])
        views, mid = SystemStreamPartition("local", "views", 0), SystemStreamPartition.parse(KEY)
        task = SimpleNamespace(name=TASK, read_to={views: "0", mid: "0"}, stats=TaskStats(), control=TaskControl())
        progress = TaskProgress.__new__(TaskProgress)
        progress.runner = SimpleNamespace(plan=_Plan(systems))
        progress.inputs, progress.by_ssp = ["views", "mid"], {KEY: task, views.key(): task}
        report = ProgressView({"batchId": 0, "observedMetrics": {observation_name(1): {"control": controls}}})
        _, taken = progress._apply_control_rows(report)
        read = progress._records_read(task, {views: "10", mid: "5"})
    finally:
        systems.close()
    assert taken == {TASK: 8} and task.stats.replays_dropped == 7
    assert read == 10, "the intermediate partition's 5 records are not counted as records in"
    task.stats.records_in = read + taken[TASK]
    got = scrape({TASK: _report(task, TASK)})
    assert got["weirflow_task_records_in_total"] == [({"processor": "p1", "task": TASK}, 18)]


def test_the_query_label_is_the_stage_s_name_whatever_tasks_its_shared_query_runs() -> None:
    stage = SimpleNamespace(name=STAGE)

    def query(n: int, merged: bool = True) -> StageQuery:
        members = [SimpleNamespace(name=f"{STAGE}-{i}", keys=set()) for i in range(n)]
        return StageQuery(SimpleNamespace(), stage, members, merged)  # type: ignore[arg-type]

    assert query(4).name == query(2).name == STAGE
    assert query(1, merged=False).name == f"{STAGE}-0"
    task = SimpleNamespace(stats=TaskStats(records_out={"out": 5}))
    got = scrape(
        {f"{STAGE}-{n}": _report(task, query(4).name) for n in range(4)},
        {query(4).name: {"tasks": 4, "records_out": {"out": 20}}},
    )
    assert {s["query"] for s, _ in got["weirflow_task_records_out_total"]} == {STAGE}
    assert got["weirflow_query_tasks"] == [({"processor": "p1", "query": STAGE}, 4)], "the count, apart"


def test_batch_durations_are_a_histogram_whose_count_and_sum_are_the_batches_fed() -> None:
    stats = TaskStats()
    durations = [0.2, 0.5, 0.7, 3.0, 400.0]
    for seconds in durations:
        stats.batch_seconds.observe(seconds)
    got = scrape({"views-0": {**stats.to_json(), "query": STAGE}})
    assert got["weirflow_task_batch_duration_seconds_count"] == [({"processor": "p1", "task": "views-0"}, 5)]
    ((_, total),) = got["weirflow_task_batch_duration_seconds_sum"]
    assert total == pytest.approx(sum(durations))
    buckets = {s["le"]: v for s, v in got["weirflow_task_batch_duration_seconds_bucket"]}
    assert buckets["0.25"] == 1 and buckets["0.5"] == 2 and buckets["1.0"] == 3 and buckets["5.0"] == 4
    assert buckets["300.0"] == 4 and buckets["+Inf"] == 5, "cumulative, the last past every bound"
    assert "weirflow_task_batch_duration_seconds" not in got, "no gauge of the last batch any more"
