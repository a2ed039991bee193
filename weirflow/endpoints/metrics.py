"""``GET /metrics``: the processor's metrics in Prometheus text format (prometheus-client), read from the
running processor at scrape time (a custom collector: nothing is updated on the hot path).

Per processor: ``weirflow_tasks_running``, ``weirflow_job_model_version``, ``weirflow_leader``,
``weirflow_processor_state``, ``weirflow_lease_renewals_total``, ``weirflow_rebalances_total``. Per task it runs
(label ``task``): ``weirflow_task_records_in_total``, ``weirflow_task_records_out_total`` (label ``stream``;
a stateless stage's tasks share one query, whose counts each of them reports, label ``query``),
``weirflow_task_batches_total``, ``weirflow_task_batch_duration_seconds`` (the last batch),
``weirflow_task_last_checkpoint_timestamp_seconds``, ``weirflow_task_dead_letters_total`` and
``weirflow_task_lag_records`` (label ``ssp``: records between the task's position and the partition's end).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ProcessorSnapshot:
    processor_id: str
    state: str
    job_model_version: int
    tasks: int
    leader: bool
    task_reports: dict[str, dict[str, Any]] = field(default_factory=dict)  # weirflow.endpoints.task_report
    renewals: int = 0
    rebalances: int = 0


def _processor_families(now: ProcessorSnapshot) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    labels = ["processor"]
    p = [now.processor_id]
    tasks = GaugeMetricFamily("weirflow_tasks_running", "Tasks this processor runs", labels=labels)
    tasks.add_metric(p, now.tasks)
    version = GaugeMetricFamily(
        "weirflow_job_model_version", "Job model version this processor runs", labels=labels
    )
    version.add_metric(p, now.job_model_version)
    leader = GaugeMetricFamily("weirflow_leader", "1 while this processor leads the job", labels=labels)
    leader.add_metric(p, 1 if now.leader else 0)
    state = GaugeMetricFamily(
        "weirflow_processor_state", "1 for the processor's current state", labels=["processor", "state"]
    )
    state.add_metric([now.processor_id, now.state], 1)
    renewals = CounterMetricFamily(
        "weirflow_lease_renewals", "Task lock renewals the store confirmed", labels=labels
    )
    renewals.add_metric(p, now.renewals)
    rebalances = CounterMetricFamily("weirflow_rebalances", "Job models this processor moved to", labels=labels)
    rebalances.add_metric(p, now.rebalances)
    yield from (tasks, version, leader, state, renewals, rebalances)


def _task_families(now: ProcessorSnapshot) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    t = ["processor", "task"]
    records_in = CounterMetricFamily("weirflow_task_records_in", "Records read from the task's inputs", labels=t)
    records_out = CounterMetricFamily(
        "weirflow_task_records_out", "Records written by the task's query", labels=[*t, "query", "stream"]
    )
    batches = CounterMetricFamily("weirflow_task_batches", "Micro-batches checkpointed", labels=t)
    duration = GaugeMetricFamily(
        "weirflow_task_batch_duration_seconds", "Duration of the last micro-batch", labels=t
    )
    checkpoint = GaugeMetricFamily(
        "weirflow_task_last_checkpoint_timestamp_seconds",
        "When the task last wrote its checkpoint (Unix time)",
        labels=t,
    )
    dead = CounterMetricFamily("weirflow_task_dead_letters", "Records sent to dead-letter streams", labels=t)
    replays = CounterMetricFamily(
        "weirflow_task_replays_dropped", "Intermediate rows dropped as replays of rows already read", labels=t
    )
    lag = GaugeMetricFamily(
        "weirflow_task_lag_records", "Records between the task's position and the end", labels=[*t, "ssp"]
    )
    for task, r in sorted(now.task_reports.items()):
        labels = [now.processor_id, task]
        records_in.add_metric(labels, r.get("records_in", 0))
        for stream, n in sorted((r.get("records_out") or {}).items()):
            records_out.add_metric([*labels, str(r.get("query") or task), stream], n)
        batches.add_metric(labels, r.get("batches", 0))
        duration.add_metric(labels, r.get("last_batch_ms", 0) / 1000)
        checkpoint.add_metric(labels, r.get("last_checkpoint_ms", 0) / 1000)
        dead.add_metric(labels, r.get("dead_letters", 0))
        replays.add_metric(labels, r.get("replays_dropped", 0))
        for ssp, n in sorted((r.get("lag") or {}).items()):
            if n >= 0:
                lag.add_metric([*labels, ssp], n)
    yield from (records_in, records_out, batches, duration, checkpoint, dead, replays, lag)


def metrics_exposition(snapshot: Callable[[], ProcessorSnapshot]) -> Callable[[], bytes]:
    """A function that renders the current metrics; ``snapshot`` reads the processor."""
    from prometheus_client import CollectorRegistry, generate_latest

    class _Collector:
        def collect(self) -> Iterator[Any]:
            now = snapshot()
            yield from _processor_families(now)
            yield from _task_families(now)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    return lambda: generate_latest(registry)
