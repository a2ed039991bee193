"""Throughput and lag over time (`weirflow.endpoints.history`), their charts (`weirflow.endpoints.charts`) and the
status page's silent processors and job model changes (`weirflow.endpoints.page`), with a controlled clock and
hand-made reports."""

from __future__ import annotations

import re
from typing import Any

from weirflow.endpoints.charts import Series, line_chart
from weirflow.endpoints.history import ThroughputHistory, job_series
from weirflow.endpoints.page import describe_change, render_status_page


class Tasks:
    """What `TaskReport` answers, set by the test: task -> records in, records out (by stream) and lag."""

    def __init__(self) -> None:
        self.now = 1_000_000
        self.report: dict[str, dict[str, Any]] = {}

    def set(self, task: str, records_in: int, out: int, lag: int | None) -> None:
        self.report[task] = {"records_in": records_in, "records_out": {"o": out}, "lag_total": lag}

    def __call__(self) -> dict[str, dict[str, Any]]:
        return {task: dict(r) for task, r in self.report.items()}


def test_rates_come_from_each_tasks_growth_so_tasks_that_move_or_restart_add_no_jump() -> None:
    tasks = Tasks()
    history = ThroughputHistory(tasks, 1000, 60_000, now_ms=lambda: tasks.now)
    tasks.set("a", 100, 50, 7)
    tasks.set("b", 1000, 0, None)
    first = history.sample()
    assert (first.records_in_per_s, first.records_out_per_s, first.lag, first.tasks) == (None, None, 7, 2)
    tasks.now += 2000
    tasks.set("a", 300, 150, 3)  # +200 in, +100 out over 2 s
    del tasks.report["b"]  # moved away: no negative rate
    tasks.set("c", 5000, 5000, 10)  # arrived: its count so far is not 2 s of throughput
    second = history.sample()
    assert (second.records_in_per_s, second.records_out_per_s, second.lag) == (100.0, 50.0, 13)
    tasks.now += 1000
    tasks.set("a", 20, 10, 0)  # restarted here: its counters began again
    tasks.set("c", 5100, 5010, 0)
    third = history.sample()
    assert (third.records_in_per_s, third.records_out_per_s, third.lag) == (100.0, 10.0, 0)


def test_the_history_keeps_only_its_window() -> None:
    tasks = Tasks()
    history = ThroughputHistory(tasks, 1000, 5000, now_ms=lambda: tasks.now)
    tasks.set("a", 0, 0, 0)
    for n in range(20):
        tasks.now += 1000 if n != 10 else 60_000  # a long pause (a stopped thread, a suspended machine)
        history.sample()
    samples = history.to_json()["samples"]
    assert len(samples) == 6 and samples[-1]["at_ms"] - samples[0]["at_ms"] == 5000
    tasks.now += 30_000
    history.sample()
    assert [s["at_ms"] for s in history.to_json()["samples"]] == [tasks.now]


def test_the_job_series_sums_processors_per_time_slot_and_leaves_out_a_newest_slot_not_everyone_sampled() -> None:
    def samples(*points: tuple[int, float | None, int]) -> dict[str, Any]:
        rows = [{"at_ms": t, "records_in_per_s": r, "records_out_per_s": r, "lag": lag} for t, r, lag in points]
        return {"interval_ms": 5000, "samples": rows}

    series = job_series(
        {
            "p0": samples((10_100, None, 5), (15_200, 10.0, 4), (20_100, 12.0, 3)),
            "p1": samples((12_400, 3.0, 1), (17_300, 5.0, 1), (22_000, 6.0, 0), (26_000, 2.0, 0)),
        }
    )
    assert [s["at_ms"] for s in series] == [10_000, 15_000, 20_000]  # 25_000: only p1 sampled there yet
    assert [s["records_in_per_s"] for s in series] == [3.0, 15.0, 18.0]
    assert [s["lag"] for s in series] == [6, 5, 3]


def test_a_chart_draws_a_line_per_run_of_known_values_and_captions_the_latest_and_largest() -> None:
    svg = line_chart(
        "Records per second",
        "/s",
        [Series("in", "in", [(1000, 1.0), (2000, 4.0), (3000, None), (4000, 2.0), (5000, 3.0)])],
        0,
        5000,
    )
    lines = re.findall(r'<polyline class="in"[^>]* points="([^"]+)"', svg)
    assert [len(points.split()) for points in lines] == [2, 2]
    assert "in <b>3</b> /s now, max 4" in svg
    assert "no samples yet" in line_chart("Lag", "records", [Series("lag", "lag", [])], 0, 5000)


STATUS: dict[str, Any] = {
    "job": "j-1",
    "now_ms": 1_763_820_235_000,
    "job_model_version": 7,
    "failovers": 1,
    "assignment": {"p1": ["main-0", "main-1"]},
    "tasks": {"main-0": "running", "main-1": "running"},
    "processors": [
        {
            "processor_id": "p0",
            "state": "SILENT",
            "live": False,
            "silent": True,
            "heartbeat_age_s": 25.3,
            "tasks": [],
            "assigned": [],
            "moved_to": {"main-0": "p1"},
        },
        {"processor_id": "p1", "state": "RUNNING", "live": True, "heartbeat_age_s": 0.2, "tasks": ["main-0"]},
    ],
    "job_model_changes": [
        {
            "version": 7,
            "at_ms": 1_763_820_221_000,
            "leader": "p1",
            "reason": {"joined": [], "left": [], "silent": ["p0"], "latch_timed_out": False},
            "moved": {"main-0": ["p0", "p1"], "main-1": ["p0", "p1"]},
        }
    ],
}


def test_the_page_names_a_silent_processor_and_where_its_tasks_went() -> None:
    page = render_status_page(STATUS)
    assert "<b>SILENT</b>" in page and "silent for 25.3 s — its tasks moved to p1" in page
    unassigned = {**STATUS["processors"][0], "moved_to": {"main-0": None}}
    assert "its tasks are unassigned" in render_status_page({**STATUS, "processors": [unassigned]})
    waiting = {**STATUS["processors"][0], "assigned": ["main-0"], "tasks": ["main-0"]}
    assert "the leader has not moved its tasks yet" in render_status_page({**STATUS, "processors": [waiting]})
    assert "failovers <b>1</b>" in page


def test_a_change_reads_as_its_version_time_reason_and_moves() -> None:
    (change,) = STATUS["job_model_changes"]
    assert describe_change(change, STATUS["now_ms"]) == (
        "v7 at 14:03:41 UTC (14 s ago): p0 went silent; 2 tasks moved p0 → p1"
    )
    first = {"version": 1, "at_ms": 0, "reason": {"joined": ["p0"]}, "moved": {"a": [None, "p0"]}}
    assert describe_change(first, 0).endswith(": p0 joined; 1 task assigned to p0")
