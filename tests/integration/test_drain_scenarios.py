"""Drain scenarios beyond the two-stage example (docs/drain.md), on the embedded default.

A drain that cannot finish, because a task fails on every attempt (a poison event its transform raises on):
`weirflow drain --wait` shows the failing task and the exception as they appear, and gives up at its time-out
with exit 1, naming both. The processor is then stopped and the job fixed; the notice stays.

A drain notice the next processor finds at its start: on that fixed job, of one stage (no shuffle, so no
intermediate stream carries the drain), and on the two-stage example, whose notice is written while no
processor runs. The processor that starts next drains at once: it finishes the batches the stopped processor
had planned (Spark's offset log; a clean stop does not wait for a batch in flight), plans none of its own, so
reads none of the input that arrived after the stop, flushes every window, and exits 0; every window up to the
cut is written once and equals pandas.
"""

from __future__ import annotations

import datetime as dt
import json
import signal
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from tests.integration import drain_job
from tests.integration.example_job import EXAMPLE, ExampleJob, generate, results
from weirflow.config import load_config
from weirflow.interfaces.system import OutgoingRecord
from weirflow.job.systems import Systems
from weirflow.local.launcher import ProcessorProcess
from weirflow.runtime.fault_points import ARMED_BY
from weirflow.runtime.fault_points import ENV as FAULT_POINT
from weirflow.testing import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]

RATE = 250
FINISH_S = 240

# One stage: per user and minute, straight from the input, which the feeder keys by user (so a user's events
# all reach one task, as a stateful stage needs: docs/pipelines.md).
PIPELINE = """
from pyspark.sql import functions as F


def per_user(views):
    return (
        views.groupBy(F.window("event_time", "1 minute"), "user")
        .count()
        .select("user", F.col("window.start").alias("window_start"), F.col("count").alias("views"))
    )


def pipeline(app):
    counts = app.input("page-views").transform(per_user)
    counts.send_to("user-counts", key=F.concat_ws("|", "user", F.col("window_start").cast("string")))
"""

# The same stage, with a transform that raises on one page: a task that reads it fails on every attempt.
POISONED = PIPELINE.replace(
    'def pipeline(app):\n    counts = app.input("page-views").transform(per_user)',
    '@F.udf("boolean")\n'
    "def checked(page):\n"
    '    if page == "/poison":\n'
    '        raise ValueError("a poison page view: this transform cannot count it")\n'
    "    return True\n\n\n"
    "def pipeline(app):\n"
    '    counts = app.input("page-views").transform(lambda df: df.where(checked("page")))\n'
    "    counts = counts.transform(per_user)",
)

OVERRIDES = [
    "app.pipeline=job_pipeline:pipeline",
    "app.run.id=r1",
    "streams.page-views.partitions=2",
    "streams.page-views.bounded=false",
    "streams.user-counts.partitions=2",
    "streams.page-counts.partitions=2",
    "job.debounce.time.ms=1000",
    "job.coordinator.poll.interval.ms=250",
]


def _job(tmp_path: Path, pipeline: str) -> tuple[ExampleJob, list[str], object]:
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "job_pipeline.py").write_text(pipeline)
    (job_dir / "job.yaml").write_text((EXAMPLE / "job.yaml").read_text())
    overrides = [f"job.state.dir={tmp_path / 'state'}", *OVERRIDES]
    job = ExampleJob("job.yaml", overrides, tmp_path / "logs", FINISH_S)
    job.config_path = job_dir / "job.yaml"
    return job, overrides, load_config(job.config_path, overrides)


def _upcoming(config: object) -> dict[int, int]:
    systems = Systems(config)
    try:
        return {p: int(m.upcoming) for p, m in systems.admin("local").partition_metadata("page-views").items()}
    finally:
        systems.close()


def _expected(events: list[dict]) -> dict[tuple[str, str], int]:
    frame = pd.DataFrame(events)
    minute = pd.to_datetime(frame["event_time"]).dt.floor("1min").dt.strftime("%Y-%m-%dT%H:%M")
    return {(str(u), str(m)): int(n) for (u, m), n in frame.groupby([frame["user"], minute]).size().items()}


def _windows_once(config: object, stages: int) -> tuple[dict[tuple[str, str], int], list[tuple[str, str]]]:
    """The job's windows (its output per key and minute) and those written more than once."""
    if stages == 2:
        got, twice = drain_job.window_counts_once(config)
        return dict(got), list(twice)
    rows = drain_job.output_rows(config, "user-counts")
    written = Counter((r["user"], r["window_start"][:16]) for r in rows)
    got = {(r["user"], r["window_start"][:16]): int(r["views"]) for r in rows}
    return got, [w for w, n in written.items() if n > 1]


@dataclass(frozen=True)
class Stop:
    """Per input partition: where the stopped processor had checkpointed, and how far the stream reached."""

    stopped_at: dict[int, int]
    available: dict[int, int]


def _drain_on_start(job: ExampleJob, overrides: list[str], config: object, stopped: ProcessorProcess) -> Stop:
    """Stop ``stopped`` with SIGTERM, write the drain notice while nothing runs (unless it is there already) and
    let the input grow; then start the next processor, which must drain and exit 0. Returns where the input was
    checkpointed and how far it reached at the stop."""
    assert stopped.terminate() == 0, stopped.log_text()[-4000:]
    return _drain_next(job, overrides, config)


def _drain_next(job: ExampleJob, overrides: list[str], config: object) -> Stop:
    """With no processor running: write the drain notice (unless it is there already), let the input grow, then
    start the next processor, which must drain and exit 0. Returns where the input was checkpointed and how far
    it reached at the stop."""
    stopped_at = drain_job.input_cut(config)
    available = _upcoming(config)  # what any batch the stopped processor planned can reach
    if not drain_job.drain_notices(config):
        notice = drain_job.drain_command(job.config_path, overrides)
        assert notice.returncode == 0, notice.stdout + notice.stderr
    assert [n.run_id for n in drain_job.drain_notices(config)] == ["r1"]
    grown = sum(available.values()) + RATE
    wait_until(lambda: sum(_upcoming(config).values()) >= grown, 60, "more input after the stop", 0.1)
    second = job.start("p1")
    assert second.popen.wait(FINISH_S) == 0, second.log_text()[-4000:]
    assert "job drained" in second.log_text()
    return Stop(stopped_at, available)


def _check_drained_at_the_stop(
    config: object, stages: int, stop: Stop
) -> tuple[dict[int, int], list[dict], dict[tuple[str, str], int]]:
    """Every task drained in r1 from where the stopped processor left off, reading no input that arrived after
    the stop; every window once and equal to pandas over the input up to the cut. Returns the cut, the events
    after it and the windows."""
    states = drain_job.checkpoints(config)
    assert len(states) == 2 * stages, states
    assert all(c.control.get("drained") == "r1" for c in states.values()), states
    cut = drain_job.input_cut(config)
    stopped_at, available = stop.stopped_at, stop.available
    assert all(stopped_at[p] <= cut[p] <= available[p] for p in cut), (
        f"the processor started under a drain notice read input that arrived after the stop: cut {cut}, "
        f"checkpointed at the stop {stopped_at}, in the stream at the stop {available}"
    )
    before, after = drain_job.split_at_cut(config, cut)
    assert after, "the input did not grow past the cut: the cut was not tested"
    got, twice = _windows_once(config, stages)
    assert twice == [], "a window was written twice"
    expected = _expected(before) if stages == 1 else dict(results.expected_counts(before))
    assert got == expected, "the windows are not exactly pandas over the input up to the cut"
    assert drain_job.drain_notices(config) == [], "the leader removes the notice once the job drained"
    return cut, after, got


def test_a_two_stage_job_noticed_to_drain_before_its_processor_starts_drains_without_reading_newer_input(
    tmp_path: Path, measure
) -> None:
    job, overrides, config = _job(tmp_path, (EXAMPLE / "pipeline.py").read_text())
    feeder = drain_job.Feeder(config, RATE).create_stream()
    try:
        first = job.start("p0")
        wait_until(lambda: "started task" in first.log_text(), FINISH_S, "p0 to run its tasks", 0.2)
        feeder.start()
        wait_until(lambda: results.consumed(config) >= 3 * RATE, FINISH_S, "the job to read", 0.2)
        stop = _drain_on_start(job, overrides, config, first)
    finally:
        feeder.stop()
        job.stop_all()
    cut, after, got = _check_drained_at_the_stop(config, 2, stop)
    assert drain_job.unread_intermediate(config) == {}, "the intermediate stream was not read to its end"
    measure(
        f"notice before start, 2 stages: drained at {sum(cut.values())} events (checkpointed at the stop "
        f"{sum(stop.stopped_at.values())}, in the stream {sum(stop.available.values())}), "
        f"{len(got)} windows once each, equal pandas; {len(after)} later events unread"
    )


def test_a_two_stage_job_killed_past_its_first_stage_checkpoint_and_noticed_to_drain_takes_the_killed_batch_in(
    tmp_path: Path, measure
) -> None:
    """The first stage's holder dies after a batch's rows reached the intermediate stream and before its
    checkpoint names the batch (as a SIGTERM can stop a batch in flight); the drain notice is written while
    nothing runs. The next processor's first stage starts from that checkpoint, but the rows past it are
    already on their way downstream: its cut takes the killed batch in (replayed rows dropped by their
    positions, the rest written), so what the job counted is exactly its input up to the cut, and the next run,
    which starts there, counts nothing twice."""
    armed = tmp_path / "armed"
    job, overrides, config = _job(tmp_path, (EXAMPLE / "pipeline.py").read_text())
    feeder = drain_job.Feeder(config, RATE).create_stream()
    try:
        fault = {FAULT_POINT: "before-checkpoint-of-rows:page_views:1", ARMED_BY: str(armed)}
        first = job.start("p0", env=fault)
        wait_until(lambda: "started task" in first.log_text(), FINISH_S, "p0 to run its tasks", 0.2)
        feeder.start()
        wait_until(lambda: results.consumed(config) >= 3 * RATE, FINISH_S, "the job to read", 0.2)
        armed.touch()  # p0 dies with its next batch of rows written and not checkpointed
        assert first.popen.wait(FINISH_S) == -signal.SIGKILL, first.log_text()[-4000:]
        stop = _drain_next(job, overrides, config)
    finally:
        feeder.stop()
        job.stop_all()
    cut, after, got = _check_drained_at_the_stop(config, 2, stop)
    assert cut != stop.stopped_at, (
        f"the drain cut {cut} is where the killed processor had checkpointed: the batch it wrote past its "
        "checkpoint was not taken in"
    )
    assert drain_job.unread_intermediate(config) == {}, "the intermediate stream was not read to its end"
    measure(
        f"first stage killed past its checkpoint, then a drain: checkpointed at {sum(stop.stopped_at.values())} "
        f"events, cut at {sum(cut.values())} (the killed batch taken in), {len(got)} windows once each, equal "
        f"pandas; {len(after)} later events unread"
    )


def test_a_drain_a_failing_task_keeps_from_finishing_names_the_task_and_completes_once_the_job_is_fixed(
    tmp_path: Path, measure
) -> None:
    """A one-stage job whose task fails on a poison event: the drain names the task and the exception and
    gives up at its time-out while the healthy task drains. The processor is stopped and the job fixed; the
    notice stays, so the fixed job's next processor drains at once, without reading input that arrived after
    the stop (a job of one stage: no intermediate stream carries the drain)."""
    job, overrides, config = _job(tmp_path, POISONED)
    feeder = drain_job.Feeder(config, RATE).create_stream()
    systems = Systems(config)
    try:
        proc = job.start("p0")
        wait_until(lambda: "started task" in proc.log_text(), FINISH_S, "p0 to run its tasks", 0.2)
        feeder.start()
        wait_until(lambda: results.consumed(config) >= RATE, FINISH_S, "the job to read", 0.2)
        # stamped where the feed is, so the fixed job counts it instead of dropping it as late
        when = generate.START + dt.timedelta(milliseconds=feeder.sent * generate.STEP_MS)
        stamp = when.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        poison = {"user": "u-poison", "page": "/poison", "event_time": stamp}
        systems.producer("local").send(
            [OutgoingRecord("page-views", json.dumps(poison).encode(), key=b"u-poison", partition=1)]
        )
        wait_until(
            lambda: "task page_views-1 failed" in proc.log_text(), FINISH_S, "the poisoned task to fail", 0.2
        )
        done = drain_job.drain_command(job.config_path, overrides, "--wait", "--timeout", "20")
        assert proc.alive(), "the processor keeps running (and retrying the task) while the drain cannot finish"
        said = " ".join((done.stdout + done.stderr).split())  # the terminal's width wraps the lines
        assert done.returncode == 1, said
        assert "did not complete in 20 s" in said and "still draining: page_views-1" in said, said
        assert "p0: task page_views-1" in said and "ValueError: a poison page view" in said, said
        assert drain_job.checkpoints(config)["page_views-0"].control.get("drained") == "r1", (
            "the healthy task drained; only the failing one holds the drain up"
        )

        # The fix: the transform no longer raises (the poison view is counted like any other).
        (job.config_path.parent / "job_pipeline.py").write_text(PIPELINE)
        stop = _drain_on_start(job, overrides, config, proc)
    finally:
        systems.close()
        feeder.stop()
        job.stop_all()
    cut, after, got = _check_drained_at_the_stop(config, 1, stop)
    assert got[("u-poison", stamp[:16])] == 1, "the fixed job counted the poison view"
    measure(
        "a drain held up by a failing task: the command named the task and the exception, exit 1 at 20 s; "
        f"fixed, the next processor drained at {sum(cut.values())} events (checkpointed at the stop "
        f"{sum(stop.stopped_at.values())}, in the stream {sum(stop.available.values())}), "
        f"{len(got)} windows once each, equal pandas; {len(after)} later events unread"
    )
