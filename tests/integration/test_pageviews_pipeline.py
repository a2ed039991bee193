"""The example pipeline end to end on real PySpark: exact counts, shared tasks, SIGKILL, dead letters.

Each test runs `weirflow run` processes on a copy of examples/pageviews (2 input partitions to keep Spark's
start-up cost down) over generated bounded input, waits for the job to finish (every task reached
end-of-stream) and compares the window counts with pandas over the same events.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.integration.example_job import ExampleJob, generate, results
from weirflow.cli import status_document
from weirflow.config import load_config
from weirflow.interfaces.system import OutgoingRecord, SystemStreamPartition
from weirflow.local.launcher import wait_until
from weirflow.systems import Systems

pytestmark = pytest.mark.integration

EVENTS = 20_000
SHORT = [
    "streams.page-views.partitions=2",
    "streams.page-counts.partitions=2",
    "job.coordinator.lease.duration.ms=5000",
    "job.coordinator.lease.renew.interval.ms=1500",
    "job.coordinator.heartbeat.interval.ms=1000",
    "job.coordinator.liveness.timeout.ms=4000",
    "job.coordinator.poll.interval.ms=250",
    "job.debounce.time.ms=1000",
    "task.max.records.per.trigger=4000",
]
FINISH_S = 240


class PageViewsJob(ExampleJob):
    def __init__(self, tmp_path: Path) -> None:
        super().__init__("job.yaml", [f"job.state.dir={tmp_path / 'state'}", *SHORT], tmp_path / "logs", FINISH_S)
        self.config = load_config(self.config_path, self.overrides)

    def generate(self, n: int = EVENTS) -> dict[results.Window, int]:
        return results.expected_counts(generate.write(self.config, n))


@pytest.fixture
def job(tmp_path: Path):
    j = PageViewsJob(tmp_path)
    yield j
    j.stop_all()


def test_window_counts_equal_pandas_and_bad_events_go_to_the_dead_letter_stream(
    job: PageViewsJob, measure
) -> None:
    expected = job.generate()
    bad = [b"{not json", b'{"user": "u1", "page": "/page/1", "event_time": "yesterday"}', b'["a", "list"]']
    systems = Systems(job.config)
    systems.producer("local").send([OutgoingRecord("page-views", v, key=b"u1", partition=1) for v in bad])
    proc = job.start("p0")
    job.wait_finished([proc])

    got = results.read_counts(job.config)
    assert got == expected, f"{len(set(expected) ^ set(got))} windows differ"
    measure(f"{len(got)} windows over {EVENTS} events equal pandas exactly")

    letters = []
    for partition in range(2):
        ssp = SystemStreamPartition("local", "page-views.dlq", partition)
        letters += [json.loads(r.value) for r in systems.consumer("local").read(ssp, "0", 100)]
    assert len(letters) == 3
    reasons = sorted(letter["error"] for letter in letters)
    assert any("not valid JSON" in r for r in reasons)
    assert any("field 'event_time'" in r and "timestamp" in r for r in reasons)
    assert any("expected a JSON object" in r for r in reasons)
    assert {letter["ssp"] for letter in letters} == {"local.page-views.1"}
    assert sorted(int(letter["offset"]) for letter in letters) == sorted(
        int(o) for o in {letter["offset"] for letter in letters}
    )
    import base64

    assert sorted(base64.b64decode(letter["raw_base64"]) for letter in letters) == sorted(bad)
    from weirflow.factories import checkpoint_factory

    manager = checkpoint_factory(job.config).get_checkpoint_manager(job.config)
    manager.start()
    dead = sum(dict(c.control).get("dead-letters", 0) for c in manager.read_all().values())
    assert dead == 3  # reported in the tasks' checkpoints (and logged)
    assert "sent to its dead-letter stream" in proc.log_text()
    systems.close()


def test_two_processors_share_the_tasks_and_counts_stay_exact(job: PageViewsJob) -> None:
    expected = job.generate()
    procs = [job.start("p0"), job.start("p1")]
    job.wait_finished(procs)
    for p in procs:
        assert "started task" in p.log_text(), f"{p.processor_id} ran no task"
    assert results.read_counts(job.config) == expected


def test_a_processor_killed_mid_run_and_restarted_loses_no_window(job: PageViewsJob, measure) -> None:
    expected = job.generate()
    first = job.start("p0")
    wait_until(lambda: results.consumed(job.config) >= EVENTS * 0.3, FINISH_S, "30% of the input to be processed",
               interval_s=0.2)
    done_at_kill = results.consumed(job.config)
    first.kill()
    assert done_at_kill < EVENTS, "the job finished before the kill; nothing was tested"
    second = job.start("p1")
    job.wait_finished([second])

    got = results.read_counts(job.config)
    missing = set(expected) - set(got)
    assert not missing, f"{len(missing)} windows missing after the restart, e.g. {sorted(missing)[:3]}"
    assert all(got[w] >= n for w, n in expected.items()), "a window lost events"
    exact = sum(got[w] == n for w, n in expected.items())
    measure(f"killed at {done_at_kill}/{EVENTS} events; {exact}/{len(expected)} windows exact after restart "
            "(others over-counted by replays, at-least-once)")


def test_a_windowed_job_paused_past_its_lease_finishes_with_every_window_once(
    job: PageViewsJob, measure
) -> None:
    """SIGSTOP freezes one processor's Python process for four leases; its Spark JVM and workers run on. The
    other processor takes every task over; the paused one fences itself when it wakes, rejoins, and gets tasks
    back whose Spark checkpoints are now behind the checkpoint store (the store wins). The bounded job must
    finish, with counts equal to pandas and every window written once.

    (Seen here: the paused processor's queries stall at their next micro-batch, because PySpark merges the
    batch's accumulators through the driver's Python process; a batch already writing is what the sink's
    fence stops, proved by `tests/integration/test_spark_fencing.py`.)"""
    import os
    import signal

    expected = job.generate(EVENTS * 2)
    running, paused = job.start("p0"), job.start("p1")
    wait_until(lambda: results.consumed(job.config) >= EVENTS * 0.2, FINISH_S, "20% of the input processed",
               interval_s=0.2)  # fmt: skip
    os.kill(paused.pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        paused_at = results.consumed(job.config)
        # the lease is 5 s: p0 takes every task over meanwhile, and p1's Spark keeps running its queries
        owners = lambda: sorted(status_document(job.config)["assignment"])  # noqa: E731
        wait_until(lambda: owners() == ["p0"], 60, "p0 assigned every task",
                   interval_s=0.25)  # fmt: skip
        time.sleep(max(0.0, 20 - (time.monotonic() - stopped_at)))  # paused four leases in all
    finally:
        os.kill(paused.pid, signal.SIGCONT)
    job.wait_finished([running, paused])
    writes: dict[results.Window, int] = {}
    systems = Systems(job.config)
    try:
        consumer = systems.consumer("local")
        for partition in range(2):
            offset = "0"
            ssp = SystemStreamPartition("local", "page-counts", partition)
            while batch := consumer.read(ssp, offset, 10_000):
                for record in batch:
                    row = json.loads(record.value)
                    window = (row["page"], row["window_start"][:16])
                    writes[window] = writes.get(window, 0) + 1
                offset = batch[-1].next_offset
    finally:
        systems.close()
    twice = sorted(w for w, n in writes.items() if n > 1)
    assert results.read_counts(job.config) == expected
    assert not twice, f"{len(twice)} of {len(writes)} windows written more than once, e.g. {twice[:3]}"
    measure(f"p1 SIGSTOPped at {paused_at}/{EVENTS * 2} events: {len(writes)} windows, each written once")
