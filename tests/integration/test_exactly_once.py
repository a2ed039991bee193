"""Exactly-once between stages (docs/guarantees.md) through both replays a SIGKILL can cause, in one run of a
three-stage pageviews job: views partitioned by page, counted per minute by a stateful stage whose results go
to a second intermediate stream, then sent to the output.

* A processor SIGKILLed after a first-stage batch's rows reached the intermediate stream, before the checkpoint
  naming the batch's input offsets (the `before-checkpoint` fault point): the next holder replays the batch
  and writes its rows again; the counting stage must drop every one of them.
* A processor SIGKILLed after the counting stage's batch wrote its results to the intermediate stream, before
  Spark committed the batch (`before-spark-commit`): the next processor's Spark runs the batch again and
  produces the same results; they must not be written twice.

Every window is then written once, with pandas' count.

The first stage also copies a tenth of the views (one user in ten) to an event hub on the emulator, keyed by
user: a row-wise stage's output, at least once on Event Hubs, where the first kill's replay leaves rows twice.
The example reader of examples/reading_results, the unmodified azure-eventhub SDK through `ReplayFilter`, reads
each of those views exactly once (docs/guarantees.md, "Reading results once").

Both stages also write Delta tables (docs/delta.md): the first stage every view, the counting stage its counts
(the second kill lands after the batch's table commit, before Spark's). Read with deltalake and pandas, each
view and each window is in its table once, with pandas' count (docs/guarantees.md, "Tables")."""

from __future__ import annotations

import datetime as dt
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest

from tests.integration import reading_results
from tests.integration.drain_job import window_counts_once
from tests.integration.example_job import DROPPED, EXAMPLE, generate, replayed_rows_dropped, results
from weirflow.config import Config, load_config
from weirflow.interfaces.system import SystemStreamPartition
from weirflow.job.systems import Systems
from weirflow.local.launcher import ProcessorProcess, start_processor
from weirflow.runtime.fault_points import ARMED_BY
from weirflow.runtime.fault_points import ENV as FAULT_POINT
from weirflow.spark.writer_log import WROTE
from weirflow.testing import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]

COPIES = "view-copies"  # the hub the first stage copies a tenth of the views to
EVENTS = 12_000  # 3.6 minutes of views: windows still close after p1's fault is armed, and at the end
FINISH_S = 240

# The example's stages with a stateful one between them: the counting stage reads the views partitioned by page
# (whole windows per task) and writes its per-minute counts, results, to the intermediate stream minute-counts.
PIPELINE = """
from pyspark.sql import functions as F


def per_minute(views):
    return views.groupBy(F.window("event_time", "1 minute"), "page").count().select(
        "page", F.col("window.start").alias("window_start"), F.col("count").alias("views")
    )


def pipeline(app):
    raw = app.input("page-views")
    copied = raw.transform(lambda df: df.filter(F.col("user").endswith("0")))  # a tenth: the emulator is slow
    copied.send_to("view-copies", key="user")  # on Event Hubs: at least once, with ids
    raw.send_to("views-lake")  # a Delta table: exactly once by the marks of its commits
    views = raw.partition_by("page", name="views-by-page")
    counted = views.transform(per_minute)
    counted.send_to("counts-lake")  # a Delta table: exactly once by reading back
    counts = counted.partition_by("page", name="minute-counts")
    minute = F.date_format("window_start", "yyyy-MM-dd'T'HH:mm")
    counts.send_to("page-counts", key=F.concat_ws("|", "page", minute))
"""

NOT_WRITTEN_AGAIN = re.compile(r": (\d+) replayed results not written again")


def _overrides(root: Path) -> list[str]:
    return [
        f"job.state.dir={root / 'state'}",
        "task.max.records.per.trigger=700",  # several batches per task, so the faults land mid-stream
        "job.coordinator.lease.duration.ms=3000",
        "job.coordinator.lease.renew.interval.ms=1000",
        "job.coordinator.heartbeat.interval.ms=500",
        "job.coordinator.liveness.timeout.ms=2500",
        "job.debounce.time.ms=500",
        "job.trim.interval.ms=0",  # the intermediate stream's rows, replays included, are counted afterwards
    ]


def _intermediate_rows(config: Config) -> int:
    """Rows in the intermediate stream views-by-page, replays included (each packed record's row count)."""
    from weirflow.runtime.control import is_control
    from weirflow.spark.packing import unpack

    systems = Systems(config)
    try:
        physical = f"{config.get('job.name')}-{config.get('job.id')}-views-by-page"
        consumer, total = systems.consumer("local"), 0
        for partition, metadata in systems.admin("local").partition_metadata(physical).items():
            offset = metadata.oldest
            ssp = SystemStreamPartition("local", physical, partition)
            while batch := consumer.read(ssp, offset, 10_000):
                total += sum(
                    unpack(r.value).num_rows for r in batch if r.value[:1] == b"\x04" and not is_control(r.value)
                )
                offset = batch[-1].next_offset
        return total
    finally:
        systems.close()


def _event_hub_copies(connection_string: str) -> tuple[list[dict], int, int]:
    """The views in the copies' hub as examples/reading_results reads them (each once, through `ReplayFilter`),
    the events the hub holds, and how many of them the filter left out."""
    from azure.eventhub import EventHubConsumerClient

    client = EventHubConsumerClient.from_connection_string(connection_string, "$Default", eventhub_name=COPIES)
    held = sum(
        client.get_partition_properties(p)["last_enqueued_sequence_number"] + 1 for p in client.get_partition_ids()
    )
    read: list[dict] = []
    replays = reading_results.example("eventhubs").read_results(
        client, lambda _p, e: read.append(e.body_as_json())
    )
    return read, held, replays.replays


def _view(row: dict) -> tuple[str, str, int]:
    """A view as (user, page, event time in epoch ms), whichever way its time was written."""
    when = row["event_time"]
    if isinstance(when, str):
        when = dt.datetime.fromisoformat(when.replace("Z", "+00:00"))
    elif when.tzinfo is None:  # a Delta table's timestamps come back in UTC without a zone
        when = when.replace(tzinfo=dt.UTC)
    return row["user"], row["page"], round(when.timestamp() * 1000)


def _table(location: Path) -> list[dict]:
    """Every row of the Delta table at ``location``, as any Delta reader reads it (deltalake's SQL, pandas)."""
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    found = QueryBuilder().register("t", DeltaTable(str(location))).execute("select * from t").read_all()
    return pa.table(found).to_pandas().to_dict("records")


def _rows_dropped_and_checkpointed(log: str) -> int:
    """`replayed_rows_dropped`, counting only the drops whose batch's checkpoint was written: the processor logs a
    batch's drops, then writes its checkpoint, then logs the task's "wrote task=..." line."""
    pending: dict[str, int] = {}
    done = 0
    for line in log.splitlines():
        if (drop := DROPPED.search(line)) is not None:
            pending[drop[1]] = pending.get(drop[1], 0) + int(drop[2])
        elif (wrote := WROTE.search(line)) is not None:
            done += pending.pop(wrote["task"], 0)
    return done


def _results_not_written_again(log: str) -> int:
    """Replayed results the counting stage left out, from its "N replayed results not written again" lines."""
    return sum(int(n) for n in NOT_WRITTEN_AGAIN.findall(log))


def test_a_replayed_batch_is_counted_once_and_a_stateful_stage_s_replayed_results_are_written_once(
    tmp_path: Path, eventhubs_emulator, measure
) -> None:
    """p0 dies before a first-stage checkpoint, p1 (its first-stage tasks replay the batch) dies before Spark
    commits a counting batch that wrote results, p2 (its counting tasks replay that batch) finishes the job.
    p1's fault is armed only once p1 dropped every row p0 left to replay and wrote the checkpoints of those
    drops: a kill between a batch's drops and its checkpoint would have the next processor drop them again,
    and the drops would no longer add up to the rows written twice. Every window once, with pandas' count."""
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    shutil.copy(EXAMPLE / "job.yaml", job_dir / "job.yaml")
    (job_dir / "pipeline_three_stages.py").write_text(PIPELINE)
    hub = eventhubs_emulator({COPIES: 2}).connection_string()
    copies = [
        "systems.eh.factory=eventhub",
        f"systems.eh.connection.string={hub}",
        f"streams.{COPIES}.system=eh",
        f"streams.{COPIES}.partitions=2",
    ]
    lake = [
        "systems.lake.factory=delta",
        f"systems.lake.path={tmp_path / 'lake'}",
        *(f"streams.{t}.{k}" for t in ("views-lake", "counts-lake") for k in ("system=lake", "partitions=1")),
    ]
    overrides = [*_overrides(tmp_path), "app.pipeline=pipeline_three_stages:pipeline", *copies, *lake]
    config = load_config(job_dir / "job.yaml", overrides)
    events = generate.write(config, EVENTS)

    def start(name: str, env: dict[str, str] | None = None) -> ProcessorProcess:
        return start_processor(job_dir / "job.yaml", name, overrides, log_dir=tmp_path / "logs", env=env)

    # p0 dies on the third checkpoint of a first-stage task: that batch's rows are in the intermediate stream
    first = start("p0", {FAULT_POINT: "before-checkpoint:page_views-:3"})
    assert first.popen.wait(FINISH_S) == -9, first.log_text()[-4000:]
    # one row per view: the rows past the views the first stage checkpointed are written again by the next holder
    replayed = _intermediate_rows(config) - results.consumed(config)
    assert replayed > 0, "the kill before the checkpoint left no row to replay: " + first.log_text()[-3000:]

    # p1 dies at the first commit of a counting batch with results once armed (per Spark worker: n = 1)
    armed = tmp_path / "armed"
    second = start("p1", {FAULT_POINT: "before-spark-commit:views_by_page-:1", ARMED_BY: str(armed)})
    try:
        wait_until(
            lambda: _rows_dropped_and_checkpointed(second.log_text()) >= replayed or not second.alive(),
            FINISH_S,
            "p1's counting stage to drop and checkpoint the replayed rows",
        )
        assert _rows_dropped_and_checkpointed(second.log_text()) == replayed, second.log_text()[-4000:]
        armed.touch()
        assert second.popen.wait(FINISH_S) == -9, second.log_text()[-4000:]
    finally:
        second.kill()
    dropped_by_second = replayed_rows_dropped(second.log_text())
    assert dropped_by_second == replayed, f"p1 dropped {dropped_by_second} replayed rows; p0 left {replayed}"

    third = start("p2")
    try:
        assert third.popen.wait(FINISH_S) == 0, third.log_text()[-4000:]
    finally:
        third.kill()

    written = _intermediate_rows(config)
    assert written > EVENTS, f"{written} rows in the intermediate stream for {EVENTS} events: nothing was replayed"
    # p2 drops what p1's kill left to replay, if anything: together, every row written twice
    dropped = dropped_by_second + replayed_rows_dropped(third.log_text())
    assert dropped == written - EVENTS, (dropped, written)
    got, twice = window_counts_once(config)
    assert not twice, f"{len(twice)} windows written more than once, e.g. {twice[:3]}"
    expected = results.expected_counts(events)
    wrong = {w: (got.get(w), n) for w, n in expected.items() if got.get(w) != n}
    assert not wrong, (
        f"{len(wrong)} of {len(expected)} windows differ from pandas (got, expected): {list(wrong.items())[:5]}"
    )
    assert set(got) == set(expected)
    assert results.read_counts(config) == got
    skipped = _results_not_written_again(third.log_text())
    assert skipped > 0, "the kill left no result to replay: " + third.log_text()[-3000:]

    lake_views = _table(tmp_path / "lake" / "views-lake")
    assert Counter(_view(row) for row in lake_views) == Counter(_view(event) for event in events)
    assert len({row["weirflow_id"] for row in lake_views}) == EVENTS
    lake_counts = _table(tmp_path / "lake" / "counts-lake")
    in_lake = Counter((row["page"], row["window_start"].strftime("%Y-%m-%dT%H:%M")) for row in lake_counts)
    assert set(in_lake.values()) == {1}, "a window twice in the table"
    assert {w: row["views"] for w, row in zip(in_lake, lake_counts, strict=True)} == expected

    copied, held, left_out = _event_hub_copies(hub)
    expected_copies = Counter(_view(event) for event in events if event["user"].endswith("0"))
    views = sum(expected_copies.values())
    assert held > views, f"the hub holds {held} events for {views} views: nothing was replayed into it"
    assert Counter(_view(row) for row in copied) == expected_copies, "not each view once"
    assert left_out == held - views
    measure(
        f"kill before a first-stage checkpoint: {replayed} rows written twice to the intermediate stream, all "
        f"dropped by the counting stage ({written - EVENTS} with those the second kill left); kill after the "
        f"counting stage's results were written, before Spark's commit: {skipped} replayed results not written "
        f"again; {len(got)} windows once each, equal pandas; {views} views copied to Event Hubs: {held} events, "
        f"{left_out} replays left out by ReplayFilter, each view read once; Delta tables: {EVENTS} views and "
        f"{len(lake_counts)} windows, each once"
    )
