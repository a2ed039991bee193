"""Real `weirflow run` processes coordinated through Azure Storage (Azurite, or a real account).

The job is the relay job of the local coordination tests with two keys changed — `job.coordinator.factory:
azure` and `task.checkpoint.factory: azure-table` — and the shipped default timings (blob leases cannot be
shorter than 15 s). Streams stay on the embedded system, so what is under test is the coordination alone.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import unique_job_name
from tests.integration.relay_job import PARTITIONS, Job, finish
from weirflow.interfaces.timings import CoordinationTimings
from weirflow.testing import wait_until
from weirflow_azure.checkpoint.table import TableCheckpointManager
from weirflow_azure.coordinator.storage import Storage

pytestmark = pytest.mark.integration


def azure_job(root: Path, connection_string: str) -> Job:
    return Job(
        root,
        {},
        {
            "job.name": unique_job_name("itest"),
            "job.coordinator.factory": "azure",
            "task.checkpoint.factory": "azure-table",
            "azure.storage.connection.string": connection_string,
        },
    )


@pytest.fixture
def job(tmp_path: Path, azure_storage: str) -> Iterator[Job]:
    job = azure_job(tmp_path, azure_storage)
    yield job
    finish(job)


def checkpoint_offsets(job: Job) -> dict[str, dict[str, int]]:
    manager = TableCheckpointManager(Storage.from_config(job.config))
    try:
        return {
            task: {ssp.key(): int(offset) for ssp, offset in checkpoint.offsets.items()}
            for task, checkpoint in manager.read_all().items()
            if checkpoint.offsets  # a task claimed by its holder (epoch only) has no offsets yet
        }
    finally:
        manager.stop()


def partition_ends(job: Job) -> dict[str, int]:
    """Per task, the offset after the last event of its partition (task ``main-n`` reads partition n)."""
    meta = job.systems.admin("local").partition_metadata("events")
    return {f"main-{n}": int(meta[n].upcoming) for n in range(PARTITIONS)}


def test_three_processors_share_tasks_and_a_killed_leader_is_replaced_by_a_survivor(job: Job, measure) -> None:
    ids = {"p1", "p2", "p3"}
    for pid in sorted(ids):
        job.start(pid)
    job.produce(3000)
    took = wait_until(lambda: job.all_tasks_running_once(ids), 90, "12 tasks running once on 3 processors")
    measure(f"[azure] 3 processors running all tasks {took:.1f} s after start")
    assert {len(t) for t in job.status()["assignment"].values()} == {4}

    leader = job.status()["leader"]
    assert leader in ids
    job.processes[leader].kill()
    killed_at = time.monotonic()
    job.produce(3000)
    survivors = ids - {leader}
    wait_until(lambda: job.all_tasks_running_once(survivors), 90, "all tasks running on the survivors")
    failover_s = time.monotonic() - killed_at
    new_leader = job.status()["leader"]
    lease_s = CoordinationTimings.from_config(job.config).lease_ms / 1000
    measure(
        f"[azure, default timings] leader {leader} SIGKILLed: new leader {new_leader}, all tasks running again "
        f"after {failover_s:.2f} s (lease {lease_s:.0f} s)"
    )
    assert new_leader in survivors

    wait_until(lambda: len(job.relayed_ids()) >= job.sent, 60, "every event relayed")
    assert job.relayed_ids() == set(range(job.sent)), "an event was lost"
    ends = partition_ends(job)
    wait_until(
        lambda: checkpoint_offsets(job) == {t: {f"local.events.{t[5:]}": e} for t, e in ends.items()},
        30,
        "every task checkpointed at the end of its partition",
    )


def test_a_processor_joining_and_one_leaving_move_only_the_tasks_needed(job: Job, measure) -> None:
    first = {"p1", "p2", "p3"}
    for pid in sorted(first):
        job.start(pid)
    wait_until(lambda: job.all_tasks_running_once(first), 90, "12 tasks running once on 3 processors")
    before = job.status()["assignment"]

    job.start("p4")
    everyone = first | {"p4"}
    took = wait_until(lambda: job.all_tasks_running_once(everyone), 90, "12 tasks running once on 4 processors")
    after = job.status()["assignment"]
    moved = {t for pid, tasks in after.items() for t in tasks if t not in before.get(pid, [])}
    measure(f"[azure] p4 joined: moved {sorted(moved)}; all 12 running on 4 processors {took:.2f} s after start")
    assert len(moved) == 3, "12 tasks over 3 -> 4 processors needs exactly 3 moves"
    assert set(after["p4"]) == moved
    assert all(set(after[pid]) <= set(before[pid]) for pid in first)

    assert job.processes["p2"].terminate() == 0
    remaining = everyone - {"p2"}
    took = wait_until(lambda: job.all_tasks_running_once(remaining), 90, "12 tasks running on 3 processors")
    final = job.status()["assignment"]
    moved_after_leave = {t for pid, tasks in final.items() for t in tasks if t not in after.get(pid, [])}
    measure(f"[azure] p2 left: moved {sorted(moved_after_leave)} in {took:.2f} s")
    assert moved_after_leave == set(after["p2"]), "only the leaver's tasks move"
    assert all(set(after[pid]) <= set(final[pid]) for pid in remaining)

    job.produce(2000)
    wait_until(lambda: len(job.relayed_ids()) >= job.sent, 60, "every event relayed")
    assert job.relayed_ids() == set(range(job.sent))


def test_a_paused_processor_commits_nothing_for_tasks_it_lost_and_rejoins(job: Job, measure) -> None:
    ids = {"p1", "p2"}
    for pid in sorted(ids):
        job.start(pid)
    wait_until(lambda: job.all_tasks_running_once(ids), 90, "tasks running on 2 processors")
    job.produce(1200)
    ends = partition_ends(job)
    wait_until(
        lambda: {t: max(o.values()) for t, o in checkpoint_offsets(job).items()} == ends,
        60,
        "every task checkpointed at the end of its partition",
    )
    paused_tasks = set(job.status()["assignment"]["p2"])
    paused_at = dict(ends)

    os.kill(job.processes["p2"].pid, signal.SIGSTOP)
    try:
        # Far more per partition than one poll (500 records), so any write p2 could make after waking up
        # would hold an offset behind what p1 has committed by then.
        job.produce(12 * 1500)
        took = wait_until(lambda: job.all_tasks_running_once({"p1"}), 90, "p1 running every task")
        measure(f"[azure] p2 SIGSTOPped: p1 runs all tasks after {took:.1f} s")
        ends = partition_ends(job)
        wait_until(
            lambda: {t: max(o.values()) for t, o in checkpoint_offsets(job).items()} == ends,
            60,
            "p1 checkpointed the paused processor's tasks to the end",
        )
    finally:
        os.kill(job.processes["p2"].pid, signal.SIGCONT)

    # p2 wakes up believing it runs its old tasks. Watch the table until it has rejoined.
    seen: list[dict[str, dict[str, int]]] = []

    def rejoined() -> bool:
        seen.append(checkpoint_offsets(job))
        return job.all_tasks_running_once(ids)

    took = wait_until(rejoined, 120, "p2 to rejoin and the tasks to spread over p1 and p2 again", interval_s=0.2)
    measure(f"[azure] p2 SIGCONTed: rejoined, tasks on 2 processors after {took:.1f} s; {len(seen)} table reads")
    for snapshot in seen:
        for task in paused_tasks:
            offset = max(snapshot[task].values())
            assert offset == ends[task], f"{task} checkpoint moved to {offset} (p1 had committed {ends[task]})"
    assert all(paused_at[t] < ends[t] for t in paused_tasks)
    log = job.processes["p2"].log_text()
    assert "lost the lock" in log or "LockLostError" in log, "p2 should have found its locks lost"
    wait_until(lambda: len(job.relayed_ids()) >= job.sent, 60, "every event relayed")
    assert job.relayed_ids() == set(range(job.sent))


def test_processors_ride_out_storage_going_away_for_ten_seconds(tmp_path: Path, own_azurite, measure) -> None:
    (tmp_path / "job").mkdir()
    job = azure_job(tmp_path / "job", own_azurite.connection_string)
    try:
        ids = {"p1", "p2"}
        for pid in sorted(ids):
            job.start(pid)
        wait_until(lambda: job.all_tasks_running_once(ids), 90, "tasks running on 2 processors")
        pids = {pid: proc.pid for pid, proc in job.processes.items()}
        job.produce(2000)

        own_azurite.stop()
        stopped_at = time.monotonic()
        job.produce(2000)  # the streams are local: events keep arriving while storage is away
        time.sleep(10)  # not synchronisation: the outage itself, storage stays away for 10 s
        own_azurite.start()
        measure(f"[azure] storage away for {time.monotonic() - stopped_at:.1f} s")

        took = wait_until(lambda: job.all_tasks_running_once(ids), 120, "both processors running every task again")
        measure(f"[azure] all tasks running on both processors {took:.1f} s after storage came back")
        assert all(proc.alive() for proc in job.processes.values()), "a processor died"
        assert {pid: proc.pid for pid, proc in job.processes.items()} == pids, "a processor was restarted"
        job.produce(1000)
        wait_until(lambda: len(job.relayed_ids()) >= job.sent, 90, "every event relayed")
        assert job.relayed_ids() == set(range(job.sent)), "an event was lost"
        ends = partition_ends(job)
        wait_until(
            lambda: {t: max(o.values()) for t, o in checkpoint_offsets(job).items()} == ends,
            60,
            "checkpoints at the end of every partition",
        )
    finally:
        finish(job)
