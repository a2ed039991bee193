"""Regression: an in-band watermark row must move Spark's watermark and flush open windows.

The runtime's ``observe`` after ``withWatermark`` is also a barrier: without it Spark's optimizer pushes the
``__ctl IS NULL`` filter (data rows only) below the watermark node, control rows never reach it, and windows
are only ever emitted by data (see docs/pipelines.md, "How a task runs"). Here one task of the second stage
runs in this process on an intermediate stream written by hand: two windows end before the producer's
watermark, one after it.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from weirflow.config import load_config
from weirflow.interfaces.system import OutgoingRecord, SystemStreamPartition
from weirflow.job.context import JobContext
from weirflow.runtime.control import MAX_TIMESTAMP_MS, ControlMessage, MessageType, encode_user
from weirflow.testing import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]

PIPELINE = """
from pyspark.sql import functions as F


def pipeline(app):
    counts = app.input("events").partition_by("k", name="byk").transform(
        lambda df: df.groupBy(F.window("event_time", "1 minute"), "k").count()
        .select("k", F.date_format("window.start", "HH:mm").alias("start"), "count"))
    counts.send_to("out")
"""

CONFIG = """
job: {name: barrier}
app: {pipeline: "barrier_pipeline:pipeline"}
job.intermediate.partitions: 1
task.trigger.interval.ms: 200
job.coordinator.lease.duration.ms: 600000   # nothing renews the test's task lock
streams:
  events: {partitions: 1, schema: "k string, event_time timestamp", event-time: {field: event_time}}
  out: {partitions: 1}
spark: {master: "local[1]"}
"""

MINUTE_MS = 60_000
BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def _event(k: str, ms: int) -> bytes:
    iso = f"2026-01-01T00:{ms // MINUTE_MS:02d}:{ms % MINUTE_MS // 1000:02d}Z"
    return encode_user(json.dumps({"k": k, "event_time": iso}).encode())


def test_a_control_row_advances_the_watermark_and_flushes_open_windows(tmp_path: Path, measure) -> None:
    (tmp_path / "barrier_pipeline.py").write_text(textwrap.dedent(PIPELINE))
    (tmp_path / "job.yaml").write_text(CONFIG)
    config = load_config(tmp_path / "job.yaml")
    ctx = JobContext.open(config, "test")
    from weirflow.spark.plane import SparkDataPlane

    plane = SparkDataPlane(ctx)
    try:
        tasks = plane.plan.plan_tasks()
        assert sorted(tasks) == ["byk-0", "events-0"]
        producer = ctx.systems.producer("local")
        mid = plane.plan.ref("byk").physical
        producer.send(
            [
                OutgoingRecord(mid, v, partition=0)
                for v in (_event("a", 10_000), _event("b", 90_000), _event("a", 300_000))
            ]
        )
        watermark = ControlMessage(MessageType.WATERMARK, "events-0", 1, BASE_MS + 2 * MINUTE_MS)
        producer.send([OutgoingRecord(mid, watermark.encode(), partition=0)])

        lock = ctx.coordination.lock("task-byk-0")
        assert lock.try_acquire()
        plane.runner.start_task(tasks["byk-0"], lock)
        out = SystemStreamPartition("local", "out", 0)

        def emitted() -> list[tuple[str, str, int]]:
            rows = [json.loads(r.value) for r in ctx.systems.consumer("local").read(out, "0", 100)]
            return sorted((r["k"], r["start"], r["count"]) for r in rows)

        took = wait_until(lambda: len(emitted()) >= 2, 120, "windows before the watermark to be emitted", 0.2)
        measure(f"windows before an in-band watermark emitted {took:.1f} s after the task started")
        assert emitted() == [("a", "00:00", 1), ("b", "00:01", 1)]  # the 00:05 window is still open

        def injected_watermark() -> int:
            cp = ctx.checkpoints.read_last_checkpoint("byk-0")
            return dict(cp.control).get("injected", {}).get("byk", -1) if cp else -1

        wait_until(lambda: injected_watermark() == BASE_MS + 2 * MINUTE_MS, 60, "the reconciled watermark")
        assert emitted() == [("a", "00:00", 1), ("b", "00:01", 1)]

        producer.send(
            [
                OutgoingRecord(
                    mid,
                    ControlMessage(MessageType.END_OF_STREAM, "events-0", 1, MAX_TIMESTAMP_MS).encode(),
                    partition=0,
                )
            ]
        )
        wait_until(lambda: "byk-0" in plane.runner.finished(), 120, "the task to finish after end-of-stream", 0.2)
        assert emitted() == [("a", "00:00", 1), ("a", "00:05", 1), ("b", "00:01", 1)]
    finally:
        plane.runner.close()
        ctx.close()
        plane.spark.stop()
