"""The example pipeline on Azure services by config alone (examples/pageviews/azure.yaml): streams on Event
Hubs (the emulator, through the real SDK), coordination and checkpoints in Azure Storage (Azurite). Two
processors run it over an unbounded input fed at a steady rate; one is SIGKILLed while it runs tasks and a new
one takes its place (as a replaced container would). Then `weirflow upgrade`, with no run id set anywhere,
drains the job mid-stream (docs/drain.md): the notification in Blob Storage, drain messages on every partition
of the intermediate hub, drained checkpoints in Table Storage; it records the next run and becomes a processor
of the new version, which has another aggregation and an intermediate schema the old rows do not fit. Every
window is written once with pandas' count on both sides of the cut, no two writers of one task (processor, lock
epoch) ever wrote at the same time, and an old processor started again after the upgrade runs nothing.
(Bounded inputs ending with end-of-stream: tests/integration/test_drain.py; the SDK checkpoint layout:
test_table_checkpoints.py; a longer run with a SIGKILL every few seconds: benchmarks/chaos.py.)

Inputs have 2 partitions to keep Spark's start-up cost down; each test has its own emulator and job id.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.integration import drain_job
from tests.integration.example_job import EXAMPLE, ExampleJob, results
from tests.integration.test_drain import PIPELINE_V2, _expected_v2
from weirflow.config import load_config
from weirflow.interfaces.system import OutgoingRecord, SystemStreamPartition
from weirflow.job.context import JobContext
from weirflow.job.drain_notice import DEFAULT_RUN_ID, DrainUtils
from weirflow.job.systems import Systems
from weirflow.runtime.control import ControlMessage, MessageType, decode, is_control
from weirflow.spark import writer_log
from weirflow.testing import wait_until
from weirflow_azure.checkpoint.table import TableCheckpointManager
from weirflow_azure.coordinator.storage import Storage

pytestmark = [pytest.mark.integration, pytest.mark.spark]

FINISH_S = 300
V2_KEYS = [
    "app.pipeline=pipeline_v2:pipeline",
    "streams.page-views.bounded=true",
    "streams.page-counts-v2.partitions=2",
]
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


def _log(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


# Four processors, a drain and an upgrade: 144 to 162 s alone on a slow hour of this 2-core machine, past the
# suite's 300 s safety net beside two other Spark files (the test waits for conditions; this only bounds a hang).
@pytest.mark.timeout(600)
def test_two_processors_on_event_hubs_upgraded_mid_stream_with_every_window_once_and_dead_letter_bad_events(
    tmp_path: Path, eventhubs_emulator, azure_storage: str, monkeypatch, measure
) -> None:
    extra = ("streams.page-views.bounded=false", *QUICK_FAILOVER)
    job = AzurePageViews(tmp_path, eventhubs_emulator, azure_storage, monkeypatch, extra, {"page-counts-v2": 2})
    v2_dir = tmp_path / "v2"
    v2_dir.mkdir()
    shutil.copy(EXAMPLE / "azure.yaml", v2_dir / "azure.yaml")
    (v2_dir / "pipeline_v2.py").write_text(PIPELINE_V2)
    log = tmp_path / "upgrade.log"
    command = [sys.executable, "-m", "weirflow", "upgrade", str(job.config_path), str(v2_dir / "azure.yaml")]
    for item in job.overrides:
        command += ["--set", item]
    for item in V2_KEYS:
        command += ["--new-set", item]
    # fed from when both processors run tasks, at a rate they keep up with: the checks read every event back
    feeder = drain_job.Feeder(job.config, rate=150).create_stream()
    systems = Systems(job.config)
    upgrade = None
    try:
        systems.producer("eh").send([OutgoingRecord("page-views", b"{not json", partition=1)])
        p0, p1 = job.start("p0"), job.start("p1")
        running = lambda p: "started task" in p.log_text()  # noqa: E731
        up = lambda: (running(p0) and running(p1)) or not (p0.alive() and p1.alive())  # noqa: E731
        wait_until(up, FINISH_S, "both to run tasks", 0.2)
        assert p0.alive() and p1.alive(), p0.log_text()[-2000:] + p1.log_text()[-2000:]
        assert f"run {DEFAULT_RUN_ID} (" in p0.log_text(), "the job's first run, with no run id set"
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
        with log.open("w") as out:
            upgrade = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        # the feed goes on until the processors noticed the drain, and a second longer: input after the cut
        noticed = lambda: all("drain requested" in p.log_text() for p in procs)  # noqa: E731
        wait_until(noticed, FINISH_S, "the processors to notice the drain", 0.2)
        sent = feeder.sent
        wait_until(lambda: feeder.sent >= sent + 150, 60, "a second more of input", 0.1)
        feeder.stop()
        for p in procs:
            assert p.popen.wait(FINISH_S) == 0, p.log_text()[-4000:]
            assert "ignoring drain notification" in p.log_text()
        took = time.monotonic() - began
        wait_until(lambda: "the new version runs as run" in _log(log), FINISH_S, "the next run recorded", 0.2)
        text = " ".join(_log(log).split())
        next_run = text.split("the new version runs as run ", 1)[1].split(" ", 1)[0]
        assert next_run != DEFAULT_RUN_ID and f"(after run {DEFAULT_RUN_ID})" in text, text
        # v1's cut, read while the new version's processor is still starting Spark (before its first checkpoint)
        states = drain_job.checkpoints(job.config)
        drained = [c.control.get("drained") for c in states.values()]
        assert drained == [DEFAULT_RUN_ID] * 4, f"not v1's drained checkpoints: {states}"
        cut = drain_job.input_cut(job.config, states)

        # the old version, started again (as a container platform restarts an exited replica), runs nothing
        old = job.start("p0-again")
        assert old.popen.wait(120) == 0, old.log_text()[-3000:]
        assert "drained and was upgraded" in old.log_text() and "started task" not in old.log_text()

        assert upgrade.wait(FINISH_S) == 0, _log(log)[-5000:]
    finally:
        if upgrade is not None and upgrade.poll() is None:
            upgrade.kill()
        feeder.stop()
        job.stop_all()

    try:
        assert f"run {next_run} (joined the running deployment)" in _log(log), _log(log)[-3000:]
        # v1: every window up to the cut, once, equal to pandas
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

        # v2: every window of the input after the cut, once, equal to pandas; no v1 row read
        config_v2 = load_config(v2_dir / "azure.yaml", [*job.overrides, *V2_KEYS])
        rows = drain_job.output_rows(config_v2, "page-counts-v2")
        got_v2 = {(r["page"], r["window_start"][:16]): (int(r["views"]), int(r["user_len"])) for r in rows}
        assert len(rows) == len(got_v2), "a window of the new version was written twice"
        assert got_v2 == _expected_v2(after), "the new version's output is not exactly the input after the cut"
        assert drain_job.intermediate_dead_letters(config_v2) == []
        ended = drain_job.checkpoints(config_v2)
        assert all(c.control.get("finished") for c in ended.values()), ended
        measure(
            f"[event hubs + azure] p1 SIGKILLed, p2 took over; upgraded without a run id, v1 drained in "
            f"{took:.1f} s; {len(before)} events up to the cut, {len(got)} windows once each, equal pandas; "
            f"{batches} batches logged, no two writers of a task at once; v2 as run {next_run} counted the "
            f"{len(after)} events after the cut in {len(got_v2)} windows, equal pandas"
        )

        letters = drain_job.dead_letters(job.config)
        assert len(letters) == 1
        assert "not valid JSON" in letters[0]["error"] and letters[0]["ssp"] == "eh.page-views.1"
        assert base64.b64decode(letters[0]["raw_base64"]) == b"{not json"

        # Control messages reach every partition of the intermediate hub (which both versions write): each
        # upstream task's watermarks and its drain in v1's run, which is what let every downstream task drain;
        # the new version's bounded input ends its run with end-of-stream instead.
        middle = f"pageviews-{job.config.get('job.id')}-views-by-page"
        for partition in range(2):
            ssp = SystemStreamPartition("eh", middle, partition)
            records = systems.consumer("eh").read(ssp, "0", 100_000)
            control = [decode(r.value)[1] for r in records if is_control(r.value)]
            by_run = {
                run: {(m.type, m.task_name) for m in control if isinstance(m, ControlMessage) and m.run_id == run}
                for run in (DEFAULT_RUN_ID, next_run)
            }
            producers = {"page_views-0", "page_views-1"}
            assert {t for kind, t in by_run[DEFAULT_RUN_ID] if kind is MessageType.DRAIN} == producers
            assert {t for kind, t in by_run[DEFAULT_RUN_ID] if kind is MessageType.WATERMARK} == producers
            assert not any(kind is MessageType.END_OF_STREAM for kind, _ in by_run[DEFAULT_RUN_ID])
            assert {t for kind, t in by_run[next_run] if kind is MessageType.END_OF_STREAM} == producers
            assert not any(kind is MessageType.DRAIN for kind, _ in by_run[next_run])

        # The Azure SDKs' layout for the Event Hubs inputs is never ahead of what was processed: here the new
        # version's last checkpoint, which read on from v1's cut.
        final = drain_job.input_cut(config_v2, ended)
        assert all(final[p] >= cut[p] for p in cut), (final, cut)
        manager = TableCheckpointManager(Storage.from_config(job.config))
        namespace = f"127.0.0.1:{job.emulator.port}"
        rows = [
            r
            for r in manager.read_sdk_rows()
            if r["PartitionKey"] == f"{namespace} page-views $Default Checkpoint"
        ]
        manager.stop()
        assert sorted(int(r["RowKey"]) for r in rows) == [0, 1], rows
        for row in rows:
            assert int(row["sequencenumber"]) < final[int(row["RowKey"])]
    finally:
        systems.close()
