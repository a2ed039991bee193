"""The example pipeline on Azure services by config alone (examples/pageviews/azure.yaml): streams on Event
Hubs (the emulator, through the real SDK), coordination and checkpoints in Azure Storage (Azurite). Two
processors run it over an unbounded input fed at a steady rate; one is SIGKILLed while it runs tasks and a new
one takes its place (as a replaced container would), then the job is drained mid-stream (docs/drain.md): the
notification in Blob Storage, drain messages on every partition of the intermediate hub, drained checkpoints
in Table Storage. Every window up to the cut is written once with pandas' count, and no two writers of one task
(processor, lock epoch) ever wrote at the same time. (Bounded inputs ending with end-of-stream: the upgraded
run of tests/integration/test_drain.py; the SDK checkpoint layout: test_table_checkpoints.py; a longer run with
a SIGKILL every few seconds: benchmarks/chaos.py.)

Inputs have 2 partitions to keep Spark's start-up cost down; each test has its own emulator and job id.
"""

from __future__ import annotations

import base64
import time
import uuid
from pathlib import Path

import pytest

from tests.integration import drain_job
from tests.integration.example_job import ExampleJob, results
from weirflow.config import load_config
from weirflow.control import MessageType, decode, is_control
from weirflow.drain_notice import DrainUtils
from weirflow.interfaces.system import OutgoingRecord, SystemStreamPartition
from weirflow.job_context import JobContext
from weirflow.local.launcher import wait_until
from weirflow.spark import writer_log
from weirflow.systems import Systems
from weirflow_azure.checkpoint.table import TableCheckpointManager
from weirflow_azure.coordinator.storage import Storage

pytestmark = pytest.mark.integration

FINISH_S = 300
# A killed processor is noticed in seconds (the blob lease itself cannot be shorter than 15 s).
QUICK_FAILOVER = (
    "job.coordinator.heartbeat.interval.ms=1500",
    "job.coordinator.liveness.timeout.ms=6000",
    "job.debounce.time.ms=1000",
)


class AzurePageViews(ExampleJob):
    def __init__(
        self,
        tmp_path: Path,
        eventhubs_emulator,
        azure_storage: str,
        monkeypatch,
        extra: tuple[str, ...] = (),
        hubs: dict[str, int] | None = None,
    ) -> None:
        """``hubs``: more event hubs the emulator holds (name -> partitions), beside the example's."""
        job_id = uuid.uuid4().hex[:8]
        self.emulator = eventhubs_emulator(
            {
                "page-views": 2,
                "page-views.dlq": 2,
                "page-counts": 2,
                f"pageviews-{job_id}-views-by-page": 2,
                **(hubs or {}),
            }
        )
        # azure.yaml reads both from the environment, as a deployment would; processors inherit it.
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azure_storage)
        monkeypatch.setenv("EVENTHUBS_CONNECTION_STRING", self.emulator.connection_string())
        self.overrides = [
            f"job.state.dir={tmp_path / 'state'}",
            f"job.id={job_id}",
            "streams.page-views.partitions=2",
            "streams.page-counts.partitions=2",
            "task.max.records.per.trigger=400",  # several micro-batches per partition
            *extra,
        ]
        super().__init__("azure.yaml", self.overrides, tmp_path / "logs", FINISH_S)
        self.config = load_config(self.config_path, self.overrides)

    def emulator_properties(self, hub: str) -> dict[str, dict]:
        from azure.eventhub import EventHubProducerClient

        client = EventHubProducerClient.from_connection_string(self.emulator.connection_string(hub))
        try:
            return {p: client.get_partition_properties(p) for p in client.get_partition_ids()}
        finally:
            client.close()


@pytest.fixture
def job(tmp_path: Path, eventhubs_emulator, azure_storage: str, monkeypatch):
    j = AzurePageViews(tmp_path, eventhubs_emulator, azure_storage, monkeypatch)
    yield j
    j.stop_all()


def test_two_processors_on_event_hubs_drain_mid_stream_with_every_window_once_and_dead_letter_bad_events(
    tmp_path: Path, eventhubs_emulator, azure_storage: str, monkeypatch, measure
) -> None:
    extra = ("streams.page-views.bounded=false", "app.run.id=blue", *QUICK_FAILOVER)
    job = AzurePageViews(tmp_path, eventhubs_emulator, azure_storage, monkeypatch, extra)
    # fed from when both processors run tasks, at a rate they keep up with: the checks read every event back
    feeder = drain_job.Feeder(job.config, rate=150).create_stream()
    systems = Systems(job.config)
    try:
        systems.producer("eh").send([OutgoingRecord("page-views", b"{not json", partition=1)])
        p0, p1 = job.start("p0"), job.start("p1")
        running = lambda p: "started task" in p.log_text()  # noqa: E731
        up = lambda: (running(p0) and running(p1)) or not (p0.alive() and p1.alive())  # noqa: E731
        wait_until(up, FINISH_S, "both to run tasks", 0.2)
        assert p0.alive() and p1.alive(), p0.log_text()[-2000:] + p1.log_text()[-2000:]
        feeder.start()
        wait_until(lambda: results.consumed(job.config) >= 600, FINISH_S, "the job to process input", 0.5)

        # a machine dies with tasks running and input arriving; a new processor takes its place
        p1.kill()
        p2 = job.start("p2")
        wait_until(lambda: running(p2) or not p2.alive(), FINISH_S, "the new processor to take tasks over", 0.2)
        assert p2.alive(), p2.log_text()[-3000:]
        at_takeover = results.consumed(job.config)
        wait_until(lambda: results.consumed(job.config) >= at_takeover + 600, FINISH_S, "input after it", 0.5)
        procs = [p0, p2]
        ctx = JobContext.open(job.config, owner="test")
        try:
            other = DrainUtils(ctx.metadata).write("green")  # another deployment's drain: ignored
        finally:
            ctx.close()
        began = time.monotonic()
        done = drain_job.drain_command(job.config_path, job.overrides, "--wait", "--timeout", "240")
        took = time.monotonic() - began
        assert done.returncode == 0, done.stdout + done.stderr
        for p in procs:
            assert p.popen.wait(60) == 0, p.log_text()[-4000:]
            assert "ignoring drain notification" in p.log_text()
    finally:
        feeder.stop()
        job.stop_all()

    try:
        states = drain_job.checkpoints(job.config)
        assert len(states) == 4 and all(c.control.get("drained") == "blue" for c in states.values()), states
        cut = drain_job.input_cut(job.config)
        before, after = drain_job.split_at_cut(job.config, cut)
        expected = results.expected_counts(before)
        got, twice = drain_job.window_counts_once(job.config)
        assert not twice, f"{len(twice)} windows written more than once"
        assert got == expected, f"{len(set(expected) ^ set(got))} windows differ from pandas up to the cut"
        assert drain_job.unread_intermediate(job.config) == {}
        assert drain_job.drain_notices(job.config) == [other], "the leader removes its run's notice, not another's"
        overlap, batches = writer_log.overlap_ms(p.log_text() for p in (p0, p1, p2))
        assert batches > 0, "no processor logged its committed batches: overlap not measured"
        assert overlap == 0, f"two writers of one task wrote at the same time for {overlap} ms"
        measure(
            f"[event hubs + azure] p1 SIGKILLed, p2 took over; drained in {took:.1f} s; {len(before)} events up "
            f"to the cut, {len(got)} windows once each, equal pandas; {len(after)} events after the cut; "
            f"{batches} batches logged, no two writers of a task at once"
        )

        letters = drain_job.dead_letters(job.config)
        assert len(letters) == 1
        assert "not valid JSON" in letters[0]["error"] and letters[0]["ssp"] == "eh.page-views.1"
        assert base64.b64decode(letters[0]["raw_base64"]) == b"{not json"

        # Control messages reach every partition of the intermediate hub: each upstream task's watermarks and
        # its drain (for this run), which is what let every downstream task drain.
        middle = f"pageviews-{job.config.get('job.id')}-views-by-page"
        for partition in range(2):
            ssp = SystemStreamPartition("eh", middle, partition)
            records = systems.consumer("eh").read(ssp, "0", 100_000)
            control = [decode(r.value) for r in records if is_control(r.value)]
            drains = {b.task_name for kind, b in control if kind is MessageType.DRAIN and b.run_id == "blue"}
            assert drains == {"page_views-0", "page_views-1"}
            marks = {body.task_name for kind, body in control if kind is MessageType.WATERMARK}
            assert marks == {"page_views-0", "page_views-1"}
            assert not any(kind is MessageType.END_OF_STREAM for kind, _ in control)

        # The Azure SDKs' layout for the Event Hubs inputs is never ahead of what was processed.
        manager = TableCheckpointManager(Storage.from_config(job.config))
        namespace = f"127.0.0.1:{job.emulator.port}"
        for row in manager.read_sdk_rows():
            if row["PartitionKey"] == f"{namespace} page-views $Default Checkpoint":
                assert int(row["sequencenumber"]) < cut[int(row["RowKey"])]
        manager.stop()
    finally:
        systems.close()
