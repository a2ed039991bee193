"""Every decoder of bytes or documents that come from outside the process, under arbitrary input: each either
decodes or raises its module's documented error, never anything else (a KeyError or TypeError escaping would
fail a processor loop or answer 500), and encode -> decode gives the value back where an encoder exists.

Decoders covered: control messages (`weirflow.runtime.control.decode`), packed rows
(`weirflow.spark.packing.unpack`),
drain notices, job models, checkpoints (their control state, the SQLite rows and the Azure Table rows),
processor registry rows (JSON and Azure Table entities), stored metadata values, typed config values, Kinesis
positions and the keys of served tables' URLs.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from weirflow.base.errors import ConfigError, InvalidOffsetError, MalformedDocumentError, MalformedMessageError
from weirflow.config.loader import Config
from weirflow.endpoints.tables import Answer, table_request
from weirflow.interfaces.checkpoint import Checkpoint
from weirflow.interfaces.coordination import ProcessorInfo
from weirflow.interfaces.metadata import decode_value
from weirflow.interfaces.system import SystemStreamPartition
from weirflow.job.drain_notice import DrainMode, DrainNotification
from weirflow.job.model import JobModel, TaskModel
from weirflow.local.checkpoint import SqliteCheckpointManager
from weirflow.runtime.control import ControlMessage, MessageType, TaskControl, decode
from weirflow.spark.packing import pack, unpack
from weirflow_azure.checkpoint.table import (
    CONTROL_ROW,
    FENCE_ROW,
    SSP_PREFIX,
    TableCheckpointManager,
    checkpoint_rows,
)
from weirflow_azure.coordinator.registry import _from_entity, _to_entity
from weirflow_azure.coordinator.storage import escape_key
from weirflow_kinesis import positions

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# the decoders whose examples are costly to build or check (Arrow streams, SQLite writes, whole job models)
HEAVY = settings(SETTINGS, max_examples=100)

# --- strategies -------------------------------------------------------------------------------------------------
scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
names = st.text(min_size=1, max_size=8)
ints = st.integers(min_value=-(2**62), max_value=2**62)


def shaped(required: dict[str, Any], optional: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Objects with some of a document's own field names holding anything, and sometimes not objects at all:
    the inputs a decoder's field checks must survive."""
    keys = {**required, **optional}
    return st.fixed_dictionaries({}, optional={k: v | json_values for k, v in keys.items()}) | json_values


# --- control messages -------------------------------------------------------------------------------------------
control_types = st.sampled_from([MessageType.WATERMARK, MessageType.END_OF_STREAM, MessageType.DRAIN])


@SETTINGS
@given(
    st.binary(max_size=64)
    | st.builds(
        lambda t, doc: bytes([t]) + json.dumps(doc).encode(),
        st.integers(0, 9),
        shaped({"task-name": names, "task-count": ints, "timestamp": ints}, {"run-id": names, "version": ints}),
    )
)
@example(b'\x01{"task-name": "a", "task-count": Infinity, "timestamp": 1}')  # int() of a float: OverflowError
def test_a_control_message_decodes_or_is_a_malformed_message(raw: bytes) -> None:
    try:
        kind, payload = decode(raw)
    except MalformedMessageError:
        return
    assert isinstance(kind, MessageType)
    assert isinstance(payload, bytes | ControlMessage)


@SETTINGS
@given(control_types, names, ints, ints, st.text(max_size=12))
def test_a_control_message_round_trips(kind: MessageType, task: str, count: int, timestamp: int, run: str) -> None:
    message = ControlMessage(kind, task, count, timestamp, run)
    assert decode(message.encode()) == (kind, message)


# --- packed rows ------------------------------------------------------------------------------------------------
@SETTINGS
@given(st.binary(max_size=256))
def test_packed_rows_decode_or_are_a_malformed_message(raw: bytes) -> None:
    try:
        table = unpack(b"\x04" + raw)
    except MalformedMessageError:
        return
    assert isinstance(table, pa.Table)


@HEAVY
@given(
    st.lists(
        st.tuples(st.text(max_size=16), st.integers(-(2**63), 2**63 - 1) | st.none()), min_size=1, max_size=24
    ),
    st.integers(min_value=0, max_value=400),
)
def test_packed_rows_round_trip_and_a_cut_record_is_malformed_or_fewer_rows(
    rows: list[tuple[str, int | None]], cut: int
) -> None:
    batch = pa.RecordBatch.from_pylist([{"k": k, "v": v} for k, v in rows])
    records = [record for record, _ in pack(batch, max_rows=16)]
    assert pa.concat_tables([unpack(r) for r in records if r is not None]).to_pylist() == batch.to_pylist()
    first = records[0]
    assert first is not None
    whole = unpack(first).to_pylist()
    assume(cut < len(first) - 1)
    try:  # a cut at a message boundary is a shorter stream (an Arrow IPC stream needs no end marker)
        part = unpack(first[: cut + 1]).to_pylist()
    except MalformedMessageError:
        return
    # a cut inside the stream's end marker (8 bytes: 0xFFFFFFFF, then a zero length) loses no row
    inside_end_marker = len(first) - (cut + 1) <= 8
    assert part == whole[: len(part)] and (len(part) < len(whole) or inside_end_marker)


# --- drain notices ----------------------------------------------------------------------------------------------
@SETTINGS
@given(shaped({"uuid": names, "run-id": names}, {"mode": st.just("DEFAULT"), "created-ms": ints, "format": ints}))
def test_a_drain_notice_decodes_or_is_a_malformed_document(data: Any) -> None:
    try:
        notice = DrainNotification.from_json(data)
    except MalformedDocumentError:
        return
    assert isinstance(notice.uuid, str) and notice.uuid
    assert isinstance(notice.run_id, str) and notice.run_id
    assert isinstance(notice.created_ms, int)


@SETTINGS
@given(names, names, ints)
def test_a_drain_notice_round_trips(uuid: str, run_id: str, created_ms: int) -> None:
    notice = DrainNotification(uuid, run_id, DrainMode.DEFAULT, created_ms)
    assert DrainNotification.from_json(json.loads(json.dumps(notice.to_json()))) == notice


# --- job models -------------------------------------------------------------------------------------------------
ssp_docs = shaped({"system": names, "stream": names, "partition": ints}, {})
task_docs = shaped({"stage": names, "ssps": st.lists(ssp_docs, max_size=3)}, {})


@HEAVY
@given(
    shaped(
        {
            "format": st.just(1),
            "version": ints,
            "created_ms": ints,
            "leader": names,
            "tasks": st.dictionaries(names, task_docs, max_size=3),
            "assignment": st.dictionaries(names, st.lists(names, max_size=3), max_size=3),
        },
        {},
    )
)
def test_a_job_model_decodes_or_is_a_malformed_document(data: Any) -> None:
    try:
        model = JobModel.from_json(data)
    except MalformedDocumentError:
        return
    assert isinstance(model.version, int)
    for processor in model.processors:
        assert all(task in model.tasks for task in model.tasks_of(processor))


# a system's name holds no dot: the stores key an SSP as ``system.stream.partition`` (`SystemStreamPartition.key`)
ssps = st.builds(SystemStreamPartition, names.filter(lambda n: "." not in n), names, st.integers(0, 10_000))


@st.composite
def job_models(draw: st.DrawFn) -> JobModel:
    task_names = draw(st.lists(names, unique=True, max_size=4))
    tasks = {n: TaskModel(n, draw(names), tuple(draw(st.lists(ssps, max_size=3)))) for n in task_names}
    processors = draw(st.lists(names, unique=True, min_size=1, max_size=3))
    owners = {n: draw(st.sampled_from(processors)) for n in task_names}
    assignment = {p: tuple(sorted(n for n in task_names if owners[n] == p)) for p in processors}
    return JobModel(draw(ints), tasks, assignment, draw(ints), draw(st.text(max_size=12)))


@HEAVY
@given(job_models())
def test_a_job_model_round_trips(model: JobModel) -> None:
    assert JobModel.from_json(json.loads(json.dumps(model.to_json()))) == model


# --- checkpoints: control state, SQLite rows, Azure Table rows --------------------------------------------------
partition_docs = shaped(
    {},
    {
        "task-count": ints,
        "watermarks": st.dictionaries(names, ints, max_size=2),
        "ended": st.lists(names, max_size=2),
        "drained": st.lists(names, max_size=2),
    },
)
control_docs = shaped(
    {},
    {
        "streams": st.dictionaries(
            names, shaped({}, {"partitions": st.dictionaries(names, partition_docs)}), max_size=2
        ),
        "injected": st.dictionaries(names, ints, max_size=2),
        "finished": st.booleans(),
        "drained": names,
        "dead-letters": ints,
        "sent-watermark": ints,
        "marks": st.dictionaries(names, st.dictionaries(names, ints), max_size=2),
        "tails": st.dictionaries(names, names, max_size=2),
        "replays": st.dictionaries(names, st.lists(ints, max_size=2), max_size=2),
    },
)


@SETTINGS
@given(control_docs)
def test_a_checkpoints_control_state_decodes_or_is_a_malformed_document(data: Any) -> None:
    try:
        control = TaskControl.from_json(data)
    except MalformedDocumentError:
        return
    assert isinstance(control, TaskControl)


@st.composite
def task_controls(draw: st.DrawFn) -> TaskControl:
    control = TaskControl(
        injected=draw(st.dictionaries(names, ints, max_size=2)),
        finished=draw(st.booleans()),
        drained=draw(st.text(max_size=8)),
        dead_letters=draw(ints),
        sent_watermark=draw(ints),
        tails=draw(st.dictionaries(names, names, max_size=2)),
        replays=draw(st.dictionaries(names, st.lists(ints, max_size=2), max_size=2)),
    )
    for stream in draw(st.lists(names, max_size=2)):
        for partition in draw(st.lists(names, max_size=2)):
            message = ControlMessage(draw(control_types), draw(names), draw(st.integers(1, 4)), draw(ints))
            control.stream(stream).apply(partition, message)
    return control


@SETTINGS
@given(task_controls())
def test_a_checkpoints_control_state_round_trips(control: TaskControl) -> None:
    assert TaskControl.from_json(json.loads(json.dumps(control.to_json()))) == control


@pytest.fixture(scope="module")
def sqlite_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SqliteCheckpointManager, Path]]:
    path = tmp_path_factory.mktemp("checkpoints") / "job.db"
    manager = SqliteCheckpointManager(path)
    manager.start()
    yield manager, path
    manager.stop()


@HEAVY
@given(st.text(max_size=40), st.text(max_size=30) | ssps.map(SystemStreamPartition.key))
def test_a_sqlite_checkpoint_row_decodes_or_is_a_malformed_document(
    sqlite_checkpoints: tuple[SqliteCheckpointManager, Path], control: str, ssp_key: str
) -> None:
    manager, path = sqlite_checkpoints
    with sqlite3.connect(path) as db:
        db.execute("DELETE FROM checkpoints")
        db.execute("DELETE FROM checkpoint_control")
        db.execute("INSERT INTO checkpoints (task, ssp, next_offset) VALUES ('t', ?, '1')", (ssp_key,))
        db.execute("INSERT INTO checkpoint_control (task, control) VALUES ('t', ?)", (control,))
    try:
        checkpoint = manager.read_last_checkpoint("t")
        TaskControl.from_json(checkpoint.control if checkpoint else None)
    except MalformedDocumentError as exc:
        assert "task t" in str(exc) or "control state" in str(exc)


@HEAVY
@given(st.dictionaries(ssps, st.text(max_size=12), max_size=3), task_controls(), st.integers(0, 2**31 - 1))
def test_a_sqlite_checkpoint_round_trips(
    sqlite_checkpoints: tuple[SqliteCheckpointManager, Path],
    offsets: dict[Any, str],
    control: TaskControl,
    epoch: int,
) -> None:
    manager, path = sqlite_checkpoints
    with sqlite3.connect(path) as db:
        for table in ("checkpoints", "checkpoint_control", "checkpoint_epochs"):
            db.execute(f"DELETE FROM {table}")
    written = Checkpoint(offsets, control=control.to_json(), epoch=epoch)
    manager.write_checkpoint("t", written)
    assert manager.read_last_checkpoint("t") == written


def azure_rows(task: str, checkpoint: Checkpoint) -> list[dict[str, Any]]:
    """The rows `TableCheckpointManager.write_checkpoint` stores for ``checkpoint`` (and the fence row)."""
    fence = {"PartitionKey": escape_key(task), "RowKey": FENCE_ROW, "epoch": checkpoint.epoch}
    return [*checkpoint_rows(task, checkpoint), fence]


azure_row_docs = st.fixed_dictionaries(
    {"PartitionKey": names, "RowKey": st.sampled_from([CONTROL_ROW, FENCE_ROW, SSP_PREFIX + "x.y.0", "other"])},
    optional={
        f: v | scalars
        for f, v in {
            "system": names,
            "stream": names,
            "partition": ints,
            "offset": names,
            "control": st.text(max_size=20),
            "chunks": st.integers(0, 3),
            "control_1": st.text(max_size=5),
            "epoch": ints,
        }.items()
    },
)


@SETTINGS
@given(
    st.lists(
        azure_row_docs
        | shaped({}, {"PartitionKey": names, "RowKey": names}).filter(lambda d: isinstance(d, dict)),
        max_size=4,
    )
)
def test_azure_table_checkpoint_rows_decode_or_are_a_malformed_document(rows: list[dict[str, Any]]) -> None:
    try:
        found = TableCheckpointManager._assemble(rows)
    except MalformedDocumentError:
        return
    assert all(isinstance(c, Checkpoint) for c in found.values())


@SETTINGS
@given(
    names,
    st.dictionaries(ssps, st.text(max_size=12), max_size=3),
    task_controls(),
    st.integers(0, 2**31 - 1),
    st.sampled_from([0, 7, 29_990, 30_000, 61_000]).map(lambda n: "é" * n),
)
def test_azure_table_checkpoint_rows_round_trip(
    task: str, offsets: dict[Any, str], control: TaskControl, epoch: int, padding: str
) -> None:
    document = {**control.to_json(), "padding": padding}  # a long one is stored in chunks of 30,000 characters
    written = Checkpoint(offsets, control=document, epoch=epoch)
    assert TableCheckpointManager._assemble(azure_rows(task, written)) == {task: written}


# --- processor registry rows ------------------------------------------------------------------------------------
@SETTINGS
@given(
    shaped(
        {"processor_id": names, "host": names, "pid": ints, "state": names},
        {"tasks": st.lists(names, max_size=2), "heartbeat_ms": ints, "beat": ints, "job_model_version": ints},
    )
)
def test_a_processor_row_decodes_or_is_a_malformed_document(data: Any) -> None:
    try:
        row = ProcessorInfo.from_json(data)
    except MalformedDocumentError:
        return
    assert isinstance(row.heartbeat_ms, int) and isinstance(row.tasks, list)


@SETTINGS
@given(
    st.builds(
        ProcessorInfo,
        names,
        names,
        ints,
        names,
        ints,
        st.lists(names, max_size=3),
        st.text(max_size=8),
        ints,
        ints,
        st.text(max_size=8),
        st.text(max_size=8),
        ints,
    )
)
def test_a_processor_row_round_trips(row: ProcessorInfo) -> None:
    assert ProcessorInfo.from_json(json.loads(json.dumps(row.to_json()))) == row


@SETTINGS
@given(
    st.fixed_dictionaries(
        {"RowKey": names},
        optional={
            f: st.text(max_size=6) | st.integers().map(str) | scalars
            for f in ("processor_id", "host", "pid", "state", "tasks", "heartbeat_ms", "beat", "job_model_version")
        },
    )
)
def test_an_azure_registry_entity_decodes_or_is_a_malformed_document(entity: dict[str, Any]) -> None:
    try:
        row = _from_entity(entity)
    except MalformedDocumentError:
        return
    assert isinstance(row.pid, int) and all(isinstance(t, str) for t in row.tasks)


@SETTINGS
@given(st.builds(ProcessorInfo, names, names, ints, names, ints, st.lists(names, max_size=3)))
def test_an_azure_registry_entity_round_trips(row: ProcessorInfo) -> None:
    assert _from_entity(_to_entity(row)) == row


# --- metadata documents as stored (JSON text) -------------------------------------------------------------------
@SETTINGS
@given(st.binary(max_size=40) | st.text(max_size=40) | json_values.map(json.dumps))
@example("[" * 100_000)  # nested past the JSON decoder's recursion limit
def test_a_stored_metadata_value_decodes_or_is_a_malformed_document(raw: str | bytes) -> None:
    try:
        decode_value("doc", raw)
    except MalformedDocumentError as exc:
        assert "doc" in str(exc)


# --- typed config values ----------------------------------------------------------------------------------------
TYPED_KEYS = {
    "str": "job.id",
    "int": "task.max.records.per.trigger",
    "bool": "task.stateless.merge",
    "list": "task.inputs",
    "duration_ms": "job.coordinator.poll.interval.ms",
}
config_values = st.text(max_size=24) | st.integers() | st.booleans() | st.lists(st.text(max_size=8), max_size=3)


@SETTINGS
@given(st.sampled_from(sorted(TYPED_KEYS)), config_values)
def test_a_typed_config_value_converts_or_is_a_config_error(kind: str, value: Any) -> None:
    key = TYPED_KEYS[kind]
    try:
        converted = Config.from_dict({"job.name": "j", key: value}).get(key)
    except ConfigError as exc:
        assert key in str(exc)
        return
    expected = {"str": str, "int": int, "bool": bool, "list": list, "duration_ms": int}[kind]
    assert isinstance(converted, expected)


@SETTINGS
@given(
    st.integers(min_value=0, max_value=10**12),
    st.sampled_from(["", "ms", "s", "m", "h"]),
    st.booleans(),
    st.lists(
        st.text(min_size=1, max_size=8).map(str.strip).filter(lambda t: t and "," not in t and "${" not in t),
        max_size=4,
    ),
)
def test_typed_config_values_round_trip(number: int, unit: str, flag: bool, items: list[str]) -> None:
    config = Config.from_dict(
        {
            "job.name": "j",
            TYPED_KEYS["int"]: str(number),
            TYPED_KEYS["duration_ms"]: f"{number}{unit}",
            TYPED_KEYS["bool"]: str(flag).lower(),
            TYPED_KEYS["list"]: ",".join(items),
        }
    )
    assert config.get(TYPED_KEYS["int"]) == number
    multiplier = {"": 1, "ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}[unit]
    assert config.get(TYPED_KEYS["duration_ms"]) == number * multiplier
    assert config.get(TYPED_KEYS["bool"]) is flag
    assert config.get(TYPED_KEYS["list"]) == items


# --- Kinesis positions ------------------------------------------------------------------------------------------
position_states = (
    st.sampled_from(["E", "@0", "@1763820000000"])
    | st.integers(0, 10**56).map(str)
    | st.tuples(st.integers(0, 10**56), st.integers(1, 2**40)).map(lambda t: positions.processed(str(t[0]), t[1]))
)


@SETTINGS
@given(st.text(max_size=40) | json_values.map(json.dumps))
def test_a_kinesis_position_decodes_or_is_an_invalid_offset(text: str) -> None:
    try:
        position = positions.decode(text)
    except InvalidOffsetError:
        return
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in position.items())


@SETTINGS
@given(st.dictionaries(names, position_states, max_size=4), st.dictionaries(names, position_states, max_size=4))
def test_kinesis_positions_round_trip_and_compare(a: dict[str, str], b: dict[str, str]) -> None:
    assert positions.decode(positions.encode(a)) == a
    assert positions.compare(positions.encode(a), positions.encode(a)) == 0
    assert positions.compare(positions.encode(a), positions.encode(b)) in (-1, 0, 1, None)


# --- keys in served tables' URLs --------------------------------------------------------------------------------
class RecordingTables:
    """Our `TableService` as `table_request` uses it: records the key it is asked for."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    async def get(self, table: str, key: str, hop: bool) -> Answer:
        self.keys.append(key)
        return Answer(200, b"{}")

    async def scan(self, *args: Any) -> Answer:
        return Answer(200, b"[]")


def serve(raw_path: bytes, query: bytes = b"") -> tuple[RecordingTables, dict[str, Any]]:
    tables = RecordingTables()
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"method": "GET", "headers": [], "path": "/", "raw_path": raw_path, "query_string": query}
    asyncio.run(table_request(tables, scope, send))  # type: ignore[arg-type]
    return tables, sent[0]


@SETTINGS
@given(st.binary(max_size=40), st.binary(max_size=20))
def test_a_served_table_url_is_answered_never_raising(tail: bytes, query: bytes) -> None:
    _, start = serve(b"/tables/t/" + tail if tail[:1] != b"?" else b"/tables/t" + tail, query)
    assert start["status"] in (200, 400)


@SETTINGS
@given(st.text(min_size=1, max_size=30).filter(lambda t: not any(0xD800 <= ord(c) <= 0xDFFF for c in t)))
def test_a_served_table_key_round_trips_through_its_url(key: str) -> None:
    tables, start = serve(b"/tables/t/" + quote(key, safe="").encode())
    assert start["status"] == 200
    assert tables.keys == [key]
