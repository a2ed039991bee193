"""What the operator of a processor watches beyond its tasks, counted where it happens and read by
``GET /metrics`` at scrape time (docs/endpoints.md, "Status page and metrics").

The numbers live far from the endpoints: a storage call's retries in a store plugin, a latch time-out in the
leader, a lease renewal in the keeper. Each place counts into this module's process-wide registry (a lock and
an addition, or a bucket increment: nothing else on the path it measures) and the metrics collector reads the
registry when Prometheus scrapes. It is a public helper (docs/architecture.md, "The dependency rule"): it
imports nothing of weirflow, so plugins count their own calls here without depending on the core's endpoints.

Every metric is declared once (`Metric`, then `declare`), with its kind, help text and label names: core's
below, a plugin's in the plugin (the Kinesis spool's size in `weirflow_kinesis.spool`). A count under other
labels is a programming error and raises `ValueError`. One process runs one processor in production, so
the collector labels these series with that processor (a test running several in one process shares them).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

# Upper bounds (seconds) of latency histograms: storage calls answer in milliseconds and give up after a few s.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Upper bounds (seconds) of micro-batch durations: a trigger every 500 ms by default, a catch-up batch minutes.
BATCH_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


@dataclass(frozen=True)
class Metric:
    """One metric of the registry: its Prometheus ``name`` (a counter's without ``_total``, which the exposition
    adds), ``kind``, ``help`` and the names of its ``labels`` (``processor`` is added by the collector)."""

    name: str
    kind: Literal["counter", "histogram", "gauge"]
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = LATENCY_BUCKETS


STORAGE_RETRIES = Metric(
    "weirflow_storage_retries",
    "counter",
    "Storage calls retried after a transient failure (one per retry)",
    ("store", "operation"),
)
STORAGE_ERRORS = Metric(
    "weirflow_storage_errors",
    "counter",
    "Storage calls that failed, retries exhausted or not retryable (the error reached the caller)",
    ("store", "operation"),
)
LATCH_TIMEOUTS = Metric(
    "weirflow_latch_timeouts", "counter", "Job model latches this processor timed out while it led the job"
)
CHECKPOINT_WRITE_SECONDS = Metric(
    "weirflow_checkpoint_write_seconds",
    "histogram",
    "Duration of a task's fenced checkpoint write (lock check and store write) that succeeded",
)
LEASE_RENEWAL_SECONDS = Metric(
    "weirflow_lease_renewal_seconds", "histogram", "Duration of a task lock renewal the store answered"
)


# Every metric declared in this process: core's, then each plugin's as its module is imported. Those without
# labels are exposed from the start (a counter at 0, a histogram without observations), so an alert on their
# increase needs no series to appear first.
_DECLARED: list[Metric] = [
    STORAGE_RETRIES,
    STORAGE_ERRORS,
    LATCH_TIMEOUTS,
    CHECKPOINT_WRITE_SECONDS,
    LEASE_RENEWAL_SECONDS,
]
_DECLARING = threading.Lock()


def declare(metric: Metric) -> Metric:
    """Add a plugin's ``metric`` to the registry's families (once; a second metric of the same name is a
    programming error) and return it, for a module-level ``NAME = declare(Metric(...))``."""
    with _DECLARING:
        same = [m for m in _DECLARED if m.name == metric.name]
        if same and same[0] != metric:
            raise ValueError(f"metric {metric.name} is declared twice, differently")
        if not same:
            _DECLARED.append(metric)
    return metric


def declared() -> tuple[Metric, ...]:
    """Every metric declared so far: the families ``GET /metrics`` and the exporters show."""
    with _DECLARING:
        return tuple(_DECLARED)


class Histogram:
    """Observations counted per bucket (``bounds``: upper bounds, ascending; one more bucket for +Inf), with
    their sum: fixed memory however many are observed. Thread-safe."""

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.bounds = tuple(bounds)
        self._counts = [0] * (len(self.bounds) + 1)
        self._sum = 0.0
        self._guard = threading.Lock()

    def observe(self, value: float) -> None:
        index = bisect.bisect_left(self.bounds, value)  # a value equal to a bound belongs to its bucket (le)
        with self._guard:
            self._counts[index] += 1
            self._sum += value

    def to_json(self) -> dict[str, Any]:
        """``{"bounds": [...], "counts": [...], "sum": s}``: per-bucket counts (not cumulative), the last one
        past every bound. The shape ``GET /tasks`` carries and `HistogramData.of` reads."""
        with self._guard:
            return {"bounds": list(self.bounds), "counts": list(self._counts), "sum": self._sum}


@dataclass(frozen=True)
class HistogramData:
    """A histogram as Prometheus exposes it: (upper bound, cumulative count) pairs ending with +Inf, and the
    sum of the observations."""

    buckets: tuple[tuple[float, int], ...]
    sum: float

    @property
    def count(self) -> int:
        return self.buckets[-1][1]

    @classmethod
    def of(cls, doc: dict[str, Any]) -> HistogramData:
        """From `Histogram.to_json`'s shape."""
        bounds = [float(b) for b in doc.get("bounds", [])] + [float("inf")]
        counts = [int(c) for c in doc.get("counts", [])]
        total, buckets = 0, []
        for bound, n in zip(bounds, counts, strict=True):
            total += n
            buckets.append((bound, total))
        return cls(tuple(buckets), float(doc.get("sum", 0.0)))


Labels = tuple[str, ...]


class Telemetry:
    """The registry: counters, histograms and gauges (each read by a function at scrape time), keyed by metric
    and label values. `TELEMETRY` is the process's; tests make their own."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._counters: dict[tuple[Metric, Labels], float] = {}
        self._histograms: dict[tuple[Metric, Labels], Histogram] = {}
        self._gauges: dict[tuple[Metric, Labels], Callable[[], float]] = {}

    @staticmethod
    def _values(metric: Metric, kind: str, labels: dict[str, str]) -> Labels:
        if metric.kind != kind or set(labels) != set(metric.labels):
            raise ValueError(
                f"metric {metric.name} is a {metric.kind} with labels {list(metric.labels)}, "
                f"not a {kind} with {list(labels)}"
            )
        return tuple(str(labels[name]) for name in metric.labels)

    def count(self, metric: Metric, n: float = 1, **labels: str) -> None:
        key = (metric, self._values(metric, "counter", labels))
        with self._guard:
            self._counters[key] = self._counters.get(key, 0) + n

    def observe(self, metric: Metric, value: float, **labels: str) -> None:
        key = (metric, self._values(metric, "histogram", labels))
        histogram = self._histograms.get(key)
        if histogram is None:
            with self._guard:
                histogram = self._histograms.setdefault(key, Histogram(metric.buckets))
        histogram.observe(value)

    def gauge(self, metric: Metric, read: Callable[[], float], **labels: str) -> Callable[[], None]:
        """Read ``read()`` at every scrape (it must be cheap and may raise: the series is then left out);
        returns the function that stops it (a closed resource's gauge)."""
        key = (metric, self._values(metric, "gauge", labels))
        with self._guard:
            self._gauges[key] = read

        def remove() -> None:
            with self._guard:
                if self._gauges.get(key) is read:
                    del self._gauges[key]

        return remove

    def counters(self) -> list[tuple[Metric, Labels, float]]:
        with self._guard:
            found = dict(self._counters)
        for metric in declared():
            if metric.kind == "counter" and not metric.labels:
                found.setdefault((metric, ()), 0)
        return [(m, labels, v) for (m, labels), v in found.items()]

    def histograms(self) -> list[tuple[Metric, Labels, HistogramData]]:
        with self._guard:
            found = dict(self._histograms)
        for metric in declared():
            if metric.kind == "histogram" and not metric.labels and (metric, ()) not in found:
                found[(metric, ())] = Histogram(metric.buckets)
        return [(m, labels, HistogramData.of(h.to_json())) for (m, labels), h in found.items()]

    def gauges(self) -> list[tuple[Metric, Labels, float]]:
        """Every gauge's current value; one whose reading raises is left out of this scrape."""
        with self._guard:
            found = list(self._gauges.items())
        values = []
        for (metric, labels), read in found:
            try:
                values.append((metric, labels, float(read())))
            except Exception:  # a closed or corrupt resource: no value rather than no scrape
                continue
        return values


TELEMETRY = Telemetry()


def count(metric: Metric, n: float = 1, **labels: str) -> None:
    """Add ``n`` to counter ``metric`` of the process's registry."""
    TELEMETRY.count(metric, n, **labels)


def observe(metric: Metric, value: float, **labels: str) -> None:
    """Add one observation (seconds) to histogram ``metric`` of the process's registry."""
    TELEMETRY.observe(metric, value, **labels)


def gauge(metric: Metric, read: Callable[[], float], **labels: str) -> Callable[[], None]:
    """Register gauge ``metric`` of the process's registry, read by ``read`` at scrape time; returns the function
    that removes it."""
    return TELEMETRY.gauge(metric, read, **labels)
