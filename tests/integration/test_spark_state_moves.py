"""A stateful Spark task keeps its state when it moves to another machine (``task.spark.checkpoint.store:
azure``, the default on the Azure coordinator; `weirflow_azure.coordinator.spark_state`): its open windows when
its processor is SIGKILLed, and the new run's state when it moves away and back across a drain and an upgrade.

Two processors on Azurite (coordination and checkpoints in Azure Storage) with **separate local state
directories**, as on two machines; their streams are one embedded log both can reach. The job counts views per
page and minute over windows that all stay open until the job is drained (lateness 1 h), read 60 events per
trigger. One scenario, two runs of the job:

* **Run r1 (v1), the SIGKILL move.** ``views-0`` has 720 events: twelve batches. The processor running it is
  SIGKILLed once that task has committed two batches of its own: every window is open at that moment. The
  survivor takes the task over and reads the rest; the job is then drained at the end of its input. The
  windows must hold the killed processor's counts, restored from Blob Storage, so that every window count
  equals pandas over r1's input. Without the store the survivor starts the task with empty state from the
  checkpoint store's offsets, and the windows lose the events counted before the kill.
* **Run r2 (v2, another output), away and back.** The upgrade starts the task afresh on the killed machine
  (its old Spark checkpoint deleted) for two batches of r2, then it comes back to the survivor's machine,
  whose local directory of the task is of v1's history and further on by batch number. The task must resume
  from the store's copy of r2's state: every window of r2 counts r2's events only, although r2's views fall
  in v1's windows (v1's state would add v1's views to them). docs/drain.md describes the drain and upgrade.
"""

from __future__ import annotations

import json
import signal
import textwrap
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import pytest

from tests.conftest import unique_job_name
from weirflow.cli import status_document
from weirflow.config import load_config
from weirflow.interfaces.plugins import checkpoint_factory
from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.job.context import JobContext
from weirflow.job.drain_notice import DrainUtils
from weirflow.job.systems import Systems
from weirflow.local.launcher import ProcessorProcess, start_processor
from weirflow.runtime.fault_points import ARMED_BY
from weirflow.runtime.fault_points import ENV as FAULT_POINT
from weirflow.testing import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]

PAGES = 5
# r1: 720 and 480 per partition (pages 0, 2, 4 and 1, 3), 60 per trigger: views-0 may have run batches on the
# other processor before the job model settled, and still has batches left after its owner's two
EVENTS = 1200
VIEWS_0 = EVENTS * 3 // PAGES  # the events of task views-0 (partition 0) in r1
BASE_S = 1_795_000_000 - 1_795_000_000 % 60  # a minute boundary

# Lease: the shortest blob lease. Liveness 8 s: a processor starting Spark on a busy 2-core machine must not be
# declared dead for a slow heartbeat (at 4 s one was, under load: a needless rebalance), and it delays nothing
# after the kill, where the killed owner's task lock (renewed every 5 s) frees only 10 to 15 s after it.
JOB = """
job: {{name: {name}, coordinator.factory: azure}}
app: {{pipeline: "pipeline:pipeline"}}
task: {{checkpoint.factory: azure-table}}
azure: {{storage.connection.string: "{storage}"}}
job.coordinator.lease.duration.ms: 15000
job.coordinator.heartbeat.interval.ms: 1000
job.coordinator.liveness.timeout.ms: 8000
job.debounce.time.ms: 1000
systems: {{local: {{path: "{log}"}}}}
streams:
  views:
    partitions: 2
    schema: "page string, event_time timestamp"
    event-time: {{field: event_time}}
    lateness: 1h
    bounded: false
    max-events-per-trigger: 60
  counts: {{partitions: 1}}
  counts-v2: {{partitions: 1}}
spark: {{master: "local[2]"}}
"""

PIPELINE = """
from pyspark.sql import functions as F


def count(views):
    return views.groupBy(F.window("event_time", "1 minute"), "page").count().select(
        "page", F.col("window.start").cast("long").alias("window_s"), F.col("count").alias("views"))


def pipeline(app):
    app.input("views").transform(count).send_to("counts", key=F.concat_ws("|", "page", "window_s"))
"""

PIPELINE_V2 = PIPELINE.replace('send_to("counts"', 'send_to("counts-v2"')


def event(i: int) -> dict:
    return {"page": f"/p{i % PAGES}", "event_time": BASE_S + (i * 300) // EVENTS}  # 5 minutes of events


def _partition(row: dict) -> int:
    """A page's views all in one partition, so each window is counted by one task."""
    return int(row["page"][2:]) % 2


def _assert_windows_once_and_exact(systems: Systems, stream: str, events: Iterable[dict]) -> Counter:
    """Every window in ``stream`` (one partition) written once with the count of ``events`` in it; returns the
    expected counts."""
    out = [
        json.loads(r.value)
        for r in systems.consumer("local").read(SystemStreamPartition("local", stream, 0), "0", 100_000)
    ]
    written = Counter((r["page"], int(r["window_s"])) for r in out)
    assert all(n == 1 for n in written.values()), "a window written twice"
    expected = Counter((e["page"], e["event_time"] - e["event_time"] % 60) for e in events)
    got = {(r["page"], int(r["window_s"])): int(r["views"]) for r in out}
    assert got == dict(expected), {k: (got.get(k), v) for k, v in expected.items() if got.get(k) != v}
    return expected


class _Job:
    """The job on Azurite: its streams on the embedded log, its checkpoint store, and its processors, each on a
    machine of its own (its own state directory)."""

    def __init__(self, tmp_path: Path, storage: str) -> None:
        self.tmp_path = tmp_path
        (tmp_path / "job.yaml").write_text(
            textwrap.dedent(
                JOB.format(name=unique_job_name("state"), storage=storage, log=tmp_path / "streams.db")
            )
        )
        (tmp_path / "pipeline.py").write_text(PIPELINE)
        (tmp_path / "pipeline_v2.py").write_text(PIPELINE_V2)
        self.config = load_config(tmp_path / "job.yaml")
        self.systems = Systems(self.config)
        for stream in ("views", "counts", "counts-v2"):
            self.systems.admin("local").create_stream(StreamSpec(stream, 2 if stream == "views" else 1))
        self.manager = checkpoint_factory(self.config).get_checkpoint_manager(self.config)
        self.manager.start()
        self.sent: dict[str, list[dict]] = {"r1": [], "r2": []}  # the events of each run
        self.fed: Counter[int] = Counter()  # events sent per partition of views
        self.procs: list[ProcessorProcess] = []

    def feed(self, run: str, indices: Iterable[int]) -> None:
        rows = [event(i) for i in indices]
        self.sent[run].extend(rows)
        self.fed.update(_partition(r) for r in rows)
        self.systems.producer("local").send(
            [
                OutgoingRecord(
                    "views",
                    json.dumps({"page": r["page"], "event_time": r["event_time"] * 1000}).encode(),
                    partition=_partition(r),
                )
                for r in rows
            ]
        )

    def start(self, machine: str, run: str, env: dict[str, str] | None = None) -> ProcessorProcess:
        """A processor named after ``machine``, with its state directory, running ``run`` (r2: the v2 code)."""
        overrides = [f"job.state.dir={self.tmp_path / machine}", f"app.run.id={run}"]
        if run == "r2":
            overrides.append("app.pipeline=pipeline_v2:pipeline")
        proc = start_processor(
            self.tmp_path / "job.yaml", machine, overrides, log_dir=self.tmp_path / f"logs-{run}", env=env
        )
        self.procs.append(proc)
        return proc

    def drain(self, run: str) -> None:
        ctx = JobContext.open(load_config(self.tmp_path / "job.yaml", [f"app.run.id={run}"]), owner="test")
        try:
            DrainUtils(ctx.metadata).write(run)
        finally:
            ctx.close()

    def committed(self, task: str) -> tuple[int, int]:
        """(events committed, the epoch of the tenure that wrote them)."""
        checkpoint = self.manager.read_last_checkpoint(task)
        return (sum(int(o) for o in checkpoint.offsets.values()), checkpoint.epoch) if checkpoint else (0, 0)

    def read_all_fed(self) -> bool:
        """Both tasks committed every event sent so far: a drain now cuts at the end of the input."""
        return all(self.committed(f"views-{p}")[0] >= n for p, n in self.fed.items())

    def running_views_0(self) -> str | None:
        """The processor that reports task views-0 running, once each processor runs one task."""
        running = {p["processor_id"]: p["tasks"] for p in status_document(self.config)["processors"]}
        if sorted(len(tasks) for tasks in running.values()) != [1, 1]:
            return None
        return next(p for p, tasks in running.items() if "views-0" in tasks)

    def windows(self, stream: str, run: str) -> Counter:
        """`_assert_windows_once_and_exact` on ``stream`` over the events of ``run``."""
        return _assert_windows_once_and_exact(self.systems, stream, self.sent[run])

    def __enter__(self) -> _Job:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        """Every processor's last log lines when the test failed; then `close`."""
        if kind is not None:
            for proc in self.procs:
                print(proc.log_text()[-3000:])
        self.close()

    def close(self) -> None:
        for proc in self.procs:
            if proc.alive():
                proc.popen.send_signal(signal.SIGKILL)
        self.manager.stop()
        self.systems.close()


def test_a_moved_stateful_task_keeps_its_open_windows_after_a_sigkill_and_the_new_run_s_state_after_an_upgrade(
    azure_storage: str, tmp_path: Path, measure
) -> None:
    """Run r1: the processor running ``views-0`` is SIGKILLed with every window open; the survivor restores
    the task's state from Blob Storage, reads the rest and is drained at the end of the input: every window of
    r1 exact. Run r2 (the v2 code, output ``counts-v2``): two batches on the killed machine, then back on the
    survivor's, whose local directory of the task is of v1's history and further on: every window of r2 counts
    r2's events only."""
    with _Job(tmp_path, azure_storage) as job:
        # r1: views-0 moved by a SIGKILL with every window open
        job.feed("r1", range(EVENTS))
        r1 = {machine: job.start(machine, "r1") for machine in ("p1", "p2")}
        owner = ""

        def views_0_runs_somewhere() -> bool:
            nonlocal owner
            owner = job.running_views_0() or ""
            return owner != ""

        # the job's status reads every coordination store: polled twice a second, not ten times, beside the two
        # processors starting Spark
        wait_until(views_0_runs_somewhere, 180, "each processor running one task", 0.5)
        # The owner's own tenure must commit batches: views-0 may have run on the other processor first, whose
        # local state would then be as new as the store's and no restore would happen.
        base, epoch = job.committed("views-0")

        def owner_committed_two_batches() -> bool:  # the checkpoint (one read) first, the status once it is there
            events, by = job.committed("views-0")
            return by == epoch and events >= base + 120 and job.running_views_0() == owner

        wait_until(owner_committed_two_batches, 120, f"views-0 to commit two batches on {owner}", 0.2)
        at_kill = job.committed("views-0")[0]
        assert at_kill < VIEWS_0, "the task read all its input before the kill: nothing would be open"
        r1[owner].kill()  # SIGKILL
        home = "p2" if owner == "p1" else "p1"  # the survivor's machine: views-0 comes back to it in r2
        survivor = r1[home]
        wait_until(job.read_all_fed, 240, "the survivor to read all of r1's input", 0.5)
        job.drain("r1")
        assert survivor.popen.wait(120) == 0, survivor.log_text()[-4000:]
        assert "restored its Spark state as of batch" in survivor.log_text(), survivor.log_text()[-3000:]
        expected = job.windows("counts", "r1")
        measure(
            f"views-0 moved by SIGKILL after committing {at_kill} of its {VIEWS_0} events, every window open: "
            f"restored from Blob Storage, all {len(expected)} window counts equal pandas"
        )

        # r2: the same five minutes of views again, every sixth event each time (120 of partition 0: two
        # batches), so each of v1's windows is one of r2's too
        job.feed("r2", range(0, EVENTS, 6))
        away = job.start(owner, "r2")
        wait_until(
            lambda: job.committed("views-0")[0] >= job.fed[0],
            180,
            f"views-0 to read r2's first views on {owner}",
            0.5,
        )
        assert away.terminate(timeout_s=120) == 0, away.log_text()[-4000:]
        assert "starting run r2 from its drained offsets with a fresh Spark checkpoint" in away.log_text()

        job.feed("r2", range(3, EVENTS, 6))
        back = job.start(home, "r2")
        wait_until(job.read_all_fed, 180, f"views-0 to read on, back on {home}", 0.5)
        job.drain("r2")
        assert back.popen.wait(120) == 0, back.log_text()[-4000:]
        back_log = back.log_text()
        assert "restored its Spark state as of batch" in back_log or "is of another history" in back_log, back_log
        expected = job.windows("counts-v2", "r2")
        measure(
            f"views-0 then ran r2 on {owner} (the v2 code), then came back to {home} (a local directory of v1's "
            f"history, further on): all {len(expected)} windows of r2 count r2's {len(job.sent['r2'])} views only"
        )


# A stateful stage whose results in a micro-batch come of that batch's own input (a window's count, in append
# mode, comes of the input before the batch that emits it: Spark drops a closed window's later rows as late)
DISTINCT = """
from pyspark.sql import functions as F


def distinct(views):
    return views.dropDuplicates(["page", "event_time"]).select("page", F.col("event_time").cast("long").alias("t"))


def pipeline(app):
    key = F.concat_ws("|", "page", F.col("t").cast("string"))
    app.input("views").transform(distinct).send_to("counts", key=key)
"""


def test_a_stateful_task_killed_with_results_past_its_checkpoint_drains_on_another_machine_past_them(
    azure_storage: str, tmp_path: Path, measure
) -> None:
    """A stateful stage whose results come of the batch that emits them (distinct page views). The processor
    running both tasks is SIGKILLed after a batch of ``views-0`` wrote its results and before Spark committed
    the batch (``before-spark-commit``), and the drain notice is written while nothing runs. The next processor,
    on another machine, restores the task's state from Blob Storage as of the last committed batch: Spark does
    not know the killed batch. A cut where the query has read to would leave that batch's results written and
    their input past the cut, for the next deployment to count again; the task instead drains past everything
    an earlier attempt can have read (docs/drain.md), writes each result once, and the output is exactly the
    distinct views of the input up to the cut."""
    armed = tmp_path / "armed"
    with _Job(tmp_path, azure_storage) as job:
        (tmp_path / "pipeline.py").write_text(DISTINCT)
        job.feed("r1", range(EVENTS))
        fault = {FAULT_POINT: "before-spark-commit:views-0:1", ARMED_BY: str(armed)}
        first = job.start("p1", "r1", env=fault)
        wait_until(lambda: job.committed("views-0")[0] >= 120, 240, "views-0 to commit two batches", 0.2)
        armed.touch()  # the next batch of views-0 kills p1 once its results are written, before Spark's commit
        assert first.popen.wait(120) == -signal.SIGKILL, first.log_text()[-4000:]
        at_kill = job.committed("views-0")[0]
        assert at_kill < VIEWS_0, "views-0 read all its input before the kill"
        job.drain("r1")
        second = job.start("p2", "r1")
        assert second.popen.wait(240) == 0, second.log_text()[-4000:]
        assert "restored its Spark state as of batch" in second.log_text(), second.log_text()[-3000:]
        assert "written past its checkpoint by an earlier attempt" in second.log_text(), second.log_text()[-3000:]
        cut: dict[int, int] = {}
        for p in (0, 1):
            checkpoint = job.manager.read_last_checkpoint(f"views-{p}")
            assert checkpoint is not None and checkpoint.control.get("drained") == "r1", checkpoint
            cut.update({ssp.partition: int(o) for ssp, o in checkpoint.offsets.items()})
        seen: Counter[int] = Counter()
        expected: set[tuple[str, int]] = set()
        for row in job.sent["r1"]:  # a partition's events in the order they were sent: its offsets
            partition = _partition(row)
            if seen[partition] < cut[partition]:
                expected.add((row["page"], row["event_time"]))
            seen[partition] += 1
        out = [
            json.loads(r.value)
            for r in job.systems.consumer("local").read(SystemStreamPartition("local", "counts", 0), "0", 100_000)
        ]
        written = Counter((r["page"], int(r["t"])) for r in out)
        assert [w for w, n in written.items() if n > 1] == [], "a result written twice"
        assert set(written) == expected, (
            f"the output is not the distinct views up to the cut {cut}: {len(set(written) - expected)} of input "
            f"past it, {len(expected - set(written))} missing"
        )
        measure(
            f"views-0 killed before Spark committed a batch that wrote results (checkpointed at {at_kill} "
            f"events), drained on another machine at {cut[0]}: {len(written)} results once each, exactly the "
            "input up to the cut"
        )
