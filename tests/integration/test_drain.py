"""Drain and upgrade on the embedded default (docs/drain.md), on the two-stage example over an unbounded input
fed at a steady rate by two processors: a drain for another run id changes nothing; `weirflow drain --wait`
stops the job at a cut although a processor is SIGKILLed in the middle of it, with every window emitted once
and equal to pandas and bad events dead-lettered with their reasons; the job upgraded (another aggregation,
an incompatible intermediate schema) reads on from exactly the cut and, its input now bounded, finishes at its
end. A drain with nothing in its way, nothing left unread in the intermediate stream, and an upgrade run
through `weirflow upgrade`: tests/integration/test_pageviews_on_azure.py.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tests.integration import drain_job
from tests.integration.example_job import EXAMPLE, ExampleJob, results
from weirflow.config import load_config
from weirflow.interfaces.system import OutgoingRecord
from weirflow.job.drain_notice import DEFAULT_RUN_ID
from weirflow.job.systems import Systems
from weirflow.local.launcher import ProcessorProcess, start_processor
from weirflow.runtime.fault_points import ENV as FAULT_POINT
from weirflow.testing import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]

# Events per second into the unbounded input, fed from when both processors run tasks: a rate the job keeps up
# with on a busy machine, so the cut lies near the input's end and the upgrade reads a few seconds of input.
RATE = 250
FINISH_S = 240
SHORT = [
    "streams.page-views.partitions=2",
    "streams.page-counts.partitions=2",
    "streams.page-views.bounded=false",
    "job.coordinator.lease.duration.ms=5000",
    "job.coordinator.lease.renew.interval.ms=1500",
    "job.coordinator.heartbeat.interval.ms=1000",
    # A processor starting its Spark queries on a busy 2-core machine can miss heartbeats for several seconds;
    # declared dead for it, its tasks move away and back (two rebalances, each restarting queries) and the
    # stages may change hands before the test has begun.
    "job.coordinator.liveness.timeout.ms=8000",
    "job.coordinator.poll.interval.ms=250",
    "job.debounce.time.ms=1000",
    "task.max.records.per.trigger=4000",
    "job.trim.interval.ms=0",  # the drain messages are counted in the whole intermediate stream afterwards
]

# The upgrade: the intermediate stream carries (page, user_len, event_time) instead of (user, page, event_time),
# and the second stage counts views and sums user-name lengths per page in two-minute windows.
PIPELINE_V2 = """
from pyspark.sql import functions as F


def per_two_minutes(views):
    return (
        views.groupBy(F.window("event_time", "2 minutes"), "page")
        .agg(F.count("*").alias("views"), F.sum("user_len").alias("user_len"))
        .select("page", F.col("window.start").alias("window_start"), "views", "user_len")
    )


def pipeline(app):
    views = app.input("page-views").transform(
        lambda df: df.select("page", F.length("user").alias("user_len"), "event_time")
    )
    counts = views.partition_by("page", name="views-by-page").transform(per_two_minutes)
    key = F.concat_ws("|", "page", F.date_format("window_start", "yyyy-MM-dd'T'HH:mm"))
    counts.send_to("page-counts-v2", key=key)
"""


class DrainJob(ExampleJob):
    def __init__(self, tmp_path: Path, run_id: str | None = "r1") -> None:
        """``run_id`` None: no `app.run.id`, as a user who forgets it runs the job (`weirflow.job.runs`)."""
        run = [f"app.run.id={run_id}"] if run_id else []
        overrides = [f"job.state.dir={tmp_path / 'state'}", *run, *SHORT]
        self.run_id = run_id
        super().__init__("job.yaml", overrides, tmp_path / "logs", FINISH_S)
        self.config = load_config(self.config_path, self.overrides)

    def consumed(self) -> int:
        return results.consumed(self.config)

    def with_tasks(self, names: list[str]) -> None:
        wait_until(
            lambda: all("started task" in p.log_text() for p in self.processors),
            FINISH_S,
            f"{', '.join(names)} to run tasks",
            0.2,
        )


@pytest.fixture
def forgetful_job(tmp_path: Path):
    """The job without `app.run.id`, in v1 and in its upgrade."""
    j = DrainJob(tmp_path, run_id=None)
    yield j
    j.stop_all()


def _status(job: DrainJob, *overrides: str) -> dict:
    args = [sys.executable, "-m", "weirflow", "status", str(job.config_path), "--json"]
    for item in [*job.overrides, *overrides]:
        args += ["--set", item]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _expected_v2(events: list[dict]) -> dict[tuple[str, str], tuple[int, int]]:
    frame = pd.DataFrame(events)
    start = pd.to_datetime(frame["event_time"]).dt.floor("2min").dt.strftime("%Y-%m-%dT%H:%M")
    frame["user_len"] = frame["user"].str.len()
    grouped = frame.groupby([frame["page"], start])["user_len"].agg(["size", "sum"])
    return {(str(p), str(w)): (int(n), int(s)) for (p, w), (n, s) in grouped.iterrows()}


def _upgrade(job: DrainJob, tmp_path: Path) -> tuple[Any, ProcessorProcess]:
    """Run the job upgraded (`PIPELINE_V2`, run id r2 unless the job sets none, the input now bounded) to its
    end on one processor; returns its config and the processor."""
    upgrade = tmp_path / "upgrade"
    upgrade.mkdir()
    shutil.copy(EXAMPLE / "job.yaml", upgrade / "job.yaml")
    (upgrade / "pipeline_v2.py").write_text(PIPELINE_V2)
    overrides = [o for o in job.overrides if not o.startswith(("app.run.id=", "streams.page-views.bounded="))]
    overrides += [
        *(["app.run.id=r2"] if job.run_id else []),
        "app.pipeline=pipeline_v2:pipeline",
        "streams.page-views.bounded=true",
        "streams.page-counts-v2.partitions=2",
    ]
    v2 = ExampleJob("job.yaml", overrides, tmp_path / "logs-v2", FINISH_S)
    v2.config_path = upgrade / "job.yaml"
    try:
        proc = v2.start("p2")
        v2.wait_finished([proc])
    finally:
        v2.stop_all()
    return load_config(v2.config_path, overrides), proc


def test_a_processor_killed_between_a_drain_message_and_its_drained_checkpoint_leaves_nothing_for_the_upgrade(
    forgetful_job: DrainJob, tmp_path: Path, measure
) -> None:
    """Two processors read the unbounded input, bad events among it; a drain for another deployment changes
    nothing; then `weirflow drain --wait` drains this one, at the hardest moment of a drain: a first-stage task
    sent its last rows and its DRAIN message downstream, and its processor dies before the ``drained``
    checkpoint (a fault point). The survivor replays the task's last batch and drains it again; the counting
    stage must count no replayed row, every window up to the cut is written once and equals pandas, and the
    upgrade (another aggregation and intermediate schema) must read nothing of v1's: its output is exactly the
    input after the cut.

    Neither version sets `app.run.id` (the forgetful upgrade): v1 runs as the job's first run, and the changed
    job started after the drain gets a run of its own instead of finishing at once in v1's."""
    job = forgetful_job
    feeder = drain_job.Feeder(job.config, RATE).create_stream()
    bad = [b"{not json", b'{"user": "u1", "page": "/page/1", "event_time": "yesterday"}', b'["a", "list"]']
    systems = Systems(job.config)
    try:
        systems.producer("local").send([OutgoingRecord("page-views", v, key=b"u1", partition=1) for v in bad])
    finally:
        systems.close()
    # A fresh assignment gives p0, started first, the first stage (tasks in natural order; docs/coordination.md)
    first = start_processor(
        job.config_path,
        "p0",
        job.overrides,
        log_dir=job.logs,
        env={FAULT_POINT: "before-drained-checkpoint:page_views-:1"},
    )
    job.processors.append(first)
    survivor = job.start("p1")
    procs = [first, survivor]
    job.with_tasks(["p0", "p1"])
    feeder.start()
    wait_until(lambda: job.consumed() >= 3 * RATE, FINISH_S, "the job to process input", 0.2)

    # A drain for another deployment is seen and ignored: the job keeps reading and nothing drains.
    other = drain_job.drain_command(job.config_path, job.overrides, "--run-id", "r0")
    assert other.returncode == 0, other.stderr
    wait_until(
        lambda: all("ignoring drain notification" in p.log_text() for p in procs),
        30,
        "both processors to see the other run's notice",
        0.2,
    )
    seen = job.consumed()
    wait_until(lambda: job.consumed() >= seen + RATE, 60, "the job to read on", 0.2)
    shown = _status(job, "app.run.id=r0")  # what `weirflow status` shows for the other deployment
    assert shown["drain"]["run-id"] == "r0" and set(shown["tasks"].values()) == {"draining"}, shown
    assert all(p.alive() for p in procs)
    assert not any(c.control.get("drained") for c in drain_job.checkpoints(job.config).values())

    # Drain this deployment (its first run, recorded by its processors); the input keeps growing meanwhile.
    began = time.monotonic()
    done = drain_job.drain_command(job.config_path, job.overrides, "--wait", "--timeout", "180")
    took = time.monotonic() - began
    assert done.returncode == 0, done.stdout + done.stderr
    assert "drained" in done.stdout
    assert first.popen.wait(FINISH_S) == -9, "p0 ran no first-stage task to its drain: " + first.log_text()[-3000:]
    assert survivor.popen.wait(FINISH_S) == 0, survivor.log_text()[-4000:]
    assert "job drained" in survivor.log_text()
    feeder.stop()

    states = drain_job.checkpoints(job.config)
    drained = [c.control.get("drained") for c in states.values()]
    assert drained == [DEFAULT_RUN_ID] * 4, states
    shown = _status(job)
    assert shown["drain"] is None and set(shown["tasks"].values()) == {"drained"}, shown
    before, after = drain_job.split_at_cut(job.config, drain_job.input_cut(job.config))
    assert after, "the input did not grow past the cut: the cut was not tested"
    expected = results.expected_counts(before)
    got, twice = drain_job.window_counts_once(job.config)
    missing = set(expected) - set(got)
    assert not missing, f"{len(missing)} windows lost, e.g. {sorted(missing)[:3]}"
    assert set(got) == set(expected), "a window outside the input up to the cut was written"
    wrong = {w: (got[w], n) for w, n in expected.items() if got[w] != n}
    assert not wrong, f"{len(wrong)} windows differ from pandas (got, expected), e.g. {list(wrong.items())[:3]}"
    assert not twice, f"{len(twice)} windows written more than once, e.g. {twice[:3]}"
    left = drain_job.unread_intermediate(job.config)
    # the fault landed after the DRAIN was durable: the survivor drained the task again, a second DRAIN
    drains = drain_job.drain_messages(job.config)
    redrained = sorted({task for (task, _), n in drains.items() if n > 1})
    assert redrained, f"no first-stage task sent its DRAIN twice: {dict(drains)}"
    remaining = drain_job.drain_notices(job.config)
    assert [n.run_id for n in remaining] == ["r0"], "the leader removes its own run's notice, not another's"

    letters = drain_job.dead_letters(job.config)
    reasons = sorted(letter["error"] for letter in letters)
    assert len(letters) == 3, reasons
    assert any("not valid JSON" in r for r in reasons)
    assert any("field 'event_time'" in r and "timestamp" in r for r in reasons)
    assert any("expected a JSON object" in r for r in reasons)
    assert {letter["ssp"] for letter in letters} == {"local.page-views.1"}
    assert sorted(base64.b64decode(letter["raw_base64"]) for letter in letters) == sorted(bad)
    assert sum(c.control.get("dead-letters", 0) for c in states.values()) == 3  # in the drained checkpoints

    # The upgrade reads on from the cut with an intermediate schema v1's rows do not fit.
    config_v2, upgraded = _upgrade(job, tmp_path)
    assert "a new deployment after run default drained" in upgraded.log_text(), upgraded.log_text()[-3000:]
    rows = drain_job.output_rows(config_v2, "page-counts-v2")
    got_v2 = {(r["page"], r["window_start"][:16]): (int(r["views"]), int(r["user_len"])) for r in rows}
    assert len(rows) == len(got_v2), "a window of the upgraded job was written twice"
    assert got_v2 == _expected_v2(after), "the upgraded job's output is not exactly the input after the cut"
    assert sum(n for n, _ in got_v2.values()) == len(after)
    letters = drain_job.intermediate_dead_letters(config_v2)
    assert letters == [], f"the upgrade read v1 rows: {letters[:2]}"
    measure(
        f"p0 SIGKILLed between a first-stage task's DRAIN and its drained checkpoint: the drain completed on p1 "
        f"in {took:.1f} s, all {len(expected)} windows exact and once; {', '.join(redrained)} drained twice; "
        f"3 bad events dead-lettered; {sum(left.values())} v1 records left after the cut, none read by the "
        f"upgrade, which counted the {len(after)} later events exactly"
    )
