"""A real job's ``GET /metrics`` adds up to what it did (docs/endpoints.md, "Status page and metrics").

One `weirflow run` processor runs a two-stage job of stateless stages, each as one Spark query shared by its
tasks: `page_views` (4 tasks) writes every view to the intermediate stream `by-user`, keyed by user, and
`by_user` copies what it reads to the output stream `seen`. Scraped with prometheus-client's parser: summed
over tasks, records out of `seen` are the records `seen` holds (a shared query's output is not repeated on each
of its tasks), records in of `by_user` are the views (rows, not the packed records carrying them), and the
``query`` label is each stage's name.

The processor also pushes its metrics to Azure Monitor (`metrics.export: azure-monitor`, the unmodified
exporter of the ``monitor`` extra) with its ingestion endpoint pointed at a receiver here: the increases it
sends add up to the same records, the leader's job-wide gauges arrive, and every metric name and property the
KQL queries of docs/deploy.md read is one it sends."""

from __future__ import annotations

import gzip
import json
import re
import signal
import textwrap
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import unique_job_name
from tests.integration.endpoints_example import views as _views
from weirflow.cli import status_document
from weirflow.config import load_config
from weirflow.config.loader import Config
from weirflow.endpoints.otel_export import CONNECTION_VARIABLE
from weirflow.interfaces.stream_names import stream_ref
from weirflow.interfaces.system import SystemStreamPartition
from weirflow.job.systems import Systems
from weirflow.local.launcher import start_processor
from weirflow.testing import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]


VIEWS, USERS, TASKS = 2500, 50, 4

PIPELINE = """
def pipeline(app):
    app.input("page-views").partition_by("user", name="by-user").send_to("seen", key="user")
"""

CONFIG = """
streams:
  page-views:
    partitions: 4
    schema: "user string, page string, event_time timestamp"
    event-time: {field: event_time}
  seen: {partitions: 2}
task.trigger.interval.ms: 200
job.trim.interval.ms: 0  # the intermediate stream's records are counted whole afterwards
spark: {master: "local[2]"}
"""


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return found


def total(samples: list[tuple[dict[str, str], float]], **match: str) -> float:
    return sum(v for labels, v in samples if all(labels.get(k) == want for k, want in match.items()))


def records(config: Config, stream: str, intermediate: bool = False) -> int:
    """The records ``stream`` holds, every partition (an intermediate stream's are packed rows and control
    messages)."""
    ref = stream_ref(config, stream, intermediate=intermediate)
    systems = Systems(config)
    try:
        partitions = systems.admin(ref.system).partition_count(ref.physical)
        consumer = systems.consumer(ref.system)
        return sum(
            len(consumer.read(SystemStreamPartition(ref.system, ref.physical, p), "0", 10 * VIEWS))
            for p in range(partitions)
        )
    finally:
        systems.close()


class Receiver:
    """Azure Monitor's ingestion endpoint as far as the exporter uses it: ``POST /v2.1/track`` with a JSON array of
    envelopes (gzip or not), answered as accepted. Keeps every metric envelope's data point."""

    def __init__(self) -> None:
        self.points: list[dict[str, Any]] = []  # {name, value, properties, role, instance}
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                items = json.loads(body)
                receiver.take(items)
                answer = json.dumps({"itemsReceived": len(items), "itemsAccepted": len(items), "errors": []})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer.encode())

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.connection_string = (
            "InstrumentationKey=00000000-0000-0000-0000-000000000000;"
            f"IngestionEndpoint=http://127.0.0.1:{self.server.server_port}/"
        )

    def take(self, items: list[dict[str, Any]]) -> None:
        with self._lock:
            for item in items:
                if item.get("data", {}).get("baseType") != "MetricData":
                    continue
                base, tags = item["data"]["baseData"], item.get("tags", {})
                for metric in base["metrics"]:
                    self.points.append(
                        {
                            "name": metric["name"],
                            "value": metric["value"],
                            "properties": base.get("properties", {}),
                            "role": tags.get("ai.cloud.role"),
                            "instance": tags.get("ai.cloud.roleInstance"),
                        }
                    )

    def sum(self, name: str, **match: str) -> float:
        with self._lock:
            points = [p for p in self.points if p["name"] == name]
        return sum(p["value"] for p in points if all(p["properties"].get(k) == v for k, v in match.items()))

    def last(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            return next((p for p in reversed(self.points) if p["name"] == name), None)

    def stop(self) -> None:
        self.server.shutdown()


def kql_reads(markdown: str) -> list[tuple[set[str], set[str]]]:
    """Per KQL block of a Markdown file: the metric names it reads (``Name == "x"``, ``Name in ("x", "y")``) and
    the properties (``Properties.key``)."""
    found = []
    for block in re.findall(r"```kusto\n(.*?)```", markdown, re.S):
        names = set(re.findall(r'Name == "(\w+)"', block))
        for group in re.findall(r"Name in \(([^)]*)\)", block):
            names |= set(re.findall(r'"(\w+)"', group))
        found.append((names, set(re.findall(r"Properties\.(\w+)", block))))
    return found


def test_summed_over_tasks_a_running_job_s_metrics_are_what_it_read_and_wrote(tmp_path: Path, measure) -> None:
    (tmp_path / "metrics_pipeline.py").write_text(textwrap.dedent(PIPELINE))
    job = unique_job_name("metrics")
    (tmp_path / "job.yaml").write_text(
        f"job: {{name: {job}}}\napp: {{pipeline: 'metrics_pipeline:pipeline'}}\n" + CONFIG
    )
    config = load_config(tmp_path / "job.yaml")
    _views.send(config, 0, VIEWS, USERS)
    receiver = Receiver()
    proc = start_processor(
        tmp_path / "job.yaml",
        "p0",
        ["metrics.export=azure-monitor", "metrics.export.interval.ms=1000"],
        log_dir=tmp_path / "logs",
        env={
            CONNECTION_VARIABLE: receiver.connection_string,
            "APPLICATIONINSIGHTS_STATSBEAT_DISABLED_ALL": "true",  # the exporter's own usage reports: not here
        },
    )
    try:
        urls: list[str] = []

        def serving() -> bool:
            urls[:] = [p["endpoint"] for p in status_document(config)["processors"] if p["live"] and p["endpoint"]]
            return bool(urls)

        wait_until(serving, 120, "the processor's endpoint")

        def done() -> bool:
            got = scrape(urls[0])
            out = got.get("weirflow_task_records_out_total", [])
            return (
                records(config, "seen") == VIEWS
                and total(out, stream="seen") >= VIEWS
                and total(out, stream="by-user") >= VIEWS
            )

        took = wait_until(done, 240, "every view through both stages, counted", interval_s=1)
        measure(f"2,500 views through two shared queries and counted in {took:.0f} s")

        def read_by_stage_two() -> float:  # counted just after the last batch's records out, in the same call
            read = scrape(urls[0]).get("weirflow_task_records_in_total", [])
            return sum(v for labels, v in read if labels["task"].startswith("by_user-"))

        wait_until(lambda: read_by_stage_two() >= VIEWS, 30, "stage two's records in to reach the views")
        got = scrape(urls[0])
        written = records(config, "seen")
        packed = records(config, "by-user", intermediate=True)
        wait_until(
            lambda: receiver.sum("weirflow_task_records_out_total", stream="seen") >= VIEWS,
            60,
            "the exported increases of records out to reach the views",
        )
    finally:
        if proc.alive():
            proc.popen.send_signal(signal.SIGKILL)
        receiver.stop()

    # Azure Monitor: per-export increases that add up, the leader's job-wide gauges, the job and processor named
    assert receiver.sum("weirflow_task_records_out_total", stream="seen") == VIEWS
    assert receiver.sum("weirflow_task_records_in_total") == 2 * VIEWS
    tasks, live = receiver.last("weirflow_job_tasks"), receiver.last("weirflow_job_processors_live")
    assert tasks is not None and tasks["value"] == 2 * TASKS and tasks["properties"] == {"job": f"{job}-1"}
    assert live is not None and live["value"] == 1
    assert {(p["role"], p["instance"]) for p in receiver.points} == {(f"{job}-1", "p0")}
    exported: dict[str, set[str]] = {}
    for point in receiver.points:
        exported.setdefault(point["name"], set()).update(point["properties"])
    reads = kql_reads((Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text())
    assert len(reads) >= 6, "the KQL queries of docs/deploy.md"
    for names, properties in reads:
        # a labelled counter has a series once it counted: storage errors did not happen here
        unsent = names - set(exported) - {"weirflow_storage_errors_total"}
        assert not unsent, f"the KQL reads {unsent}, which the exporter never sent (it sent {sorted(exported)})"
        sent = set().union(*(exported.get(n, set()) for n in names))
        assert properties <= sent | {"store"}, f"the KQL reads properties {properties - sent} of {names}"

    out = got["weirflow_task_records_out_total"]
    assert total(out, stream="seen") == written == VIEWS, "each record of `seen` counted once, for its task"
    assert total(out, stream="by-user") == VIEWS
    assert {labels["query"] for labels, _ in out} == {"page_views", "by_user"}, "stable names, no task count"
    per_task = {labels["task"]: v for labels, v in out if labels["stream"] == "seen"}
    assert len(per_task) == TASKS and all(v < VIEWS for v in per_task.values()), "split, not repeated"
    assert total(got["weirflow_query_records_out_total"], stream="seen") == VIEWS
    assert {labels["query"]: v for labels, v in got["weirflow_query_tasks"]} == {"page_views": 4, "by_user": 4}

    read = got["weirflow_task_records_in_total"]
    stage_two = sum(v for labels, v in read if labels["task"].startswith("by_user-"))
    assert stage_two == VIEWS, "rows read from `by-user`"
    assert packed < VIEWS / 10, f"{packed} records carried the {VIEWS} rows: counting them would mislead"
    assert sum(v for labels, v in read if labels["task"].startswith("page_views-")) == VIEWS

    batches = {labels["task"]: v for labels, v in got["weirflow_task_batches_total"]}
    counts = {labels["task"]: v for labels, v in got["weirflow_task_batch_duration_seconds_count"]}
    assert counts == batches and all(n > 0 for n in batches.values()), "one observation per checkpointed batch"
