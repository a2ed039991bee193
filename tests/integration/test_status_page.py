"""The status page (``GET /``) as a person sees it: headless Chromium (Debian ``chromium``, which make test
installs) renders a running processor's page; its table text and a screenshot are checked."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from tests.png import dark_pixels, read_png
from tests.unit.test_processor_faults import TASKS, FakeRunner, job_config, start
from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.local.launcher import wait_until
from weirflow.systems import Systems

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
