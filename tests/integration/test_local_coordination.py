"""Three (then four) real `weirflow run` processes on the embedded backend share a job's tasks.

Timings are shortened through config so the suite stays fast; the bounds asserted are the protocol's own
(lease + debounce + 2 s), computed from the same config values the processors use.
"""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from weirflow.cli import status_document
from weirflow.config import load_config
from weirflow.coordination.timings import CoordinationTimings
from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.local.coordination import SqliteCoordinationUtils
from weirflow.local.factories import job_database_path
from weirflow.local.launcher import ProcessorProcess, start_processor, wait_until
from weirflow.systems import Systems

pytestmark = pytest.mark.integration

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
  class: relay_task:relay
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
    def __init__(self, root: Path, timings: dict[str, int]) -> None:
        self.root = root
        self.config_path = root / "job.yaml"
        lines = "".join(f"{key}: {value}\n" for key, value in timings.items())
        self.config_path.write_text(textwrap.dedent(JOB_YAML) + lines)
        (root / "relay_task.py").write_text(RELAY)
        self.config = load_config(self.config_path)
        self.systems = Systems(self.config)
        admin = self.systems.admin("local")
        admin.create_stream(StreamSpec("events", PARTITIONS))
        admin.create_stream(StreamSpec("relayed", 3))
        self.processes: dict[str, ProcessorProcess] = {}
        self.sent = 0

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
        return status_document(self.config)

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
        self.systems.close()


@pytest.fixture
def job(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Job]:
    job = Job(tmp_path, getattr(request, "param", SHORT_TIMINGS))
    yield job
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


@pytest.mark.parametrize(
    ("job", "profile"), [(SHORT_TIMINGS, "short"), ({}, "default")], indirect=["job"], ids=["short", "default"]
)
def test_three_processors_share_tasks_and_a_killed_leader_is_replaced_within_the_lease(
    job: Job, profile: str, measure
) -> None:
    ids = {"p1", "p2", "p3"}
    for pid in sorted(ids):
        job.start(pid)
    job.produce(3000)
    took = wait_until(lambda: job.all_tasks_running_once(ids), 60, "12 tasks running once on 3 processors")
    measure(f"3 processors running all tasks {took:.1f} s after start")
    assert {len(t) for t in job.status()["assignment"].values()} == {4}

    leader = job.status()["leader"]
    assert leader in ids
    job.processes[leader].kill()
    killed_at = time.monotonic()
    job.produce(3000)
    survivors = ids - {leader}
    wait_until(lambda: job.all_tasks_running_once(survivors), 60, "all tasks running on the survivors")
    failover_s = time.monotonic() - killed_at
    new_leader = job.status()["leader"]
    timings = CoordinationTimings.from_config(job.config)
    bound_s = (timings.lease_ms + timings.debounce_ms) / 1000 + 2
    measure(
        f"[{profile} timings] leader {leader} SIGKILLed: new leader {new_leader}, all tasks running again after "
        f"{failover_s:.2f} s (bound: lease + debounce + 2 s = {bound_s:.0f} s)"
    )
    assert new_leader in survivors
    assert failover_s <= bound_s

    wait_until(lambda: len(job.relayed_ids()) >= job.sent, 60, "every event relayed")
    assert job.relayed_ids() == set(range(job.sent)), "an event was lost"
    assert_no_lock_held_twice(job.lock_history())


def test_a_fourth_processor_joining_moves_only_the_tasks_needed_for_balance(job: Job, measure) -> None:
    first = {"p1", "p2", "p3"}
    for pid in sorted(first):
        job.start(pid)
    wait_until(lambda: job.all_tasks_running_once(first), 60, "12 tasks running once on 3 processors")
    before = job.status()["assignment"]

    job.start("p4")
    everyone = first | {"p4"}
    took = wait_until(lambda: job.all_tasks_running_once(everyone), 60, "12 tasks running once on 4 processors")
    after = job.status()["assignment"]
    moved = {t for pid, tasks in after.items() for t in tasks if t not in before.get(pid, [])}
    measure(f"p4 joined: moved {sorted(moved)}; all 12 running on 4 processors {took:.2f} s after its start")
    assert len(moved) == 3, "12 tasks over 3 -> 4 processors needs exactly 3 moves"
    assert set(after["p4"]) == moved
    assert all(set(after[pid]) <= set(before[pid]) for pid in first)

    job.produce(2000)
    wait_until(lambda: len(job.relayed_ids()) >= job.sent, 60, "every event relayed")
    assert job.relayed_ids() == set(range(job.sent))
    assert_no_lock_held_twice(job.lock_history())


def test_a_stopped_processor_hands_its_tasks_over_and_reports_stopped(job: Job) -> None:
    ids = {"p1", "p2"}
    for pid in sorted(ids):
        job.start(pid)
    wait_until(lambda: job.all_tasks_running_once(ids), 60, "tasks running on 2 processors")
    assert job.processes["p2"].terminate() == 0
    wait_until(lambda: job.all_tasks_running_once({"p1"}), 60, "p1 running every task")
    rows = {p["processor_id"]: p for p in job.status()["processors"]}
    assert rows["p2"]["state"] == "STOPPED"
    assert rows["p2"]["tasks"] == []
