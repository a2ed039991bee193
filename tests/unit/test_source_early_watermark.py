"""A stateful task's read of an intermediate stream moves Spark's watermark in the batch that read the
producers' watermark messages (`BatchReader._early_watermark`), on the embedded log and its checkpoint store:
the reconciled minimum over producers and partitions, from the task's checkpointed control state plus what the
read heard, never ahead of it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import types as T

from weirflow.config.loader import Config
from weirflow.interfaces.checkpoint import Checkpoint
from weirflow.interfaces.plugins import checkpoint_factory
from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.job.systems import Systems
from weirflow.runtime.control import MAX_TIMESTAMP_MS, ControlMessage, MessageType, TaskControl
from weirflow.spark import source
from weirflow.spark.batch_reader import BatchReader

KEYS = ["local.mid.0", "local.mid.1"]
TASK = "counts-0"
DELAY_MS = 1000


def _watermark(producer: str, ms: int, count: int = 2) -> bytes:
    return ControlMessage(MessageType.WATERMARK, producer, count, ms).encode()


@pytest.fixture
def config(tmp_path: Path) -> Config:
    config = Config.from_dict({"job.name": "early", "job.state.dir": str(tmp_path / "state")})
    systems = Systems(config)
    try:
        systems.admin("local").create_stream(StreamSpec("mid", 2))
    finally:
        systems.close()
    return config


def _send(config: Config, partition: int, messages: list[bytes]) -> None:
    systems = Systems(config)
    try:
        systems.producer("local").send([OutgoingRecord("mid", m, partition=partition) for m in messages])
    finally:
        systems.close()


def _store(config: Config, control: TaskControl) -> None:
    manager = checkpoint_factory(config).get_checkpoint_manager(config)
    manager.start()
    try:
        offsets = {SystemStreamPartition.parse(k): "0" for k in KEYS}
        manager.write_checkpoint(TASK, Checkpoint(offsets=offsets, control=control.to_json()))
    finally:
        manager.stop()


def _reader(config: Config, inject: str = TASK, run_id: str = "r1") -> BatchReader:
    options = {
        "config": config.snapshot(),
        "stream": "mid",
        "tasks": json.dumps({k: TASK for k in KEYS}),
        "inject": inject,
        "system": "local",
        "physical": "mid",
        "ssps": json.dumps(KEYS),
        "start": "{}",
        "serde": "json",
        "user_schema": json.dumps(T.StructType([T.StructField("n", T.LongType())]).jsonValue()),
        "event_time_field": "t",
        "event_time_from_record": "true",
        "delay_ms": str(DELAY_MS),
        "intermediate": "true",
        "bounded": "false",
        "max_records": "10",
        "run_id": run_id,
    }
    return BatchReader(source.SourceSpec(options))


def _injected(reader: BatchReader, planned: tuple[Any, ...]) -> list[tuple[int, int]]:
    """(``__wm_time`` in ms, ``ctl_ms``) of the ``inject`` rows one planned read yields."""
    rows = []
    for batch in reader.read(planned):
        for wm, ctl in zip(batch.column("__wm_time").to_pylist(), batch.column("__ctl").to_pylist(), strict=True):
            if ctl is not None and ctl["kind"] == "inject":
                rows.append((int(wm.timestamp() * 1000), int(ctl["ctl_ms"])))
    return rows


def test_a_read_moves_spark_to_the_minimum_over_producers_and_partitions(config: Config) -> None:
    _send(config, 0, [_watermark("views-0", 5_000), _watermark("views-1", 7_000)])
    _send(config, 1, [_watermark("views-0", 6_000), _watermark("views-1", 4_000)])
    group = ("group", (("ssp", KEYS[0], "0", "2", ""), ("ssp", KEYS[1], "0", "2", "")))
    rows = _injected(_reader(config), group)
    # partition 0 alone knows its watermark (5 s) but not partition 1's yet: nothing; then min(5 s, 4 s)
    assert rows == [(4_000 + DELAY_MS, 4_000)], "the row's event time is the watermark plus the lateness"


def test_the_checkpointed_state_completes_what_the_read_heard(config: Config) -> None:
    stored = TaskControl()
    stored.stream("mid").apply(KEYS[1], ControlMessage(MessageType.WATERMARK, "views-0", 2, 9_000))
    stored.stream("mid").apply(KEYS[1], ControlMessage(MessageType.WATERMARK, "views-1", 2, 8_000))
    stored.stream("mid").apply(KEYS[0], ControlMessage(MessageType.WATERMARK, "views-1", 2, 3_000))
    _store(config, stored)
    _send(config, 0, [_watermark("views-0", 10_000), _watermark("views-1", 11_000)])
    assert _injected(_reader(config), ("ssp", KEYS[0], "0", "2", "")) == [(8_000 + DELAY_MS, 8_000)]


def test_nothing_moves_while_a_producer_has_not_reported(config: Config) -> None:
    _send(config, 0, [_watermark("views-0", 10_000)])
    _send(config, 1, [_watermark("views-0", 10_000), _watermark("views-1", 10_000)])
    assert _injected(_reader(config), ("ssp", KEYS[0], "0", "1", "")) == []
    assert _injected(_reader(config), ("ssp", KEYS[1], "0", "2", "")) == [], "partition 0 lacks views-1"


def test_ended_producers_count_as_the_end_of_time(config: Config) -> None:
    for partition in (0, 1):
        _send(config, partition, [ControlMessage(MessageType.END_OF_STREAM, p, 2, 0).encode() for p in ("a", "b")])
    group = ("group", (("ssp", KEYS[0], "0", "2", ""), ("ssp", KEYS[1], "0", "2", "")))
    assert _injected(_reader(config), group) == [(MAX_TIMESTAMP_MS + DELAY_MS, MAX_TIMESTAMP_MS)]


def test_the_state_of_a_task_drained_in_another_deployment_is_not_used(config: Config) -> None:
    old = TaskControl(drained="r0")
    for key in KEYS:
        old.stream("mid").apply(key, ControlMessage(MessageType.DRAIN, "views-0", 2, MAX_TIMESTAMP_MS, "r0"))
        old.stream("mid").apply(key, ControlMessage(MessageType.DRAIN, "views-1", 2, MAX_TIMESTAMP_MS, "r0"))
    _store(config, old)
    for partition in (0, 1):
        _send(config, partition, [_watermark("views-0", 2_000), _watermark("views-1", 2_000)])
    group = ("group", (("ssp", KEYS[0], "0", "2", ""), ("ssp", KEYS[1], "0", "2", "")))
    assert _injected(_reader(config, run_id="r1"), group) == [(2_000 + DELAY_MS, 2_000)], (
        "r0's drains say nothing of r1: its watermark is what r1's producers sent, not the end of time"
    )


def test_a_stateless_stages_read_moves_nothing(config: Config) -> None:
    _send(config, 0, [_watermark("views-0", 1_000, count=1)])
    _send(config, 1, [_watermark("views-0", 1_000, count=1)])
    group = ("group", (("ssp", KEYS[0], "0", "1", ""), ("ssp", KEYS[1], "0", "1", "")))
    assert _injected(_reader(config, inject=""), group) == []
