"""A stream's retention on the embedded log deletes records, read or not, and a task whose next record it deleted
fails with an error naming the stream, the partition and the first offset still held; it never skips them.

A record job relays its input's records and stops once its task checkpointed them all. More records arrive; the
stream's retention (`streams.events.retention.bytes`, applied by the leader's trimmer: `Trimmer` with the job's
systems) deletes all but the newest ten, among them the next record the task would read. The next processor's
task fails as it starts, naming what was deleted, and writes nothing; with `streams.events.on-deleted: earliest`
the next one resumes at the first offset held and says how many records it skipped.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.integration.relay_job import SHORT_TIMINGS
from weirflow.config import load_config
from weirflow.coordination.trimming import Trimmer
from weirflow.interfaces.plugins import checkpoint_factory
from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.job.model import JobModel
from weirflow.job.systems import Systems
from weirflow.local.launcher import start_processor
from weirflow.testing import wait_until

pytestmark = pytest.mark.integration

JOB = """
job: {name: retained}
task: {inputs: [events], function: "relay:relay"}
streams:
  events: {partitions: 1}
  relayed: {partitions: 1}
"""

RELAY = """
def relay(record):
    return [{"stream": "relayed", "value": {"offset": int(record["offset"])}}]
"""


def test_a_task_whose_next_record_outlived_its_retention_fails_naming_the_first_offset_held(
    tmp_path: Path,
) -> None:
    timings = "".join(f"{key}: {json.dumps(value)}\n" for key, value in SHORT_TIMINGS.items())
    (tmp_path / "job.yaml").write_text(textwrap.dedent(JOB) + timings)
    (tmp_path / "relay.py").write_text(RELAY)
    kept = ["streams.events.retention.bytes=10"]  # one byte a record: the newest ten
    config = load_config(tmp_path / "job.yaml", kept)
    systems = Systems(config)
    checkpoints = checkpoint_factory(config).get_checkpoint_manager(config)
    checkpoints.start()
    procs = []
    try:
        admin, producer = systems.admin("local"), systems.producer("local")
        admin.create_stream(StreamSpec("events", 1))
        admin.create_stream(StreamSpec("relayed", 1))
        producer.send([OutgoingRecord("events", b"x", partition=0) for _ in range(20)])
        first = start_processor(tmp_path / "job.yaml", "p1", log_dir=tmp_path / "logs")
        procs.append(first)
        ssp = SystemStreamPartition("local", "events", 0)

        def checkpointed() -> str | None:
            checkpoint = checkpoints.read_last_checkpoint("main-0")
            return checkpoint.offsets.get(ssp) if checkpoint is not None else None

        wait_until(lambda: checkpointed() == "20", 120, "the task to checkpoint the first 20 records", 0.2)
        assert first.terminate() == 0, first.log_text()[-3000:]

        producer.send([OutgoingRecord("events", b"x", partition=0) for _ in range(20)])  # offsets 20..39
        trimmer = Trimmer(checkpoints, systems, None, 1000, declared=[("local", "events")])
        assert trimmer.check(JobModel(1)) == 30 and trimmer.trimmed == {"events": 30}
        assert admin.partition_metadata("events")[0].oldest == "30"

        second = start_processor(tmp_path / "job.yaml", "p2", kept, log_dir=tmp_path / "logs")
        procs.append(second)
        wanted = "local.events.0: the checkpoint resumes at offset 20, which was deleted"
        wait_until(lambda: wanted in second.log_text(), 120, "the task to fail naming the deleted offset", 0.2)
        line = next(line for line in second.log_text().splitlines() if wanted in line)
        assert "the first offset held is 30" in line, line
        relayed = systems.consumer("local").read(SystemStreamPartition("local", "relayed", 0), "0", 1000)
        assert [json.loads(r.value)["offset"] for r in relayed] == list(range(20)), "nothing was skipped"
        assert checkpointed() == "20", "the checkpoint did not move"
        assert second.terminate() == 0, second.log_text()[-3000:]

        # the same, with the stream's on-deleted saying where to resume: at the first offset held, said once
        skipping = [*kept, "streams.events.on-deleted=earliest"]
        third = start_processor(tmp_path / "job.yaml", "p3", skipping, log_dir=tmp_path / "logs")
        procs.append(third)
        wait_until(lambda: checkpointed() == "40", 120, "the task to resume at the first offset held", 0.2)
        relayed = systems.consumer("local").read(SystemStreamPartition("local", "relayed", 0), "0", 1000)
        assert [json.loads(r.value)["offset"] for r in relayed] == [*range(20), *range(30, 40)]
        assert "resuming at the first offset held, 30, skipping 10 records" in third.log_text()
    finally:
        for proc in procs:
            if proc.alive():
                proc.kill()
        checkpoints.stop()
        systems.close()
