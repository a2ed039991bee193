"""The ``delta`` system on a local directory: its `TableWriter` (marks as the table's application transactions,
conflicts refused atomically, reading back what later commits added) and the admin, consumer and producer that
``weirflow streams`` uses. Real deltalake and a real file system throughout; docs/delta.md."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder, write_deltalake
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import CommitProperties, Transaction

from weirflow.base.errors import (
    InvalidArgumentError,
    LockLostError,
    StreamExistsError,
    StreamNotFoundError,
)
from weirflow.config.loader import Config
from weirflow.interfaces.plugins import system_factory
from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.interfaces.table import TableConflictError
from weirflow.results import ReplayFilter
from weirflow.results.ids import row_id
from weirflow_delta.clients import DeltaSystemAdmin, DeltaSystemConsumer, DeltaSystemProducer
from weirflow_delta.errors import DeltaSchemaError, DeltaTableError
from weirflow_delta.factory import DeltaSystemFactory
from weirflow_delta.log import COMMIT_TOKEN_FIELD
from weirflow_delta.writer import DeltaTableWriter, _Commit


def job_config(lake: Path, **extra: Any) -> Config:
    return Config.from_dict(
        {
            "job.name": "lakejob",
            "systems.lake.factory": "delta",
            "systems.lake.path": str(lake),
            "streams.views.system": "lake",
            "streams.counts.system": "lake",
            **extra,
        },
        base_dir=lake.parent,
    )


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return job_config(tmp_path / "lake")


def writer_of(config: Config) -> DeltaTableWriter:
    writer = DeltaSystemFactory().get_table_writer("lake", config)
    assert isinstance(writer, DeltaTableWriter)
    return writer


@pytest.fixture
def writer(config: Config) -> DeltaTableWriter:
    return writer_of(config)


def views(*pages: str, first: int = 0) -> pa.Table:
    return pa.table(
        {
            "page": list(pages),
            "views": pa.array(range(first, first + len(pages)), pa.int64()),
            "weirflow_id": [f"id-{first + i}" for i in range(len(pages))],
        }
    )


def read_back(writer: DeltaTableWriter, table: str) -> list[dict[str, Any]]:
    """Every row of the table through deltalake's own query engine (its file listing in Python,
    `DeltaTable.to_pyarrow_table`, leaves the interpreter aborting at exit in deltalake 1.6)."""
    loaded = DeltaTable(writer.tables.uri(table))
    rows = pa.table(QueryBuilder().register("t", loaded).execute("select * from t").read_all())
    return sorted(rows.to_pylist(), key=lambda row: str(row["weirflow_id"]))


def versions(writer: DeltaTableWriter, table: str) -> int:
    return DeltaTable(writer.tables.uri(table)).version()


# --- commits and marks ---------------------------------------------------------------------------------------
def test_the_first_commit_creates_the_table_and_a_snapshot_reads_its_marks_back(writer: DeltaTableWriter) -> None:
    assert writer.snapshot("views", ["s0/0"]).version == -1
    version = writer.commit("views", views("/a", "/b"), {"s0/0": 41, "s0/1": 7}, -1)
    snapshot = writer.snapshot("views", ["s0/0", "s0/1", "never"])
    assert snapshot.version == version
    assert dict(snapshot.marks) == {"s0/0": 41, "s0/1": 7}, "a mark never set is absent"
    assert read_back(writer, "views") == views("/a", "/b").to_pylist()
    later = writer.commit("views", views("/c", first=2), {"s0/0": 42}, snapshot.version)
    assert later == version + 1
    assert dict(writer.snapshot("views", ["s0/0", "s0/1"]).marks) == {"s0/0": 42, "s0/1": 7}
    assert DeltaTable(writer.tables.uri("views")).transaction_version("s0/0") == 42, "a Delta txn, for any reader"


def test_a_commit_with_no_rows_still_sets_its_marks(writer: DeltaTableWriter) -> None:
    first = writer.commit("views", views("/a"), {"m": 1}, -1)
    empty = views("/a").slice(0, 0)
    version = writer.commit("views", empty, {"m": 2}, first)
    assert version == first + 1
    assert dict(writer.snapshot("views", ["m"]).marks) == {"m": 2}
    assert len(read_back(writer, "views")) == 1


def test_two_writers_of_one_mark_from_one_version_the_second_is_refused_and_commits_nothing(
    config: Config,
) -> None:
    first, second = writer_of(config), writer_of(config)
    base = first.commit("views", views("/a"), {"s0/0": 1}, -1)
    assert second.snapshot("views", ["s0/0"]).version == base
    winner = first.commit("views", views("/b", first=1), {"s0/0": 2}, base)
    with pytest.raises(
        TableConflictError, match=r"'views'.*set mark 's0/0' \(version \d+\); nothing was committed"
    ):
        second.commit("views", views("/c", first=2), {"s0/0": 2}, base)
    assert versions(first, "views") == winner, "no version was added by the refused commit"
    assert [row["page"] for row in read_back(first, "views")] == ["/a", "/b"]


def test_a_commit_that_lands_between_the_writers_load_and_its_put_is_caught_by_delta_rs(config: Config) -> None:
    """The conflict checked by delta-rs's optimistic concurrency: the other writer commits inside the fence,
    after this writer loaded the table and read the commits since its version, right before its own put."""
    ours, theirs = writer_of(config), writer_of(config)
    base = ours.commit("views", views("/a"), {"task-1": 1, "task-2": 1}, -1)
    fenced: list[int] = []

    def other_task_commits_first() -> None:
        fenced.append(1)
        if len(fenced) == 1:
            theirs.commit("views", views("/b", first=1), {"task-1": 2}, base)

    with pytest.raises(TableConflictError, match="'task-1'"):
        ours.commit("views", views("/c", first=2), {"task-1": 2}, base, other_task_commits_first)
    assert [row["page"] for row in read_back(ours, "views")] == ["/a", "/b"]
    # the same race with another mark: both go through
    fenced.clear()
    snapshot = ours.snapshot("views", ["task-2"])

    def another_task_commits_first() -> None:
        fenced.append(1)
        if len(fenced) == 1:
            theirs.commit("views", views("/d", first=3), {"task-1": 3}, snapshot.version)

    version = ours.commit(
        "views", views("/e", first=4), {"task-2": 2}, snapshot.version, another_task_commits_first
    )
    assert version == snapshot.version + 2
    assert dict(ours.snapshot("views", ["task-1", "task-2"]).marks) == {"task-1": 3, "task-2": 2}
    assert [row["page"] for row in read_back(ours, "views")] == ["/a", "/b", "/d", "/e"]


def test_writers_of_other_marks_from_one_version_both_commit(config: Config) -> None:
    first, second = writer_of(config), writer_of(config)
    base = first.commit("views", views("/a"), {"s0/0": 1, "s0/1": 1}, -1)
    one = first.commit("views", views("/b", first=1), {"s0/0": 2}, base)
    two = second.commit("views", views("/c", first=2), {"s0/1": 2}, base)
    assert (one, two) == (base + 1, base + 2)
    assert dict(first.snapshot("views", ["s0/0", "s0/1"]).marks) == {"s0/0": 2, "s0/1": 2}
    assert len(read_back(first, "views")) == 3


def test_delta_rs_refuses_a_commit_of_an_app_id_set_after_its_snapshot(tmp_path: Path) -> None:
    """The behaviour of deltalake the writer's second layer rests on (docs/delta.md, "Verified behaviour"):
    pinned here so that an upgrade that changed it fails this test."""
    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"x": [0]}), mode="error")
    one, two, other = DeltaTable(uri, version=0), DeltaTable(uri, version=0), DeltaTable(uri, version=0)

    def txn(table: DeltaTable, app: str, value: int) -> None:
        properties = CommitProperties(app_transactions=[Transaction(app, 1)], max_commit_retries=1)
        write_deltalake(table, pa.table({"x": [value]}), mode="append", commit_properties=properties)

    txn(one, "m", 1)
    with pytest.raises(CommitFailedError, match="Concurrent transaction"):
        txn(two, "m", 2)
    txn(other, "n", 3)
    assert DeltaTable(uri).version() == 2
    assert sorted(
        pa.table(QueryBuilder().register("t", DeltaTable(uri)).execute("select x from t").read_all())[
            "x"
        ].to_pylist()
    ) == [0, 1, 3]


def test_racing_first_commits_are_each_committed_once_and_one_mark_once(config: Config) -> None:
    """Writers (each its own writer, as on separate processors) committing the first batch of a new table at
    once: delta-rs 1.6 lets racing creators each commit a table's creation, so the table is created without
    rows or marks and the rows follow as appends (module docstring of `weirflow_delta.writer`)."""
    writers = [writer_of(config) for _ in range(6)]

    def race(commit: Callable[[int, DeltaTableWriter], int]) -> list[int | Exception]:
        start = threading.Barrier(len(writers))
        results: list[int | Exception] = [0] * len(writers)

        def run(index: int, writer: DeltaTableWriter) -> None:
            start.wait()
            try:
                results[index] = commit(index, writer)
            except Exception as exc:  # the verdict of each writer is what the test checks
                results[index] = exc

        threads = [threading.Thread(target=run, args=pair) for pair in enumerate(writers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return results

    other_marks = race(lambda i, w: w.commit("views", views(f"/p{i}", first=i), {f"task-{i}": 1}, -1))
    assert all(isinstance(r, int) for r in other_marks), other_marks
    assert sorted(row["page"] for row in read_back(writers[0], "views")) == [f"/p{i}" for i in range(6)]
    marks = writers[0].snapshot("views", [f"task-{i}" for i in range(6)]).marks
    assert dict(marks) == {f"task-{i}": 1 for i in range(6)}

    one_mark = race(lambda i, w: w.commit("counts", views(f"/q{i}", first=i), {"task-0": 1}, -1))
    landed = [r for r in one_mark if isinstance(r, int)]
    assert len(landed) == 1, one_mark
    assert all(isinstance(r, TableConflictError) for r in one_mark if not isinstance(r, int)), one_mark
    assert len(read_back(writers[0], "counts")) == 1


def test_a_commit_whose_earlier_attempt_landed_unseen_is_not_committed_again(writer: DeltaTableWriter) -> None:
    """A storage failure can hide that a commit's log entry was written; the retry finds its own token among
    the commits since and returns that version instead of conflicting with itself or writing twice."""
    base = writer.commit("views", views("/a"), {"m": 1}, -1)
    attempt = _Commit(writer, "views", views("/b", first=1), {"m": 2}, base, None)
    landed = DeltaTable(writer.tables.uri("views"))
    properties = CommitProperties(
        app_transactions=[Transaction("m", 2)], custom_metadata={COMMIT_TOKEN_FIELD: attempt.token}
    )
    write_deltalake(landed, attempt.rows, mode="append", commit_properties=properties)  # the lost reply's commit
    assert attempt.run() == base + 1
    assert versions(writer, "views") == base + 1
    assert len(read_back(writer, "views")) == 2


def test_before_attempt_runs_before_the_write_and_what_it_raises_ends_the_commit(writer: DeltaTableWriter) -> None:
    base = writer.commit("views", views("/a"), {"m": 1}, -1)
    calls: list[int] = []

    def fence() -> None:
        calls.append(versions(writer, "views"))
        raise LockLostError("task-s0-0", "p1")

    with pytest.raises(LockLostError):
        writer.commit("views", views("/b", first=1), {"m": 2}, base, fence)
    assert calls == [base], "called once, before anything was written"
    assert versions(writer, "views") == base
    assert dict(writer.snapshot("views", ["m"]).marks) == {"m": 1}
    with pytest.raises(LockLostError):
        writer.commit("fresh", views("/a"), {"m": 1}, -1, lambda: (_ for _ in ()).throw(LockLostError("t", "p")))
    assert writer.snapshot("fresh", []).version == -1, "not even the table is made past a refused fence"


# --- reading back --------------------------------------------------------------------------------------------
def test_rows_since_yields_what_each_later_commit_added_in_commit_order(writer: DeltaTableWriter) -> None:
    assert list(writer.rows_since("views", -1)) == []
    v1 = writer.commit("views", views("/a", "/b"), {"m": 1}, -1)
    v2 = writer.commit("views", views("/c", first=2), {"m": 2}, v1)
    writer.commit("views", views("/a").slice(0, 0), {"m": 3}, v2)  # marks only
    v4 = writer.commit("views", views("/d", "/e", first=3), {"m": 4}, v2 + 1)
    added = [t.to_pylist() for t in writer.rows_since("views", v1)]
    assert added == [views("/c", first=2).to_pylist(), views("/d", "/e", first=3).to_pylist()]
    assert [t.num_rows for t in writer.rows_since("views", -1)] == [2, 1, 2]
    assert list(writer.rows_since("views", v4)) == []
    # a DELETE rewrites files: its commit re-adds rows the table held, which are not new
    DeltaTable(writer.tables.uri("views")).delete("page = '/a'")
    assert [t.num_rows for t in writer.rows_since("views", v4)] == []
    assert all(writer.id_column in t.column_names for t in writer.rows_since("views", -1))


# --- schemas and partitioning ----------------------------------------------------------------------------------
def test_rows_the_table_cannot_take_are_refused_naming_the_table_and_columns(writer: DeltaTableWriter) -> None:
    base = writer.commit("views", views("/a"), {}, -1)
    extra = views("/b").append_column("referrer", pa.array(["x"]))
    with pytest.raises(
        DeltaSchemaError, match=r"Delta table 'views' at .*views: the table has no column 'referrer'"
    ):
        writer.commit("views", extra, {"m": 1}, base)
    with pytest.raises(DeltaSchemaError, match="the rows lack column 'views'"):
        writer.commit("views", views("/b").drop_columns(["views"]), {"m": 1}, base)
    wrong = views("/b").set_column(1, "views", pa.array(["many"]))
    with pytest.raises(DeltaSchemaError, match=r"column 'views' is string in the rows, int64 in the table"):
        writer.commit("views", wrong, {"m": 1}, base)
    assert versions(writer, "views") == base and writer.snapshot("views", ["m"]).marks == {}
    narrower = views("/b").set_column(1, "views", pa.array([5], pa.int32()))
    writer.commit("views", narrower, {"m": 1}, base)  # widens without loss
    assert sorted(row["views"] for row in read_back(writer, "views")) == [0, 5]
    with pytest.raises(DeltaSchemaError, match="no id column 'weirflow_id'"):
        writer.commit("other", views("/a").drop_columns(["weirflow_id"]), {}, -1)


def test_a_table_is_partitioned_only_as_its_stream_says(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    config = job_config(lake, **{"streams.views.table.partition.by": ["day"]})
    writer = writer_of(config)
    day = dt.date(2026, 11, 20)
    at = dt.datetime(2026, 11, 20, 8, 30, 0, 250000, tzinfo=dt.UTC)
    rows = (
        views("/a", "/b")
        .append_column("day", pa.array([day, day]))
        .append_column("at", pa.array([at, at], pa.timestamp("us", "UTC")))
    )
    writer.commit("views", rows, {"m": 1}, -1)
    writer.commit("counts", rows, {"m": 1}, -1)
    assert DeltaTable(writer.tables.uri("views")).metadata().partition_columns == ["day"]
    assert (lake / "views" / "day=2026-11-20").is_dir()
    assert DeltaTable(writer.tables.uri("counts")).metadata().partition_columns == [], "no key, no partitioning"
    back = [row for table in writer.rows_since("views", -1) for row in table.to_pylist()]
    assert {(row["day"], row["at"]) for row in back} == {(day, at)}, "partition values read back typed"
    # the key cannot repartition a table, and a partition column the rows lack is named
    repartitioned = writer_of(job_config(lake, **{"streams.counts.table.partition.by": ["page"]}))
    with pytest.raises(DeltaSchemaError, match=r"'counts' .* is partitioned by no column, but streams.counts"):
        repartitioned.commit("counts", rows, {"m": 2}, 1)
    missing = writer_of(job_config(tmp_path / "other", **{"streams.views.table.partition.by": ["region"]}))
    with pytest.raises(DeltaSchemaError, match=r"partitioned by 'region' \(streams.views.table.partition.by\)"):
        missing.commit("views", rows, {}, -1)


# --- admin, consumer and producer ------------------------------------------------------------------------------
def clients(config: Config) -> tuple[DeltaSystemAdmin, DeltaSystemConsumer, DeltaSystemProducer]:
    factory = system_factory(config, "lake")
    admin, consumer = factory.get_admin("lake", config), factory.get_consumer("lake", config)
    producer = factory.get_producer("lake", config)
    assert isinstance(admin, DeltaSystemAdmin) and isinstance(consumer, DeltaSystemConsumer)
    assert isinstance(producer, DeltaSystemProducer)
    return admin, consumer, producer


def test_a_table_is_a_stream_of_one_partition_read_by_position_with_its_ids(
    config: Config, writer: DeltaTableWriter
) -> None:
    admin, consumer, _ = clients(config)
    assert admin.list_streams() == {}, "no tables, not even the system's directory"
    with pytest.raises(StreamNotFoundError, match="created by its first commit"):
        admin.partition_count("views")
    assert admin.create_stream(StreamSpec("views", 1)) is True, "nothing stands before its first commit"
    with pytest.raises(InvalidArgumentError, match="one partition"):
        admin.create_stream(StreamSpec("views", 4))
    v1 = writer.commit("views", views("/a", "/b"), {"m": 1}, -1)
    writer.commit("views", views("/c", first=2), {"m": 2}, v1)
    assert admin.create_stream(StreamSpec("views", 1)) is False
    with pytest.raises(StreamExistsError):
        admin.create_stream(StreamSpec("views", 2))
    assert admin.partition_count("views") == 1 and admin.list_streams() == {"views": 1}
    assert admin.retention("views") is None and admin.dense_offsets is False
    meta = admin.partition_metadata("views")[0]
    assert (meta.oldest, meta.newest, meta.upcoming) == ("0:0", None, f"{v1 + 2}:0")
    assert admin.records_between("views", 0, meta.oldest, meta.upcoming) == 3
    ssp = SystemStreamPartition("lake", "views", 0)
    records = consumer.read(ssp, meta.oldest, 100)
    assert [json.loads(r.value) for r in records] == views("/a", "/b", "/c").to_pylist()
    assert [r.id for r in records] == ["id-0", "id-1", "id-2"]
    assert [(r.offset, r.next_offset) for r in records] == [
        (f"{v1}:0", f"{v1}:1"),
        (f"{v1}:1", f"{v1 + 1}:0"),
        (f"{v1 + 1}:0", f"{v1 + 2}:0"),
    ]
    assert records[0].timestamp_ms > 0
    # reads resume from any next offset, stop before an end, and plan what they will read
    assert [r.id for r in consumer.read(ssp, records[0].next_offset, 1)] == ["id-1"]
    assert [r.id for r in consumer.read(ssp, meta.oldest, 100, end=records[2].offset)] == ["id-0", "id-1"]
    assert consumer.read(ssp, meta.upcoming, 100) == []
    plan = admin.plan_read("views", 0, meta.oldest, 2)
    assert (plan.end, plan.records, plan.at_end) == (records[1].next_offset, 2, False)
    assert admin.plan_read("views", 0, plan.end, 10) == (meta.upcoming, 1, True)
    assert admin.compare_offsets(records[0].offset, records[2].offset) == -1
    assert admin.compare_offsets(records[2].next_offset, meta.upcoming) == 0


def test_a_read_from_before_the_log_s_clean_up_reads_from_the_oldest_commit_left(
    config: Config, writer: DeltaTableWriter, tmp_path: Path
) -> None:
    admin, consumer, _ = clients(config)
    version = -1
    for i in range(4):
        version = writer.commit("views", views(f"/p{i}", first=i), {"m": i}, version)
    DeltaTable(writer.tables.uri("views")).create_checkpoint()
    log = tmp_path / "lake" / "views" / "_delta_log"
    for old in range(version - 1):  # what Delta's log clean-up removes once a checkpoint covers it
        (log / f"{old:020d}.json").unlink()
    assert admin.partition_metadata("views")[0].oldest == f"{version - 1}:0"
    ssp = SystemStreamPartition("lake", "views", 0)
    assert [json.loads(r.value)["page"] for r in consumer.read(ssp, "0:0", 10)] == ["/p2", "/p3"]
    assert admin.plan_read("views", 0, "0:0", 10).records == 2
    assert [t.num_rows for t in writer.rows_since("views", version - 2)] == [1, 1]
    with pytest.raises(DeltaTableError, match=r"no longer has the log entry of version \d"):
        list(writer.rows_since("views", -1))


def test_json_lines_are_appended_with_the_table_s_own_types_and_ids(
    config: Config, writer: DeltaTableWriter
) -> None:
    admin, consumer, producer = clients(config)
    with pytest.raises(StreamNotFoundError, match="JSON cannot be its first write"):
        producer.send([OutgoingRecord("views", b'{"page": "/a", "views": 1}')])
    at = dt.datetime(2026, 11, 20, 8, 0, tzinfo=dt.UTC)
    first = views("/a").append_column("at", pa.array([at], pa.timestamp("us", "UTC")))
    base = writer.commit("views", first, {}, -1)
    producer.send(
        [
            OutgoingRecord("views", b'{"page": "/b", "views": 2, "at": "2026-11-20T09:00:00Z"}', id="given"),
            OutgoingRecord("views", b'{"page": "/c", "views": 3, "weirflow_id": "own"}'),
        ]
    )
    assert versions(writer, "views") == base + 1, "one commit per send"
    rows = read_back(writer, "views")
    assert [(r["page"], r["views"], r["weirflow_id"]) for r in rows] == [
        ("/b", 2, "given"),
        ("/a", 0, "id-0"),
        ("/c", 3, "own"),
    ]
    assert rows[0]["at"] == dt.datetime(2026, 11, 20, 9, 0, tzinfo=dt.UTC)
    with pytest.raises(DeltaSchemaError, match="no column 'referrer'"):
        producer.send([OutgoingRecord("views", b'{"page": "/d", "referrer": "x"}')])
    with pytest.raises(DeltaSchemaError, match="column 'views' of Delta table 'views' is int64"):
        producer.send([OutgoingRecord("views", b'{"page": "/d", "views": "many"}')])
    assert versions(writer, "views") == base + 1
    fenced: list[str] = []
    producer.send_fenced([OutgoingRecord("views", b'{"page": "/e"}')], lambda: fenced.append("checked"))
    assert fenced == ["checked"]
    ssp = SystemStreamPartition("lake", "views", 0)
    assert consumer.read(ssp, "0:0", 10)[-1].value == b'{"page":"/e","views":null,"weirflow_id":null,"at":null}'


def test_a_reader_meets_each_table_partition_s_rows_in_the_order_they_were_committed(tmp_path: Path) -> None:
    """What `weirflow streams consume` leaves replays out by (`SystemAdmin.ordered_partitions`, one mark per
    lane and `read_sequence`): delta-rs writes a commit's Arrow batches in no fixed order, so the writer hands
    it one batch, and a partitioned table's partitions are separate sequences."""
    config = job_config(tmp_path / "lake", **{"streams.views.table.partition.by": ["day"]})
    writer = writer_of(config)
    admin, consumer, _ = clients(config)
    count = 60_000
    days = pa.array([("mon", "tue", "wed")[(i * 7919) % 3] for i in range(count)])
    ids = pa.array([row_id("s0", i % 2, i // 2, 0) for i in range(count)])
    rows = pa.table({"day": days, "n": pa.array(range(count), pa.int64()), "weirflow_id": ids})
    shipped = pa.Table.from_batches(rows.to_batches(max_chunksize=1_000))  # as the sink's workers hand them over
    writer.commit("views", shipped, {}, -1)
    replayed = rows.slice(count - 3_000)  # a replay of rows without positions: appended again
    writer.commit("views", replayed, {}, writer.snapshot("views", []).version)

    ssp = SystemStreamPartition("lake", "views", 0)
    records, at = [], admin.partition_metadata("views")[0].oldest
    while batch := consumer.read(ssp, at, 7_000):
        records += batch
        at = batch[-1].next_offset
    assert len(records) == count + 3_000
    by_day: dict[str, list[int]] = {}
    for record in records[:count]:
        by_day.setdefault(admin.read_sequence(record), []).append(json.loads(record.value)["n"])
    assert sorted(by_day) == ["day=mon", "day=tue", "day=wed"]
    assert all(ns == sorted(ns) for ns in by_day.values()), "each partition's rows in the order committed"
    seen = ReplayFilter.for_job(config, admin.ordered_partitions)
    new = [r for r in records if seen.is_new((0, admin.read_sequence(r)), r.id)]
    assert len(new) == count and seen.replays == 3_000, "every row once, each replay left out"


def test_the_cli_lists_consumes_and_produces_a_delta_stream(
    config: Config, writer: DeltaTableWriter, tmp_path: Path
) -> None:
    writer.commit("views", views("/a", "/b"), {"m": 1}, -1)
    job = tmp_path / "job.yaml"
    job.write_text(
        "job: {name: lakejob}\n"
        "systems: {lake: {factory: delta, path: lake}}\n"
        "streams: {views: {system: lake, partitions: 1}}\n"
    )

    def cli(*args: str, stdin: str = "") -> str:
        done = subprocess.run(
            [sys.executable, "-m", "weirflow", *args], input=stdin, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr  # also: no abort of delta-rs at the interpreter's exit
        return done.stdout

    listed = json.loads(cli("streams", "list", str(job), "--json"))
    assert {"system": "lake", "stream": "views", "partitions": 1, "records": 2} in listed
    cli("streams", "produce", str(job), "views", stdin='{"page": "/c", "views": 7}\n')
    consumed = [json.loads(line) for line in cli("streams", "consume", str(job), "views", "--json").splitlines()]
    assert [c["value"]["page"] for c in consumed] == ["/a", "/b", "/c"]
    assert [c["value"]["weirflow_id"] for c in consumed] == ["id-0", "id-1", None]
    assert [c["partition"] for c in consumed] == [0, 0, 0]
    assert [c["id"] for c in consumed] == ["id-0", "id-1", None]
