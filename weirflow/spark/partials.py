"""Partial aggregates of one micro-batch, and when a batch may send them (docs/design/data-plane.md, 3.2).

A stage whose rows go to an aggregation in the next stage can send, per batch, one row per group with the
group's partial values instead of every row, as Spark's own map-side ``HashAggregate(partial)`` does. Each
row enters as a partial of its own (a count of 1, its value as sum, min and max); `combine` merges the rows
of one batch per input partition (``__pss``) and group.

**Positions.** The partials of one input partition for one intermediate partition are written as one record
(`combine_batch`), all at the position of the batch's last row of that input partition, ``__k`` counting them.
The consumer's marks (`weirflow.spark.replay.Marks`) then hold as they do for rows: the record is in the
intermediate partition whole or not at all, and once taken its mark covers every row of the batch's range.

**Replays send rows.** A replay need not cut its batches where the first attempt did, so its partials could
overlap one already taken, which can be neither dropped nor taken. A start that may replay therefore sends
every row of a batch on its own (`BatchMode`): until every input partition is read past where it
ended when the start began, no batch that read below that end is combined. No earlier attempt read further (it
stopped writing before this one started: the fence), so what a combined batch sums is new to every consumer.
The bound stays in the task's checkpoint for as long as it lies ahead of the offsets: a clean stop in the
middle of such a replay leaves an earlier attempt's writes past its offsets, and the next start must know.
``tests/unit/test_partials.py`` checks this against the marks with random batch cuts, kills and restarts.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from weirflow.base.errors import PipelineError
from weirflow.spark.replay import POS, PSS, K, output_index

KINDS = ("count", "sum", "min", "max")
_MERGE = {"count": "sum", "sum": "sum", "min": "min", "max": "max"}

MAX_PARTIALS_PER_RECORD = 4096  # as many rows as a packed record holds (`weirflow.spark.packing`)


@dataclass(frozen=True)
class Partial:
    """One partial value: its column in the rows, and how two of them merge (``kind``, one of `KINDS`)."""

    column: str
    kind: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise PipelineError(f"partial {self.column!r}: kind {self.kind!r} is not one of {', '.join(KINDS)}")


@dataclass(frozen=True)
class PartialSpec:
    """How a batch's rows merge: grouped by ``keys`` (the window's start among them), ``partials`` merged by
    their kind, and ``time`` (the event time) kept as the latest of the group, which lies in the group's window,
    so that the consumer judges a partial late exactly when it would judge each of its rows late."""

    keys: tuple[str, ...]
    time: str
    partials: tuple[Partial, ...]


def combine(rows: pa.Table, spec: PartialSpec) -> pa.Table:
    """``rows`` (one batch's, each a partial of its own) merged per (``__pss``, keys): the partial columns by
    their kind, the event time as the group's latest. Groups come out in a deterministic order (by ``__pss``
    then keys), without ``__pos`` and ``__k``, which `combine_batch` gives them."""
    columns = [*spec.keys, spec.time, *(p.column for p in spec.partials), PSS]
    if rows.num_rows == 0:
        return rows.select(columns)
    groups = [PSS, *spec.keys]
    aggregations = [(spec.time, "max")] + [(p.column, _MERGE[p.kind]) for p in spec.partials]
    merged = rows.group_by(groups, use_threads=False).aggregate(aggregations)
    merged = merged.rename_columns([_unsuffixed(name, aggregations) for name in merged.column_names])
    return merged.sort_by([(name, "ascending") for name in groups]).select(columns)


def _unsuffixed(name: str, aggregations: list[tuple[str, str]]) -> str:
    """pyarrow names an aggregate ``<column>_<function>``; the partial keeps its own column's name."""
    for column, function in aggregations:
        if name == f"{column}_{function}":
            return column
    return name


@dataclass(frozen=True)
class Piece:
    """What one batch sends one intermediate partition of one input partition: its partials as one record
    (``combined``), or its rows one by one (replay, or too many groups for one record). ``source``: the
    batch's rows of that piece, which `rows_alone` sends when the partials are too large for one record."""

    partition: int
    pss: int
    rows: pa.Table
    combined: bool
    source: pa.Table


def combine_batch(
    rows: pa.Table, spec: PartialSpec, partition_column: str, mode: BatchMode | None
) -> Iterator[Piece]:
    """One batch's ``rows`` (with ``__pss``, ``__pos`` and the intermediate partition in ``partition_column``)
    as the pieces to send, per intermediate partition and input partition in a deterministic order, each with
    ``__k``. ``mode`` says which input partitions may send partials in this batch (None: none). A piece of
    partials holds them all (one record), at the batch's last position of its input partition over every
    intermediate partition, so that the next batch's rows of that input partition lie above it; else the
    rows go one by one."""
    if rows.num_rows == 0:
        return
    ends = rows.group_by([PSS], use_threads=False).aggregate([(POS, "min"), (POS, "max")])
    first = dict(zip(ends.column(PSS).to_pylist(), ends.column(f"{POS}_min").to_pylist(), strict=True))
    last = dict(zip(ends.column(PSS).to_pylist(), ends.column(f"{POS}_max").to_pylist(), strict=True))
    partitions = rows.column(partition_column).to_numpy(zero_copy_only=False)
    pss_values = rows.column(PSS).to_numpy(zero_copy_only=False)
    for partition in np.unique(partitions):
        for value in np.unique(pss_values[partitions == partition]):
            chosen = pa.array((partitions == partition) & (pss_values == value))
            part = rows.filter(chosen).drop_columns([partition_column])
            if mode is not None and mode.may_combine(int(value), first[value]):
                merged = combine(part, spec)
                if merged.num_rows <= MAX_PARTIALS_PER_RECORD:
                    merged = merged.append_column(POS, pa.array([last[value]] * merged.num_rows, pa.int64()))
                    k = pa.array(np.arange(merged.num_rows, dtype=np.int32))
                    yield Piece(int(partition), int(value), merged.append_column(K, k), True, part)
                    continue
            yield Piece(int(partition), int(value), rows_alone(part), False, part)


def rows_alone(part: pa.Table) -> pa.Table:
    """The rows of one input partition for one intermediate partition, each sent as a partial of its own: in
    position order, with ``__k`` counting the rows of one position."""
    part = part.sort_by([(POS, "ascending")])
    pss_values = part.column(PSS).to_numpy(zero_copy_only=False)
    k = output_index(pss_values, part.column(POS).to_numpy(zero_copy_only=False), None)
    return part.append_column(K, pa.array(k, pa.int32()))


@dataclass
class BatchMode:
    """Per input partition (``__pss``), the position below which a batch's rows go one by one
    (``rows_until``): where the partition ended when a start that may replay began, as a position. A
    partition not listed, or read past its bound, may send partials."""

    rows_until: dict[int, int]

    def may_combine(self, pss_value: int, first_pos: int) -> bool:
        """Whether a batch whose first row of input partition ``pss_value`` is at ``first_pos`` may send
        partials: only if no earlier attempt can have read that far."""
        bound = self.rows_until.get(pss_value)
        return bound is None or first_pos >= bound
