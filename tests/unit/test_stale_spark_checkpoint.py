"""A task's Spark checkpoint behind the checkpoint store is discarded (the store wins); one ahead of it is kept
for catching up (weirflow.spark.stage_query.StageQuery._stale). The Spark checkpoint is written in Spark's own
offset-log layout (``offsets/<batch>``: a version line, the batch metadata, one JSON line per source)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from weirflow.interfaces.system import SystemStreamPartition
from weirflow.spark.stage_query import StageQuery

SSP = SystemStreamPartition("local", "views-by-page", 1)


def spark_checkpoint(root: Path, batch: int, end: int, committed: bool = True, history: str = "q1") -> Path:
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    (root / "metadata").write_text(json.dumps({"id": history}))
    source = {"s": "views-by-page", "p": {SSP.key(): {"o": str(end)}}, "w": -1}
    metadata = json.dumps({"batchWatermarkMs": 0})
    (root / "offsets" / str(batch)).write_text(f"v1\n{metadata}\n{json.dumps(source)}\n")
    if committed:
        (root / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    return root


def task(offset: int, history: str = "") -> SimpleNamespace:
    from weirflow.runtime.control import TaskControl

    return SimpleNamespace(
        name="views-by-page-1", offsets={SSP: str(offset)}, control=TaskControl(spark_history=history)
    )


def query() -> StageQuery:
    """A StageQuery with nothing but its runner's systems, whose admin compares dense offsets (the default
    `SystemAdmin.compare_offsets`)."""
    from weirflow.local.streams import LocalSystemAdmin

    stage_query = StageQuery.__new__(StageQuery)
    admin = LocalSystemAdmin.__new__(LocalSystemAdmin)
    stage_query.runner = SimpleNamespace(plan=SimpleNamespace(systems=SimpleNamespace(admin=lambda _: admin)))
    return stage_query


def test_a_spark_checkpoint_behind_the_store_is_stale_and_discarded_with_a_warning(tmp_path: Path, caplog) -> None:
    location = spark_checkpoint(tmp_path / "t", batch=7, end=400)
    assert query()._stale(task(900), location)
    assert "behind the checkpoint store" in caplog.text and "views-by-page-1" in caplog.text


def test_a_spark_checkpoint_level_with_or_ahead_of_the_store_is_kept(tmp_path: Path) -> None:
    location = spark_checkpoint(tmp_path / "t", batch=7, end=400)
    assert not query()._stale(task(400), location)
    assert not query()._stale(task(250), location)  # caught up instead


def test_a_spark_checkpoint_without_a_committed_batch_is_discarded(tmp_path: Path) -> None:
    """A query stopped during its first batch leaves offsets/0 and no commit; Spark 4 refuses to rerun batch 0
    over it (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY), so the task must start a new one."""
    location = spark_checkpoint(tmp_path / "t", batch=0, end=40, committed=False)
    assert query()._stale(task(0), location)


def test_catching_up_mirrors_the_state_before_the_checkpoint_names_the_batch(tmp_path: Path) -> None:
    """A processor killed between Spark's commit and its own checkpoint: the next start catches the store up
    with Spark's batch, and sends the state as of that batch to the state store first (a copy behind the
    store's offsets would restore state older than them elsewhere)."""
    from weirflow.runtime.control import TaskControl

    location = spark_checkpoint(tmp_path / "spark", batch=4, end=50)
    (location / "state").mkdir()
    events: list[tuple[str, object]] = []

    class Store:
        def mirror(self, task: str, local: Path, batch: int, epoch: int) -> SimpleNamespace:
            events.append(("mirror", batch))
            return SimpleNamespace(uploaded=1, deleted=0, uploaded_bytes=1, seconds=0.0)

    class Writer:
        epoch = 3

        def write(self, checkpoint) -> None:
            events.append(("write", dict(checkpoint.offsets)))

    stage_query = query()
    plan = stage_query.runner.plan
    plan.is_intermediate = lambda _: False
    plan.ref = lambda _: SimpleNamespace(system="local", physical="views-by-page")
    stage_query.runner.state_store = Store()
    stage_query.merged = False
    stage_query.stage = SimpleNamespace(serves=False)
    stage_query.inputs = ["views-by-page"]
    stage_query.location = None  # not started yet: the directory is passed in
    t = SimpleNamespace(
        name="views-by-page-1",
        offsets={SSP: "20"},
        control=TaskControl(),
        writer=Writer(),
        task=SimpleNamespace(ssps=[SSP]),
        done=False,
    )
    stage_query._catch_up(t, location)
    assert events == [("mirror", 4), ("write", {SSP: "50"})]


def test_a_spark_checkpoint_of_another_history_than_the_stores_offsets_is_stale(tmp_path: Path, caplog) -> None:
    location = spark_checkpoint(tmp_path / "spark", batch=5, end=90, history="q-left-over")
    assert query()._stale(task(80, history="q-current"), location), "offsets ahead, but another history"
    assert "another history" in caplog.text
    assert not query()._stale(task(80, history="q-left-over"), location), "the same history: caught up with"
    assert not query()._stale(task(80), location), "a checkpoint written before histories were recorded"
