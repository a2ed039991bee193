"""`ReplayFilter` (weirflow/results/replay_filter.py): a reader of a job's outputs that feeds it every record in
the order it reads each partition handles every row exactly once, whatever the job's attempts re-sent, and never
drops a record for having the value of another."""

from __future__ import annotations

import json
import random
from collections import Counter
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weirflow.base.errors import ConfigError, InvalidArgumentError
from weirflow.config.loader import Config
from weirflow.results import ReplayFilter
from weirflow.results.ids import dead_letter_id, result_id, row_id
from weirflow.results.replay_filter import (
    EVENT_HUBS_ID_PROPERTY,
    KINESIS_ID_FIELD,
    SPARK_BATCH_ROWS,
    event_record_id,
    kinesis_record_id,
)

PARTITIONS = 2
VALUES = "ab"  # few values: many rows are equal to others and differ only by their ids

Record = tuple[int, str | None, str]  # (output partition, id, value) as a reader gets it
Send = list[Record]


def _outputs(lane: int, offset: int) -> list[tuple[int, str]]:
    """What a deterministic row-wise stage makes of input record ``offset`` of input partition ``lane``: 0 to 3
    rows, each bound for an output partition, with a value (a replay makes the same)."""
    rng = random.Random(lane * 1_000_003 + offset)
    return [(rng.randrange(PARTITIONS), rng.choice(VALUES)) for _ in range(rng.randrange(4))]


def _rows(stage: str, lane: int, start: int, end: int) -> list[Record]:
    """The rows of input records ``start`` to ``end`` of ``lane``, in place order, with their ids."""
    return [
        (partition, row_id(stage, lane, offset << 12, k), value)
        for offset in range(start, end)
        for k, (partition, value) in enumerate(_outputs(lane, offset))
    ]


def _attempts(
    rng: random.Random, stage: str, lane: int, length: int, send_rows: int, reorder: bool, zombies: bool = False
) -> list[Send]:
    """Every send of one input partition's attempts: each attempt starts at the last checkpoint and sends its
    batches' rows in place order, at most ``send_rows`` per send (each shuffled when ``reorder``: Kinesis's
    rounds and retries), and is killed now and then mid-batch or between a batch and its checkpoint. With
    ``zombies``, some sends a killed attempt had in flight land later, among the next attempt's (in their own
    order)."""
    sends: list[Send] = []
    in_flight: list[Send] = []
    checkpoint = 0
    while checkpoint < length:
        end = min(length, checkpoint + rng.randrange(1, 6))
        rows = _rows(stage, lane, checkpoint, end)
        batch = [rows[i : i + send_rows] for i in range(0, len(rows), send_rows)]
        for send in batch:
            if reorder:
                rng.shuffle(send)
        fate = rng.random()
        late, in_flight = in_flight, []
        if fate < 0.3:  # killed mid-batch: a prefix of its sends is durable
            cut = rng.randrange(len(batch) + 1)
            batch, rest = batch[:cut], batch[cut:]
            if zombies:
                in_flight = rest[: rng.randrange(len(rest) + 1)]
        while batch or late:  # the last attempt's late sends among this one's
            pick = late if late and (not batch or rng.random() < 0.5) else batch
            sends.append(pick.pop(0))
        if fate >= 0.6:  # the checkpoint got written; else the next attempt sends the batch again
            checkpoint = end
    return sends + in_flight


def _merge(rng: random.Random, streams: list[list[Record]]) -> list[Record]:
    """Writers' records as one stream holds them: each writer's in its own order, the writers mixed."""
    merged: list[Record] = []
    streams = [list(s) for s in streams if s]
    while streams:
        stream = rng.choice(streams)
        merged.append(stream.pop(0))
        if not stream:
            streams.remove(stream)
    return merged


def _expected(lanes: int, length: int) -> Counter[tuple[int, str | None, str]]:
    return Counter(r for lane in range(lanes) for r in _rows("views", lane, 0, length))


def _read(records: list[Record], flt: ReplayFilter) -> list[Record]:
    return [r for r in records if flt.is_new(r[0], r[1])]


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32), lanes=st.integers(1, 4), length=st.integers(1, 30), window=st.integers(1, 6))
def test_on_kinesis_every_row_is_read_once_however_each_send_was_reordered(
    seed: int, lanes: int, length: int, window: int
) -> None:
    """Sends of at most ``window`` rows, each reordered; input partitions written side by side."""
    rng = random.Random(seed)
    streams = [sum(_attempts(rng, "views", lane, length, window, reorder=True), []) for lane in range(lanes)]
    log = _merge(rng, streams)
    flt = ReplayFilter(window)
    taken = _read(log, flt)
    assert Counter(taken) == _expected(lanes, length)
    assert flt.replays == len(log) - len(taken)
    assert all(len(lane.members) <= window for lane in flt._lanes.values()), "more kept than the window"


def _ordered_log(rng: random.Random, lanes: int, length: int) -> list[Record]:
    """Sends in place order, a killed attempt's sends in flight landing among the next attempt's; dead letters
    (each sent twice), results and records without ids in between."""
    streams: list[list[Record]] = []
    for lane in range(lanes):
        sends = _attempts(rng, "views", lane, length, rng.randrange(1, 5), reorder=False, zombies=True)
        streams.append(sum(sends, []))
    letters = [(0, dead_letter_id("local.views.0", str(o)), "bad") for o in range(length) for _ in range(2)]
    results = [(1, result_id("counts-0", f"{i:x}.1.0.0.{i:x}", "0" * 16), "a") for i in range(length)]
    no_ids = [(0, None, "a")] * 3
    return _merge(rng, [*streams, letters, results, no_ids])


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32), lanes=st.integers(1, 4), length=st.integers(1, 30))
def test_on_an_ordered_system_a_mark_per_lane_reads_every_row_dead_letter_and_result_once(
    seed: int, lanes: int, length: int
) -> None:
    rng = random.Random(seed)
    log = _ordered_log(rng, lanes, length)
    taken = _read(log, ReplayFilter())
    expected = _expected(lanes, length)
    assert Counter(r for r in taken if r[1] and r[1].startswith("views/")) == expected
    assert Counter(r[1] for r in taken if r[2] == "bad") == Counter(
        dead_letter_id("local.views.0", str(o)) for o in range(length)
    )
    assert len([r for r in taken if r[1] and r[1].startswith("counts-0/")]) == length, "every result, all equal"
    assert len([r for r in taken if r[1] is None]) == 3, "records without ids all pass"


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**32), window=st.integers(1, 5), data=st.data())
def test_a_reader_starting_anywhere_drops_no_row_it_has_not_read_and_reads_none_twice(
    seed: int, window: int, data: st.DataObject
) -> None:
    rng = random.Random(seed)
    streams = [sum(_attempts(rng, "views", lane, 20, window, reorder=True), []) for lane in range(2)]
    log = _merge(rng, streams)
    start = data.draw(st.integers(0, len(log)))
    taken = _read(log[start:], ReplayFilter(window))
    first_after_start = {r for i, r in enumerate(log) if i >= start and r not in log[:start]}
    assert first_after_start <= set(taken), "a row first sent after the reader's start was dropped"
    assert max(Counter(taken).values(), default=1) == 1


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**32), window=st.integers(1, 5), data=st.data())
def test_a_filter_saved_and_restored_midway_answers_as_one_that_went_on(
    seed: int, window: int, data: st.DataObject
) -> None:
    rng = random.Random(seed)
    log = _merge(rng, [sum(_attempts(rng, "views", lane, 15, window, reorder=True), []) for lane in range(3)])
    cut = data.draw(st.integers(0, len(log)))
    whole, first = ReplayFilter(window), ReplayFilter(window)
    expected = [whole.is_new(p, i) for p, i, _ in log]
    before = [first.is_new(p, i) for p, i, _ in log[:cut]]
    second = ReplayFilter.from_state(json.loads(json.dumps(first.state())))
    after = [second.is_new(p, i) for p, i, _ in log[cut:]]
    assert before + after == expected
    assert second.replays == whole.replays


def test_the_log_really_holds_replays_and_equal_values_that_the_filter_tells_apart() -> None:
    rng = random.Random(5)
    log = _merge(rng, [sum(_attempts(rng, "views", lane, 40, 3, reorder=True), []) for lane in range(3)])
    expected = _expected(3, 40)
    assert len(log) > sum(expected.values()), "the scenario replayed nothing"
    values = Counter(value for _, _, value in expected.elements())
    assert all(n > 10 for n in values.values()), "few equal values"
    assert Counter(_read(log, ReplayFilter(3))) == expected


def test_a_window_smaller_than_a_send_drops_a_new_row_so_the_window_is_the_send_size() -> None:
    """A send of three rows of one lane, delivered in reverse: a window of 2 takes the first row for a replay."""
    rows = _rows("views", 0, 0, 12)[:3]
    assert len(rows) == 3
    reversed_send = rows[::-1]
    assert Counter(_read(reversed_send, ReplayFilter(3))) == Counter(rows)
    assert len(_read(reversed_send, ReplayFilter(2))) == 2
    assert len(_read(reversed_send, ReplayFilter(1))) == 1


def test_lanes_are_kept_per_partition_stage_and_input_partition() -> None:
    flt = ReplayFilter()
    assert flt.is_new(0, row_id("views", 1, 8192, 0))
    assert not flt.is_new(0, row_id("views", 1, 4096, 0)), "below the lane's mark"
    assert flt.is_new(1, row_id("views", 1, 4096, 0)), "another partition"
    assert flt.is_new(0, row_id("clicks", 1, 4096, 0)), "another stage"
    assert flt.is_new(0, row_id("views", 2, 4096, 0)), "another input partition"
    assert flt.is_new(0, row_id("views", 1, 8192, 1)), "the next row of the same input row"
    assert flt.replays == 1


def test_what_the_filter_cannot_order_passes() -> None:
    flt = ReplayFilter()
    for _ in range(2):
        assert flt.is_new(0, None)
        assert flt.is_new(0, "not an id of weirflow")
        assert flt.is_new(0, dead_letter_id("kin.views.0", "shardId-000000000001/4960"))  # Kinesis: positions
        assert flt.is_new(0, result_id("counts-0", "ab.1.0.0.0", "0" * 16))
    kinesis, letter = ReplayFilter(SPARK_BATCH_ROWS), dead_letter_id("x.views.0", "7")
    assert kinesis.is_new(0, letter) and kinesis.is_new(0, letter), "not bounded by a send"
    assert flt.replays == kinesis.replays == 0


def test_the_window_is_the_job_s_arrow_batch_on_an_unordered_system() -> None:
    def config(**values: object) -> Config:
        return Config.from_dict({"job.name": "j", **values}, source="job.yaml")

    assert ReplayFilter.for_job(config(), ordered=True).window == 1
    assert ReplayFilter.for_job(config(), ordered=False).window == SPARK_BATCH_ROWS == 10_000
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    assert ReplayFilter.for_job(config(**{key: 20}), ordered=False).window == 20
    assert ReplayFilter.for_job(config(**{key: "-1"}), ordered=False).window is None
    with pytest.raises(ConfigError, match=f"{key}.*'many'"):
        ReplayFilter.for_job(config(**{key: "many"}), ordered=False)
    with pytest.raises(InvalidArgumentError, match="window=0"):
        ReplayFilter(0)
    with pytest.raises(InvalidArgumentError, match="str or int"):
        flt = ReplayFilter()
        flt.is_new(("p", 0), row_id("views", 1, 0, 0))
        flt.state()


def test_the_adapters_read_the_ids_the_plugins_write() -> None:
    from azure.eventhub import EventData

    from weirflow_azure.eventhubs.clients import RECORD_ID_PROPERTY
    from weirflow_kinesis.producer import _with_id
    from weirflow_kinesis.settings import KinesisSettings

    assert EVENT_HUBS_ID_PROPERTY == RECORD_ID_PROPERTY
    assert KINESIS_ID_FIELD == KinesisSettings.record_id_field
    the_id = row_id("views", 3, 4096, 0)

    sent = EventData(b'{"page": "/a"}')
    sent.properties = {RECORD_ID_PROPERTY: the_id}
    received = SimpleNamespace(properties={RECORD_ID_PROPERTY.encode(): the_id.encode()})  # as the SDK gives it
    assert event_record_id(sent) == event_record_id(received) == the_id
    assert event_record_id(EventData(b"x")) is None and event_record_id(object()) is None

    from weirflow.interfaces.system import OutgoingRecord

    written = OutgoingRecord("s", b'{"page": "/a", "weirflow_id": "mine"}', id=the_id)
    data = _with_id(written, KINESIS_ID_FIELD).value
    assert kinesis_record_id({"Data": data, "PartitionKey": "k"}) == the_id, "the last field wins, as written"
    assert kinesis_record_id({"Data": b"[1]"}) is None and kinesis_record_id({"Data": b"\xff"}) is None
    assert kinesis_record_id({}) is None and kinesis_record_id({"Data": data}, id_field="") is None

    flt = ReplayFilter()
    assert flt.is_new_event("0", received) and not flt.is_new_event("0", received)
    assert flt.is_new_kinesis_record("shardId-0", {"Data": data})
    assert not flt.is_new_kinesis_record("shardId-0", {"Data": data})
    assert flt.is_new_kinesis_record("shardId-1", {"Data": data}), "another shard"
