"""Trimming intermediate streams (weirflow/runtime/trim_points.py, weirflow/coordination/trimming.py): the leader
deletes only what no consuming task, mark, rebuild or producer's tails may read again, and a property test over
random checkpoints, kills and trims on the real embedded log shows every row taken exactly once, with no read
ever refused."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from weirflow.base.errors import RecordsDeletedError
from weirflow.coordination.trimming import Trimmer
from weirflow.interfaces.checkpoint import Checkpoint
from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.job.model import JobModel, TaskModel
from weirflow.local.checkpoint import SqliteCheckpointManager
from weirflow.local.streams import LocalSystemAdmin, LocalSystemConsumer, LocalSystemProducer, SqliteStreamStore
from weirflow.runtime.trim_points import TrimScope, trim_points

MID = "job-1-mid"
P0, P1 = (SystemStreamPartition("local", MID, p) for p in (0, 1))


def _dense(ssp: SystemStreamPartition, a: str, b: str) -> int:
    return (int(a) > int(b)) - (int(a) < int(b))


def _task(name: str, stage: str, *ssps: SystemStreamPartition) -> TaskModel:
    return TaskModel(name, stage, tuple(ssps))


def _cp(offsets: dict[SystemStreamPartition, str], **control: Any) -> Checkpoint:
    return Checkpoint(offsets=offsets, control=control)


def _points(tasks, checkpoints, rebuilds=lambda stage: False):
    return trim_points({t.name: t for t in tasks}, checkpoints, [P0, P1], rebuilds=rebuilds, compare=_dense)


def test_a_partition_is_held_at_the_lowest_offset_anything_may_still_read() -> None:
    tasks = [_task("count-0", "count", P0), _task("count-1", "count", P1), _task("views-0", "views")]
    checkpoints = {
        "count-0": _cp({P0: "900"}, marks={P0.key(): {"at": "850", "marks": {}}}, rebuild={P0.key(): [[700, 5]]}),
        "count-1": _cp({P1: "400"}, marks={P1.key(): {"at": "400"}}),
        "views-0": _cp({}, tails={P1.key(): "380"}),  # a stateful producer's tails on P1
    }
    points = _points(tasks, checkpoints, rebuilds=lambda stage: stage == "count")
    assert (points[P0].offset, points[P0].held_by) == ("700", "task count-0's rebuild marks")
    assert (points[P1].offset, points[P1].held_by) == ("380", "task views-0's tails")


def test_nothing_is_trimmed_while_a_reader_has_no_checkpoint_of_the_partition() -> None:
    tasks = [_task("count-0", "count", P0), _task("again-0", "again", P0), _task("count-1", "count", P1)]
    points = _points(tasks, {"count-0": _cp({P0: "900"}), "count-1": _cp({})})
    assert points[P0].offset is None and "again-0 has no checkpoint" in points[P0].held_by
    assert points[P1].offset is None and "count-1 has no checkpoint" in points[P1].held_by


def test_a_task_that_would_rebuild_from_the_oldest_record_keeps_everything() -> None:
    """A task of a shared aggregation stage with windows closed and no rebuild mark (its checkpoint was written by
    a query of its own) rebuilds from the partition's oldest record; another stage's task with the same
    checkpoint restores its Spark state instead, so its offset is the bound."""
    tasks = [_task("count-0", "count", P0)]
    checkpoint = {"count-0": _cp({P0: "900"}, closed=60_000)}
    assert _points(tasks, checkpoint, rebuilds=lambda stage: True)[P0].offset is None
    assert _points(tasks, checkpoint, rebuilds=lambda stage: False)[P0].offset == "900"


def test_a_partition_no_task_reads_is_kept() -> None:
    assert _points([], {})[P0].offset is None


def test_the_leader_trims_the_embedded_log_and_a_read_below_says_so(tmp_path: Path) -> None:
    store = SqliteStreamStore(tmp_path / "streams.db")
    admin, consumer, producer = LocalSystemAdmin(store), LocalSystemConsumer(store), LocalSystemProducer(store)
    admin.create_stream(StreamSpec(MID, 2))
    producer.send([OutgoingRecord(MID, b"x", partition=p) for p in (0, 1) for _ in range(100)])
    checkpoints = SqliteCheckpointManager(tmp_path / "checkpoints.db")
    checkpoints.start()
    checkpoints.write_checkpoint("count-0", _cp({P0: "60"}, marks={P0.key(): {"at": "40"}}))
    checkpoints.write_checkpoint("count-1", _cp({P1: "100"}))
    model = JobModel(1, {t.name: t for t in [_task("count-0", "count", P0), _task("count-1", "count", P1)]})

    class Systems:
        def admin(self, system: str) -> LocalSystemAdmin:
            return admin

    now = [0.0]
    trimmer = Trimmer(
        checkpoints,
        Systems(),
        TrimScope(frozenset({("local", MID)}), lambda s: False),
        30_000,
        clock=lambda: now[0],
    )
    assert trimmer.check(model) == 40 + 100
    assert admin.partition_metadata(MID)[0].oldest == "40" and admin.partition_metadata(MID)[1].oldest == "100"
    checkpoints.write_checkpoint("count-0", _cp({P0: "90"}, marks={P0.key(): {"at": "90"}}))
    assert trimmer.check(model) == 0, "not due before the interval"
    now[0] = 30.0
    assert trimmer.check(model) == 50
    try:
        consumer.read(P0, "80", 10)
    except RecordsDeletedError as exc:
        assert "first offset held is 90" in str(exc)
    else:
        raise AssertionError("a read below the first offset held was not refused")
    producer.send([OutgoingRecord(MID, b"y", partition=1)])
    assert [r.offset for r in consumer.read(P1, "100", 10)] == ["100"], "offsets go on after a full trim"
    assert Trimmer(checkpoints, Systems(), None, 30_000).check(model) == 0, "a job with nothing to trim"


# --- the property: random sends, reads, checkpoints, kills and trims -----------------------------------------


@dataclass
class Reader:
    """A consuming task of one partition: takes rows by position past its mark (the marks of
    weirflow/spark/replay.py, simplified to one producer), keeps a running sum of the last ``window`` positions it
    took (an open window, rebuilt on restart from its rebuild mark), and commits what it took with its checkpoint
    (a killed reader's uncommitted rows are taken again by its next attempt)."""

    name: str
    ssp: SystemStreamPartition
    window: int
    offset: int = 0
    mark: int = -1
    taken: list[int] = field(default_factory=list)
    committed: list[int] = field(default_factory=list)
    checkpoint: tuple[int, int, int] = (0, -1, 0)  # offset, mark, rebuild offset

    def read(self, consumer: LocalSystemConsumer, n: int) -> None:
        for record in consumer.read(self.ssp, str(self.offset), n):
            position = int(record.value)
            if position > self.mark:
                self.taken.append(position)
                self.mark = position
            self.offset = int(record.next_offset)

    def commit(self, checkpoints: SqliteCheckpointManager) -> None:
        self.committed += self.taken
        self.taken = []
        rebuild = self.checkpoint[2]
        if len(self.committed) > self.window:  # the rebuild mark: where the last ``window`` rows begin
            rebuild = self._offset_of[self.committed[-self.window]]
        self.checkpoint = (self.offset, self.mark, rebuild)
        control = {
            "marks": {self.ssp.key(): {"at": str(self.offset)}},
            "rebuild": {self.ssp.key(): [[rebuild, 0]]},
        }
        checkpoints.write_checkpoint(self.name, Checkpoint({self.ssp: str(self.offset)}, control))

    def kill_and_restart(self, consumer: LocalSystemConsumer) -> None:
        self.offset, self.mark, rebuild = self.checkpoint
        self.taken = []
        # the open window is rebuilt from the rebuild mark: every row from there to the checkpoint must be held
        rows = consumer.read(self.ssp, str(rebuild), self.offset - rebuild) if self.offset > rebuild else []
        assert len(rows) == self.offset - rebuild

    _offset_of: dict[int, int] = field(default_factory=dict)


def _trim(admin: LocalSystemAdmin, model: dict[str, TaskModel], checkpoints: SqliteCheckpointManager) -> None:
    points = trim_points(model, checkpoints.read_all(), [P0, P1], rebuilds=lambda stage: True, compare=_dense)
    for ssp, point in points.items():
        if point.offset is not None:
            admin.trim(ssp.stream, ssp.partition, point.offset)


@settings(max_examples=80, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["send", "replay", "read", "commit", "kill", "trim"]),
            st.integers(0, 1),
            st.integers(1, 9),
        ),
        min_size=5,
        max_size=80,
    )
)
def test_trims_between_random_checkpoints_and_kills_lose_no_row_and_take_none_twice(steps) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStreamStore(Path(tmp) / "streams.db")
        admin, consumer, producer = LocalSystemAdmin(store), LocalSystemConsumer(store), LocalSystemProducer(store)
        admin.create_stream(StreamSpec(MID, 2))
        checkpoints = SqliteCheckpointManager(Path(tmp) / "checkpoints.db")
        checkpoints.start()
        readers = [Reader("count-0", P0, window=5), Reader("count-1", P1, window=3)]
        model = {r.name: _task(r.name, "count", r.ssp) for r in readers}
        sent = [0, 0]  # positions sent per partition
        for action, p, n in steps:
            reader = readers[p]
            if action == "send":
                for _ in range(n):
                    offset = int(admin.partition_metadata(MID)[p].upcoming)
                    reader._offset_of[sent[p]] = offset
                    producer.send([OutgoingRecord(MID, str(sent[p]).encode(), partition=p)])
                    sent[p] += 1
            elif action == "replay":  # a killed producer writes its last rows again: same positions
                again = list(range(max(0, sent[p] - n), sent[p]))
                producer.send([OutgoingRecord(MID, str(i).encode(), partition=p) for i in again])
            elif action == "read":
                reader.read(consumer, n)
            elif action == "commit":
                reader.commit(checkpoints)
            elif action == "kill":
                reader.kill_and_restart(consumer)
            else:
                points = trim_points(
                    model, checkpoints.read_all(), [P0, P1], rebuilds=lambda s: True, compare=_dense
                )
                for ssp, point in points.items():
                    if point.offset is not None:
                        admin.trim(ssp.stream, ssp.partition, point.offset)
        for reader in readers:  # the last attempt reads to the end
            reader.kill_and_restart(consumer)
            reader.read(consumer, 10_000)
            reader.commit(checkpoints)
            assert reader.committed == list(range(sent[reader.ssp.partition])), reader.name
        store.close()
        checkpoints.stop()


# --- the embedded log's retention ------------------------------------------------------------------------------


def test_the_embedded_log_deletes_records_past_their_stream_s_retention_in_time_and_in_bytes(
    tmp_path: Path, monkeypatch
) -> None:
    from weirflow.base import clock
    from weirflow.config import Config
    from weirflow.local.factories import LocalSystemFactory

    config = Config.from_dict(
        {
            "job.name": "kept",
            "job.state.dir": str(tmp_path),
            "streams.views.retention": "5m",
            "streams.clicks.physical.name": "clicks-v2",
            "streams.clicks.retention.bytes": 100,
            "streams.other.partitions": 1,
        }
    )
    admin = LocalSystemFactory().get_admin("local", config)
    producer = LocalSystemFactory().get_producer("local", config)
    assert str(admin.retention("views")) == "drops records after 5 minutes (streams.views.retention)"
    assert admin.retention("clicks-v2") is not None and admin.retention("clicks-v2").ms is None
    assert admin.retention("other") is None, "a stream without a retention keeps every record"
    for stream in ("views", "clicks-v2", "other"):
        admin.create_stream(StreamSpec(stream, 2))
    now = [1_800_000_000_000]
    monkeypatch.setattr(clock, "now_ms", lambda: now[0])
    for _minute in range(10):  # a record a minute in partition 0 of each stream
        producer.send(
            [OutgoingRecord(s, b"0123456789", key=b"k", partition=0) for s in ("views", "clicks-v2", "other")]
        )
        now[0] += 60_000
    deleted = admin.apply_retention()
    # views: appended at minutes 0..9, now is minute 10: older than 5 minutes are minutes 0..4
    # clicks-v2: 11 bytes a record, 100 bytes per partition keep the newest 9
    assert deleted == {"views": 5, "clicks-v2": 1}
    meta = {s: admin.partition_metadata(s)[0] for s in ("views", "clicks-v2", "other")}
    assert (meta["views"].oldest, meta["clicks-v2"].oldest, meta["other"].oldest) == ("5", "1", "0")
    assert admin.partition_metadata("views")[1].oldest == "0", "an empty partition keeps its start"
    assert admin.apply_retention() == {}, "nothing more until time passes"
    now[0] += 60_000
    assert admin.apply_retention() == {"views": 1}


# --- output ids ------------------------------------------------------------------------------------------------


def test_the_ids_no_replay_sends_again_are_forgotten_and_the_others_kept(tmp_path: Path) -> None:
    from weirflow.coordination import id_pruning
    from weirflow.results.ids import dead_letter_id, result_id, row_id
    from weirflow.spark import replay

    assert (id_pruning.CODE_BITS, id_pruning.ROW_BITS, id_pruning.LANE_SHIFT) == (
        replay.CODE_BITS,
        replay.ROW_BITS,
        replay.LANE_SHIFT,
    ), "the id layout is weirflow.spark.replay's"
    views = SystemStreamPartition("local", "page-views", 3)
    code = replay.input_codes([("local", "page-views")])[("local", "page-views")]
    model = JobModel(1, {"views-3": _task("views-3", "views", views), "counts-0": _task("counts-0", "counts", P0)})
    keep = id_pruning.ids_to_keep(
        model, {"views-3": _cp({views: "100"})}, {"views": {code: ("local", "page-views")}}
    )
    row = replay.pss(code, 3)
    assert not keep(row_id("views", row, 99 << 12 | 7, 0)), "input record 99: before the checkpoint's 100"
    assert keep(row_id("views", row, 100 << 12, 0)), "input record 100: a replay sends it again"
    assert keep(row_id("views", replay.pss(code, 2), 5 << 12, 0)), "a partition no task has checkpointed"
    assert keep(row_id("other", row, 5 << 12, 0)), "a stage of another job"
    assert keep(row_id("views", (1 << 32) | row, 5 << 12, 0)), "a lane of a system of positions"
    assert not keep(dead_letter_id(views.key(), "42")) and keep(dead_letter_id(views.key(), "100"))
    assert not keep(result_id("counts-0", "5f0c1e2a9b3d4c6e.1a.3.0.2f", "9c0e4d1b22aa0f3e")), "never sent twice"
    assert keep(result_id("elsewhere-0", "5f0c1e2a9b3d4c6e.1a.3.0.2f", "9c0e4d1b22aa0f3e")), "not this job's"
    assert keep("no known shape")

    store = SqliteStreamStore(tmp_path / "streams.db")
    admin, producer = LocalSystemAdmin(store), LocalSystemProducer(store)
    admin.create_stream(StreamSpec("out", 1))
    sent = [row_id("views", row, i << 12, 0) for i in range(98, 102)]
    producer.send([OutgoingRecord("out", b"v", partition=0, id=i) for i in sent])
    assert admin.forget_ids("out", keep) == 2
    producer.send([OutgoingRecord("out", b"v", partition=0, id=i) for i in sent])  # a replay of all four
    consumer = LocalSystemConsumer(store)
    held = [r.id for r in consumer.read(SystemStreamPartition("local", "out", 0), "0", 100)]
    assert held == sent + sent[:2], "the forgotten ids are written again, the kept ones still dropped"


# --- compacted changelogs ----------------------------------------------------------------------------------------


def test_a_compacted_changelog_keeps_the_latest_record_per_key_and_rebuilds_the_same_table(tmp_path: Path) -> None:
    store = SqliteStreamStore(tmp_path / "streams.db")
    admin, producer, consumer = LocalSystemAdmin(store), LocalSystemProducer(store), LocalSystemConsumer(store)
    admin.create_stream(StreamSpec("table", 2))
    updates = [(p, f"user-{i % 7}", f"v{i}") for i in range(200) for p in (0, 1)]
    producer.send([OutgoingRecord("table", v.encode(), key=k.encode(), partition=p) for p, k, v in updates])
    producer.send([OutgoingRecord("table", b"no key", partition=0)])

    def rebuilt(partition: int) -> tuple[dict[bytes | None, bytes], list[str]]:
        ssp = SystemStreamPartition("local", "table", partition)
        table, offsets = {}, []
        for record in consumer.read(ssp, admin.partition_metadata("table")[partition].oldest, 10_000):
            table[record.key] = record.value
            offsets.append(record.offset)
        return table, offsets

    before = [rebuilt(p) for p in (0, 1)]
    assert admin.compact("table") == 2 * (200 - 7)
    after = [rebuilt(p) for p in (0, 1)]
    assert [t for t, _ in after] == [t for t, _ in before], "the same table, latest row per key"
    assert len(after[1][1]) == 7 and len(after[0][1]) == 8, "one record per key, and the keyless one"
    assert set(after[0][1]) <= set(before[0][1]), "offsets stay as they were"
    producer.send([OutgoingRecord("table", b"newest", key=b"user-3", partition=1)])
    assert admin.partition_metadata("table")[1].upcoming == "201", "appends go on from the last offset"
    assert admin.compact("table") == 1
