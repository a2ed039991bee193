"""Metrics to Azure Monitor (or any OpenTelemetry exporter): the samples of ``GET /metrics``, pushed.

A Container Apps user looks in Azure Monitor, where nothing scrapes ``/metrics``. With `metrics.export:
azure-monitor` (the ``monitor`` extra: ``pip install 'weirflow[monitor]'``) every processor exports the same
numbers through OpenTelemetry's SDK to Application Insights, every `metrics.export.interval.ms`. Nothing is
translated by hand: the bridge reads the processor's Prometheus collector (`weirflow.endpoints.metrics`) when
the SDK collects, and reports each family through one observable instrument of the same name:

* a counter's samples (``weirflow_task_records_in_total``) through an observable counter named like the sample;
  Azure Monitor stores per-interval increments (the exporter asks for delta temporality), so a KQL ``sum()``
  over time bins adds up;
* a gauge's through an observable gauge of the family's name;
* a histogram's ``_count`` and ``_sum`` through two observable counters (Azure Monitor takes no buckets).

Each sample's labels become the metric's dimensions (``Properties`` / ``customDimensions`` in KQL), and the
resource names the job and the processor (``cloud_RoleName`` = `job.name`-`job.id`, ``cloud_RoleInstance`` =
the processor id). The connection string comes from the environment, ``APPLICATIONINSIGHTS_CONNECTION_STRING``,
as every Azure Monitor exporter reads it; the deployment passes it as a secret (docs/deploy.md, "Telemetry").
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from weirflow.interfaces.config import ConfigView

log = logging.getLogger("weirflow.endpoints")

CONNECTION_VARIABLE = "APPLICATIONINSIGHTS_CONNECTION_STRING"
EXPORTS = ("none", "azure-monitor")
_SUFFIXES = {"counter": ("_total",), "histogram": ("_count", "_sum")}


class _Samples:
    """One read of the collector per SDK collection, shared by every instrument's callback (they run one after
    the other within a collection; a read younger than ``max_age_s`` is reused)."""

    def __init__(self, collect: Callable[[], Iterable[Any]], max_age_s: float = 1.0) -> None:
        self._collect = collect
        self._max_age_s = max_age_s
        self._lock = threading.Lock()
        self._at = float("-inf")
        self._by_name: dict[str, list[tuple[dict[str, str], float]]] = {}

    def of(self, name: str) -> list[tuple[dict[str, str], float]]:
        with self._lock:
            if time.monotonic() - self._at > self._max_age_s:
                self._by_name = {}
                for family in self._collect():
                    for sample in family.samples:
                        self._by_name.setdefault(sample.name, []).append(
                            (dict(sample.labels), float(sample.value))
                        )
                self._at = time.monotonic()
            return list(self._by_name.get(name, ()))


def instrument_names(families: Iterable[Any]) -> dict[str, str]:
    """Sample name -> ``counter`` or ``gauge``: the instruments that carry a collector's families."""
    names: dict[str, str] = {}
    for family in families:
        suffixes = _SUFFIXES.get(family.type)
        if suffixes is None:
            names[family.name] = "gauge"
        else:
            names.update({family.name + suffix: "counter" for suffix in suffixes})
    return names


class MetricsBridge:
    """Exports a Prometheus collector's samples through an OpenTelemetry ``MetricExporter`` every ``interval_ms``.
    The instruments are the families the collector yields when the bridge starts (a custom collector yields
    every family, with or without samples)."""

    def __init__(
        self,
        collect: Callable[[], Iterable[Any]],
        exporter: Any,
        interval_ms: int,
        attributes: dict[str, str],
        readers: list[Any] | None = None,
    ) -> None:
        """``exporter`` is pushed to every ``interval_ms``; ``readers`` replace that push (a test reads the
        instruments with the SDK's in-memory reader)."""
        from opentelemetry.metrics import CallbackOptions, Observation
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource

        if readers is None:
            readers = [PeriodicExportingMetricReader(exporter, export_interval_millis=interval_ms)]
        self.provider = MeterProvider(metric_readers=readers, resource=Resource.create(attributes))
        meter = self.provider.get_meter("weirflow")
        samples = _Samples(collect)

        def callback(name: str) -> Callable[[CallbackOptions], Iterator[Observation]]:
            def observe(_options: CallbackOptions) -> Iterator[Observation]:
                for labels, value in samples.of(name):
                    yield Observation(value, labels)

            return observe

        self.instruments = instrument_names(collect())
        for name, kind in sorted(self.instruments.items()):
            create = meter.create_observable_counter if kind == "counter" else meter.create_observable_gauge
            create(name, callbacks=[callback(name)])

    def flush(self, timeout_ms: int = 10_000) -> bool:
        """Collect and export now (tests, and the last export at a stop)."""
        return bool(self.provider.force_flush(timeout_ms))

    def stop(self) -> None:
        """Export once more and stop the export thread."""
        self.provider.shutdown()


def export_setting(config: ConfigView) -> str:
    """`metrics.export`, checked: a value of `EXPORTS`, and for Azure Monitor its connection string set and its
    extra installed; a `ConfigError` naming the key otherwise."""
    export = str(config.get("metrics.export"))
    if export not in EXPORTS:
        raise config.error("metrics.export", f"'{export}' is not one of {', '.join(EXPORTS)}")
    if export == "azure-monitor":
        if not os.environ.get(CONNECTION_VARIABLE):
            raise config.error(
                "metrics.export",
                f"azure-monitor needs the Application Insights connection string in ${CONNECTION_VARIABLE} "
                '(the deployment sets it from a secret: docs/deploy.md, "Telemetry")',
            )
        try:
            import azure.monitor.opentelemetry.exporter  # noqa: F401
        except ImportError as exc:
            raise config.error(
                "metrics.export", "azure-monitor needs the exporter: pip install 'weirflow[monitor]'"
            ) from exc
    return export


def start_export(
    config: ConfigView, collect: Callable[[], Iterable[Any]], processor_id: str
) -> MetricsBridge | None:
    """The processor's exporter per `metrics.export` (None for ``none``), started."""
    if export_setting(config) == "none":
        return None
    from azure.monitor.opentelemetry.exporter import AzureMonitorMetricExporter

    exporter = AzureMonitorMetricExporter(connection_string=os.environ[CONNECTION_VARIABLE])
    job = f"{config.get('job.name')}-{config.get('job.id')}"
    bridge = MetricsBridge(
        collect,
        exporter,
        int(config.get("metrics.export.interval.ms")),
        {"service.name": job, "service.instance.id": processor_id},
    )
    log.info("exporting metrics to Azure Monitor every %d ms", config.get("metrics.export.interval.ms"))
    return bridge


__all__ = ["CONNECTION_VARIABLE", "MetricsBridge", "export_setting", "instrument_names", "start_export"]
