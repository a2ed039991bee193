"""``GET /metrics``: the processor's metrics in Prometheus text format (prometheus-client), read from the
running processor at scrape time by a custom collector: nothing is updated on the hot path beyond the runner's
own counts and the bucket increments of `weirflow.base.telemetry`.

Three sources, each a family of series (docs/endpoints.md, "Status page and metrics", lists every metric):

* the processor: its state, leadership, job model version, lease renewals and rebalances;
* its tasks (label ``task``) and queries (label ``query``, a stable name: a stateless stage's shared query is
  named by its stage, a stateful task's by the task), from the runner (`TaskRunner.task_stats`,
  `TaskRunner.query_stats`). Every task count is the task's own, so a sum over tasks counts nothing twice;
  what a shared query wrote but could not attribute to a task is in the query's own count only;
* the process-wide registry (`weirflow.base.telemetry`): storage retries and errors, latch time-outs, checkpoint
  write and lease renewal latencies, the Kinesis spool's size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from weirflow.base.telemetry import TELEMETRY, HistogramData, Telemetry, declared
from weirflow.coordination.leader import JobView


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
    query_reports: dict[str, dict[str, Any]] = field(default_factory=dict)  # `TaskRunner.query_stats`
    job: str = ""  # `job.name`-`job.id`: the label of the job-wide gauges
    job_view: JobView | None = None  # the leader's view of the job; None on the other processors


def _buckets(data: HistogramData) -> list[tuple[str, float]]:
    from prometheus_client.utils import floatToGoString

    return [(floatToGoString(bound), float(n)) for bound, n in data.buckets]


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


def _job_families(now: ProcessorSnapshot) -> Iterator[Any]:
    """Job-wide gauges, from the leader only (every family is yielded, empty elsewhere): a sum or a max over the
    processors is then the job's value, counted once, and it carries on across a change of leader."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    labels = ["job"]
    live = GaugeMetricFamily("weirflow_job_processors_live", "Processors the leader counts as live", labels=labels)
    tasks = GaugeMetricFamily("weirflow_job_tasks", "Tasks of the job model", labels=labels)
    unassigned = GaugeMetricFamily(
        "weirflow_job_tasks_unassigned",
        "Tasks whose owner in the job model is not live (a silent processor's, until the leader moves them)",
        labels=labels,
    )
    failovers = CounterMetricFamily(
        "weirflow_job_failovers", "Job models published because a processor went silent", labels=labels
    )
    view = now.job_view
    if view is not None:
        live.add_metric([now.job], view.live_processors)
        tasks.add_metric([now.job], view.tasks)
        unassigned.add_metric([now.job], view.unassigned_tasks)
        failovers.add_metric([now.job], view.failovers)
    yield from (live, tasks, unassigned, failovers)


def _task_families(now: ProcessorSnapshot) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    t = ["processor", "task"]
    records_in = CounterMetricFamily(
        "weirflow_task_records_in",
        "Records the task read: an input stream's records, an intermediate stream's rows",
        labels=t,
    )
    records_out = CounterMetricFamily(
        "weirflow_task_records_out",
        "Records written for the task, per output stream (its own rows only, never its query's whole output)",
        labels=[*t, "query", "stream"],
    )
    batches = CounterMetricFamily("weirflow_task_batches", "Micro-batches checkpointed", labels=t)
    duration = HistogramMetricFamily(
        "weirflow_task_batch_duration_seconds", "Durations of the task's checkpointed micro-batches", labels=t
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
        if r.get("batch_seconds"):
            data = HistogramData.of(r["batch_seconds"])
            duration.add_metric(labels, _buckets(data), data.sum)
        checkpoint.add_metric(labels, r.get("last_checkpoint_ms", 0) / 1000)
        dead.add_metric(labels, r.get("dead_letters", 0))
        replays.add_metric(labels, r.get("replays_dropped", 0))
        for ssp, n in sorted((r.get("lag") or {}).items()):
            if n >= 0:
                lag.add_metric([*labels, ssp], n)
    yield from (records_in, records_out, batches, duration, checkpoint, dead, replays, lag)


def _query_families(now: ProcessorSnapshot) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    q = ["processor", "query"]
    records_out = CounterMetricFamily(
        "weirflow_query_records_out",
        "Records the query wrote, per output stream (all of them, attributed to a task or not)",
        labels=[*q, "stream"],
    )
    tasks = GaugeMetricFamily("weirflow_query_tasks", "Tasks the query runs", labels=q)
    for query, r in sorted(now.query_reports.items()):
        labels = [now.processor_id, query]
        tasks.add_metric(labels, r.get("tasks", 0))
        for stream, n in sorted((r.get("records_out") or {}).items()):
            records_out.add_metric([*labels, stream], n)
    yield from (records_out, tasks)


def _telemetry_families(processor: str, telemetry: Telemetry) -> Iterator[Any]:
    """The registry's series, each labelled with the processor whose process counted it."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    families: dict[str, Any] = {}

    def family(metric: Any, kind: type) -> Any:
        if metric.name not in families:
            families[metric.name] = kind(metric.name, metric.help, labels=["processor", *metric.labels])
        return families[metric.name]

    kinds = {"counter": CounterMetricFamily, "histogram": HistogramMetricFamily, "gauge": GaugeMetricFamily}
    for metric in declared():  # every family, series or not: an exporter registers its instruments from them
        family(metric, kinds[metric.kind])
    for metric, labels, value in sorted(telemetry.counters(), key=lambda c: (c[0].name, c[1])):
        family(metric, CounterMetricFamily).add_metric([processor, *labels], value)
    for metric, labels, data in sorted(telemetry.histograms(), key=lambda h: (h[0].name, h[1])):
        family(metric, HistogramMetricFamily).add_metric([processor, *labels], _buckets(data), data.sum)
    for metric, labels, value in sorted(telemetry.gauges(), key=lambda g: (g[0].name, g[1])):
        family(metric, GaugeMetricFamily).add_metric([processor, *labels], value)
    yield from families.values()


class ProcessorCollector:
    """The prometheus-client collector of one processor: every family, read at collection time (a scrape of
    ``GET /metrics``, or an export of `weirflow.endpoints.otel_export`)."""

    def __init__(self, snapshot: Callable[[], ProcessorSnapshot], telemetry: Telemetry = TELEMETRY) -> None:
        self._snapshot = snapshot
        self._telemetry = telemetry

    def collect(self) -> Iterator[Any]:
        now = self._snapshot()
        yield from _processor_families(now)
        yield from _job_families(now)
        yield from _task_families(now)
        yield from _query_families(now)
        yield from _telemetry_families(now.processor_id, self._telemetry)


def metrics_exposition(
    snapshot: Callable[[], ProcessorSnapshot] | ProcessorCollector, telemetry: Telemetry = TELEMETRY
) -> Callable[[], bytes]:
    """A function that renders the current metrics; ``snapshot`` reads the processor (or is its collector
    already), ``telemetry`` is the process's registry (a test passes its own)."""
    from prometheus_client import CollectorRegistry, generate_latest

    collector = snapshot if isinstance(snapshot, ProcessorCollector) else ProcessorCollector(snapshot, telemetry)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return lambda: generate_latest(registry)
