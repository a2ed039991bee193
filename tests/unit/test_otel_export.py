"""`metrics.export` (`weirflow.endpoints.otel_export`): the setting's checks, and the bridge from the metrics
collector to OpenTelemetry instruments, read with the SDK's in-memory reader; and the job-wide gauges, which
only the leader reports."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from weirflow.base.errors import ConfigError
from weirflow.base.telemetry import Telemetry
from weirflow.config.loader import Config
from weirflow.coordination.leader import JobView
from weirflow.endpoints.metrics import ProcessorCollector, ProcessorSnapshot
from weirflow.endpoints.otel_export import CONNECTION_VARIABLE, MetricsBridge, export_setting, instrument_names


def _config(**values: str) -> Config:
    return Config.from_dict({"job.name": "j", **values}, source="job.yaml")


def test_the_setting_names_the_key_and_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    assert export_setting(_config()) == "none"
    with pytest.raises(ConfigError, match=r"metrics\.export.*'prometheus' is not one of none, azure-monitor"):
        export_setting(_config(**{"metrics.export": "prometheus"}))
    monkeypatch.delenv(CONNECTION_VARIABLE, raising=False)
    with pytest.raises(ConfigError, match=CONNECTION_VARIABLE):
        export_setting(_config(**{"metrics.export": "azure-monitor"}))
    monkeypatch.setenv(CONNECTION_VARIABLE, "InstrumentationKey=00000000-0000-0000-0000-000000000000")
    assert export_setting(_config(**{"metrics.export": "azure-monitor"})) == "azure-monitor"


def _snapshot(leader: bool) -> ProcessorSnapshot:
    report = {"records_in": 7, "records_out": {"out": 5}, "batches": 2, "lag": {"local.in.0": 3}}
    return ProcessorSnapshot(
        "p1",
        "RUNNING",
        4,
        1,
        leader,
        {"t-0": report},
        job="j-1",
        job_view=JobView(live_processors=2, tasks=8, unassigned_tasks=1, failovers=3) if leader else None,
    )


def _exported(snapshot: ProcessorSnapshot) -> dict[str, list[tuple[dict[str, object], float]]]:
    reader = InMemoryMetricReader()
    collector = ProcessorCollector(lambda: snapshot, Telemetry())
    bridge = MetricsBridge(collector.collect, None, 60_000, {"service.name": "j-1"}, readers=[reader])
    try:
        data = reader.get_metrics_data()
    finally:
        bridge.stop()
    found: dict[str, list[tuple[dict[str, object], float]]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    found.setdefault(metric.name, []).append((dict(point.attributes or {}), point.value))
    return found


def test_every_family_becomes_an_instrument_and_each_sample_a_point_with_its_labels() -> None:
    collector = ProcessorCollector(lambda: _snapshot(True), Telemetry())
    names = instrument_names(collector.collect())
    assert names["weirflow_task_records_in_total"] == "counter" and names["weirflow_tasks_running"] == "gauge"
    assert names["weirflow_task_batch_duration_seconds_count"] == "counter"  # a histogram: count and sum
    assert names["weirflow_storage_errors_total"] == "counter", "a family without series yet is an instrument"
    got = _exported(_snapshot(True))
    assert got["weirflow_task_records_in_total"] == [({"processor": "p1", "task": "t-0"}, 7)]
    assert got["weirflow_task_lag_records"] == [({"processor": "p1", "task": "t-0", "ssp": "local.in.0"}, 3)]
    assert got["weirflow_job_tasks_unassigned"] == [({"job": "j-1"}, 1)]
    assert got["weirflow_job_failovers_total"] == [({"job": "j-1"}, 3)]


def test_only_the_leader_reports_the_job_wide_gauges() -> None:
    got = _exported(_snapshot(False))
    assert not any(name.startswith("weirflow_job_") and name != "weirflow_job_model_version" for name in got)
    assert got["weirflow_tasks_running"] == [({"processor": "p1"}, 1)]
