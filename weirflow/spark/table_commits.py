"""Output streams that are tables (`weirflow.interfaces.table`, Delta Lake): one atomic commit per micro-batch.

Spark's Python workers do not write a table: each returns its rows of the batch as Arrow IPC in its commit
message (`ship`), and the sink's ``commit``, on the processor's machine before Spark commits the batch, writes
each table's rows in **one commit** (`commit_rows`), through the fence. A batch is thus in a table whole or not
at all, and what makes it exactly once is the table's own transaction log (docs/guarantees.md, "Tables"):

* **Rows of a row-wise stage** carry their positions (``__pss``, ``__pos``, `weirflow.spark.replay`). The
  commit sets, in the same atomic commit as the rows, a **mark** per (stage, ``__pss``): the largest ``__pos``
  committed (Delta: the application transaction ``txn(appId="<stage>/<pss hex>", version=<pos>)``). A batch
  reads whole input records and all the rows made of one are in its commit, and the attempts at an input
  partition commit its positions in order from a checkpoint written only after everything before it was
  committed; so the table holds, per (stage, ``__pss``), exactly the rows of the positions at or below the
  mark. A replay's rows at or below it are left out before the commit. A commit that read the marks at
  version *v* fails when a commit after *v* set one of them (another holder of the task; a paused worker
  woken up), and is decided anew from the marks then: never a row twice.
* **Results of a stateful task** are left out by reading back what an earlier attempt committed past the
  task's checkpoint (`weirflow.spark.result_replays`; a table's tail is its version), before they are
  shipped; each has an id of its own.
* **Rows without positions** (a transform dropped them) are appended: at least once, as into any stream.

Every row carries its id (`weirflow.results.ids`) in the table's id column (`TableWriter.id_column`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import pyarrow as pa
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_random

from weirflow.interfaces.table import TableConflictError, TableWriter
from weirflow.spark.replay import POS, PSS, K

log = logging.getLogger("weirflow.spark")

CONFLICT_ATTEMPTS = 8  # commits decided anew after a conflict before the batch fails (it is then replayed)


def ship(rows: pa.Table) -> bytes:
    """A writer's rows of one table as Arrow IPC, for its commit message."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema) as stream:
        stream.write_table(rows)
    return sink.getvalue().to_pybytes()


def unship(payloads: list[bytes]) -> pa.Table | None:
    """The rows of every writer's payload, as one table; None without any."""
    tables = [pa.ipc.open_stream(payload).read_all() for payload in payloads]
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return None
    return pa.concat_tables(tables, promote_options="default")


def mark_name(stage: str, pss_value: int) -> str:
    """The mark of a row-wise stage's input partition (or lane) ``pss_value`` in a table."""
    return f"{stage}/{pss_value:x}"


def commit_rows(
    writer: TableWriter, table: str, stage: str, rows: pa.Table, before_attempt: Callable[[], None]
) -> int:
    """Commit one batch's ``rows`` of ``table`` written by ``stage`` (see the module docstring); returns how
    many were committed (a replay's rows at or below their marks are not). ``before_attempt`` is the fence."""
    positioned = PSS in rows.column_names and POS in rows.column_names
    committed = 0
    for attempt in Retrying(
        retry=retry_if_exception_type(TableConflictError),
        stop=stop_after_attempt(CONFLICT_ATTEMPTS),
        wait=wait_random(0.05, 0.5),
        reraise=True,
        before_sleep=lambda state: log.info(
            "table %s: a concurrent commit set a mark this one read (attempt %d); deciding again",
            table,
            state.attempt_number,
        ),
    ):
        with attempt:
            if not positioned:  # no marks: nothing to read first (stateful results were read back already)
                writer.commit(table, without_positions(rows), {}, None, before_attempt)
                committed = rows.num_rows
                continue
            fresh, marks, read_version = _above_marks(writer, table, stage, rows)
            writer.commit(table, without_positions(fresh), marks, read_version, before_attempt)
            committed = fresh.num_rows
    if committed < rows.num_rows:
        log.info("table %s: %d replayed rows were committed already", table, rows.num_rows - committed)
    return committed


def _above_marks(
    writer: TableWriter, table: str, stage: str, rows: pa.Table
) -> tuple[pa.Table, dict[str, int], int]:
    """The rows above their marks, the marks they move, and the version the marks were read at."""
    pss_values = rows.column(PSS).to_numpy(zero_copy_only=False)
    pos = rows.column(POS).to_numpy(zero_copy_only=False)
    lanes, lane_of_row = np.unique(pss_values, return_inverse=True)
    names = [mark_name(stage, int(v)) for v in lanes]
    snapshot = writer.snapshot(table, names)
    held = np.array([snapshot.marks.get(name, -1) for name in names], dtype=np.int64)
    keep = pos > held[lane_of_row]
    fresh = rows.filter(pa.array(keep))
    marks: dict[str, int] = {}
    for lane, name in enumerate(names):
        mine = keep & (lane_of_row == lane)
        if mine.any():
            marks[name] = int(pos[mine].max())
    return fresh, marks, snapshot.version


def without_positions(rows: pa.Table) -> pa.Table:
    """``rows`` without the position columns (what a table holds)."""
    return rows.drop_columns([c for c in (PSS, POS, K) if c in rows.column_names])
