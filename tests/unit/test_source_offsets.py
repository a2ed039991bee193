"""How the Spark source plans a micro-batch (`WeirflowStreamReader.latestOffset`), on the embedded log:
each task has its own reading budget, and the system is asked for a partition's end only when the last
known ends may not fill a task's budget (an Event Hubs management call costs ~0.35 s)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import types as T
from pyspark.sql.streaming.datasource import ReadMaxRows

from weirflow.config.loader import Config
from weirflow.interfaces.system import OffsetRange, OutgoingRecord, RecordColumns, StreamSpec
from weirflow.job.systems import Systems
from weirflow.spark import source
from weirflow.spark.batch_reader import BatchReader, _dense_positions
from weirflow.spark.replay import ROW_BITS

SSPS = [f"local.views.{p}" for p in range(3)]


@pytest.fixture
def config(tmp_path: Path) -> Config:
    config = Config.from_dict({"job.name": "offsets", "job.state.dir": str(tmp_path)})
    systems = Systems(config)
    try:
        systems.admin("local").create_stream(StreamSpec("views", 3))
        # partition 0: 100 records, 1: 30, 2: none
        systems.producer("local").send(
            [OutgoingRecord("views", b"{}", partition=0) for _ in range(100)]
            + [OutgoingRecord("views", b"{}", partition=1) for _ in range(30)]
        )
    finally:
        systems.close()
    return config


def _reader(
    config: Config, tasks: dict[str, str], bounded: bool = False, drain_flag: str = "", inject: str = ""
) -> Any:
    options = {
        "config": config.snapshot(),
        "stream": "views",
        "tasks": json.dumps(tasks),
        "system": "local",
        "physical": "views",
        "ssps": json.dumps(SSPS),
        "start": json.dumps({k: {"o": "0", "e": False} for k in SSPS}),
        "serde": "bytes",
        "user_schema": json.dumps(T.StructType().jsonValue()),
        "event_time_field": "event_time",
        "event_time_from_record": "false",
        "delay_ms": "0",
        "intermediate": "false",
        "bounded": "true" if bounded else "false",
        "max_records": "40",
        "drain_flag": drain_flag,
        "run_id": "r1",
        "inject": inject,
    }
    return source.WeirflowStreamReader(source.SourceSpec(options))


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The partitions each call to the admin's `partition_metadata_of` asked about."""
    calls: list[list[int]] = []
    real = source.systems_for

    def counting(snapshot: str) -> Any:
        systems = real(snapshot)
        admin = systems.admin("local")
        if not getattr(admin, "_counted", False):
            inner = admin.partition_metadata_of

            def partition_metadata_of(stream: str, partitions: Any) -> Any:
                calls.append(sorted(partitions))
                return inner(stream, partitions)

            admin.partition_metadata_of = partition_metadata_of
            admin._counted = True
        return systems

    monkeypatch.setattr(source, "systems_for", counting)
    return calls


def _ends(offset: dict[str, Any]) -> dict[str, int]:
    return {key: int(pos["o"]) for key, pos in offset["p"].items()}


def test_each_task_reads_at_most_its_budget(config: Config, asked: list[list[int]]) -> None:
    one_task_each = {k: f"views-{k[-1]}" for k in SSPS}
    reader = _reader(config, one_task_each)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(40))
    assert _ends(end) == {SSPS[0]: 40, SSPS[1]: 30, SSPS[2]: 0}

    shared = _reader(config, {k: "views-0" for k in SSPS})  # one task holding all three partitions
    end = shared.latestOffset(shared.initialOffset(), ReadMaxRows(40))
    assert _ends(end) == {SSPS[0]: 40, SSPS[1]: 0, SSPS[2]: 0}, "the budget is the task's, not the partition's"


def test_the_system_is_asked_only_when_known_ends_may_not_fill_the_budget(
    config: Config, asked: list[list[int]]
) -> None:
    reader = _reader(config, {SSPS[0]: "views-0", SSPS[1]: "views-1", SSPS[2]: "views-2"})
    first = reader.latestOffset(reader.initialOffset(), ReadMaxRows(40))
    assert asked == [[0, 1, 2]]
    second = reader.latestOffset(first, ReadMaxRows(40))
    # partition 0 is known to hold 60 more than read (more than the budget): no question; 1 and 2 are
    # read to their known ends, so new records may be there
    assert asked[1] == [1, 2]
    assert _ends(second) == {SSPS[0]: 80, SSPS[1]: 30, SSPS[2]: 0}


def test_a_bounded_stream_ends_only_at_an_end_the_system_just_reported(config: Config, asked: list[Any]) -> None:
    reader = _reader(config, {k: "views-0" for k in SSPS}, bounded=True)
    offset = reader.initialOffset()
    seen = []
    for _ in range(6):
        before = len(asked)
        offset = reader.latestOffset(offset, ReadMaxRows(40))
        fresh = {p for call in asked[before:] for p in call}
        seen.append(({k: (int(p["o"]), p["e"]) for k, p in offset["p"].items()}, fresh))
    assert seen[-1][0] == {SSPS[0]: (100, True), SSPS[1]: (30, True), SSPS[2]: (0, True)}
    # partition 0 was read up to 100 from a known end first (not ended then), and ended once asked again
    reached = next(i for i, (ends, _) in enumerate(seen) if ends[SSPS[0]][0] == 100)
    assert seen[reached][0][SSPS[0]] == (100, False) and 0 not in seen[reached][1]
    ended = next(i for i, (ends, _) in enumerate(seen) if ends[SSPS[0]][1])
    assert ended > reached and 0 in seen[ended][1]


def _send(config: Config, partition: int, n: int) -> None:
    systems = Systems(config)
    try:
        systems.producer("local").send([OutgoingRecord("views", b"{}", partition=partition) for _ in range(n)])
    finally:
        systems.close()


def test_a_drain_cuts_where_the_query_has_read_to_and_takes_no_new_input(
    config: Config, tmp_path: Path, asked: list[Any]
) -> None:
    flag = tmp_path / "job.r1.draining"
    reader = _reader(config, {k: "views-0" for k in SSPS}, drain_flag=str(flag), inject="views-0")
    first = reader.latestOffset(reader.initialOffset(), ReadMaxRows(40))
    assert not any(p["e"] for p in first["p"].values()), "no drain yet: an unbounded stream never ends"
    assert _ends(first) == {SSPS[0]: 40, SSPS[1]: 0, SSPS[2]: 0}  # a backlog of 60 + 30 is waiting
    flag.write_text("{}")
    _send(config, 2, 7)  # after the cut: never read
    calls = len(asked)
    offset = reader.latestOffset(first, ReadMaxRows(40))
    assert len(asked) == calls, "the cut needs no round trip to the system"
    final = {k: (int(p["o"]), p["e"], p.get("d", False)) for k, p in offset["p"].items()}
    assert final == {SSPS[0]: (40, True, True), SSPS[1]: (0, True, True), SSPS[2]: (0, True, True)}
    assert offset["w"] == source.MAX_TIMESTAMP_MS, "the batch reaching the cut moves the watermark to +infinity"
    kinds = {p.value[1]: p.value[4] for p in reader.partitions(first, offset) if p.value[0] == "ssp"}
    assert kinds == {k: "drain" for k in SSPS}, "the drain batch carries a drain row per partition, not eos"
    assert reader.latestOffset(offset, ReadMaxRows(40)) == offset, "nothing more is planned after the cut"


def test_a_drain_message_of_another_run_is_not_an_end(tmp_path: Path) -> None:
    from weirflow.interfaces.system import RecordColumns
    from weirflow.runtime.control import ControlMessage, MessageType

    options = {
        "config": Config.from_dict({"job.name": "x", "job.state.dir": str(tmp_path)}).snapshot(),
        "stream": "mid",
        "system": "local",
        "physical": "mid",
        "ssps": "[]",
        "start": "{}",
        "serde": "json",
        "user_schema": json.dumps(T.StructType([T.StructField("page", T.StringType())]).jsonValue()),
        "event_time_field": "t",
        "event_time_from_record": "true",
        "delay_ms": "0",
        "intermediate": "true",
        "bounded": "false",
        "max_records": "10",
        "run_id": "r2",
    }
    batch_reader = BatchReader(source.SourceSpec(options))
    messages = [
        ControlMessage(MessageType.DRAIN, "a-0", 2, 0, run_id="r1").encode(),
        ControlMessage(MessageType.DRAIN, "a-1", 2, 0, run_id="r2").encode(),
    ]
    chunk = RecordColumns(
        values=messages, keys=[None, None], offsets=["0", "1"], timestamps_ms=[0, 0], next_offset="2"
    )
    batches = list(batch_reader._decode("local.mid.0", chunk))
    rows = [row for b in batches for row in b.column(1).to_pylist() if row]
    assert [(r["kind"], r["producer"]) for r in rows] == [("drain", "a-1")]


def test_consecutive_offsets_read_as_the_list_of_their_strings_and_position_rows_alike() -> None:
    """The embedded log gives consecutive offsets as an `OffsetRange` (no string per record); it reads as the
    list it stands for, and the rows' positions come out as from that list."""
    offsets = OffsetRange(7, 3)
    assert list(offsets) == ["7", "8", "9"] and offsets == ["7", "8", "9"] and len(offsets) == 3
    assert offsets[-1] == "9" and offsets[1:] == ["8", "9"]
    with pytest.raises(IndexError):
        offsets[3]
    as_range = RecordColumns(offsets, [None] * 3, [b""] * 3, [0] * 3, "10")
    as_list = RecordColumns(["7", "8", "9"], [None] * 3, [b""] * 3, [0] * 3, "10")
    for index in ([0, 1, 2], [2], [0, 2]):
        assert _dense_positions(as_range, index).tolist() == _dense_positions(as_list, index).tolist()
        assert _dense_positions(as_range, index).tolist() == [(7 + i) << ROW_BITS for i in index]
