"""A stateful Spark task keeps its open windows when it moves to another machine (``task.spark.checkpoint.store:
azure``, the default on the Azure coordinator; `weirflow_azure.coordinator.spark_state`).

Two processors on Azurite (coordination and checkpoints in Azure Storage) with **separate local state
directories**, as on two machines; their streams are one embedded log both can reach. The job counts views per
page and minute over windows that all stay open until the bounded input ends (lateness 1 h), read 60 events
per trigger (``views-0`` has 720 events: twelve batches). The processor running task ``views-0`` is SIGKILLed once
that task has committed two batches of its own: every window is open at that moment. The survivor takes the
task over; its windows must hold the killed processor's counts, restored from Blob Storage, so that every
window count equals pandas over the whole input. Without the store the survivor starts the task with empty
state from the checkpoint store's offsets, and the windows lose the events counted before the kill.
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
from weirflow.drain_notice import DrainUtils
from weirflow.factories import checkpoint_factory
from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.job_context import JobContext
from weirflow.local.launcher import ProcessorProcess, start_processor, wait_until
from weirflow.systems import Systems

pytestmark = [pytest.mark.integration, pytest.mark.spark]

PAGES = 5
# 720 and 480 per partition (pages 0, 2, 4 and 1, 3), 60 per trigger: views-0 may have run batches on the other
# processor before the job model settled, and still has batches left after its owner's two
EVENTS = 1200
VIEWS_0 = EVENTS * 3 // PAGES  # the events of task views-0 (partition 0)
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
    bounded: true
    max-events-per-trigger: 60
  counts: {{partitions: 1}}
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


def event(i: int) -> dict:
    return {"page": f"/p{i % PAGES}", "event_time": BASE_S + (i * 300) // EVENTS}  # 5 minutes of events


def _assert_windows_once_and_exact(systems: Systems, stream: str, events: Iterable[dict]) -> Counter:
    """Every window in ``stream`` (one partition) written once with the count of ``events`` in it; closes
    ``systems`` and returns the expected counts."""
    try:
        out = [
            json.loads(r.value)
            for r in systems.consumer("local").read(SystemStreamPartition("local", stream, 0), "0", 100_000)
        ]
    finally:
        systems.close()
    written = Counter((r["page"], int(r["window_s"])) for r in out)
    assert all(n == 1 for n in written.values()), "a window written twice"
    expected = Counter((e["page"], e["event_time"] - e["event_time"] % 60) for e in events)
    got = {(r["page"], int(r["window_s"])): int(r["views"]) for r in out}
    assert got == dict(expected), {k: (got.get(k), v) for k, v in expected.items() if got.get(k) != v}
    return expected


def test_a_stateful_task_moved_by_a_sigkill_keeps_its_open_windows(
    azure_storage: str, tmp_path: Path, measure
) -> None:
    (tmp_path / "job.yaml").write_text(
        textwrap.dedent(
            JOB.format(name=unique_job_name("state"), storage=azure_storage, log=tmp_path / "streams.db")
        )
    )
    (tmp_path / "pipeline.py").write_text(PIPELINE)
    config = load_config(tmp_path / "job.yaml")
    systems = Systems(config)
    admin = systems.admin("local")
    admin.create_stream(StreamSpec("views", 2))
    admin.create_stream(StreamSpec("counts", 1))
    records = []
    for i in range(EVENTS):
        row = event(i)
        value = {"page": row["page"], "event_time": row["event_time"] * 1000}
        # a page's views all in one partition, so each window is counted by one task
        records.append(OutgoingRecord("views", json.dumps(value).encode(), partition=(i % PAGES) % 2))
    systems.producer("local").send(records)

    def start(name: str) -> ProcessorProcess:  # its own state directory: another machine
        return start_processor(
            tmp_path / "job.yaml", name, [f"job.state.dir={tmp_path / name}"], log_dir=tmp_path / "logs"
        )

    manager = checkpoint_factory(config).get_checkpoint_manager(config)
    manager.start()

    def committed(task: str) -> tuple[int, int]:
        """(events committed, the epoch of the tenure that wrote them)."""
        checkpoint = manager.read_last_checkpoint(task)
        return (sum(int(o) for o in checkpoint.offsets.values()), checkpoint.epoch) if checkpoint else (0, 0)

    def running_views_0() -> str | None:
        """The processor that reports task views-0 running, once each processor runs one task."""
        running = {p["processor_id"]: p["tasks"] for p in status_document(config)["processors"]}
        if sorted(len(tasks) for tasks in running.values()) != [1, 1]:
            return None
        return next(p for p, tasks in running.items() if "views-0" in tasks)

    procs = {name: start(name) for name in ("p1", "p2")}
    try:
        owner = ""

        def views_0_runs_somewhere() -> bool:
            nonlocal owner
            owner = running_views_0() or ""
            return owner != ""

        # the job's status reads every coordination store: polled twice a second, not ten times, beside the two
        # processors starting Spark
        wait_until(views_0_runs_somewhere, 180, "each processor running one task", 0.5)
        # The owner's own tenure must commit batches: views-0 may have run on the other processor first, whose
        # local state would then be as new as the store's and no restore would happen.
        base, epoch = committed("views-0")

        def owner_committed_two_batches() -> bool:  # the checkpoint (one read) first, the status once it is there
            events, by = committed("views-0")
            return by == epoch and events >= base + 120 and running_views_0() == owner

        wait_until(owner_committed_two_batches, 120, f"views-0 to commit two batches on {owner}", 0.2)
        at_kill = committed("views-0")[0]
        assert at_kill < VIEWS_0, "the task read all its input before the kill: nothing would be open"
        procs[owner].kill()  # SIGKILL
        survivor = procs["p2" if owner == "p1" else "p1"]
        wait_until(lambda: not survivor.alive(), 240, "the survivor to finish the job")
        assert survivor.popen.wait() == 0, survivor.log_text()[-4000:]
    except Exception:
        for proc in procs.values():
            print(proc.log_text()[-3000:])
        raise
    finally:
        for proc in procs.values():
            if proc.alive():
                proc.popen.send_signal(signal.SIGKILL)
        manager.stop()
    assert "restored its Spark state as of batch" in survivor.log_text(), survivor.log_text()[-3000:]

    expected = _assert_windows_once_and_exact(systems, "counts", map(event, range(EVENTS)))
    measure(
        f"views-0 moved by SIGKILL after committing {at_kill} of its {VIEWS_0} events, every window open: "
        f"restored from Blob Storage, all {len(expected)} window counts equal pandas"
    )


PIPELINE_V2 = PIPELINE.replace('send_to("counts"', 'send_to("counts-v2"')


def test_a_task_moved_away_and_back_across_a_drain_and_upgrade_keeps_the_new_run_s_state(
    azure_storage: str, tmp_path: Path, measure
) -> None:
    """Machine A runs ``views-0`` far (v1), the job is drained and upgraded (run r2: a fresh Spark history),
    the task runs two batches of r2 on machine B and comes back to A, whose local directory of the task is of
    v1's history and further on by batch number. A must resume from the store's copy of r2's state: every
    window of r2 counts r2's events only (v1's state would add v1's views to them)."""
    name = unique_job_name("moves")
    (tmp_path / "job.yaml").write_text(
        textwrap.dedent(JOB.format(name=name, storage=azure_storage, log=tmp_path / "streams.db"))
        .replace("bounded: true", "bounded: false")
        .replace("  counts: {partitions: 1}\n", "  counts: {partitions: 1}\n  counts-v2: {partitions: 1}\n")
    )
    (tmp_path / "pipeline.py").write_text(PIPELINE)
    (tmp_path / "pipeline_v2.py").write_text(PIPELINE_V2)
    config = load_config(tmp_path / "job.yaml")
    systems = Systems(config)
    for stream in ("views", "counts", "counts-v2"):
        systems.admin("local").create_stream(StreamSpec(stream, 2 if stream == "views" else 1))
    sent: list[dict] = []

    def feed(n: int) -> None:  # the same five minutes of views again: v1's windows are r2's windows too
        rows = [event(i) for i in range(len(sent), len(sent) + n)]
        sent.extend(rows)
        systems.producer("local").send(
            [
                OutgoingRecord(
                    "views",
                    json.dumps({"page": r["page"], "event_time": r["event_time"] * 1000}).encode(),
                    partition=int(r["page"][2:]) % 2,
                )
                for r in rows
            ]
        )

    def start(machine: str, run: str) -> ProcessorProcess:
        overrides = [f"job.state.dir={tmp_path / machine}", f"app.run.id={run}"]
        if run == "r2":
            overrides.append("app.pipeline=pipeline_v2:pipeline")
        return start_processor(tmp_path / "job.yaml", machine, overrides, log_dir=tmp_path / f"logs-{run}")

    def drain(run: str) -> None:
        ctx = JobContext.open(load_config(tmp_path / "job.yaml", [f"app.run.id={run}"]), owner="test")
        try:
            DrainUtils(ctx.metadata).write(run)
        finally:
            ctx.close()

    manager = checkpoint_factory(config).get_checkpoint_manager(config)
    manager.start()

    def views_0_read(n: int) -> bool:
        checkpoint = manager.read_last_checkpoint("views-0")
        return checkpoint is not None and sum(int(o) for o in checkpoint.offsets.values()) >= n

    procs: list[ProcessorProcess] = []
    try:
        feed(600)  # 360 views of partition 0: six batches of 60 on machine A
        procs.append(a := start("A", "r1"))
        wait_until(lambda: views_0_read(360), 180, "views-0 to read its v1 input on A", 0.5)
        drain("r1")
        assert a.popen.wait(120) == 0, a.log_text()[-4000:]
        v1_cut = len(sent)

        feed(200)  # 120 views of partition 0: two batches of r2 on machine B
        procs.append(b := start("B", "r2"))
        wait_until(lambda: views_0_read(480), 180, "views-0 to read r2's first views on B", 0.5)
        assert b.terminate(timeout_s=120) == 0, b.log_text()[-4000:]

        feed(200)
        procs.append(back := start("A", "r2"))
        wait_until(lambda: views_0_read(600), 180, "views-0 to read on, back on A", 0.5)
        drain("r2")
        assert back.popen.wait(120) == 0, back.log_text()[-4000:]
    except Exception:
        for proc in procs:
            print(proc.log_text()[-3000:])
        raise
    finally:
        for proc in procs:
            if proc.alive():
                proc.popen.send_signal(signal.SIGKILL)
        manager.stop()

    expected = _assert_windows_once_and_exact(systems, "counts-v2", sent[v1_cut:])
    assert "starting run r2 from its drained offsets with a fresh Spark checkpoint" in b.log_text()
    back_log = back.log_text()
    assert "restored its Spark state as of batch" in back_log or "is of another history" in back_log, back_log
    measure(
        f"views-0 ran v1 on A, r2 on B, then came back to A (a local directory of v1's history, further on): "
        f"all {len(expected)} windows of r2 count r2's {len(sent) - v1_cut} views only"
    )
