"""Handover under faults, proved by counting: every output is tagged with the task, the processor and the lock
epoch that wrote it (`weirflow.tasks.record_task.current_task`), and the write time of each output (stamped
by the embedded log when it is appended) gives each tenure (task, processor, epoch) an interval. Two tenures
of one task that overlap in time are two processors writing for one task at once: `overlap_ms` must be 0.

* SIGTERM (SQLite): a processor with 4 tasks busy with records that outlast the lease stops them in parallel
  while its keeper still renews their locks, writes every final checkpoint, releases every lock; nothing
  overlaps.
* Blackhole (Azure, Azurite behind `tests/support/tcp_proxy.py`): one processor loses storage while another
  reaches it directly, until that other one has taken over and written for every task of the cut-off one (the
  other one breaks the cut-off one's locks once its heartbeat is older than the liveness timeout); the cut-off
  one fences itself first (stops its tasks when its heartbeat or a lock was not confirmed in time), the other
  takes the tasks over, and no time exists when both wrote for one task.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REAL_ACCOUNT_ENV, unique_job_name
from tests.integration.relay_job import (
    PARTITIONS,
    SHORT_TIMINGS,
    Job,
    assert_no_lock_held_twice,
    finish,
)
from weirflow.interfaces.system import SystemStreamPartition
from weirflow.local.launcher import start_processor
from weirflow.testing import wait_until

pytestmark = pytest.mark.integration

TAGGED_RELAY = """
import json
import os
import threading
import time
import uuid

from weirflow.tasks.record_task import current_task

DELAY_S = {delay}
SLOW = {slow!r}  # the processor whose records take DELAY_S (None: every processor's)
MARKS = {marks!r}
_thread = threading.local()  # each start of a task is a new thread: a run id per tenure, whatever the epoch


def relay(record):
    task = current_task()
    if not hasattr(_thread, "run"):
        _thread.run = uuid.uuid4().hex
        open(os.path.join(MARKS, task.processor_id + "." + task.name), "w").close()  # the task began a poll
    if DELAY_S and SLOW in (None, task.processor_id):
        time.sleep(DELAY_S)  # not synchronisation: a slow record, the load under test
    tag = {{"task": task.name, "processor": task.processor_id, "epoch": task.epoch, "run": _thread.run}}
    return [{{"stream": "relayed", "value": {{"id": json.loads(record["value"])["id"], **tag}}}}]
"""


def tag_outputs(job: Job, delay_s: float = 0.0, slow: str | None = None) -> None:
    marks = job.root / "marks"
    marks.mkdir(exist_ok=True)
    (job.root / "relay_task.py").write_text(TAGGED_RELAY.format(delay=delay_s, slow=slow, marks=str(marks)))


def begun(job: Job, processor: str) -> set[str]:
    """The tasks ``processor`` has begun relaying records for (the relay marks a task's first record)."""
    names = [m.name.split(".", 1) for m in (job.root / "marks").iterdir()]
    return {task for owner, task in names if owner == processor}


@dataclass
class Tenure:
    task: str
    processor: str
    epoch: int
    first_ms: int
    last_ms: int
    outputs: int


def tenures(job: Job) -> list[Tenure]:
    """Per tenure (task, processor, epoch, and the run of the task thread): first and last write time."""
    consumer = job.systems.consumer("local")
    found: dict[tuple[str, str, int, str], Tenure] = {}
    for partition in range(3):
        offset = "0"
        while batch := consumer.read(SystemStreamPartition("local", "relayed", partition), offset, 5000):
            for record in batch:
                tag = json.loads(record.value)
                key = (tag["task"], tag["processor"], tag["epoch"], tag["run"])
                tenure = found.setdefault(
                    key, Tenure(tag["task"], tag["processor"], tag["epoch"], record.timestamp_ms, 0, 0)
                )
                tenure.first_ms = min(tenure.first_ms, record.timestamp_ms)
                tenure.last_ms = max(tenure.last_ms, record.timestamp_ms)
                tenure.outputs += 1
            offset = batch[-1].next_offset
    return sorted(found.values(), key=lambda t: (t.task, t.first_ms))


def overlap_ms(found: list[Tenure]) -> int:
    """Total time two tenures of one task both wrote (their write intervals intersect)."""
    total = 0
    for i, a in enumerate(found):
        for b in found[i + 1 :]:
            if a.task == b.task:
                total += max(0, min(a.last_ms, b.last_ms) - max(a.first_ms, b.first_ms))
    return total


def assert_fenced_epochs(found: list[Tenure]) -> None:
    """Every tenure has a lock epoch, and a task's next holder a greater one than its last (the fencing token;
    a processor that takes its own unexpired lease again keeps the epoch)."""
    assert all(t.epoch > 0 for t in found), "outputs carry no lock epoch (Lock.epoch not set by try_acquire)"
    for earlier, later in zip(found, found[1:], strict=False):  # sorted by task, then first write
        if earlier.task == later.task:
            grows = later.epoch > earlier.epoch or (
                later.processor == earlier.processor and later.epoch == earlier.epoch
            )
            assert grows, f"{later.task}: epoch {earlier.epoch} ({earlier.processor}) then {later.epoch}"


class Producer:
    """Produces ``per_tick`` events every ``interval_s`` in a thread, so every task keeps writing."""

    def __init__(self, job: Job, per_tick: int = 24, interval_s: float = 0.25) -> None:
        self._job = job
        self._per_tick = per_tick
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Producer:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._job.produce(self._per_tick)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# --- SIGTERM hands over cleanly ------------------------------------------------------------------------------
def test_sigterm_stops_busy_tasks_in_parallel_under_renewed_locks_and_hands_over_without_overlap(
    tmp_path: Path, measure
) -> None:
    # A stop waits for the record in hand (docs/architecture.md): on p3 one record takes 9 s, half as long
    # again as the 6 s lease, so its locks must be renewed while it stops. p3 is stopped as soon as each of its
    # tasks began its first record; p1 and p2 relay at full speed.
    job = Job(tmp_path, SHORT_TIMINGS)
    tag_outputs(job, delay_s=9.0, slow="p3")
    try:
        ids = {"p1", "p2", "p3"}
        for pid in sorted(ids):
            job.start(pid)
        wait_until(lambda: job.all_tasks_running_once(ids), 60, "12 tasks running once on 3 processors")
        leaving = sorted(job.status()["assignment"]["p3"])
        assert len(leaving) == PARTITIONS // 3
        job.produce(PARTITIONS * 60)
        wait_until(lambda: begun(job, "p3") == set(leaving), 60, "every task of p3 busy with a record")

        terminated_at = time.monotonic()
        assert job.processes["p3"].terminate(timeout_s=90) == 0
        took = time.monotonic() - terminated_at
        measure(f"p3 SIGTERMed with {len(leaving)} busy tasks: stopped in {took:.1f} s (lease 6 s)")

        wait_until(lambda: job.all_tasks_running_once({"p1", "p2"}), 60, "p1 and p2 running every task")
        wait_until(lambda: len(job.relayed_ids()) >= job.sent, 120, "every event relayed")
        assert job.relayed_ids() == set(range(job.sent)), "an event was lost"

        history = job.lock_history()
        assert_no_lock_held_twice(history)
        ends = {r["name"]: r["end_reason"] for r in history if r["owner"] == "p3" and r["name"] != "leader"}
        assert ends == {f"task-{t}": "released" for t in leaving}, f"p3's locks ended as {ends}"
        found = tenures(job)
        assert overlap_ms(found) == 0, [t for t in found if t.task in leaving]
        log = job.processes["p3"].log_text()
        for refused in ("LockLostError", "FencedOffError", "lost the lock", "abandoned", "did not stop"):
            assert refused not in log, f"p3's log shows {refused!r}: a final checkpoint was refused or skipped"
        rows = {p["processor_id"]: p for p in job.status()["processors"]}
        assert rows["p3"]["state"] == "STOPPED" and rows["p3"]["tasks"] == []
    finally:
        finish(job)


# --- a processor cut off from storage fences itself ----------------------------------------------------------
@pytest.fixture
def proxy(azure_storage: str) -> Iterator[object]:
    if os.environ.get(REAL_ACCOUNT_ENV):
        pytest.skip("proxies Azurite's local ports; not a real account")
    from tests.support.tcp_proxy import AzuriteProxy

    with AzuriteProxy(azure_storage) as running:
        yield running


def test_a_processor_cut_off_from_storage_stops_its_tasks_before_another_takes_them(
    tmp_path: Path, azure_storage: str, proxy, measure
) -> None:
    job = Job(
        tmp_path,
        {},  # the shipped timings: 15 s leases, renewed every 5 s, a 5 s margin
        {
            "job.name": unique_job_name("fence"),
            "job.coordinator.factory": "azure",
            "task.checkpoint.factory": "azure-table",
            "azure.storage.connection.string": azure_storage,
            # no checkpoint falls due during the test (only final ones, on handover): a cut-off task touches
            # no storage and would go on writing outputs but for the self-fence
            "task.commit.ms": 120000,
        },
    )
    tag_outputs(job)
    try:
        # p2 reaches storage only through the proxy; it starts first, so it is normally the leader too
        job.processes["p2"] = start_processor(
            job.config_path,
            "p2",
            [f"azure.storage.connection.string={proxy.connection_string}"],
            log_dir=job.root / "logs",
        )
        # a status read opens the job's storage and reads leader, model, registry and checkpoints: polled every
        # 0.25-0.5 s
        wait_until(lambda: job.status()["leader"] == "p2", 60, "p2 leading", interval_s=0.5)
        job.start("p1")
        wait_until(lambda: job.all_tasks_running_once({"p1", "p2"}), 90, "tasks running on p1 and p2", 0.5)
        cut_off = sorted(job.status()["assignment"]["p2"])

        with Producer(job):
            wait_until(
                lambda: {t.task for t in tenures(job) if t.processor == "p2"} >= set(cut_off),
                60,
                "every task of p2 writing",
                interval_s=0.5,
            )
            blackholed_ms = int(time.time() * 1000)
            proxy.blackhole()
            blackholed_at = time.monotonic()
            took = wait_until(lambda: job.all_tasks_running_once({"p1"}), 90, "p1 running every task", 0.25)
            measure(f"[azure] p2 cut off from storage: p1 runs all tasks after {took:.1f} s")
            # the outage lasts until p1 wrote for every task of p2: the time both could have written
            wait_until(
                lambda: (
                    {t.task for t in tenures(job) if t.processor == "p1" and t.first_ms >= blackholed_ms}
                    >= set(cut_off)
                ),
                60,
                "p1 writing for every task of p2",
                interval_s=0.25,
            )
            proxy.heal()
            measure(f"[azure] p2 cut off from storage for {time.monotonic() - blackholed_at:.1f} s")
            took = wait_until(
                lambda: job.all_tasks_running_once({"p1", "p2"}), 120, "p2 back, tasks on both", interval_s=0.25
            )
            measure(f"[azure] storage back for p2: tasks on both processors again after {took:.1f} s")
        wait_until(lambda: len(job.relayed_ids()) >= job.sent, 90, "every event relayed", interval_s=0.5)
        assert job.relayed_ids() == set(range(job.sent)), "an event was lost"

        found = tenures(job)
        assert overlap_ms(found) == 0, "two processors wrote for one task at once"
        gaps = []
        for task in cut_off:
            rows = [t for t in found if t.task == task]
            fenced = next(t for t in rows if t.processor == "p2")
            successor = next(t for t in rows if t.first_ms > fenced.first_ms and t.processor == "p1")
            gaps.append(successor.first_ms - fenced.last_ms)
        measure(f"[azure] from p2's last write to p1's first, per task: {min(gaps)}..{max(gaps)} ms")
        assert all(g > 0 for g in gaps)
        assert_fenced_epochs(found)
        log = job.processes["p2"].log_text()
        # whichever deadline passed first: a lock's (lease - margin) or the heartbeat's (liveness - margin)
        fenced_by = (
            r"(not confirmed within lease|no heartbeat of this processor was confirmed within liveness) - margin"
        )
        assert re.search(fenced_by, log), "p2 did not fence itself"
    finally:
        finish(job)
