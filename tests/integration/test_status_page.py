"""The status page (``GET /``) as a person sees it: headless Chromium (Debian ``chromium``, which make test
installs) renders a running processor's page; its table text and a screenshot are checked."""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.png import dark_pixels, read_png
from tests.unit.test_processor_faults import TASKS, FakeRunner, job_config, start
from weirflow.local.launcher import wait_until

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


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (make test installs Debian's)")
def test_the_status_page_shows_the_leader_the_processors_and_every_task(tmp_path: Path) -> None:
    running = start(job_config(tmp_path), "p1", lambda ctx: FakeRunner(ctx.checkpoints))
    try:
        processor = running.processor
        wait_until(lambda: processor.state.value == "RUNNING" and processor.endpoint_url != "", 30, "p1 running")
        wait_until(lambda: processor.runner is not None and len(processor.runner.running()) == len(TASKS), 30,
                   "every task running")  # fmt: skip
        url = processor.endpoint_url + "/"
        dom = subprocess.run([CHROMIUM, *HEADLESS, "--dump-dom", url], capture_output=True, text=True,
                             timeout=60, check=True).stdout  # fmt: skip
        shot = tmp_path / "status.png"
        subprocess.run([CHROMIUM, *HEADLESS, "--window-size=1000,700", f"--screenshot={shot}", url],
                       capture_output=True, timeout=60, check=True)  # fmt: skip
    finally:
        assert running.stop() == 0
    cells = _Cells()
    cells.feed(dom)
    processors, tasks = cells.tables
    assert processors[0] == ["processor", "state", "live", "heartbeat", "tasks", "endpoint"]
    assert processors[1][:3] == ["p1 (leader)", "RUNNING", "yes"]
    assert re.fullmatch(r"\d+(\.\d+)? s", processors[1][3])
    assert sorted(row[0] for row in tasks[1:]) == sorted(TASKS)
    assert all(row[2] == "p1" for row in tasks[1:]), tasks
    assert re.search(r"<h1>faults-1</h1>", dom) and "job model <b>v1</b>" in dom
    width, height, _ = read_png(shot)
    assert (width, height) == (1000, 700)
    assert dark_pixels(shot) > 2000, "the screenshot shows (almost) no text"
