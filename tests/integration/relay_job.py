"""A relay job for coordination tests: record tasks copy `events` (12 partitions) to `relayed`, so tests can
prove by counting that nothing was lost. Streams stay on the embedded `local` system; the coordinator and
checkpoint backend come from the test (``extra`` config), so the same job runs on SQLite and on Azure."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path
from typing import Any

from weirflow.config import load_config
from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.job.context import JobContext
from weirflow.job.systems import Systems
from weirflow.local.coordination import SqliteCoordinationUtils
from weirflow.local.factories import job_database_path
from weirflow.local.launcher import ProcessorProcess, start_processor
from weirflow.ops.status import job_status

PARTITIONS = 12
LEASE_MS = 6000
DEBOUNCE_MS = 1000

# Shortened timings keep most tests fast; the failover test also runs once with the shipped defaults.
SHORT_TIMINGS = {
    "job.coordinator.lease.duration.ms": LEASE_MS,
    "job.coordinator.lease.renew.interval.ms": 2000,
    "job.coordinator.heartbeat.interval.ms": 1000,
    "job.coordinator.liveness.timeout.ms": 4000,
    "job.coordinator.poll.interval.ms": 250,
    "job.debounce.time.ms": DEBOUNCE_MS,
}

JOB_YAML = f"""
job:
  name: itest
task:
  inputs: [events]
  function: relay_task:relay
  commit.ms: 200
streams:
  events: {{partitions: {PARTITIONS}}}
  relayed: {{partitions: 3}}
"""

RELAY = """
def relay(record):
    return [{"stream": "relayed", "value": record["value"]}]
"""


class Job:
    def __init__(self, root: Path, timings: dict[str, Any], extra: dict[str, Any] | None = None) -> None:
        self.root = root
        self.config_path = root / "job.yaml"
        lines = "".join(f"{key}: {json.dumps(value)}\n" for key, value in {**timings, **(extra or {})}.items())
        self.config_path.write_text(textwrap.dedent(JOB_YAML) + lines)
        (root / "relay_task.py").write_text(RELAY)
        self.config = load_config(self.config_path)
        self.systems = Systems(self.config)
        admin = self.systems.admin("local")
        admin.create_stream(StreamSpec("events", PARTITIONS))
        admin.create_stream(StreamSpec("relayed", 3))
        self.processes: dict[str, ProcessorProcess] = {}
        self.sent = 0
        self._status_ctx: JobContext | None = None

    def start(self, processor_id: str) -> ProcessorProcess:
        proc = start_processor(self.config_path, processor_id, log_dir=self.root / "logs")
        self.processes[processor_id] = proc
        return proc

    def produce(self, count: int) -> None:
        records = [
            OutgoingRecord(
                "events", json.dumps({"id": self.sent + i}).encode(), partition=(self.sent + i) % PARTITIONS
            )
            for i in range(count)
        ]
        self.systems.producer("local").send(records)
        self.sent += count

    def status(self) -> dict:
        """What `weirflow status --json` prints, read through one context kept open for the test. Tests poll
        this every 100 ms, and a context opened per call builds the backend's clients again each time: on the AWS
        backend 0.45 CPU-s a call (a boto3 session and a DescribeTable per table) against 0.04 through an open
        one, on Azure 0.06 against 0.035. The CLI's own path, a context per call, is tested in test_cli.py."""
        if self._status_ctx is None:
            self._status_ctx = JobContext.open(self.config, owner="test-status")
        return job_status(self.config, self._status_ctx)

    def all_tasks_running_once(self, processors: set[str]) -> bool:
        """The model assigns every task exactly once to exactly ``processors``, and each of them reports
        running exactly its assigned tasks at that model version."""
        doc = self.status()
        assignment = doc["assignment"]
        if set(assignment) != processors or doc["task_count"] != PARTITIONS:
            return False
        assigned = [t for tasks in assignment.values() for t in tasks]
        if sorted(assigned) != sorted(f"main-{n}" for n in range(PARTITIONS)):
            return False
        rows = {p["processor_id"]: p for p in doc["processors"] if p["live"]}
        return all(
            pid in rows
            and rows[pid]["state"] == "RUNNING"
            and rows[pid]["job_model_version"] == doc["job_model_version"]
            and sorted(rows[pid]["tasks"]) == sorted(assignment[pid])
            for pid in processors
        )

    def relayed_ids(self) -> set[int]:
        consumer = self.systems.consumer("local")
        ids: set[int] = set()
        for partition in range(3):
            offset = "0"
            while batch := consumer.read(SystemStreamPartition("local", "relayed", partition), offset, 5000):
                ids.update(json.loads(r.value)["id"] for r in batch)
                offset = batch[-1].next_offset
        return ids

    def lock_history(self) -> list[dict]:
        utils = SqliteCoordinationUtils(job_database_path(self.config), owner="test", lease_ms=1000)
        try:
            return utils.lock_history()
        finally:
            utils.close()

    def close(self) -> None:
        for proc in self.processes.values():
            if proc.alive():
                proc.terminate()
        if self._status_ctx is not None:
            self._status_ctx.close()
            self._status_ctx = None
        self.systems.close()


def finish(job: Job) -> None:
    """Stop every processor and print the end of each log (shown by pytest when the test failed)."""
    job.close()
    for proc in job.processes.values():
        print(f"--- log of {proc.processor_id} (last 30 lines)")
        print("\n".join(proc.log_text().splitlines()[-30:]))


def assert_no_lock_held_twice(history: list[dict]) -> None:
    by_lock: dict[str, list[dict]] = {}
    for row in history:
        by_lock.setdefault(row["name"], []).append(row)
    now = int(time.time() * 1000)
    for name, rows in by_lock.items():
        rows.sort(key=lambda r: r["acquired_ms"])
        for earlier, later in zip(rows, rows[1:], strict=False):
            end = earlier["ended_ms"] if earlier["ended_ms"] is not None else now
            assert end <= later["acquired_ms"], f"{name} held by {earlier['owner']} and {later['owner']} at once"
