"""The example pipeline end to end on real PySpark: exact counts, shared tasks, dead letters (a processor
SIGKILLed mid-run: tests/integration/test_drain.py and test_chaos.py).

Each test runs `weirflow run` processes on a copy of examples/pageviews (2 input partitions to keep Spark's
start-up cost down) over generated bounded input, waits for the job to finish (every task reached
end-of-stream) and compares the window counts with pandas over the same events.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.example_job import ExampleJob, generate, results
from weirflow.config import load_config
from weirflow.interfaces.system import OutgoingRecord, SystemStreamPartition
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


def test_two_processors_share_the_tasks_count_exactly_and_dead_letter_bad_events(
    job: PageViewsJob, measure
) -> None:
    import base64

    from weirflow.factories import checkpoint_factory

    expected = job.generate()
    bad = [b"{not json", b'{"user": "u1", "page": "/page/1", "event_time": "yesterday"}', b'["a", "list"]']
    systems = Systems(job.config)
    systems.producer("local").send([OutgoingRecord("page-views", v, key=b"u1", partition=1) for v in bad])
    procs = [job.start("p0"), job.start("p1")]
    job.wait_finished(procs)
    for p in procs:
        assert "started task" in p.log_text(), f"{p.processor_id} ran no task"
    got = results.read_counts(job.config)
    assert got == expected, f"{len(set(expected) ^ set(got))} windows differ"
    measure(f"{len(got)} windows over {EVENTS} events equal pandas exactly, 2 processors")

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
    assert sorted(base64.b64decode(letter["raw_base64"]) for letter in letters) == sorted(bad)
    manager = checkpoint_factory(job.config).get_checkpoint_manager(job.config)
    manager.start()
    dead = sum(dict(c.control).get("dead-letters", 0) for c in manager.read_all().values())
    assert dead == 3  # reported in the tasks' checkpoints (and logged)
    assert any("sent to its dead-letter stream" in p.log_text() for p in procs)
    manager.stop()
    systems.close()
