"""``GET /metrics``: the processor's metrics in Prometheus text format (prometheus-client), read from the
running processor at scrape time (a custom collector: nothing is updated on the hot path)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ProcessorSnapshot:
    processor_id: str
    state: str
    job_model_version: int
    tasks: int
    leader: bool


def metrics_exposition(snapshot: Callable[[], ProcessorSnapshot]) -> Callable[[], bytes]:
    """A function that renders the current metrics; ``snapshot`` reads the processor."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily

    class _Collector:
        def collect(self) -> Iterator[Any]:
            now = snapshot()
            labels = ["processor"]
            tasks = GaugeMetricFamily("weirflow_tasks_running", "Tasks this processor runs", labels=labels)
            tasks.add_metric([now.processor_id], now.tasks)
            version = GaugeMetricFamily("weirflow_job_model_version", "Job model version this processor runs",
                                        labels=labels)  # fmt: skip
            version.add_metric([now.processor_id], now.job_model_version)
            leader = GaugeMetricFamily("weirflow_leader", "1 while this processor leads the job", labels=labels)
            leader.add_metric([now.processor_id], 1 if now.leader else 0)
            state = GaugeMetricFamily("weirflow_processor_state", "1 for the processor's current state",
                                      labels=["processor", "state"])  # fmt: skip
            state.add_metric([now.processor_id, now.state], 1)
            yield from (tasks, version, leader, state)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())  # type: ignore[arg-type]
    return lambda: generate_latest(registry)
