"""Three (then four) real `weirflow run` processes on the embedded backend share a job's tasks.

Timings are shortened through config so the suite stays fast; the bounds asserted are the protocol's own
(lease + debounce + 2 s), computed from the same config values the processors use.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.relay_job import SHORT_TIMINGS, Job, assert_no_lock_held_twice, finish
from weirflow.interfaces.timings import CoordinationTimings
from weirflow.testing import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def job(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Job]:
    job = Job(tmp_path, getattr(request, "param", SHORT_TIMINGS))
    yield job
    finish(job)


def start_running(job: Job, ids: set[str]) -> float:
    """Start ``ids``, send 3,000 events, wait until every task runs once; seconds it took."""
    for pid in sorted(ids):
        job.start(pid)
    job.produce(3000)
    return wait_until(
        lambda: job.all_tasks_running_once(ids), 60, f"12 tasks running once on {len(ids)} processors"
    )


def kill_and_fail_over(job: Job, victim: str, ids: set[str], within_s: float) -> tuple[set[str], float]:
    """SIGKILL ``victim``, send 3,000 more events, wait up to ``within_s`` until the survivors run every task;
    the survivors and the seconds from the kill."""
    job.processes[victim].kill()
    killed_at = time.monotonic()
    job.produce(3000)
    survivors = ids - {victim}
    wait_until(lambda: job.all_tasks_running_once(survivors), within_s, "all tasks running on the survivors")
    return survivors, time.monotonic() - killed_at


@pytest.mark.parametrize(
    ("job", "profile"), [(SHORT_TIMINGS, "short"), ({}, "default")], indirect=["job"], ids=["short", "default"]
)
def test_three_processors_share_tasks_and_a_killed_leader_is_replaced_by_a_survivor(
    job: Job, profile: str, measure
) -> None:
    ids = {"p1", "p2", "p3"}
    took = start_running(job, ids)
    measure(f"3 processors running all tasks {took:.1f} s after start")
    assert {len(t) for t in job.status()["assignment"].values()} == {4}

    leader = job.status()["leader"]
    assert leader in ids
    survivors, failover_s = kill_and_fail_over(job, leader, ids, 60)
    new_leader = job.status()["leader"]
    timings = CoordinationTimings.from_config(job.config)
    measure(
        f"[{profile} timings] leader {leader} SIGKILLed: new leader {new_leader}, all tasks running again after "
        f"{failover_s:.2f} s (lease {timings.lease_ms / 1000:.0f} s, debounce {timings.debounce_ms / 1000:.0f} s)"
    )
    assert new_leader in survivors

    wait_until(lambda: len(job.relayed_ids()) >= job.sent, 60, "every event relayed")
    assert job.relayed_ids() == set(range(job.sent)), "an event was lost"
    assert_no_lock_held_twice(job.lock_history())


# A lease far longer than the liveness timeout: a killed processor's leases can only move sooner by being broken.
LONG_LEASES = {
    **SHORT_TIMINGS,
    "job.coordinator.lease.duration.ms": 60000,
    "job.coordinator.lease.renew.interval.ms": 5000,
}


@pytest.mark.parametrize("job", [LONG_LEASES], indirect=True, ids=["60 s leases"])
def test_a_killed_leaders_leases_are_broken_once_it_is_silent_not_when_they_expire(job: Job, measure) -> None:
    """The survivors break the leadership lease and the task locks of a processor silent past the liveness
    timeout (4 s here) instead of waiting for its 60 s leases to expire; nothing is lost or held twice."""
    ids = {"p1", "p2", "p3"}
    start_running(job, ids)
    leader = job.status()["leader"]
    held = {row["name"] for row in job.lock_history() if row["owner"] == leader and row["ended_ms"] is None}
    assert "leader" in held and len(held) == 5, held
    # well inside the 55-60 s the leases would still last: only a break moves them this soon
    survivors, took = kill_and_fail_over(job, leader, ids, 45)
    measure(f"leader {leader} SIGKILLed, 60 s leases: all tasks running again after {took:.1f} s")
    assert job.status()["leader"] in survivors
    ended = {
        row["name"]: row["end_reason"]
        for row in job.lock_history()
        if row["owner"] == leader and row["name"] in held
    }
    assert ended == dict.fromkeys(held, "broken"), ended
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
