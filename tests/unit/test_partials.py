"""Partial aggregates between stages (weirflow/spark/partials.py): a consumer that takes records by the marks of
weirflow/spark/replay.py counts every row exactly once, whatever the producer's batch cuts, kills and restarts,
as long as a start that may replay sends rows until it has read past where its input ended when it began."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weirflow.base.errors import PipelineError
from weirflow.spark.drain_cut import cut_past_written, furthest_written
from weirflow.spark.partials import (
    MAX_PARTIALS_PER_RECORD,
    BatchMode,
    Partial,
    PartialSpec,
    combine,
    combine_batch,
)
from weirflow.spark.replay import POS, PSS, K, Marks, pss

SPEC = PartialSpec(
    keys=("page", "window"),
    time="event_time",
    partials=(Partial("views", "count"), Partial("spent", "sum"), Partial("first", "min"), Partial("last", "max")),
)
PARTITIONS = 3  # intermediate partitions
INPUTS = 2  # input partitions, one producer task each
CODE = 300  # the input's code in __pss


def _row(source: int, offset: int) -> dict[str, int | str]:
    """Input row ``offset`` of input partition ``source``, as a partial of its own; rows of a window are
    spread over about 7 offsets, with some out of order."""
    rng = random.Random(source * 7919 + offset)
    window = max(0, offset // 7 - rng.randrange(2))
    value = rng.randrange(100)
    return {
        "page": f"/p{rng.randrange(4)}",
        "window": window,
        "event_time": window * 60 + rng.randrange(60),
        "views": 1,
        "spent": value,
        "first": value,
        "last": value,
        PSS: pss(CODE, source),
        POS: offset * 4096,
    }


def _batch(source: int, start: int, end: int) -> pa.Table:
    rows = [_row(source, offset) for offset in range(start, end)]
    table = pa.Table.from_pylist(rows)
    partitions = [hash_page(r["page"]) for r in rows]
    return table.append_column("__partition", pa.array(partitions, pa.int32()))


def hash_page(page: object) -> int:
    return int(str(page)[2:]) % PARTITIONS


def _expected(ends: list[int]) -> dict[tuple[str, int], tuple[int, int, int, int]]:
    groups: dict[tuple[str, int], list[int]] = {}
    for source in range(INPUTS):
        for offset in range(ends[source]):
            row = _row(source, offset)
            groups.setdefault((str(row["page"]), int(row["window"])), []).append(int(row["spent"]))
    return {key: (len(v), sum(v), min(v), max(v)) for key, v in groups.items()}


@dataclass
class World:
    """The intermediate stream (records per partition, each appended whole) and the producers' checkpoints."""

    log: list[list[pa.Table]] = field(default_factory=lambda: [[] for _ in range(PARTITIONS)])
    checkpoint: list[int] = field(default_factory=lambda: [0] * INPUTS)
    clean: list[bool] = field(default_factory=lambda: [True] * INPUTS)
    until: list[int | None] = field(default_factory=lambda: [None] * INPUTS)  # checkpointed with the offsets


class Killed(Exception):
    pass


def _attempt(
    world: World,
    source: int,
    available: list[int],
    rng: random.Random,
    rows_on_replay: bool,
    final: bool,
    grows: bool = True,
) -> None:
    """One attempt at ``source``: starts at its checkpoint, reads batches of random size up to what is
    available (which grows, unless a drain's cut bounds it), writes each batch's pieces (a kill may strike
    before any record), lets its checkpoint lag behind Spark's commits, and ends killed, stopped cleanly, or
    (``final``) at the input's end."""
    start = world.checkpoint[source]
    code = pss(CODE, source)
    bound = world.until[source] if world.clean[source] else available[source]
    mode = BatchMode({code: bound * 4096} if rows_on_replay and bound is not None else {})
    world.clean[source] = False  # the claim
    world.until[source] = bound
    position = start
    committed: list[int] = []
    while position < available[source]:
        end = min(available[source], position + rng.randrange(1, 12))
        rows = _batch(source, position, end)
        pieces = list(combine_batch(rows, SPEC, "__partition", mode))
        rng.shuffle(pieces)  # partitions are written in any order; each piece's records in order
        for piece in pieces:
            records = [piece.rows] if piece.combined else _split(piece.rows, rng)
            for record in records:
                if not final and rng.random() < 0.03:
                    raise Killed
                world.log[piece.partition].append(record)
        committed.append(end)
        position = end
        if rng.random() < 0.6:  # the checkpoint of the latest committed batch (it may lag behind)
            _checkpoint(world, source, committed[-1])
        if rng.random() < 0.3 and grows:
            available[source] = min(available[source] + rng.randrange(0, 15), 120)
        if not final and rng.random() < 0.05:  # a clean stop: the last batch checkpointed, nothing past it
            _checkpoint(world, source, committed[-1])
            world.clean[source] = True
            return
    if committed:
        _checkpoint(world, source, committed[-1])


def _checkpoint(world: World, source: int, offset: int) -> None:
    """The offsets, with the bound below which a start sends rows for as long as it lies ahead of them: a
    clean stop before the bound was passed leaves earlier attempts' writes past its offsets."""
    world.checkpoint[source] = offset
    until = world.until[source]
    world.until[source] = until if until is not None and until > offset else None


def _split(rows: pa.Table, rng: random.Random) -> list[pa.Table]:
    pieces, at = [], 0
    while at < rows.num_rows:
        size = rng.randrange(1, 4)
        pieces.append(rows.slice(at, size))
        at += size
    return pieces


def _consume(world: World) -> dict[tuple[str, int], tuple[int, int, int, int]]:
    totals: dict[tuple[str, int], list[int]] = {}
    for partition in range(PARTITIONS):
        marks = Marks(at="0")
        for record in world.log[partition]:
            keep = marks.admit("page_views", record)
            taken = record if keep is None else record.filter(keep)
            for row in taken.to_pylist():
                key = (str(row["page"]), int(row["window"]))
                n, s, lo, hi = totals.get(key, [0, 0, 1 << 30, -1])
                totals[key] = [n + row["views"], s + row["spent"], min(lo, row["first"]), max(hi, row["last"])]
    return {key: (v[0], v[1], v[2], v[3]) for key, v in totals.items()}


def _killed_and_stopped(seed: int, rows_on_replay: bool) -> tuple[random.Random, World, list[int]]:
    """A few attempts at random producers, each ending killed or stopped cleanly: the random source, the world
    they left and the input available."""
    rng = random.Random(seed)
    world = World()
    available = [rng.randrange(5, 40) for _ in range(INPUTS)]
    for _ in range(rng.randrange(1, 8)):
        source = rng.randrange(INPUTS)
        try:
            _attempt(world, source, available, rng, rows_on_replay, final=False)
        except Killed:
            pass
    return rng, world, available


def _run(seed: int, rows_on_replay: bool) -> tuple[dict, dict]:
    rng, world, available = _killed_and_stopped(seed, rows_on_replay)
    for source in range(INPUTS):
        _attempt(world, source, available, rng, rows_on_replay, final=True)
    return _consume(world), _expected(available)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_every_row_counted_once_through_kills_and_restarts(seed: int) -> None:
    got, expected = _run(seed, rows_on_replay=True)
    assert got == expected


def test_partials_on_replay_count_rows_twice() -> None:
    """The rule is what keeps it exact: replays that send partials sum ranges that overlap ones taken."""
    wrong = sum(_run(seed, rows_on_replay=False)[0] != _run(seed, rows_on_replay=False)[1] for seed in range(60))
    assert wrong > 0


def _drained(seed: int, past_written: bool) -> tuple[dict, dict]:
    """Attempts with kills and clean stops, then a drain: each task's next holder cuts its input where its
    checkpoint is, or (``past_written``) past what earlier attempts wrote to the intermediate stream, by the
    consumers' marks (`weirflow.spark.drain_cut`), and reads up to the cut. Returns what the consumers count
    and pandas' count of the input up to the cuts."""
    rng, world, available = _killed_and_stopped(seed, rows_on_replay=True)
    written: dict[int, int] = {}
    for partition in range(PARTITIONS):
        marks = Marks(at="0")
        for record in world.log[partition]:
            marks.admit("page_views", record)
        for source, end in furthest_written(marks, "page_views", CODE).items():
            written[source] = max(written.get(source, 0), end)
    cut = [
        cut_past_written({"k": world.checkpoint[s]}, written if past_written else {}, lambda _k, s=s: s)["k"]
        for s in range(INPUTS)
    ]
    assert all(world.checkpoint[s] <= cut[s] <= available[s] for s in range(INPUTS))
    for source in range(INPUTS):
        _attempt(world, source, list(cut), rng, True, final=True, grows=False)
    return _consume(world), _expected(cut)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_a_drain_after_kills_counts_exactly_its_input_up_to_the_cut(seed: int) -> None:
    got, expected = _drained(seed, past_written=True)
    assert got == expected


def test_a_drain_cut_at_the_checkpoint_counts_what_a_killed_batch_wrote_past_it() -> None:
    """The negative control: cut where the new holder's checkpoint is, rows a killed attempt wrote past it are
    counted, and their input lies past the cut, where the next deployment counts it again."""
    runs = (_drained(seed, past_written=False) for seed in range(60))
    wrong = sum(got != expected for got, expected in runs)
    assert wrong > 0


def test_a_batch_sends_one_record_per_input_and_intermediate_partition() -> None:
    rows = pa.concat_tables([_batch(0, 0, 40), _batch(1, 10, 30)])
    pieces = list(combine_batch(rows, SPEC, "__partition", BatchMode({pss(CODE, 1): 40 * 4096})))
    combined = [p for p in pieces if p.combined]
    assert {(p.partition, p.pss) for p in combined} == {
        (p, pss(CODE, 0)) for p in {hash_page(r["page"]) for r in rows.slice(0, 40).to_pylist()}
    }
    for piece in combined:  # all at the batch's last position of the input, counted by __k
        assert set(piece.rows.column(POS).to_pylist()) == {39 * 4096}
        assert piece.rows.column(K).to_pylist() == list(range(piece.rows.num_rows))
    assert sum(p.rows.num_rows for p in pieces if not p.combined) == 20  # input 1 sends its rows
    views = sum(sum(p.rows.column("views").to_pylist()) for p in pieces)
    assert views == 60


def test_combine_merges_by_kind_and_keeps_the_latest_event_time() -> None:
    rows = pa.Table.from_pylist(
        [
            {
                "page": "/a",
                "window": 1,
                "event_time": 65,
                "views": 1,
                "spent": 5,
                "first": 5,
                "last": 5,
                PSS: 7,
                POS: 0,
            },
            {
                "page": "/a",
                "window": 1,
                "event_time": 99,
                "views": 1,
                "spent": 2,
                "first": 2,
                "last": 2,
                PSS: 7,
                POS: 1,
            },
            {
                "page": "/b",
                "window": 1,
                "event_time": 70,
                "views": 3,
                "spent": 9,
                "first": 1,
                "last": 8,
                PSS: 7,
                POS: 2,
            },
        ]
    )
    merged = combine(rows, SPEC).to_pylist()
    assert [(r["page"], r["views"], r["spent"], r["first"], r["last"], r["event_time"]) for r in merged] == [
        ("/a", 2, 7, 2, 5, 99),
        ("/b", 3, 9, 1, 8, 70),
    ]


def test_too_many_groups_for_one_record_go_as_rows() -> None:
    n = MAX_PARTIALS_PER_RECORD + 1
    rows = pa.table(
        {
            "page": [f"/{i}" for i in range(n)],
            "window": [0] * n,
            "event_time": [1] * n,
            "views": [1] * n,
            "spent": [1] * n,
            "first": [1] * n,
            "last": [1] * n,
            PSS: [5] * n,
            POS: list(range(n)),
            "__partition": [0] * n,
        }
    )
    (piece,) = combine_batch(rows, SPEC, "__partition", BatchMode({}))
    assert not piece.combined and piece.rows.num_rows == n


def test_a_replay_sends_rows_until_it_passed_where_its_input_ended() -> None:
    mode = BatchMode({7: 10 * 4096})
    assert not mode.may_combine(7, 9 * 4096)
    assert mode.may_combine(7, 10 * 4096)
    assert mode.may_combine(8, 0)  # a partition without a bound: no earlier attempt to meet
    below = _batch(0, 9, 14).set_column(7, PSS, pa.array([7] * 5, pa.int64()))  # starts below the bound
    past = _batch(0, 10, 15).set_column(7, PSS, pa.array([7] * 5, pa.int64()))
    assert not any(p.combined for p in combine_batch(below, SPEC, "__partition", mode))
    assert all(p.combined for p in combine_batch(past, SPEC, "__partition", mode))
    assert not any(p.combined for p in combine_batch(past, SPEC, "__partition", None))  # None: rows only


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(PipelineError, match="kind 'median'"):
        Partial("x", "median")
