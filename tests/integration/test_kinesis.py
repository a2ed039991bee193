"""The pageviews example on Kinesis (examples/pageviews/kinesis.yaml) against kinesalite, through unmodified
boto3: virtual tasks over the MD5 hash space keep every task, and its window state, in place while the input
stream is split from 2 to 4 shards and merged back to 3 under the running job (docs/kinesis.md).

The input is written with raw boto3 `PutRecords` (the test learns each record's shard and sequence number),
keyed by user; the job's window counts are compared with pandas over every event once the job has consumed
them all and is drained.

The SIGKILL test runs the same example on AWS alone (examples/pageviews/aws.yaml): coordination and checkpoints
in DynamoDB, the job model and Spark state in S3, on the session's moto server (docs/aws.md).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from tests.integration import drain_job
from tests.integration.example_job import ExampleJob, generate, replayed_rows_dropped, results
from weirflow.config import load_config
from weirflow.interfaces.checkpoint import CheckpointManager
from weirflow.interfaces.plugins import checkpoint_factory
from weirflow.runtime.fault_points import ARMED_BY
from weirflow.runtime.fault_points import ENV as FAULT_POINT
from weirflow.testing import wait_until
from weirflow_kinesis import positions
from weirflow_kinesis.hashing import key_hash, slice_of
from weirflow_kinesis.shards import Shard, ShardMap

pytestmark = [pytest.mark.integration, pytest.mark.spark]

FINISH_S = 240
VIRTUAL_TASKS = 4


class KinesisPageViews(ExampleJob):
    """The example job on its own input and output streams and job id, on the session's kinesalite."""

    def __init__(
        self,
        tmp_path: Path,
        kinesalite: Any,
        monkeypatch: pytest.MonkeyPatch,
        config_file: str = "kinesis.yaml",
        moto: Any = None,
    ) -> None:
        job_id = uuid.uuid4().hex[:8]
        monkeypatch.setenv("KINESIS_ENDPOINT", kinesalite.endpoint)
        if moto is not None:  # aws.yaml reads its DynamoDB + S3 endpoint and bucket from the environment
            from tests.support.moto_server import BUCKET

            monkeypatch.setenv("AWS_ENDPOINT", moto.endpoint)
            monkeypatch.setenv("WEIRFLOW_BUCKET", BUCKET)
        self.input = f"views-{job_id}"
        self.overrides = [
            f"job.state.dir={tmp_path / 'state'}",
            f"job.id={job_id}",
            f"streams.page-views.physical.name={self.input}",
            f"streams.page-counts.physical.name=counts-{job_id}",
            "streams.page-views.bounded=false",
            "app.run.id=blue",
            "systems.kin.shard.refresh.ms=1000",
            "task.max.records.per.trigger=1500",
        ]
        super().__init__(config_file, self.overrides, tmp_path / "logs", FINISH_S)
        self.config = load_config(self.config_path, self.overrides)
        import boto3

        self.client = boto3.client("kinesis", endpoint_url=kinesalite.endpoint)
        self.client.create_stream(StreamName=self.input, ShardCount=2)
        self.client.get_waiter("stream_exists").wait(StreamName=self.input, WaiterConfig={"Delay": 0.2})
        self.client.add_tags_to_stream(StreamName=self.input, Tags={"weirflow.virtual.tasks": str(VIRTUAL_TASKS)})
        # (virtual task, shard) -> the sequence number of the last event written there: every event is consumed
        # once each of these is (sequence numbers grow in a shard), which `consumed` checks twice a second
        self.latest: dict[tuple[int, str], str] = {}
        self._checkpoints: CheckpointManager | None = None

    def write(self, events: Iterable[dict[str, Any]]) -> None:
        """Append events keyed by user, 500 per `PutRecords`, remembering the sequence number of each virtual
        task's last event in each shard."""
        batch = list(events)
        for i in range(0, len(batch), 500):
            chunk = batch[i : i + 500]
            response = self.client.put_records(
                StreamName=self.input,
                Records=[{"Data": json.dumps(e).encode(), "PartitionKey": e["user"]} for e in chunk],
            )
            assert response["FailedRecordCount"] == 0
            for event, entry in zip(chunk, response["Records"], strict=True):
                where = (slice_of(key_hash(event["user"]), VIRTUAL_TASKS), entry["ShardId"])
                sequence, before = entry["SequenceNumber"], self.latest.get(where)
                if before is None or positions.sequence_key(sequence) > positions.sequence_key(before):
                    self.latest[where] = sequence

    def open_shards(self) -> list[dict[str, Any]]:
        shards = self.client.list_shards(StreamName=self.input)["Shards"]
        return [s for s in shards if "EndingSequenceNumber" not in s.get("SequenceNumberRange", {})]

    def split_all(self) -> None:
        """Split every open shard at a third of its hash range (not on a slice boundary)."""
        for shard in self.open_shards():
            low, high = (int(shard["HashKeyRange"][k]) for k in ("StartingHashKey", "EndingHashKey"))
            self.client.split_shard(
                StreamName=self.input,
                ShardToSplit=shard["ShardId"],
                NewStartingHashKey=str(low + (high - low) // 3),
            )
            self.wait_active()

    def merge_lowest(self) -> None:
        """Merge the two open shards with the lowest hash ranges."""
        shards = sorted(self.open_shards(), key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]))
        self.client.merge_shards(
            StreamName=self.input, ShardToMerge=shards[0]["ShardId"], AdjacentShardToMerge=shards[1]["ShardId"]
        )
        self.wait_active()

    def wait_active(self) -> None:
        wait_until(
            lambda: (
                self.client.describe_stream_summary(StreamName=self.input)["StreamDescriptionSummary"][
                    "StreamStatus"
                ]
                == "ACTIVE"
            ),
            30,
            "the stream to be ACTIVE",
            0.1,
        )

    def consumed(self) -> bool:
        """Whether every written event is at or before its virtual task's checkpointed position in its shard (the
        last one written to each virtual task and shard is): the shard's state is past it, or the shard is read
        to its end (``"E"``, or pruned from the position once a child started: `ShardMap.done`)."""
        done = {
            ssp.partition: positions.decode(offset)
            for checkpoint in self.checkpoints().values()
            for ssp, offset in checkpoint.offsets.items()
            if ssp.stream == self.input
        }
        shards = ShardMap([Shard.from_api(s) for s in self.client.list_shards(StreamName=self.input)["Shards"]])
        for (task, shard), sequence in self.latest.items():
            state = done.get(task, {}).get(shard)
            if state is None and shards.done(shards.by_id[shard], done.get(task, {}), task, VIRTUAL_TASKS):
                continue
            if state != positions.ENDED and not (
                positions.is_sequence(state)
                and positions.sequence_key(positions.sequence_of(state)) >= positions.sequence_key(sequence)  # type: ignore[arg-type]
            ):
                return False
        return True

    def checkpoints(self) -> dict[str, Any]:
        """The job's checkpoints, through one manager kept open for the test: `consumed` reads them twice a
        second, and a manager opened per read builds its clients again (on the AWS backend a boto3 session and a
        DescribeTable each time)."""
        if self._checkpoints is None:
            self._checkpoints = checkpoint_factory(self.config).get_checkpoint_manager(self.config)
            self._checkpoints.start()
        return dict(self._checkpoints.read_all())

    def stop_all(self) -> None:
        super().stop_all()
        if self._checkpoints is not None:
            self._checkpoints.stop()
            self._checkpoints = None

    def wait_consumed(self, what: str) -> None:
        try:
            wait_until(self.consumed, FINISH_S, f"the job to consume {what}", 0.5)
        except TimeoutError:
            for p in self.processors:
                print(p.log_text()[-4000:])
            raise


@pytest.fixture
def job(tmp_path: Path, kinesalite: Any, monkeypatch: pytest.MonkeyPatch):
    j = KinesisPageViews(tmp_path, kinesalite, monkeypatch)
    yield j
    j.stop_all()


@pytest.fixture
def aws_job(tmp_path: Path, kinesalite: Any, moto: Any, monkeypatch: pytest.MonkeyPatch):
    """The example on AWS alone (aws.yaml): Kinesis on kinesalite, DynamoDB and S3 on moto's server."""
    j = KinesisPageViews(tmp_path, kinesalite, monkeypatch, "aws.yaml", moto)
    yield j
    j.stop_all()


def _started(text: str) -> list[str]:
    return [line.split("started task ")[1].split()[0] for line in text.splitlines() if "started task " in line]


def test_a_split_and_a_merge_under_a_running_windowed_job_move_no_task_and_lose_no_window(job, measure) -> None:
    events = list(generate.events(9000, seed=23))
    job.client.put_record(StreamName=job.input, Data=b"{not json", PartitionKey="bad")
    job.write(events[:3000])
    proc = job.start("p0")
    job.wait_consumed("the first third (2 shards)")

    began = time.monotonic()
    job.split_all()  # 2 → 4 shards, none on a slice boundary
    assert len(job.open_shards()) == 4
    job.write(events[3000:6000])
    job.wait_consumed("the second third (4 shards)")
    job.merge_lowest()  # 4 → 3
    assert len(job.open_shards()) == 3
    job.write(events[6000:])
    job.wait_consumed("the last third (3 shards)")
    resharded = time.monotonic() - began

    done = drain_job.drain_command(job.config_path, job.overrides, "--wait", "--timeout", "180")
    assert done.returncode == 0, done.stdout + done.stderr + proc.log_text()[-4000:]
    assert proc.popen.wait(60) == 0, proc.log_text()[-4000:]

    log = proc.log_text()
    started = _started(log)
    stages = ("page_views", "views_by_page")
    assert sorted(started) == sorted(f"{s}-v{k}" for s in stages for k in range(VIRTUAL_TASKS)), (
        "every virtual task started exactly once: no reshard moved or restarted one"
    )
    assert "behind the checkpoint store" not in log and "starting a new one" not in log
    # the job has exited: read until nothing more comes (reading to `upcoming` probes every shard)
    got, twice = drain_job.window_counts_once(job.config, to_upcoming=False)
    assert not twice, f"{len(twice)} windows written more than once"
    assert got == results.expected_counts(events), "window counts differ from pandas"
    shards = job.client.list_shards(StreamName=job.input)["Shards"]
    assert len(shards) == 7  # 2 parents, 4 children, 1 merged
    letters = drain_job.dead_letters(job.config, to_upcoming=False)
    assert len(letters) == 1 and "not valid JSON" in letters[0]["error"], letters
    assert letters[0]["ssp"] == f"kin.{job.input}.{slice_of(key_hash('bad'), VIRTUAL_TASKS)}"
    assert letters[0]["offset"].startswith("shardId-"), "a dead letter names its shard and sequence number"
    measure(
        f"[kinesis] split 2→4 and merge 4→3 under a running job: {len(got)} windows equal pandas, "
        f"{len(started)} tasks each started once; resharding phases took {resharded:.1f} s"
    )


def test_md5_routing_equals_kinesis_s_own_shard_choice_for_10000_keys(kinesalite: Any) -> None:
    """The hash of a partition key (`key_hash`) falls in the hash range of the shard Kinesis put it in, on a
    stream with uneven shards (one split at a third)."""
    import boto3

    client = boto3.client("kinesis", endpoint_url=kinesalite.endpoint)
    stream = f"routing-{uuid.uuid4().hex[:8]}"
    client.create_stream(StreamName=stream, ShardCount=3)
    client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.2})
    first = client.list_shards(StreamName=stream)["Shards"][0]
    high = int(first["HashKeyRange"]["EndingHashKey"])
    client.split_shard(StreamName=stream, ShardToSplit=first["ShardId"], NewStartingHashKey=str(high // 3))
    client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.2})
    ranges = {
        s["ShardId"]: (int(s["HashKeyRange"]["StartingHashKey"]), int(s["HashKeyRange"]["EndingHashKey"]))
        for s in client.list_shards(StreamName=stream)["Shards"]
        if "EndingSequenceNumber" not in s.get("SequenceNumberRange", {})
    }
    keys = [f"user-{i}-{os.urandom(3).hex()}" for i in range(10_000)]
    mismatched = []
    for i in range(0, len(keys), 500):
        chunk = keys[i : i + 500]
        entries = [{"Data": b"x", "PartitionKey": k} for k in chunk]
        response = client.put_records(StreamName=stream, Records=entries)
        for key, entry in zip(chunk, response["Records"], strict=True):
            low, high = ranges[entry["ShardId"]]
            if not low <= key_hash(key) <= high:
                mismatched.append(key)
    assert len(ranges) == 4
    assert mismatched == []


def test_a_processor_sigkilled_during_a_split_loses_no_window_on_aws_alone(aws_job, tmp_path, measure) -> None:
    """Two processors of aws.yaml share the virtual tasks, coordinated through DynamoDB counter leases and
    checkpointing in DynamoDB; one is SIGKILLed right after the split, while the children begin to fill, at
    the worst moment for exactly-once: a first-stage batch's rows are in the intermediate stream (on Kinesis)
    and its checkpoint is not written. The survivor breaks its leases once its heartbeat stood still for the
    liveness timeout on the survivor's own clock, takes its tasks (from their checkpointed positions, parents
    read to their end first, window state restored from S3) and replays that batch; the counting stage drops
    the replayed rows by their shard ordinals (docs/guarantees.md) and every window still equals pandas."""
    job = aws_job
    events = list(generate.events(6000, seed=29))
    job.write(events[:2000])
    arms = {name: tmp_path / f"arm-{name}" for name in ("p0", "p1")}
    procs = [
        job.start(name, {FAULT_POINT: "before-checkpoint-of-rows:page_views-:1", ARMED_BY: str(arm)})
        for name, arm in arms.items()
    ]
    wait_until(lambda: all(_started(p.log_text()) for p in procs), FINISH_S, "both processors to run tasks", 0.2)
    job.wait_consumed("the first third")

    readers = [p for p in procs if any(t.startswith("page_views-") for t in _started(p.log_text()))]
    victim = readers[0]  # a processor reading the resharded input
    job.split_all()
    job.write(events[2000:2600])
    arms[victim.processor_id].touch()  # SIGKILL before its next first-stage checkpoint of rows
    wait_until(lambda: not victim.alive(), FINISH_S, "the victim to reach its armed fault point", 0.1)
    assert victim.popen.wait(5) == -9
    killed_at = time.monotonic()
    job.write(events[2600:4000])
    job.wait_consumed("the second third, on the survivor")
    recovered = time.monotonic() - killed_at
    job.merge_lowest()
    job.write(events[4000:])
    job.wait_consumed("the rest")

    survivor = next(p for p in procs if p is not victim)
    done = drain_job.drain_command(job.config_path, job.overrides, "--wait", "--timeout", "180")
    assert done.returncode == 0, done.stdout + done.stderr + survivor.log_text()[-4000:]
    assert survivor.popen.wait(60) == 0, survivor.log_text()[-4000:]
    got = results.read_counts(job.config)
    assert got == results.expected_counts(events), "window counts differ from pandas"
    moved = set(_started(victim.log_text())) & set(_started(survivor.log_text()))
    assert any(t.startswith("page_views-") for t in moved), "the survivor took the killed processor's readers"
    dropped = replayed_rows_dropped(survivor.log_text())
    assert dropped > 0, "no replayed row was dropped: the fault did not land between a write and its checkpoint"
    measure(
        f"[kinesis + aws] SIGKILL during a split, before a first-stage checkpoint: {len(moved)} tasks moved, "
        f"all consumed {recovered:.1f} s after the kill, {dropped} replayed rows dropped, {len(got)} windows "
        "equal pandas"
    )


def test_throttled_calls_and_failed_entries_are_retried_without_loss_duplicates_or_reordering_per_key(
    kinesalite: Any, tmp_path: Path
) -> None:
    """The producer through a proxy refusing every 4th `PutRecords` whole and failing ~20% of the entries of
    the others (tests/support/kinesis_faults.py): every record is written once, each key's records in the order
    sent."""
    import boto3

    from tests.support.kinesis_faults import KinesisFaults
    from weirflow.base.errors import LockLostError, RecordTooLargeError
    from weirflow.config.loader import Config
    from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
    from weirflow_kinesis.factory import KinesisSystemFactory

    keys = 200  # 800 records, 4 of each key
    faults = KinesisFaults(kinesalite.endpoint).start()
    stream = f"retried-{uuid.uuid4().hex[:8]}"
    config = Config.from_dict(
        {
            "job.name": "faults",
            "job.state.dir": str(tmp_path),
            "systems.kin.factory": "kinesis",
            "systems.kin.endpoint": faults.endpoint,
            "systems.kin.region": "us-east-1",
            "systems.kin.shards": 2,
            "systems.kin.send.attempts": 20,
        }
    )
    factory = KinesisSystemFactory()
    admin, producer = factory.get_admin("kin", config), factory.get_producer("kin", config)
    try:
        admin.create_stream(StreamSpec(stream, 8))
        # Two sends, each with two records of every key: the producer sends each in two rounds (a key's second
        # record only once its first is written), one `PutRecords` call a round, retried until every entry is
        # written. The retries' back-off (0.1 s, doubling) is most of this test's time, and it is spent per
        # call: more records per key would add rounds of the same check.
        sent = [
            OutgoingRecord(stream, f"{i % keys}:{i}".encode(), key=f"key-{i % keys}".encode()) for i in range(800)
        ]
        for i in range(0, len(sent), 400):
            producer.send(sent[i : i + 400])

        # The sink's fence runs before every call, retries included: a lock lost while a call waits to be
        # retried stops the send before its next call.
        fenced = f"{stream}-fenced"
        admin.create_stream(StreamSpec(fenced, 1))
        checks = 0

        def fence() -> None:
            nonlocal checks
            checks += 1
            if checks == 3:
                raise LockLostError("task-x", "p1")

        calls = faults.calls
        with pytest.raises(LockLostError):
            producer.send_fenced([OutgoingRecord(fenced, b"r", key=f"k{i}".encode()) for i in range(400)], fence)
        assert (checks, faults.calls - calls) == (3, 2), "a check before each call, none after"
    finally:
        producer.close()
        admin.close()
        faults.stop()
    assert faults.throttled > 0 and faults.failed_entries > 50, (faults.throttled, faults.failed_entries)

    direct = Config.from_dict({"job.name": "faults", "job.state.dir": str(tmp_path), **kinesalite.config("kin")})
    admin, producer = factory.get_admin("kin", direct), factory.get_producer("kin", direct)
    consumer = factory.get_consumer("kin", direct)
    try:
        with pytest.raises(RecordTooLargeError, match="exceeds Kinesis's 1048576 byte limit"):
            producer.send([OutgoingRecord(stream, b"x" * (1024 * 1024)), OutgoingRecord(stream, b"fits")])
        ssp = SystemStreamPartition("kin", stream, 3)
        oldest = admin.partition_metadata_of(stream, [3])[3].oldest
        columns = consumer.read_columns(ssp, oldest, 10, attributes=True)
        assert len(columns) == 10 and all(a["shard_id"].startswith("shardId-") for a in columns.attributes)
        assert [a["partition_key"].encode() for a in columns.attributes] == list(columns.keys)
        assert all(slice_of(key_hash(a["partition_key"]), 8) == 3 for a in columns.attributes)
        assert all(a["approximate_arrival_time"].tzinfo is not None for a in columns.attributes)
        assert positions.compare(columns.next_offset, positions.EARLIEST) == 1
    finally:
        for client in (admin, producer, consumer):
            client.close()

    client = boto3.client("kinesis", endpoint_url=kinesalite.endpoint)
    read: dict[str, list[int]] = {}
    for shard in client.list_shards(StreamName=stream)["Shards"]:
        iterator = client.get_shard_iterator(
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        while iterator:
            response = client.get_records(ShardIterator=iterator, Limit=10_000)
            for record in response["Records"]:
                key, n = record["Data"].decode().split(":")
                read.setdefault(key, []).append(int(n))
            if not response["Records"]:
                break
            iterator = response.get("NextShardIterator")
    assert sum(len(v) for v in read.values()) == len(sent), "every record once"
    assert read == {str(k): list(range(k, 800, keys)) for k in range(keys)}, "each key's records in the order sent"


def test_a_planned_read_is_at_the_end_only_once_every_record_the_shards_hold_is_planned(
    kinesalite: Any, tmp_path: Path
) -> None:
    """What a bounded input relies on (`ReadPlan.at_end` ends it): planning never reads Kinesis itself (the
    prefetcher does), so a plan must not claim the end while the spool is still behind the shard."""
    import boto3

    from weirflow.config.loader import Config
    from weirflow_kinesis.factory import KinesisSystemFactory

    client = boto3.client("kinesis", endpoint_url=kinesalite.endpoint)
    stream = f"bounded-{uuid.uuid4().hex[:8]}"
    client.create_stream(StreamName=stream, ShardCount=1)
    client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.2})
    records = 20_500  # two full `GetRecords` pages (10,000 records) and part of a third
    for start in range(0, records, 500):
        client.put_records(
            StreamName=stream,
            Records=[{"Data": b"%d" % i, "PartitionKey": f"k{i}"} for i in range(start, start + 500)],
        )
    config = Config.from_dict(
        {
            "job.name": "bounded",
            "job.state.dir": str(tmp_path),
            **kinesalite.config("kin"),
            "systems.kin.virtual.tasks": 1,
        }
    )
    admin = KinesisSystemFactory().get_admin("kin", config)
    try:
        position, planned, plans = positions.EARLIEST, 0, 0

        def planned_to_the_end() -> bool:
            nonlocal position, planned, plans
            plan = admin.plan_read(stream, 0, position, 50_000)
            plans += 1
            planned += plan.records
            position = plan.end
            return plan.at_end

        wait_until(planned_to_the_end, 120, "a plan claiming the end", interval_s=0.05)
        assert planned == records, f"the end claimed after {planned} records"
        assert plans > 1, "the first plan, before anything was read ahead, is not the end"
    finally:
        admin.close()


def test_records_dropped_by_retention_before_a_task_read_them_are_reported_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A task resumes after a record that the stream's 24 h retention has since dropped, with the records after
    it: Kinesis would silently start at the oldest record left; weirflow reads on from there too, and reports
    the range as lost (kinesalite's clock moved 25 h on with libfaketime). So does a task replayed from a start
    pinned before its first read (`SystemAdmin.pin_starts`) whose pinned record is gone: its first attempt's
    records were numbered from there (docs/guarantees.md, "Kinesis retention")."""
    from tests.support.faketime import libfaketime
    from tests.support.kinesalite import Kinesalite, use_dummy_credentials
    from weirflow.config.loader import Config
    from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
    from weirflow_kinesis.factory import KinesisSystemFactory

    if libfaketime() is None:
        pytest.skip("libfaketime is not installed (make test installs Debian's faketime)")
    use_dummy_credentials()
    clock = tmp_path / "clock"
    clock.write_text("+0\n")
    server = Kinesalite(clock_file=clock).start()
    factory = KinesisSystemFactory()

    def clients(state: str) -> tuple[Any, Any, Any]:
        config = Config.from_dict(
            {
                "job.name": "retention",
                "job.state.dir": str(tmp_path / state),
                **server.config("kin"),
                "systems.kin.virtual.tasks": 1,
            }
        )
        return (
            factory.get_admin("kin", config),
            factory.get_consumer("kin", config),
            factory.get_producer("kin", config),
        )

    admin, consumer, producer = clients("first")
    moved_admin, moved_consumer, _ = clients("moved")  # the processor the task moves to
    try:
        admin.create_stream(StreamSpec("aging", 1, {"shards": "1"}))
        producer.send([OutgoingRecord("aging", b"old%d" % i, key=b"k%d" % i) for i in range(100)])
        ssp = SystemStreamPartition("kin", "aging", 0)
        pinned = admin.pin_starts("aging", {0: positions.EARLIEST})[0]
        oldest = next(iter(positions.decode(pinned).values()))
        assert positions.is_pinned(oldest) and positions.compare(pinned, positions.EARLIEST) == 0
        first = consumer.read(ssp, pinned, 40)
        assert [r.value for r in first] == [b"old%d" % i for i in range(40)]
        assert oldest == positions.pinned(first[0].attributes["sequence_number"])
        clock.write_text("+25h\n")  # the 60 records not yet read are now past the retention
        producer.send([OutgoingRecord("aging", b"new%d" % i, key=b"k%d" % i) for i in range(10)])
        with caplog.at_level("WARNING"):
            rest = moved_consumer.read(ssp, first[-1].next_offset, 1000)
        assert [r.value for r in rest] == [b"new%d" % i for i in range(10)]
        lost = moved_admin.lost_ranges("aging")
        assert len(lost) == 1 and lost[0][1] == first[-1].attributes["sequence_number"], lost
        assert "dropped by the stream's retention" in caplog.text and "1 lost range" in caplog.text
        caplog.clear()
        with caplog.at_level("WARNING"):
            replayed = moved_consumer.read_columns(ssp, pinned, 1000)
        assert replayed.values == [b"new%d" % i for i in range(10)]
        lost = moved_admin.lost_ranges("aging")
        assert len(lost) == 2 and lost[1][1] == oldest, lost
        assert f"from sequence number {oldest[1:]}" in caplog.text and "2 lost range" in caplog.text
    finally:
        for client in (admin, consumer, producer, moved_admin, moved_consumer):
            client.close()
        server.stop()


def test_a_read_past_a_split_prunes_the_parent_and_never_reads_it_again(kinesalite: Any, tmp_path: Path) -> None:
    """A virtual task reads a shard to its end, then both its children: the position it ends at no longer names
    the parent (`ShardMap.prune`: a child has started), a read from there reads only what came after, and
    the admin says the parent's lane is no longer read (`lanes_live`), which is what lets a consumer forget
    its mark (docs/guarantees.md, "Checkpoints stay bounded")."""
    import boto3

    from tests.support.kinesalite import use_dummy_credentials
    from weirflow.config.loader import Config
    from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
    from weirflow_kinesis.factory import KinesisSystemFactory

    use_dummy_credentials()
    config = Config.from_dict(
        {
            "job.name": "pruning",
            "job.state.dir": str(tmp_path),
            **kinesalite.config("kin"),
            "systems.kin.virtual.tasks": 1,
        }
    )
    factory = KinesisSystemFactory()
    admin, consumer, producer = (
        factory.get_admin("kin", config),
        factory.get_consumer("kin", config),
        factory.get_producer("kin", config),
    )
    stream = f"pruning-{uuid.uuid4().hex[:8]}"
    client = boto3.client("kinesis", endpoint_url=kinesalite.endpoint)
    try:
        admin.create_stream(StreamSpec(stream, 1, {"shards": "1"}))
        producer.send([OutgoingRecord(stream, b"before%d" % i, key=b"k%d" % i) for i in range(20)])
        parent = client.list_shards(StreamName=stream)["Shards"][0]
        middle = int(parent["HashKeyRange"]["EndingHashKey"]) // 2
        client.split_shard(StreamName=stream, ShardToSplit=parent["ShardId"], NewStartingHashKey=str(middle))
        client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.2})
        producer.send([OutgoingRecord(stream, b"after%d" % i, key=b"k%d" % i) for i in range(20)])
        ssp = SystemStreamPartition("kin", stream, 0)
        children = [s["ShardId"] for s in client.list_shards(StreamName=stream)["Shards"]][1:]
        lanes = {positions.lane(s) for s in [parent["ShardId"], *children]}
        assert admin.lanes_live(stream, 0, positions.EARLIEST) == lanes

        read = consumer.read_columns(ssp, positions.EARLIEST, 1000)
        assert sorted(read.values) == sorted(
            [b"before%d" % i for i in range(20)] + [b"after%d" % i for i in range(20)]
        )
        end = positions.decode(read.next_offset)
        assert parent["ShardId"] not in end and end[positions.PRUNED] == "1", end
        assert set(positions.shard_states(end)) == set(children)
        assert admin.lanes_live(stream, 0, read.next_offset) == lanes - {positions.lane(parent["ShardId"])}
        producer.send([OutgoingRecord(stream, b"later", key=b"k1")])
        later = consumer.read_columns(ssp, read.next_offset, 1000)
        assert later.values == [b"later"], "the pruned parent is not read again"
        unpruned = positions.encode({**positions.shard_states(end), parent["ShardId"]: positions.ENDED})
        assert admin.compare_offsets(read.next_offset, unpruned) == 0
        assert admin.compare_offsets(later.next_offset, read.next_offset) == 1
    finally:
        for part in (admin, consumer, producer):
            part.close()
