"""Spark tasks obey the fence, proved by who wrote what when.

The job copies `events` (8 partitions; event ``id`` lives in partition ``id % 8``, so its task is known) to
`copied`, and tags every output with the process id of the processor whose Spark wrote it (a literal planned
into that processor's query). The embedded log stamps each output with its write time, and the job database
keeps every tenure of every task lock (`lease_history`). The property under test: **no processor writes an
output for a task after another processor acquired that task's lock.**

One test, two faults on the same job (one Spark start-up for both):

* SIGSTOP: a processor running 4 Spark tasks is paused mid-batch until the other processor holds the locks of
  its tasks and the paused one's Spark has had a write refused. Its Python process stops; its Spark JVM and
  Python workers do not, and go on with the batch's transform. The other processor takes the tasks over; the
  paused one's workers must write none of it (the sink's fence, `weirflow.spark.fence`), and once resumed the
  processor abandons those tasks itself.
* SIGTERM: back with 4 busy Spark tasks (a transform of 20 ms per event ahead of the sink), the same
  processor is stopped: its queries stop in parallel, every final checkpoint is written and every lock
  released; nothing written outside a tenure, no refused checkpoint, nothing lost.

After both faults every event is in the output exactly once: what a cancelled or refused batch had sent is
sent again by the next holder with the same ids, which the embedded log drops (docs/guarantees.md).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import textwrap
import time
from pathlib import Path

import pytest

from weirflow.cli import status_document
from weirflow.config import load_config
from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.job.systems import Systems
from weirflow.local.coordination import SqliteCoordinationUtils
from weirflow.local.factories import job_database_path, stream_database_path
from weirflow.local.launcher import ProcessorProcess, start_processor
from weirflow.testing import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]

PARTITIONS = 8  # two processors run 4 tasks each
LEASE_MS = 5000

JOB_YAML = f"""
job:
  name: fenced-copy
app:
  pipeline: pipeline:pipeline
streams:
  events:
    partitions: {PARTITIONS}
    schema: "id bigint"
  copied:
    partitions: 2
spark:
  master: "local[2]"
spark.sql.execution.arrow.maxRecordsPerBatch: 20
job.coordinator.lease.duration.ms: {LEASE_MS}
job.coordinator.lease.renew.interval.ms: 1500
job.coordinator.heartbeat.interval.ms: 1000
job.coordinator.liveness.timeout.ms: 4000
job.coordinator.poll.interval.ms: 250
job.debounce.time.ms: 1000
"""

PIPELINE = """
import os
import time

from pyspark.sql import functions as F

DELAY_S = {delay}
MARKS = {marks!r}


def _slow(value):
    if value % 40 < 8:  # tells the test which events the transform is busy with (a few of each partition)
        open(os.path.join(MARKS, str(value)), "w").close()
    time.sleep(DELAY_S)  # not synchronisation: a slow transform, the load under test
    return value


def tag(events):
    ident = F.udf(_slow, "bigint")("id") if DELAY_S else F.col("id")
    # planned in this processor's Python process: the pid of the processor whose Spark writes the row. Columns
    # are replaced and added, not selected, so the rows keep their input positions and the outputs their ids: a
    # batch written before a pause and replayed by the next holder is dropped by the log (docs/guarantees.md)
    return events.withColumn("id", ident).withColumn("writer", F.lit(os.getpid()))


def pipeline(app):
    app.input("events").transform(tag).send_to("copied", key=F.col("id").cast("string"))
"""


class CopyJob:
    def __init__(self, root: Path, delay_s: float = 0.0) -> None:
        self.root = root
        state = f"job.state.dir: {json.dumps(str(root / 'state'))}\n"
        (root / "job.yaml").write_text(textwrap.dedent(JOB_YAML) + state)
        self.marks = root / "marks"
        self.marks.mkdir()
        (root / "pipeline.py").write_text(PIPELINE.format(delay=delay_s, marks=str(self.marks)))
        self.config = load_config(root / "job.yaml")
        self.systems = Systems(self.config)
        admin = self.systems.admin("local")
        admin.create_stream(StreamSpec("events", PARTITIONS))
        admin.create_stream(StreamSpec("copied", 2))
        self.processes: dict[str, ProcessorProcess] = {}
        self.sent: set[int] = set()
        self._next_id = 0

    def start(self, processor_id: str) -> ProcessorProcess:
        proc = start_processor(self.root / "job.yaml", processor_id, log_dir=self.root / "logs")
        self.processes[processor_id] = proc
        return proc

    def produce(self, count: int, partitions: set[int] | None = None) -> set[int]:
        """Send ``count`` events (ids continue the sequence; only ids of ``partitions``, when given)."""
        ids: list[int] = []
        while len(ids) < count:
            if partitions is None or self._next_id % PARTITIONS in partitions:
                ids.append(self._next_id)
            self._next_id += 1
        records = [OutgoingRecord("events", json.dumps({"id": i}).encode(), partition=i % PARTITIONS) for i in ids]
        self.systems.producer("local").send(records)
        self.sent.update(ids)
        return set(ids)

    def outputs(self) -> list[tuple[int, int, int]]:
        """Every output as (event id, writer pid, write time in ms)."""
        consumer = self.systems.consumer("local")
        found = []
        for partition in range(2):
            offset = "0"
            while batch := consumer.read(SystemStreamPartition("local", "copied", partition), offset, 10_000):
                for record in batch:
                    row = json.loads(record.value)
                    found.append((int(row["id"]), int(row["writer"]), record.timestamp_ms))
                offset = batch[-1].next_offset
        return found

    def transforming(self, ids: set[int]) -> bool:
        """Whether the transform has begun on any of ``ids`` (it marks a few of every 40 events it sees)."""
        return any(int(mark.name) in ids for mark in self.marks.iterdir())

    def acquired_since(self, owner: str, tasks: list[str], since_ms: int) -> bool:
        """Whether ``owner`` acquired the lock of every task of ``tasks`` at or after ``since_ms``."""
        taken = {r["name"] for r in self.tenures() if r["owner"] == owner and r["acquired_ms"] >= since_ms}
        return {f"task-{t}" for t in tasks} <= taken

    def written_by(self, proc: ProcessorProcess) -> set[int]:
        return {i for i, writer, _ in self.outputs() if writer == proc.pid}

    def all_copied(self) -> bool:
        return {i for i, _, _ in self.outputs()} >= self.sent

    def tenures(self) -> list[dict]:
        utils = SqliteCoordinationUtils(job_database_path(self.config), owner="test", lease_ms=1000)
        try:
            return [r for r in utils.lock_history() if r["name"].startswith("task-")]
        finally:
            utils.close()

    def assignment(self) -> dict[str, list[str]]:
        return status_document(self.config)["assignment"]

    def pause(self, proc: ProcessorProcess) -> None:
        """SIGSTOP ``proc`` outside any write to the job's SQLite files.

        SQLite's write lock is a file lock of the writing process: a processor stopped inside one of its
        (millisecond) writes would keep every other processor from writing until it resumed, renewals
        included, so everybody would lose their locks (docs/coordination.md, "Embedded: a paused writer").
        That is a fault of the embedded store, not of the fence under test; so the test takes the write lock of
        each database itself (waiting for any write in flight to commit), stops the processor, and lets go.
        """
        held = []
        try:
            for path in (job_database_path(self.config), stream_database_path(self.config, "local")):
                conn = sqlite3.connect(path, timeout=30, isolation_level=None)
                held.append(conn)
                conn.execute("BEGIN IMMEDIATE")
            os.kill(proc.pid, signal.SIGSTOP)
        finally:
            for conn in held:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                conn.close()

    def close(self) -> None:
        for proc in self.processes.values():
            if proc.alive():
                proc.terminate()
        self.systems.close()
        for proc in self.processes.values():
            print(f"--- log of {proc.processor_id} (last 40 lines)")
            print("\n".join(proc.log_text().splitlines()[-40:]))


@pytest.fixture
def copy_job(tmp_path: Path, request: pytest.FixtureRequest):
    """The copy job; ``request.param`` (indirect parametrisation) is the per-event delay of its transform."""
    job = CopyJob(tmp_path, delay_s=getattr(request, "param", 0.0))
    yield job
    job.close()


def _task_of(event_id: int, tasks: list[str]) -> str:
    suffix = f"-{event_id % PARTITIONS}"
    return next(t for t in tasks if t.endswith(suffix))


def writes_after_takeover(job: CopyJob) -> list[str]:
    """Outputs written by a processor for a task after another processor acquired that task's lock."""
    pids = {proc.pid: pid for pid, proc in job.processes.items()}
    tenures = job.tenures()
    tasks = sorted({r["name"].removeprefix("task-") for r in tenures})
    by_task: dict[str, list[dict]] = {}
    for r in tenures:
        by_task.setdefault(r["name"].removeprefix("task-"), []).append(r)
    bad = []
    for event_id, writer_pid, written_ms in job.outputs():
        writer = pids.get(writer_pid, str(writer_pid))
        task = _task_of(event_id, tasks)
        # the latest tenure begun at or before the write: it must be the writer's own
        holder = max(
            (r for r in by_task[task] if r["acquired_ms"] <= written_ms),
            key=lambda r: r["acquired_ms"],
            default=None,
        )
        if holder is None or holder["owner"] != writer:
            held_by = holder["owner"] if holder else "nobody"
            bad.append(f"event {event_id} of {task} written by {writer} at {written_ms} while {held_by} held it")
    return bad


def _partitions_of(tasks: list[str]) -> set[int]:
    return {int(t.rsplit("-", 1)[1]) for t in tasks}


@pytest.mark.parametrize("copy_job", [0.02], indirect=True)  # 20 ms per event: a burst's batch takes seconds
def test_a_paused_processor_writes_nothing_for_lost_tasks_and_a_stopped_one_hands_over_cleanly(
    copy_job: CopyJob, measure
) -> None:
    """Both faults on one job (one Spark start-up for both): first SIGSTOP, then, once p1 is back with 4 tasks,
    SIGTERM."""
    job = copy_job
    job.start("p0")
    p1 = job.start("p1")
    wait_until(lambda: sorted(job.assignment()) == ["p0", "p1"], 120, "tasks on p0 and p1")
    job.produce(40)
    wait_until(lambda: job.written_by(p1), 120, "p1's Spark writing outputs", interval_s=0.5)
    lost = sorted(job.assignment()["p1"])  # read once p1 ran a batch: a rebalance during start-up is over
    assert len(lost) == 4

    # --- SIGSTOP mid-batch until the fence refused p1's Spark ------------------------------------------------
    # A burst for p1's tasks: its micro-batch transforms for ~10 s (1000 events at 20 ms, two at a time), so
    # p1's Spark workers are mid-batch when p1 is paused and still transforming when its leases run out (at
    # most one lease later); every send after that must be refused. p1 stays paused until p0 acquired every
    # lock p1 lost and p1's Spark has had a write refused by the fence (its LockLostError in p1's log).
    burst = job.produce(1000, _partitions_of(lost))
    wait_until(lambda: job.transforming(burst), 60, "p1's Spark transforming the burst", interval_s=0.1)
    assert not job.written_by(p1) & burst
    log_at_pause = len(p1.log_text())
    stopped_ms = int(time.time() * 1000)
    job.pause(p1)
    stopped_at = time.monotonic()
    try:
        wait_until(lambda: job.acquired_since("p0", lost, stopped_ms), 60, "p0 taking p1's locks", interval_s=0.25)
        wait_until(
            lambda: "LockLostError" in p1.log_text()[log_at_pause:],
            60,
            "the fence refusing a write of p1's paused Spark",
            interval_s=0.25,
        )
    finally:
        os.kill(p1.pid, signal.SIGCONT)
    resumed_ms = int(time.time() * 1000)
    paused_s = time.monotonic() - stopped_at
    wait_until(lambda: "abandoned it, writing nothing more" in p1.log_text(), 30, "p1 fencing itself on waking")

    # --- SIGTERM with 4 busy tasks -----------------------------------------------------------------------------
    wait_until(lambda: len(job.assignment().get("p1", [])) == 4, 60, "p1 back with 4 tasks", interval_s=0.25)
    handed = sorted(job.assignment()["p1"])
    fresh = job.produce(80, _partitions_of(handed))
    wait_until(lambda: job.written_by(p1) & fresh, 120, "p1 writing again", interval_s=0.5)
    burst = job.produce(600, _partitions_of(handed))
    wait_until(lambda: job.transforming(burst), 60, "p1's Spark transforming the second burst", interval_s=0.1)
    log_before = len(p1.log_text())
    terminated_at = time.monotonic()
    assert p1.terminate(timeout_s=120) == 0
    took = time.monotonic() - terminated_at
    wait_until(lambda: sorted(job.assignment()) == ["p0"], 60, "p0 assigned every task")
    job.produce(80)
    wait_until(job.all_copied, 180, "every event copied", interval_s=0.5)

    bad = writes_after_takeover(job)
    assert not bad, f"{len(bad)} outputs written by a processor that no longer held the task, e.g. {bad[:3]}"
    after_pause = [r for r in job.tenures() if r["owner"] == "p1" and r["acquired_ms"] >= resumed_ms]
    ended = {r["name"]: r["end_reason"] for r in after_pause}  # a lock's last tenure wins (sorted by time)
    assert {f"task-{t}" for t in handed} <= set(ended), f"p1's locks after the pause: {ended}"
    assert set(ended.values()) == {"released"}, f"p1's locks after the pause ended as {ended}"
    stop_log = p1.log_text()[log_before:]
    for refused in ("LockLostError", "FencedOffError", "lost the lock", "abandoned", "did not stop"):
        assert refused not in stop_log, f"p1's stop shows {refused!r}: a final checkpoint was refused or skipped"
    copies: dict[int, int] = {}
    for event_id, _, _ in job.outputs():
        copies[event_id] = copies.get(event_id, 0) + 1
    again = sum(1 for n in copies.values() if n > 1)
    # exactly once (docs/guarantees.md): the replays of the pause and of the stop carry their first copies' ids
    assert copies == dict.fromkeys(job.sent, 1), f"{again} events written more than once"
    measure(
        f"p1 (4 tasks) SIGSTOPped {paused_s:.0f} s mid-batch with a {LEASE_MS / 1000:.0f} s lease: no output "
        f"written outside its writer's tenure"
    )
    measure(
        f"p1 SIGTERMed with 4 busy Spark tasks: stopped in {took:.1f} s, locks released; "
        f"every one of {len(job.sent)} events written exactly once (the pause's replays included)"
    )
