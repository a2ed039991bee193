"""Output streams that are tables: `TableWriter`, one atomic commit per micro-batch and table.

A system whose streams are tables (Delta Lake: ``systems.<name>.factory: delta``) offers, beside its admin,
consumer and producer, a `TableWriter` (`SystemFactory.get_table_writer`). The Spark sink then writes each
micro-batch's rows of an output stream on that system as **one commit**, made on the processor's machine when
the batch commits, not as records sent by each Spark task; what it needs of the table's own transaction log:

* **Marks**: named integers kept in the table's log and set in the same atomic commit as the rows (Delta:
  application transactions, ``txn(appId, version)``, as Spark's idempotent ``foreachBatch`` writes use them).
  The sink keeps one per (stage, input partition) of a row-wise stage, the largest position committed, and
  leaves out a replay's rows at or below it (docs/guarantees.md, "Tables").
* **Conflicts**: a commit names the table version it read its marks at; it fails with `TableConflictError`,
  committing nothing, when a commit after that version set one of its marks (another holder of the task, or
  a paused worker that woke up). The sink then reads the marks again.
* **Versions and reading back**: `TableSnapshot.version` is where the table is (a stateful task's tail) and
  `TableWriter.rows_since` what later commits added, so that a stateful task's replay leaves out the results
  an earlier attempt committed past its checkpoint.

Every row carries its output id (`weirflow.results.ids`) in the column `TableWriter.id_column`. Rows are
Arrow tables with the stage's own columns and types (no JSON in between).

Thread-safety: one writer may be used from several threads of one process; several processes write one table
at once (every processor of a job), which the table's own commit protocol orders.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from weirflow.base.errors import WeirflowError


class TableConflictError(WeirflowError):
    """A commit after the version a commit read its marks at set one of those marks: nothing was committed;
    read the marks again (`TableWriter.snapshot`) and decide anew what to commit."""


@dataclass(frozen=True)
class TableSnapshot:
    """A table's version (``-1``: the table does not exist yet) and the marks it holds at that version
    (a mark never set is absent)."""

    version: int
    marks: Mapping[str, int] = field(default_factory=dict)


class TableWriter(ABC):
    """Writes the streams of one system that are tables; ``table`` is a stream's physical name, which the
    system resolves to its location (Delta: ``systems.<name>.path`` joined with it)."""

    #: The column holding each row's output id (`weirflow.results.ids`); a system may let its config rename it.
    id_column: str = "weirflow_id"

    @abstractmethod
    def snapshot(self, table: str, marks: Collection[str]) -> TableSnapshot:
        """The table's latest version and the values of those of ``marks`` it holds, read from one version."""

    @abstractmethod
    def commit(
        self,
        table: str,
        rows: Any,
        marks: Mapping[str, int],
        read_version: int | None,
        before_attempt: Callable[[], None] | None = None,
    ) -> int:
        """Append ``rows`` (a ``pyarrow.Table``, possibly empty) and set ``marks`` in one atomic commit; return
        the version committed. ``read_version`` None: the commit sets no marks and depends on no earlier version
        (rows appended at least once, or results a reading back already left replays out of), so nothing is
        checked before it.

        The first commit creates the table from ``rows``' schema (partitioned as the system's config says);
        rows whose schema the table cannot take raise `weirflow.base.errors.ConfigError`-like errors naming the
        table and the column. Raise `TableConflictError` (nothing committed) when a commit after
        ``read_version`` set any of ``marks``; other concurrent commits (appends of other tasks) do not
        conflict. ``before_attempt`` runs right before every attempt to write the commit, the first and each
        retry, and what it raises ends the commit (the fence, as in `SystemProducer.send_fenced`). Transient
        failures of the storage are retried (bounded); the last raises
        `weirflow.base.errors.ServiceUnavailableError` naming the table's location."""

    @abstractmethod
    def rows_since(self, table: str, version: int) -> Iterator[Any]:
        """The rows that commits after ``version`` added, up to the latest version, as ``pyarrow.Table``\\s in
        commit order (``version`` -1: every row). Each has the `id_column`."""

    def close(self) -> None:
        """Release connections. Idempotent."""
