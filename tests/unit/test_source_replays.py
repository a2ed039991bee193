"""The Spark source's reads of an intermediate stream drop rows a replay wrote again (weirflow/spark/replay.py),
on the embedded log: within a read, across reads through the marks cache, and in a read that starts where no
cache is (another machine) from the marks in the task's checkpoint, read forward to its start."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from weirflow.config.loader import Config
from weirflow.interfaces.checkpoint import Checkpoint
from weirflow.interfaces.plugins import checkpoint_factory
from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.job.systems import Systems
from weirflow.runtime.control import encode_rows
from weirflow.spark import source
from weirflow.spark.batch_reader import BatchReader
from weirflow.spark.replay import POS, PRODUCER_KEY, PSS, K

KEY = "local.mid.0"
TASK = "counts-0"


def _packed(values: list[int], first_offset: int, producer: str = "views") -> bytes:
    """One packed record of rows ``values`` made from input rows ``first_offset``, ``first_offset + 1``, ..."""
    schema = pa.schema(
        [("n", pa.int64()), (PSS, pa.int32()), (POS, pa.int64()), (K, pa.int32())],
        metadata={PRODUCER_KEY: producer.encode()},
    )
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array(values, pa.int64()),
            pa.array([0] * len(values), pa.int32()),
            pa.array([(first_offset + i) << 12 for i in range(len(values))], pa.int64()),
            pa.array([0] * len(values), pa.int32()),
        ],
        schema=schema,
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_batch(batch)
    return encode_rows(sink.getvalue().to_pybytes())


@pytest.fixture
def config(tmp_path: Path) -> Config:
    config = Config.from_dict({"job.name": "replays", "job.state.dir": str(tmp_path / "state")})
    systems = Systems(config)
    try:
        systems.admin("local").create_stream(StreamSpec("mid", 1))
        records = [
            _packed([0, 1, 2], 0),  # offset 0: the first attempt
            _packed([3, 4], 3),  # 1
            _packed([0, 1, 2, 3], 0),  # 2: a replay from the checkpoint at 0, one row further
            _packed([4, 5, 6], 4),  # 3
            _packed([5, 6, 7], 5),  # 4: another replay
        ]
        systems.producer("local").send([OutgoingRecord("mid", r, partition=0) for r in records])
    finally:
        systems.close()
    return config


def _reader(config: Config, marks_dir: Path, fence: str = "") -> Any:
    options = {
        "config": config.snapshot(),
        "stream": "mid",
        "tasks": json.dumps({KEY: TASK}),
        "system": "local",
        "physical": "mid",
        "ssps": json.dumps([KEY]),
        "start": "{}",
        "serde": "json",
        "user_schema": json.dumps(T.StructType([T.StructField("n", T.LongType())]).jsonValue()),
        "event_time_field": "t",
        "event_time_from_record": "true",
        "delay_ms": "0",
        "intermediate": "true",
        "bounded": "false",
        "max_records": "10",
        "run_id": "r1",
        "marks_dir": str(marks_dir),
        "fence": fence,
    }
    return BatchReader(source.SourceSpec(options))


def _read(config: Config, marks_dir: Path, start: int, end: int) -> tuple[list[int], list[dict[str, Any]]]:
    """(the data rows' ``n``, the control rows) of one planned read of offsets [start, end)."""
    batches = list(_reader(config, marks_dir).read(("ssp", KEY, str(start), str(end), "")))
    values, controls = [], []
    for batch in batches:
        for ctl, n in zip(batch.column("__ctl").to_pylist(), batch.column("n").to_pylist(), strict=True):
            if ctl is None:
                values.append(n)
            else:
                controls.append(ctl)
    return values, controls


def test_replayed_rows_are_dropped_within_a_read_and_across_reads(config: Config, tmp_path: Path) -> None:
    marks_dir = tmp_path / "marks"
    first, controls = _read(config, marks_dir, 0, 3)
    assert first == [0, 1, 2, 3, 4]
    (marks,) = [c for c in controls if c["kind"] == "marks"]
    detail = json.loads(marks["detail"])
    assert detail["at"] == "3" and detail["dropped"] == 4 and detail["m"] == {"views|0": [4 << 12, 0]}
    second, _ = _read(config, marks_dir, 3, 5)
    assert second == [5, 6, 7], "the next read starts from the marks the last one ended with"
    again, _ = _read(config, marks_dir, 3, 5)
    assert again == [5, 6, 7], "Spark's replay of the last read drops the same rows"


def test_a_read_without_a_cache_starts_from_the_checkpoints_marks_read_forward(
    config: Config, tmp_path: Path
) -> None:
    manager = checkpoint_factory(config).get_checkpoint_manager(config)
    manager.start()
    try:
        ssp = SystemStreamPartition.parse(KEY)
        control = {"marks": {KEY: {"at": "1", "m": {"views|0": [2 << 12, 0]}}}}
        manager.write_checkpoint(TASK, Checkpoint(offsets={ssp: "1"}, control=control))
    finally:
        manager.stop()
    values, _ = _read(config, tmp_path / "another-machine", 3, 5)
    assert values == [5, 6, 7], "the marks at 1 were brought forward over offsets 1 and 2 before the read"


def test_rows_of_another_producer_stage_are_not_replays(config: Config, tmp_path: Path) -> None:
    systems = Systems(config)
    try:
        systems.producer("local").send([OutgoingRecord("mid", _packed([100], 0, producer="clicks"), partition=0)])
    finally:
        systems.close()
    values, _ = _read(config, tmp_path / "marks", 0, 6)
    assert values == [0, 1, 2, 3, 4, 5, 6, 7, 100]


def _of_another_version() -> bytes:
    """A packed record of another pipeline version: rows without the stream's column ``n``."""
    schema = pa.schema([("m", pa.string())])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_batch(pa.RecordBatch.from_arrays([pa.array(["old"])], schema=schema))
    return encode_rows(sink.getvalue().to_pybytes())


def test_packed_rows_of_another_pipeline_version_become_dead_letters(config: Config, tmp_path: Path) -> None:
    systems = Systems(config)
    try:
        systems.admin("local").create_stream(StreamSpec("mid.dlq", 1))
        systems.producer("local").send([OutgoingRecord("mid", _of_another_version(), partition=0)])
        values, controls = _read(config, tmp_path / "marks", 0, 6)
        assert values == [0, 1, 2, 3, 4, 5, 6, 7], "the task goes on past the record instead of failing"
        assert [c["task_count"] for c in controls if c["kind"] == "dlq"] == [1]
        letters = systems.consumer("local").read(SystemStreamPartition("local", "mid.dlq", 0), "0", 10)
    finally:
        systems.close()
    assert len(letters) == 1
    letter = json.loads(letters[0].value)
    assert "lack column(s) n" in letter["error"] and letter["offset"] == "5"


def test_a_reader_whose_processor_lost_the_task_sends_no_dead_letter(config: Config, tmp_path: Path) -> None:
    """Dead letters are sent fenced, as the sink's records are: a reader of a query whose processor no longer
    holds the task's lock (here: its keeper published no deadline for it) sends none and fails the read."""
    from weirflow.base.errors import LockLostError
    from weirflow.spark import fence

    systems = Systems(config)
    try:
        systems.admin("local").create_stream(StreamSpec("mid.dlq", 1))
        systems.producer("local").send([OutgoingRecord("mid", _of_another_version(), partition=0)])
        lost = fence.encode([fence.LockRef("task-counts-0", "p0", "", 1)], tmp_path / "leases.json")
        with pytest.raises(LockLostError):
            list(_reader(config, tmp_path / "marks", lost).read(("ssp", KEY, "0", "6", "")))
        assert systems.consumer("local").read(SystemStreamPartition("local", "mid.dlq", 0), "0", 10) == []
    finally:
        systems.close()
