"""`Stream.aggregate` on the embedded default (docs/pipelines.md, "Aggregations"): right after a
``partition_by`` the first stage sends per micro-batch one partial per window and key instead of every row,
and a processor SIGKILLed when one batch's partials reached some intermediate partitions and not the others
changes no result. Every aggregation (count, count of a column, sum, min, max, avg) equals pandas over the same
events, in the fast path (whose tasks share one query per processor) and in an aggregation that runs whole
(after a transform, not right after its ``partition_by``: one query per task), which the processor names at
start."""

from __future__ import annotations

import datetime as dt
import json
import random
import re
from pathlib import Path

import pandas as pd
import pytest

from tests.support.processors import KILLED, run_to_exit
from weirflow.config import load_config
from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.job.systems import Systems
from weirflow.runtime.fault_points import ENV as FAULT_POINT
from weirflow.spark.packing import unpack

pytestmark = [pytest.mark.integration, pytest.mark.spark]

FINISH_S = 240
EVENTS = 3000
PARTITIONS = 2

JOB = """
job:
  name: aggregates
  trim.interval.ms: 0  # the test reads the intermediate stream whole afterwards: nothing of it is trimmed
app:
  pipeline: aggregates:pipeline
streams:
  views:
    partitions: 2
    schema: "page string, spent int, event_time timestamp"
    event-time:
      field: event_time
    lateness: 30s
    bounded: true
  per-page:
    partitions: 2
  whole:
    partitions: 2
spark:
  master: "local[2]"
"""

PIPELINE = """
from pyspark.sql import functions as F

import weirflow
from weirflow import agg


def pipeline(app):
    views = app.input("views")
    kinds = dict(
        views=agg.count(), timed=agg.count("spent"), spent=agg.sum("spent"),
        least=agg.min("spent"), most=agg.max("spent"), mean=agg.avg("spent"),
    )
    per_page = views.partition_by("page", name="by-page").aggregate("page", window="1 minute", **kinds)
    per_page.send_to("per-page", key="page")
    everything = F.col("spent").isNull() | F.col("spent").isNotNull()
    counted = views.partition_by("page", name="by-page-again").transform(lambda rows: rows.filter(everything))
    counted.aggregate("page", window="1 minute", views=agg.count()).send_to("whole", key="page")
"""


def _events() -> list[dict[str, object]]:
    rng = random.Random(7)
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    events = []
    for i in range(EVENTS):
        moment = start + dt.timedelta(milliseconds=40 * i + rng.randrange(-3000, 3000))
        spent = None if i % 11 == 0 else rng.randrange(1, 500)
        events.append({"page": f"/p{rng.randrange(7)}", "spent": spent, "event_time": moment.isoformat()})
    return events


def _expected(events: list[dict[str, object]]) -> dict[tuple[str, str], dict[str, object]]:
    frame = pd.DataFrame(events)
    frame["window"] = pd.to_datetime(frame["event_time"]).dt.floor("1min").dt.strftime("%Y-%m-%dT%H:%M")
    grouped = frame.groupby(["page", "window"])
    out = {}
    for (page, window), rows in grouped:
        spent = rows["spent"].dropna()
        some = len(spent) > 0  # Spark's sum, min, max and avg of no value are null
        out[(page, window)] = {
            "views": len(rows),
            "timed": len(spent),
            "spent": int(spent.sum()) if some else None,
            "least": int(spent.min()) if some else None,
            "most": int(spent.max()) if some else None,
            "mean": round(float(spent.mean()), 9) if some else None,
        }
    return out


def _read(systems: Systems, stream: str) -> list[dict[str, object]]:
    ref = systems.resolve(stream)
    rows = []
    for partition in range(PARTITIONS):
        ssp = SystemStreamPartition(ref.system, ref.physical, partition)
        rows += [json.loads(r.value) for r in systems.consumer(ref.system).read(ssp, "0", 100_000)]
    return rows


def _by_window(rows: list[dict[str, object]]) -> dict[tuple[str, str], dict[str, object]]:
    out: dict[tuple[str, str], dict[str, object]] = {}
    for row in rows:
        window = str(row["window"]["start"])[:16]  # type: ignore[index]
        key = (str(row["page"]), window)
        assert key not in out, f"{key} written twice"
        values = {k: v for k, v in row.items() if k not in ("page", "window")}
        if "timed" in values:  # the JSON of a row leaves its nulls out
            values = {k: values.get(k) for k in ("views", "timed", "spent", "least", "most", "mean")}
        if values.get("mean") is not None:
            values["mean"] = round(float(values["mean"]), 9)  # type: ignore[arg-type]
        out[key] = values
    return out


def _intermediate(systems: Systems, config: object) -> tuple[int, int, int]:
    """(rows in the intermediate stream's packed records, events those rows stand for, the most one stands for)."""
    physical = f"aggregates-{config.get('job.id')}-by-page"  # type: ignore[attr-defined]
    rows = events = largest = 0
    for partition in range(PARTITIONS):
        ssp = SystemStreamPartition("local", physical, partition)
        for record in systems.consumer("local").read(ssp, "0", 100_000):
            if record.value[:1] == b"\x04":
                table = unpack(record.value)
                rows += table.num_rows
                counts = table.column("__rows").to_pylist()
                events += sum(counts)
                largest = max([largest, *counts])
    return rows, events, largest


def test_partials_cross_the_stage_boundary_and_a_sigkill_between_their_sends_changes_no_result(
    tmp_path: Path, measure
) -> None:
    (tmp_path / "job.yaml").write_text(JOB)
    (tmp_path / "aggregates.py").write_text(PIPELINE)
    overrides = [f"job.state.dir={tmp_path / 'state'}", "task.max.records.per.trigger=300"]
    config = load_config(tmp_path / "job.yaml", overrides)
    systems = Systems(config)
    try:
        for stream in ("views", "per-page", "whole"):
            ref = systems.resolve(stream)
            systems.admin(ref.system).create_stream(StreamSpec(ref.physical, PARTITIONS))
        events = _events()
        ref = systems.resolve("views")
        systems.producer(ref.system).send(
            [
                OutgoingRecord(ref.physical, json.dumps(e).encode(), key=str(i).encode())
                for i, e in enumerate(events)
            ]
        )

        # p0 dies when a batch of the first stage has sent its partials to one intermediate partition only
        job, logs = tmp_path / "job.yaml", tmp_path / "logs"
        first = run_to_exit(
            job, "p0", overrides, logs, FINISH_S, KILLED, env={FAULT_POINT: "between-partial-sends:views:1"}
        )
        text = first.log_text()
        assert (
            "stage by_page_again: its aggregation runs on every row, not on partials: it does not follow" in text
        )
        assert "stage by_page: its aggregation runs on every row" not in text  # the fast path
        # the fast path's tasks share one query; the other aggregate stage runs one query per task, and says why
        assert re.search(r"by_page-0, by_page-1: query \S+ started", text), text[-3000:]
        assert (
            "stage by_page_again: its tasks run one query each, not one per processor: its work is not one "
            "aggregate of its input, then transforms of its results" in text
        )

        # p1 cuts its batches elsewhere (a larger budget): a partial of its first batch would sum a range that
        # overlaps the one p0 sent to one partition, which neither dropping nor taking would count right
        wider = [*overrides[:-1], "task.max.records.per.trigger=450"]
        second = run_to_exit(job, "p1", wider, logs, FINISH_S)
        assert "rows, not partials, until its inputs pass" in second.log_text()

        expected = _expected(events)
        assert _by_window(_read(systems, "per-page")) == expected
        counts_whole = {key: value["views"] for key, value in _by_window(_read(systems, "whole")).items()}
        assert counts_whole == {key: value["views"] for key, value in expected.items()}

        rows, carried, largest = _intermediate(systems, config)
        assert largest > 1, "no intermediate row stands for several events: partials were not sent"
        # p0's partials, then p1's replay as rows (each its own partial) up to where the input ended at its start
        assert carried > EVENTS and rows >= EVENTS
        measure(
            f"p0 SIGKILLed between one batch's partial sends; p1 sent rows up to its inputs' ends: {rows} "
            f"intermediate rows standing for {carried} events (the largest partial {largest}); {len(expected)} "
            "windows of six aggregations equal pandas, and those of the aggregation run whole"
        )
    finally:
        systems.close()
