"""Served tables of a record-task job (``task.tables``, docs/endpoints.md): two processors in this process on
the embedded default, lookups through either one, and a table rebuilt from its changelog when its task moves
to the other processor."""

from __future__ import annotations

import json
import textwrap
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.unit.test_processor_faults import Running
from weirflow.config import load_config
from weirflow.endpoints.processor_server import serving_processor
from weirflow.interfaces.system import OutgoingRecord, StreamSpec
from weirflow.job.systems import Systems
from weirflow.testing import wait_until

CONFIG = """
job.name: tables
job.coordinator.lease.duration.ms: 3000
job.coordinator.lease.renew.interval.ms: 1000
job.coordinator.heartbeat.interval.ms: 300
job.coordinator.liveness.timeout.ms: 2000
job.coordinator.poll.interval.ms: 100
job.debounce.time.ms: 300
task.inputs: [views]
task.function: lastview:serve
task.tables: [last_view]
task.commit.ms: 100
"""

FUNCTION = """
import json


def serve(record):
    view = json.loads(record["value"])
    return [{"table": "last_view", "key": record["key"], "value": view}]
"""
USERS = 20


def get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def send(systems: Systems, first: int, count: int) -> dict[str, dict[str, Any]]:
    views = [{"user": f"u{i % USERS}", "i": i} for i in range(first, first + count)]
    systems.producer("local").send(
        [OutgoingRecord("views", json.dumps(v).encode(), key=v["user"].encode()) for v in views]
    )
    return {v["user"]: v for v in views}


def test_a_record_job_serves_its_table_through_any_processor_and_rebuilds_it_where_its_task_moves(
    tmp_path: Path,
) -> None:
    (tmp_path / "job.yaml").write_text(textwrap.dedent(CONFIG))
    (tmp_path / "lastview.py").write_text(FUNCTION)
    config = load_config(tmp_path / "job.yaml")
    systems = Systems(config)
    systems.admin("local").create_stream(StreamSpec("views", 4))
    latest = send(systems, 0, 200)
    procs = {pid: Running(serving_processor(config, processor_id=pid)) for pid in ("p1", "p2")}
    try:

        def both_running() -> bool:
            ps = [r.processor for r in procs.values()]
            return all(p.state.value == "RUNNING" and p.runner is not None and p.runner.running() for p in ps)

        wait_until(both_running, 60, "both processors running tasks")
        url = {pid: r.processor.endpoint_url for pid, r in procs.items()}

        def serves(entry: str, rows: dict[str, dict[str, Any]]) -> bool:
            return all(get(f"{url[entry]}/tables/last_view/{u}") == (200, row) for u, row in rows.items())

        wait_until(lambda: serves("p1", latest) and serves("p2", latest), 60, "every user's latest view")
        status, page = get(f"{url['p2']}/tables/last_view?prefix=u1&limit=5")
        assert status == 200 and [r["key"] for r in page["rows"]] == ["u1", "u10", "u11", "u12", "u13"]
        assert get(f"{url['p1']}/tables/last_view/nobody")[0] == 404

        assert procs.pop("p2").stop() == 0  # its tasks move to p1, which rebuilds their tables
        wait_until(lambda: len(procs["p1"].processor.runner.running()) == 4, 60, "p1 running all 4 tasks")
        assert serves("p1", latest)
        newer = send(systems, 200, USERS)
        wait_until(lambda: serves("p1", newer), 30, "the moved tables following new views")
    finally:
        for running in procs.values():
            running.stop()
        systems.close()
