"""Exactly-once between stages (docs/guarantees.md): a processor SIGKILLed after a batch's rows reached the
intermediate stream but before the checkpoint naming the batch's input offsets. The next holder replays the
batch and writes its rows again; the counting stage must drop them, so every window's count equals pandas'."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.integration.drain_job import window_counts_once
from tests.integration.example_job import EXAMPLE, generate, results
from weirflow.config import load_config
from weirflow.fault_points import ENV as FAULT_POINT
from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.local.launcher import start_processor
from weirflow.systems import Systems

pytestmark = [pytest.mark.integration, pytest.mark.spark]

EVENTS = 6_000
FINISH_S = 240


def _overrides(root: Path) -> list[str]:
    return [
        f"job.state.dir={root / 'state'}",
        "task.max.records.per.trigger=700",  # several batches per task, so the fault lands mid-stream
        "job.coordinator.lease.duration.ms=3000",
        "job.coordinator.lease.renew.interval.ms=1000",
        "job.coordinator.heartbeat.interval.ms=500",
        "job.coordinator.liveness.timeout.ms=2500",
        "job.debounce.time.ms=500",
    ]


def _intermediate_rows(config) -> int:
    """Rows in the intermediate stream, replays included (each packed record's row count)."""
    from weirflow.control import is_control
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


def test_a_batch_replayed_after_a_kill_before_its_checkpoint_is_counted_once(tmp_path: Path, measure) -> None:
    overrides = _overrides(tmp_path)
    config = load_config(EXAMPLE / "job.yaml", overrides)
    events = generate.write(config, EVENTS)

    # p0 dies on the third checkpoint of a first-stage task: that batch's rows are in the intermediate stream
    first = start_processor(
        EXAMPLE / "job.yaml",
        "p0",
        overrides,
        log_dir=tmp_path / "logs",
        env={FAULT_POINT: "before-checkpoint:page_views-:3"},
    )
    assert first.popen.wait(FINISH_S) == -9, first.log_text()[-4000:]
    second = start_processor(EXAMPLE / "job.yaml", "p1", overrides, log_dir=tmp_path / "logs")
    try:
        assert second.popen.wait(FINISH_S) == 0, second.log_text()[-4000:]
    finally:
        second.kill()

    written = _intermediate_rows(config)
    assert written > EVENTS, f"{written} rows in the intermediate stream for {EVENTS} events: nothing was replayed"
    expected = results.expected_counts(events)
    got = results.read_counts(config)
    wrong = {w: (got.get(w), n) for w, n in expected.items() if got.get(w) != n}
    assert not wrong, (
        f"{len(wrong)} of {len(expected)} windows differ from pandas (got, expected): {list(wrong.items())[:5]}"
    )
    assert set(got) == set(expected)
    dropped = sum(
        int(line.split(" replayed rows")[0].rsplit(": ", 1)[1])
        for line in second.log_text().splitlines()
        if "replayed rows of" in line
    )
    assert dropped == written - EVENTS, (dropped, written)
    measure(
        f"kill before a first-stage checkpoint: {written - EVENTS} rows written twice to the intermediate stream, "
        f"all dropped by the counting stage; {len(got)} windows equal pandas"
    )


# A stateful first stage: per-minute counts are results, written to the intermediate stream by their task.
PIPELINE_RESULTS = """
from pyspark.sql import functions as F


def per_minute(views):
    return views.groupBy(F.window("event_time", "1 minute"), "page").count().select(
        "page", F.col("window.start").alias("window_start"), F.col("count").alias("views")
    )


def pipeline(app):
    counts = app.input("page-views").transform(per_minute).partition_by("page", name="minute-counts")
    minute = F.date_format("window_start", "yyyy-MM-dd'T'HH:mm")
    counts.send_to("page-counts", key=F.concat_ws("|", "page", minute))
"""


def _views_keyed_by_page(config, n: int) -> list[dict]:
    """The example's views, each page's in one partition: a first-stage task counts whole windows."""
    events = list(generate.events(n))
    systems = Systems(config)
    try:
        systems.admin("local").create_stream(StreamSpec("page-views", 4))
        systems.producer("local").send(
            [OutgoingRecord("page-views", json.dumps(e).encode(), key=e["page"].encode()) for e in events]
        )
    finally:
        systems.close()
    return events


def test_a_stateful_stage_s_results_replayed_after_a_kill_before_spark_s_commit_are_written_once(
    tmp_path: Path, measure
) -> None:
    """The counting stage is first: its results go to the intermediate stream. Its processor dies after a
    batch's results were written, before Spark committed the batch (a fault point in the sink's commit), so
    the next processor's Spark runs the batch again and produces the same results. They must not be written
    twice: every window once, with pandas' count."""
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    shutil.copy(EXAMPLE / "job.yaml", job_dir / "job.yaml")
    (job_dir / "pipeline_results.py").write_text(PIPELINE_RESULTS)
    overrides = [*_overrides(tmp_path), "app.pipeline=pipeline_results:pipeline"]
    config = load_config(job_dir / "job.yaml", overrides)
    events = _views_keyed_by_page(config, 20_000)  # six minutes of views: results in most batches

    first = start_processor(
        job_dir / "job.yaml",
        "p0",
        overrides,
        log_dir=tmp_path / "logs",
        env={FAULT_POINT: "before-spark-commit:page_views-:1"},
    )
    assert first.popen.wait(FINISH_S) == -9, first.log_text()[-4000:]
    second = start_processor(job_dir / "job.yaml", "p1", overrides, log_dir=tmp_path / "logs")
    try:
        assert second.popen.wait(FINISH_S) == 0, second.log_text()[-4000:]
    finally:
        second.kill()

    got, twice = window_counts_once(config)
    assert not twice, f"{len(twice)} windows written more than once, e.g. {twice[:3]}"
    expected = results.expected_counts(events)
    wrong = {w: (got.get(w), n) for w, n in expected.items() if got.get(w) != n}
    assert not wrong, f"{len(wrong)} of {len(expected)} windows differ (got, expected): {list(wrong.items())[:5]}"
    assert set(got) == set(expected)
    log_text = second.log_text()
    skipped = sum(int(n) for n in re.findall(r": (\d+) replayed results not written again", log_text))
    assert skipped > 0, "the kill left no result to replay: " + log_text[-3000:]
    measure(
        f"kill after a stateful stage's results were written, before Spark's commit: {skipped} replayed results "
        f"not written again; {len(got)} windows once each, equal pandas"
    )
