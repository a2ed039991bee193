"""One processor id, one live process (weirflow.coordination.identity): a second `weirflow run` with the id of
a running processor refuses to start; a SIGKILLed processor restarted with its id takes over, losing nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.relay_job import SHORT_TIMINGS, Job, assert_no_lock_held_twice, finish
from weirflow.local.launcher import start_processor
from weirflow.testing import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Job]:
    job = Job(tmp_path, SHORT_TIMINGS)
    yield job
    finish(job)


def test_a_second_process_with_a_running_processor_s_id_refuses_to_start(job: Job, measure) -> None:
    first = job.start("p1")
    job.produce(600)
    wait_until(lambda: job.all_tasks_running_once({"p1"}), 90, "p1 running every task")
    second = start_processor(job.config_path, "p1", log_dir=job.root / "second")
    code = second.popen.wait(timeout=60)
    text = second.log_text()
    assert code != 0, "a second run of p1 started beside the first"
    assert "processor id 'p1' is already running" in text and "--processor-id" in text, text[-2000:]
    assert f"pid {first.pid}" in text, "the error names the running process"
    assert "started task" not in text
    assert first.alive() and job.all_tasks_running_once({"p1"})
    holders = {row["owner"] for row in job.lock_history()}
    assert holders == {"p1"}
    job.produce(600)
    wait_until(lambda: len(job.relayed_ids()) >= job.sent, 60, "every event relayed")
    assert job.relayed_ids() == set(range(job.sent))
    measure(f"second run of p1 refused in its log: exit code {code}")


def test_a_killed_processor_restarted_with_its_id_takes_over_and_loses_nothing(job: Job, measure) -> None:
    job.start("p1")
    job.produce(1200)
    wait_until(lambda: job.all_tasks_running_once({"p1"}), 90, "p1 running every task")
    job.processes["p1"].kill()
    job.produce(1200)
    restarted = start_processor(job.config_path, "p1", log_dir=job.root / "restarted")
    job.processes["p1-restarted"] = restarted

    def restarted_runs_everything() -> bool:
        rows = [p for p in job.status()["processors"] if p["processor_id"] == "p1"]
        return bool(rows) and rows[0]["pid"] == restarted.pid and job.all_tasks_running_once({"p1"})

    took = wait_until(restarted_runs_everything, 120, "the restarted p1 running every task")
    assert "it is gone, taking the id over" in restarted.log_text()
    wait_until(lambda: len(job.relayed_ids()) >= job.sent, 60, "every event relayed")
    assert job.relayed_ids() == set(range(job.sent))
    assert_no_lock_held_twice(job.lock_history())
    measure(f"restarted p1 ran every task {took:.1f} s after the restart")
