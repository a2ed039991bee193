"""A micro-batch's rows of a table output in one commit (weirflow.spark.table_commits): a row-wise stage's rows are
committed exactly once by the marks the commit sets with them, whatever replays and concurrent commits do; rows
without positions are appended. Over the in-memory table of tests/unit/table_fakes.py, which keeps the
`TableWriter` contract (atomic rows and marks, a conflict on a mark set after the version read)."""

from __future__ import annotations

import random
from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.table_fakes import MemoryTableWriter, tables
from weirflow.base.errors import LockLostError
from weirflow.spark.replay import POS, PSS
from weirflow.spark.table_commits import commit_rows, mark_name, ship, unship


def _rows(places: list[tuple[int, int]]) -> pa.Table:
    """Rows at (``__pss``, ``__pos``) places, each with a value naming its place."""
    return pa.table(
        {
            "value": pa.array([f"{p}:{x}" for p, x in places]),
            "weirflow_id": pa.array([f"s/{p:x}/{x:x}/0" for p, x in places]),
            PSS: pa.array([p for p, _ in places], pa.int64()),
            POS: pa.array([x for _, x in places], pa.int64()),
        }
    )


def _values(root: str) -> Counter[str]:
    committed = tables(root)["t"].rows()
    return Counter(committed.column("value").to_pylist()) if committed is not None else Counter()


def _open() -> None:
    """The fence of a writer that holds its lock."""


def test_a_replay_commits_only_the_rows_above_the_marks_and_moves_them(tmp_path) -> None:
    writer = MemoryTableWriter(str(tmp_path))
    first = [(1, x) for x in range(5)] + [(2, x) for x in range(3)]
    assert commit_rows(writer, "t", "s", _rows(first), _open) == 8
    snapshot = writer.snapshot("t", [mark_name("s", 1), mark_name("s", 2)])
    assert snapshot.marks == {"s/1": 4, "s/2": 2}
    assert tables(str(tmp_path))["t"].rows().column_names == ["value", "weirflow_id"], "positions are not kept"
    assert commit_rows(writer, "t", "s", _rows([(1, x) for x in range(3, 7)]), _open) == 2, "3 and 4 are in"
    assert _values(str(tmp_path)) == Counter([f"1:{x}" for x in range(7)] + [f"2:{x}" for x in range(3)])


def test_a_commit_decides_again_when_a_concurrent_commit_set_its_marks(tmp_path) -> None:
    """A paused worker of an earlier holder commits batch [0, 6) of partition 1 while the new holder, between
    reading the marks and committing, committed [0, 9): the late commit is refused, decided again from the
    marks then, and commits nothing twice."""
    writer = MemoryTableWriter(str(tmp_path))
    other = MemoryTableWriter(str(tmp_path))
    writer.before_commit = lambda: commit_rows(other, "t", "s", _rows([(1, x) for x in range(9)]), _open)
    assert commit_rows(writer, "t", "s", _rows([(1, x) for x in range(6)]), _open) == 0
    assert _values(str(tmp_path)) == Counter(f"1:{x}" for x in range(9))


def test_rows_without_positions_are_appended_and_a_closed_fence_commits_nothing(tmp_path) -> None:
    writer = MemoryTableWriter(str(tmp_path))
    rows = _rows([(1, 0), (1, 1)]).drop_columns([PSS, POS])
    commit_rows(writer, "t", "s", rows, _open)
    commit_rows(writer, "t", "s", rows, _open)
    assert _values(str(tmp_path)) == Counter({"1:0": 2, "1:1": 2}), "at least once without positions"

    def closed() -> None:
        raise LockLostError("s-0", "p1", "lost")

    with pytest.raises(LockLostError):
        commit_rows(writer, "t", "s", _rows([(3, 0)]), closed)
    assert "3:0" not in _values(str(tmp_path))


def test_rows_travel_from_the_writers_to_the_commit_as_arrow() -> None:
    a, b = _rows([(1, 0)]), _rows([(2, 5), (2, 6)])
    assert unship([ship(a), ship(b.slice(0, 0)), ship(b)]) == pa.concat_tables([a, b])
    assert unship([]) is None


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_row_wise_rows_are_committed_exactly_once_whatever_the_replays(seed: int) -> None:
    """Two input partitions read by attempts that each start from the last checkpoint (which lags behind the
    commits), cut their batches anew, and may die before a commit; a paused earlier attempt may commit late."""
    import tempfile

    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as root:
        writer = MemoryTableWriter(root)
        ends = {1: 40, 2: 25}
        checkpoint = {1: 0, 2: 0}
        late: list[pa.Table] = []
        for _attempt in range(6):
            position = dict(checkpoint)
            while any(position[p] < ends[p] for p in ends):
                batch = []
                for p in ends:
                    stop = min(ends[p], position[p] + rng.randrange(0, 8))
                    batch += [(p, x) for x in range(position[p], stop)]
                    position[p] = stop
                if rng.random() < 0.15:  # killed before the commit; or paused, and it commits later
                    if rng.random() < 0.5:
                        late.append(_rows(batch))
                    break
                commit_rows(writer, "t", "s", _rows(batch), _open)
                if rng.random() < 0.5:  # the processor's checkpoint of the batch
                    checkpoint = dict(position)
            if late and rng.random() < 0.5:
                commit_rows(writer, "t", "s", late.pop(0), _open)
        position = dict(checkpoint)  # the last attempt runs to the end
        batch = [(p, x) for p in ends for x in range(position[p], ends[p])]
        commit_rows(writer, "t", "s", _rows(batch), _open)
        for rows in late:
            commit_rows(writer, "t", "s", rows, _open)
        assert _values(root) == Counter(f"{p}:{x}" for p in ends for x in range(ends[p]))
