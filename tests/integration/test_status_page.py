"""The status page (``GET /``) as a person sees it: headless Chromium (Debian ``chromium``, which make test
installs) renders a running processor's page; its table text and a screenshot are checked, and after a
processor of two is SIGKILLed, that the page names it silent, shows the failover and charts the throughput."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from tests.support.png import dark_pixels, read_png
from tests.unit.test_processor_faults import TASKS, FakeRunner, job_config, start
from weirflow.cli import status_document
from weirflow.config import load_config
from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.job.systems import Systems
from weirflow.local.launcher import ProcessorProcess
from weirflow.testing import wait_until

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
HEADLESS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]


class _Cells(HTMLParser):
    """Rows of the rendered tables, as text, by table."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: object) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


class ReportingRunner(FakeRunner):
    """Task ``main-<n>`` has read 10 of its partition's 25 records (lag 15), ``10 * (n + 1)`` records in all,
    in 3 batches of 0.12 s, and sent ``n`` dead letters; its last checkpoint was 1.5 s before the page was asked
    for."""

    def task_stats(self) -> dict[str, dict[str, Any]]:
        return {
            task: {
                "batches": 3,
                "records_in": 10 * (n + 1),
                "last_batch_ms": 120,
                "batch_seconds": {"bounds": [0.1, 0.25], "counts": [0, 3, 0], "sum": 0.36},
                "dead_letters": n,
                "last_checkpoint_ms": int(time.time() * 1000) - 1500,
                "records_out": {"out": 7},
                "query": task,
                "offsets": {SystemStreamPartition("local", "views", n).key(): "10"},
            }
            for task in sorted(self.running())
            for n in [int(task.rsplit("-", 1)[1])]
        }


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (make test installs Debian's)")
def test_the_status_page_shows_the_leader_the_processors_and_every_task(tmp_path: Path) -> None:
    config = job_config(tmp_path)
    systems = Systems(config)
    systems.admin("local").create_stream(StreamSpec("views", 4))
    systems.producer("local").send([OutgoingRecord("views", b"{}", partition=i % 4) for i in range(100)])
    systems.close()
    running = start(config, "p1", lambda ctx: ReportingRunner(ctx.checkpoints))
    try:
        processor = running.processor
        wait_until(lambda: processor.state.value == "RUNNING" and processor.endpoint_url != "", 30, "p1 running")
        wait_until(
            lambda: processor.runner is not None and len(processor.runner.running()) == len(TASKS),
            30,
            "every task running",
        )
        metrics_url = processor.endpoint_url + "/metrics"
        wait_until(
            lambda: 'weirflow_lease_renewals_total{processor="p1"} 0.0' not in get(metrics_url),
            30,
            "a lock renewal counted",
        )
        metrics = get(metrics_url)
        url = processor.endpoint_url + "/"
        dom = subprocess.run(
            [CHROMIUM, *HEADLESS, "--dump-dom", url], capture_output=True, text=True, timeout=60, check=True
        ).stdout
        shot = tmp_path / "status.png"
        subprocess.run(
            [CHROMIUM, *HEADLESS, "--window-size=1000,700", f"--screenshot={shot}", url],
            capture_output=True,
            timeout=60,
            check=True,
        )
    finally:
        assert running.stop() == 0
    cells = _Cells()
    cells.feed(dom)
    processors, tasks = cells.tables
    assert tasks[0] == [
        "task",
        "state",
        "processor",
        "lag",
        "records in",
        "last batch",
        "last checkpoint",
        "dead letters",
    ]
    by_task = {row[0]: row for row in tasks[1:]}
    assert by_task["main-2"][3:5] == ["15", "30"] and by_task["main-2"][5] == "120 ms"
    assert re.fullmatch(r"\d+\.\d s ago", by_task["main-2"][6]) and by_task["main-2"][7] == "2"
    for line in (
        'weirflow_task_lag_records{processor="p1",ssp="local.views.2",task="main-2"} 15.0',
        'weirflow_task_dead_letters_total{processor="p1",task="main-3"} 3.0',
        'weirflow_task_records_in_total{processor="p1",task="main-1"} 20.0',
        'weirflow_task_records_out_total{processor="p1",query="main-0",stream="out",task="main-0"} 7.0',
        'weirflow_task_batch_duration_seconds_bucket{le="0.25",processor="p1",task="main-0"} 3.0',
        'weirflow_task_batch_duration_seconds_count{processor="p1",task="main-0"} 3.0',
    ):
        assert line in metrics, line
    assert re.search(r'weirflow_rebalances_total\{processor="p1"\} [1-9]', metrics)
    assert processors[0] == ["processor", "state", "live", "heartbeat", "tasks", "endpoint"]
    assert processors[1][:3] == ["p1 (leader)", "RUNNING", "yes"]
    assert re.fullmatch(r"\d+(\.\d+)? s", processors[1][3])
    assert sorted(row[0] for row in tasks[1:]) == sorted(TASKS)
    assert all(row[2] == "p1" for row in tasks[1:]), tasks
    assert re.search(r"<h1>faults-1</h1>", dom) and "job model <b>v1</b>" in dom
    width, height, _ = read_png(shot)
    assert (width, height) == (1000, 700)
    assert dark_pixels(shot) > 2000, "the screenshot shows (almost) no text"


# --- a failover, seen on the page ----------------------------------------------------------------------------
PARTITIONS = 4
FAILOVER_JOB = f"""
job.name: failover
task:
  inputs: [events]
  function: relay_task:relay
  commit.ms: 200
streams:
  events: {{partitions: {PARTITIONS}}}
  relayed: {{partitions: 2}}
job.coordinator.lease.duration.ms: 3000
job.coordinator.lease.renew.interval.ms: 1000
job.coordinator.heartbeat.interval.ms: 300
job.coordinator.liveness.timeout.ms: 2000
job.coordinator.poll.interval.ms: 100
job.debounce.time.ms: 300
endpoints.history.interval.ms: 1000
endpoints.history.window.ms: 120000
"""
RELAY = """
def relay(record):
    return [{"stream": "relayed", "value": record["value"]}]
"""


def start_counting_processor(config_path: Path, pid: str) -> ProcessorProcess:
    """`tests.integration.status_job`: a record job's processor whose tasks report their counts."""
    log_path = config_path.parent / f"{pid}.log"
    log = open(log_path, "ab")
    popen = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.status_job", str(config_path), pid],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=Path(__file__).resolve().parents[2],
    )
    return ProcessorProcess(pid, popen, log_path, log)


class Feed:
    """Sends ``events`` at about 200 records a second from a thread until stopped: input that flows."""

    def __init__(self, config: Any) -> None:
        self.systems = Systems(config)
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="feed", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        producer = self.systems.producer("local")
        while not self._stop.wait(0.1):
            producer.send(
                [OutgoingRecord("events", b"{}", partition=(self.sent + i) % PARTITIONS) for i in range(20)]
            )
            self.sent += 20

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.systems.close()


def runs_on(config: Any, processors: set[str]) -> dict[str, Any] | None:
    """The status document once every task is assigned to exactly ``processors``, each running its share at
    the current model version; None before."""
    doc = status_document(config)
    rows = {p["processor_id"]: p for p in doc["processors"] if p["live"]}
    ok = set(doc["assignment"]) == processors and doc["task_count"] == PARTITIONS
    return (
        doc
        if ok
        and all(
            rows.get(pid, {}).get("state") == "RUNNING"
            and rows[pid]["job_model_version"] == doc["job_model_version"]
            and sorted(rows[pid]["tasks"]) == sorted(doc["assignment"][pid])
            for pid in processors
        )
        else None
    )


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (make test installs Debian's)")
def test_after_a_sigkill_the_page_names_the_processor_silent_shows_the_failover_and_charts_throughput(
    tmp_path: Path,
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(textwrap.dedent(FAILOVER_JOB))
    (tmp_path / "relay_task.py").write_text(RELAY)
    config = load_config(path)
    systems = Systems(config)
    systems.admin("local").create_stream(StreamSpec("events", PARTITIONS))
    systems.admin("local").create_stream(StreamSpec("relayed", 2))
    systems.close()
    feed = Feed(config)
    processes = {"p0": start_counting_processor(path, "p0")}
    try:
        wait_until(lambda: runs_on(config, {"p0"}) is not None, 60, "p0 running every task")
        processes["p1"] = start_counting_processor(path, "p1")
        wait_until(lambda: runs_on(config, {"p0", "p1"}) is not None, 60, "p0 and p1 sharing the tasks")
        before = runs_on(config, {"p0", "p1"})
        assert before is not None and before["leader"] == "p0"
        lost = sorted(before["assignment"]["p0"])
        survivor = {p["processor_id"]: p["endpoint"] for p in before["processors"]}["p1"]

        def flowing_on_p1() -> bool:
            samples = json.loads(get(survivor + "/status/history"))["samples"]
            return any((s["records_in_per_s"] or 0) > 0 for s in samples)

        wait_until(flowing_on_p1, 30, "p1's history showing records flowing")
        processes["p0"].kill()  # SIGKILL, the leader: p1 must notice the silence, lead and move p0's tasks
        after: dict[str, Any] = {}

        def failed_over() -> bool:
            doc = runs_on(config, {"p1"})
            if doc is None or not doc["job_model_changes"]:
                return False
            after.update(doc)
            return doc["job_model_changes"][0]["reason"]["silent"] == ["p0"]

        wait_until(failed_over, 60, "p0's tasks moved to p1 and the failover recorded")
        wait_until(lambda: "SILENT" in get(survivor + "/"), 30, "the page showing p0 silent")
        dom = subprocess.run(
            [CHROMIUM, *HEADLESS, "--dump-dom", survivor + "/"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    finally:
        feed.stop()
        for proc in processes.values():
            if proc.alive():
                proc.kill()
        for proc in processes.values():
            print(f"--- log of {proc.processor_id} (last 30 lines)")
            print("\n".join(proc.log_text().splitlines()[-30:]))
    cells = _Cells()
    cells.feed(dom)
    rows = {row[0]: row for row in cells.tables[0][1:]}
    state, live, tasks = rows["p0"][1], rows["p0"][2], rows["p0"][4]
    assert re.fullmatch(r"SILENT silent for \d+(\.\d)? s — its tasks moved to p1", state), state
    assert (live, tasks) == ("no", ""), rows["p0"]
    assert rows["p1 (leader)"][1:3] == ["RUNNING", "yes"]
    version = after["job_model_version"]
    moved = f"{len(lost)} task{'s' if len(lost) > 1 else ''} moved p0 → p1"
    changes = re.findall(r"<li[^>]*>(v\d+ at [^<]*)</li>", dom)
    failover = rf"v{version} at \d\d:\d\d:\d\d UTC \(\d+ s ago\): p0 went silent; {moved}"
    assert any(re.fullmatch(failover, change) for change in changes), changes
    assert "failovers <b>1</b>" in dom
    # the charts: two SVGs drawn from p1's samples, records flowing in
    assert dom.count("<svg") == 2
    lines = re.findall(r'<polyline class="in"[^>]* points="([^"]+)"', dom)
    xs = [float(point.split(",")[0]) for line in lines for point in line.split()]
    assert len(xs) >= 3 and xs == sorted(xs), lines
    top = re.search(r'<span class="in">in <b>[\d,.]+</b> /s now, max ([\d,.]+)</span>', dom)
    assert top is not None and float(top.group(1).replace(",", "")) > 0, dom
    assert re.search(r'<polyline class="lag"[^>]* points="[^"]+"', dom)
    assert "No history from" not in dom and "summed over p1" in dom
