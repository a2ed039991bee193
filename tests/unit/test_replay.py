"""Row positions and replay marks (weirflow/spark/replay.py): a consumer that reads every attempt a producer
made, in stream order, takes each row exactly once."""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weirflow.spark.replay import (
    POS,
    PSS,
    K,
    Marks,
    MarksCache,
    input_codes,
    input_partition,
    lane_pss,
    output_index,
    pss,
    strip,
)

PARTITIONS = 3


def _record(rows: list[tuple[int, int, int, str]]) -> pa.Table:
    pss_values, pos, k, payload = zip(*rows, strict=True)
    return pa.table(
        {
            "payload": pa.array(payload),
            PSS: pa.array(pss_values, pa.int64()),
            POS: pa.array(pos, pa.int64()),
            K: pa.array(k, pa.int32()),
        }
    )


def _outputs(source: int, offset: int, tag: str = "") -> list[tuple[int, str]]:
    """What a deterministic row-wise transform makes of input row ``offset`` of input partition ``source``
    (``tag``: of which input): 0 to 3 rows, each bound for a partition of the intermediate stream."""
    rng = random.Random(source * 1_000_003 + offset)
    return [(rng.randrange(PARTITIONS), f"{tag}{source}:{offset}:{j}") for j in range(rng.randrange(4))]


Send = tuple[int, list[tuple[int, int, int, str]]]  # (intermediate partition, rows (pss, pos, k, payload))


def _sends(rng: random.Random, rows: list[tuple[int, int, int, int, str]]) -> list[Send]:
    """A batch's rows as its writer sends them: per partition, in order, in pieces of 1 to 3 rows."""
    sends: list[Send] = []
    for partition in range(PARTITIONS):
        mine = [r[1:] for r in rows if r[0] == partition]
        while mine:
            size = rng.randrange(1, 4)
            sends.append((partition, mine[:size]))
            mine = mine[size:]
    return sends


def _interleave(rng: random.Random, sends: list[Send], late: list[Send]) -> list[Send]:
    """Two writers' sends as they land: each in its own order, the two mixed at random."""
    merged: list[Send] = []
    while sends or late:
        pick = late if late and (not sends or rng.random() < 0.5) else sends
        merged.append(pick.pop(0))
    return merged


# The shapes a stage's transform may have, as the sink sees its rows (`weirflow.spark.query` decides which
# keep positions: docs/guarantees.md, "What a stage must be for positions to hold").
ROW_WISE_SHAPES = ("rows", "keeps_order")  # selects, filters, explodes; a map declared order-keeping
FALLBACK_SHAPES = ("union", "reorder")  # a self-union; a map that may reorder its rows


def _made(shape: str, source: int, offset: int, tag: str) -> list[tuple[str, int, str]]:
    """The rows a stage of ``shape`` makes of one input row: (branch, intermediate partition, payload)."""
    outputs = _outputs(source, offset, tag)
    if shape == "keeps_order":  # a map that drops some rows and doubles others, in their order
        kept = [o for j, o in enumerate(outputs) if (offset + j) % 3]
        return [("", partition, f"{payload}{copy}") for partition, payload in kept for copy in ("", "+")]
    if shape == "union":  # df.select(..., lit("a")).unionByName(df.select(..., lit("b")))
        return [(branch, partition, f"{branch}{payload}") for branch in "ab" for partition, payload in outputs]
    return [("", partition, payload) for partition, payload in outputs]


def _writers(shape: str, made: list[tuple[int, int, str, str, int]]) -> list[list[tuple[int, int, int, str]]]:
    """A batch's rows (branch, partition, pss, pos, payload), in input order, as its sink writers write them
    (partition, pss, pos, payload): one writer, but a union's branches are separate Spark partitions, so
    separate writers, and a reordering map writes them in another order."""
    rows = [(partition, place, pos, payload) for _, partition, place, pos, payload in made]
    if shape == "union":
        return [[(p, s, q, v) for b, p, s, q, v in made if b == branch] for branch in "ab"]
    if shape == "reorder":  # e.g. a mapInPandas that sorts what it returns
        return [sorted(rows, key=lambda row: row[3])]
    return [rows]


def _indexed(writer: list[tuple[int, int, int, str]]) -> list[tuple[int, int, int, int, str]]:
    """The writer's rows with ``__k`` as the sink gives it (`output_index`, each writer afresh)."""
    if not writer:
        return []
    k = output_index(np.array([r[1] for r in writer]), np.array([r[2] for r in writer]), None)
    return [
        (partition, place, pos, int(index), payload)
        for (partition, place, pos, payload), index in zip(writer, k, strict=True)
    ]


def _run(
    seed: int,
    sources: int,
    length: int,
    place: Callable[[int], int] = lambda source: pss(0, source),
    tags: Callable[[int], str] = lambda source: "",
    base: Callable[[int], int] = lambda source: 0,
    shape: str = "rows",
) -> tuple[dict[int, list[pa.Table]], dict[int, list[str]]]:
    """Producer tasks, one per input partition, each killed now and then mid-batch or between its batch and
    its checkpoint, and resumed from the checkpoint by another attempt while the killed one may still deliver
    some of its last sends (a zombie: in its own order, interleaved with the new attempt's). ``place`` gives
    the ``__pss`` of a source's rows, ``tags`` what tells its payloads apart from other inputs', ``base`` the
    offset its first row is at (an input read on after an upgrade continues its stream), ``shape`` the
    stage's transform (`_made`, `_writers`). Returns each intermediate partition's records in stream order,
    and what it must hold."""
    rng = random.Random(seed)
    logs: dict[int, list[pa.Table]] = {p: [] for p in range(PARTITIONS)}
    expected: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    for source in range(sources):
        for offset in range(length):
            for _, partition, payload in _made(shape, source, offset, tags(source)):
                expected[partition].append(payload)
    checkpoints = dict.fromkeys(range(sources), 0)
    zombies: dict[int, list[Send]] = {}
    while any(c < length for c in checkpoints.values()):
        source = rng.choice([s for s, c in checkpoints.items() if c < length])
        start = checkpoints[source]
        end = min(length, start + rng.randrange(1, 6))
        made = [
            (branch, partition, place(source), (base(source) + offset) << 12, payload)
            for offset in range(start, end)
            for branch, partition, payload in _made(shape, source, offset, tags(source))
        ]
        sends: list[Send] = []
        for writer in _writers(shape, made):  # several writers' sends land interleaved, each in its order
            sends = _interleave(rng, sends, _sends(rng, _indexed(writer)))
        fate = rng.random()
        if fate < 0.3:  # killed mid-batch: a prefix of the sends is durable, some of the rest arrive later
            cut = rng.randrange(len(sends) + 1)
            sends, rest = sends[:cut], sends[cut:]
            zombies[source] = rest[: rng.randrange(len(rest) + 1)]
        late = zombies.pop(source, []) if fate >= 0.3 else []
        for partition, piece in _interleave(rng, sends, late):
            logs[partition].append(_record(piece))
        if fate >= 0.6:  # the checkpoint got written (else the next attempt replays the batch)
            checkpoints[source] = end
    return logs, expected


def _consume(logs: dict[int, list[pa.Table]]) -> dict[int, list[str]]:
    taken: dict[int, list[str]] = {}
    for partition, records in logs.items():
        marks = Marks("0")
        taken[partition] = []
        for record in records:
            keep = marks.admit("stage", record)
            rows = record if keep is None else record.filter(keep)
            taken[partition] += strip(rows).column("payload").to_pylist()
    return taken


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    sources=st.integers(1, 3),
    length=st.integers(1, 30),
    shape=st.sampled_from(ROW_WISE_SHAPES),
)
def test_every_row_is_taken_once_whatever_the_producers_replayed(
    seed: int, sources: int, length: int, shape: str
) -> None:
    """Several writers per intermediate partition (a producer task per input partition, and the zombies of
    killed attempts), each stage shape that keeps positions, ``__k`` as the sink numbers it."""
    logs, expected = _run(seed, sources, length, shape=shape)
    taken = _consume(logs)
    for partition in range(PARTITIONS):
        assert sorted(taken[partition]) == sorted(expected[partition])


@pytest.mark.parametrize("shape", FALLBACK_SHAPES)
def test_a_union_or_a_reordering_map_would_lose_rows_if_it_kept_positions(shape: str) -> None:
    """Why such a stage is not row-wise (it falls back with a warning at start: the shapes themselves are
    classified on real Spark plans in tests/integration/test_row_wise_stages.py): the two branches of a union
    number their rows apart from each other (each its own sink writer), so both give an input row's first
    output ``__k`` 0; a map that reorders writes a later row of an input partition before an earlier one. Kept
    as positions, the consumer drops rows that are no replays, with or without faults."""
    lost = 0
    for seed in range(20):
        logs, expected = _run(seed, 2, 12, shape=shape)
        taken = _consume(logs)
        lost += sum(len(expected[p]) - len(taken[p]) for p in range(PARTITIONS))
    assert lost > 0


STREAMS = ["views", "clicks", "searches", "carts", "orders"]


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    v1=st.lists(st.sampled_from(STREAMS), min_size=1, max_size=3, unique=True),
    v2=st.lists(st.sampled_from(STREAMS), min_size=1, max_size=4, unique=True),
    length=st.integers(1, 20),
)
def test_rows_are_taken_once_across_an_upgrade_that_changes_the_stage_s_inputs(
    seed: int, v1: list[str], v2: list[str], length: int
) -> None:
    """A stage reads ``v1`` (its inputs in that order), then, upgraded, ``v2``: inputs added, removed,
    reordered; an input of both is read on from where v1 left it. The consumer's marks carry over the upgrade
    (they are in its checkpoint), so a row of v2 must not meet a mark of another input of v1: an input's rows
    are placed by its code, which depends on the stream alone, not on its index among the stage's inputs."""
    logs: dict[int, list[pa.Table]] = {p: [] for p in range(PARTITIONS)}
    expected: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    for version, inputs in enumerate([v1, v2]):
        codes = input_codes(("local", name) for name in inputs)
        version_logs, version_expected = _run(
            seed + version,
            len(inputs),
            length,
            place=lambda s, inputs=inputs, codes=codes: pss(codes[("local", inputs[s])], 0),
            tags=lambda s, inputs=inputs, version=version: f"v{version}:{inputs[s]}:",
            base=lambda s, inputs=inputs, version=version: length if version and inputs[s] in v1 else 0,
        )
        for partition in range(PARTITIONS):
            logs[partition] += version_logs[partition]
            expected[partition] += version_expected[partition]
    taken = _consume(logs)
    for partition in range(PARTITIONS):
        assert sorted(taken[partition]) == sorted(expected[partition])


def test_an_input_keeps_its_code_whatever_else_the_stage_reads() -> None:
    v1 = input_codes([("local", "views"), ("local", "clicks")])
    v2 = input_codes([("local", "views"), ("local", "searches"), ("local", "clicks")])
    assert v1[("local", "clicks")] == v2[("local", "clicks")] and v1[("local", "views")] == v2[("local", "views")]
    assert v2[("local", "searches")] not in v1.values()
    assert input_codes([("eh", "clicks")])[("eh", "clicks")] != v1[("local", "clicks")], "another system's stream"
    # two streams whose digests collide: the one sorting first keeps its code, whatever the order they come in
    seen: dict[int, str] = {}
    name = 0
    while (code := input_codes([("local", f"s{name}")])[("local", f"s{name}")]) not in seen:
        seen[code] = f"s{name}"
        name += 1
    a, b = sorted([seen[code], f"s{name}"])
    codes = input_codes([("local", b), ("local", a)])
    assert codes == input_codes([("local", a), ("local", b)])
    assert codes[("local", a)] == code and codes[("local", b)] == (code + 1 if code < 65535 else 256)
    assert all(256 <= c < 65536 for c in seen), "no code is an index that rows of earlier versions carry"


def _lanes_run(seed: int, lanes: int, length: int) -> tuple[dict[int, list[pa.Table]], dict[int, list[str]]]:
    """One producer task reading one input partition made of ``lanes`` lanes (Kinesis: a virtual task's
    shards), rows positioned by (lane, ordinal). Each attempt takes a different number of records from each lane
    and interleaves the lanes differently, as a replay after a crash does; attempts are killed mid-batch or
    before their checkpoint (which names every lane's place at once)."""
    rng = random.Random(seed)
    logs: dict[int, list[pa.Table]] = {p: [] for p in range(PARTITIONS)}
    expected: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    for lane in range(lanes):
        for ordinal in range(1, length + 1):
            for partition, payload in _outputs(lane, ordinal):
                expected[partition].append(payload)
    checkpoint = dict.fromkeys(range(lanes), 0)
    while any(c < length for c in checkpoint.values()):
        ends = {lane: min(length, c + rng.randrange(0, 6)) for lane, c in checkpoint.items()}
        queues = {lane: list(range(checkpoint[lane] + 1, ends[lane] + 1)) for lane in range(lanes)}
        rows: list[tuple[int, int, int, int, str]] = []
        while any(queues.values()):  # the lanes interleaved at random, each in its own order
            lane = rng.choice([n for n, q in queues.items() if q])
            ordinal = queues[lane].pop(0)
            lane_of = int(lane_pss(pss(0, 0), np.array([lane]))[0])
            for j, (partition, payload) in enumerate(_outputs(lane, ordinal)):
                rows.append((partition, lane_of, ordinal << 12, j, payload))
        sends = _sends(rng, rows)
        fate = rng.random()
        if fate < 0.3:  # killed mid-batch: a prefix of the sends is durable
            sends = sends[: rng.randrange(len(sends) + 1)]
        for partition, piece in sends:
            logs[partition].append(_record(piece))
        if fate >= 0.6:
            checkpoint = ends
    return logs, expected


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), lanes=st.integers(1, 4), length=st.integers(1, 30))
def test_rows_of_several_lanes_are_taken_once_however_each_replay_interleaved_them(
    seed: int, lanes: int, length: int
) -> None:
    logs, expected = _lanes_run(seed, lanes, length)
    taken = _consume(logs)
    for partition in range(PARTITIONS):
        assert sorted(taken[partition]) == sorted(expected[partition])


def test_a_lane_s_position_names_its_input_partition() -> None:
    base = pss(1, 3)
    lanes = lane_pss(base, np.array([0, 7, 2**31 - 2]))
    assert len(set(lanes.tolist()) | {base}) == 4, "every lane is a partition of its own, none the partition's"
    assert all(input_partition(int(v)) == base for v in lanes)
    assert input_partition(base) == base and lanes.dtype == np.int64 and (lanes > 0).all()


def test_the_stream_really_holds_replays_that_the_marks_drop() -> None:
    logs, expected = _run(seed=3, sources=2, length=40)
    written = sum(r.num_rows for records in logs.values() for r in records)
    assert written > sum(len(v) for v in expected.values()), "the scenario replayed nothing"
    taken = _consume(logs)
    assert {p: sorted(v) for p, v in taken.items()} == {p: sorted(v) for p, v in expected.items()}


def test_marks_are_kept_per_producer_stage_and_input_partition() -> None:
    marks = Marks("0")
    first = _record([(1, 4096, 0, "a"), (1, 8192, 0, "b")])
    assert marks.admit("s1", first) is None
    again = marks.admit("s1", first)
    assert again is not None and again.to_pylist() == [False, False]
    assert marks.admit("s2", first) is None, "another stage's rows with the same positions are other rows"
    other_partition = _record([(2, 4096, 0, "c")])
    assert marks.admit("s1", other_partition) is None
    assert Marks.from_json(marks.to_json()) == marks


def test_a_row_of_the_same_input_row_past_the_mark_is_taken() -> None:
    marks = Marks("0")
    marks.admit("s", _record([(0, 4096, 0, "a"), (0, 4096, 1, "b")]))
    keep = marks.admit("s", _record([(0, 4096, 0, "a"), (0, 4096, 1, "b"), (0, 4096, 2, "c"), (0, 8192, 0, "d")]))
    assert keep is not None and keep.to_pylist() == [False, False, True, True]
    assert marks.marks["s|0"] == (8192, 0)


def test_rows_without_positions_are_all_taken() -> None:
    marks = Marks("0")
    plain = pa.table({"payload": ["a", "b"]})
    assert marks.admit("s", plain) is None and marks.marks == {}


def test_the_output_index_counts_rows_of_one_input_row_across_batches() -> None:
    pss_values = np.array([0, 0, 0, 1, 1], np.int32)
    pos = np.array([4096, 4096, 8192, 8192, 8192], np.int64)
    assert output_index(pss_values, pos, None).tolist() == [0, 1, 0, 0, 1]
    assert output_index(pss_values, pos, (0, 4096, 4)).tolist() == [5, 6, 0, 0, 1]
    assert output_index(pss_values, pos, (0, 1, 4)).tolist() == [0, 1, 0, 0, 1]
    same = np.array([7, 7], np.int64)
    assert output_index(np.array([0, 0], np.int32), same, (0, 7, 0)).tolist() == [1, 2]
    assert output_index(np.array([], np.int32), np.array([], np.int64), None).tolist() == []


def test_the_cache_keeps_the_read_start_and_end_and_forgets_older_ones(tmp_path) -> None:
    cache = MarksCache(str(tmp_path))
    key = "local.job-views.0"
    for start, end in [(0, 10), (10, 25), (25, 40)]:
        cache.save(key, Marks(str(end), {"s|0": (end << 12, 0)}), str(start))
    assert cache.load(key, "40") == Marks("40", {"s|0": (40 << 12, 0)})
    assert cache.load(key, "25") is not None, "a replay of the last read needs the marks at its start"
    assert cache.load(key, "10") is None and cache.load(key, "0") is None
    assert cache.load("local.other.0", "40") is None


def test_on_a_system_of_positions_the_cache_keeps_the_read_start_and_end_only(tmp_path) -> None:
    """Kinesis offsets are JSON, which neither names a file nor orders: files are named by a digest of the
    offset and every one but the read's start and end is removed."""
    cache = MarksCache(str(tmp_path), dense=False)
    key = "kin.job-views.0"
    offsets = [
        '{"shardId-000000000000":"1#1"}',
        '{"shardId-000000000000":"9#4"}',
        '{"shardId-000000000000":"12#5"}',
    ]
    for n, (start, end) in enumerate(zip(offsets, offsets[1:], strict=False)):
        cache.save(key, Marks(end, {"s|0": (n, 0)}), start)
    assert cache.load(key, offsets[2]) == Marks(offsets[2], {"s|0": (1, 0)})
    assert cache.load(key, offsets[1]) is not None, "a replay of the last read needs the marks at its start"
    assert cache.load(key, offsets[0]) is None
    assert len(list((tmp_path / "kin.job-views.0").glob("*.json"))) == 2
