"""The `TableWriter` of a ``delta`` system: a micro-batch's rows and marks in one atomic Delta commit.

**Marks are application transactions.** A commit appends its rows and writes one ``txn(appId=<mark>,
version=<value>)`` action per mark in the same log entry (deltalake's ``CommitProperties(app_transactions=
...)``), as Spark's idempotent Delta writes do; `snapshot` reads them back with
``DeltaTable.transaction_version``. A Delta commit is atomic: its log entry ``_delta_log/<version>.json``
appears whole, by a put-if-absent of that name, or not at all.

**Conflicts.** A commit must fail, committing nothing, when any commit after the version it read its marks at
(``read_version``) set one of the same marks, and must go through when the commits in between set only other
marks (other tasks appending to the same table). Two layers do it:

1. The writer loads the table at its latest version L and reads the log entries of every version after
   ``read_version`` up to L (`weirflow_delta.log`): one of them setting a mark of the commit raises
   `TableConflictError`; one carrying this commit's own token is this commit, landed by an earlier attempt
   whose reply a storage failure hid, and its version is returned.
2. It then commits against the table loaded at L. delta-rs's optimistic concurrency checks every commit that
   lands between L and its own put-if-absent of the next log entry; its conflict checker compares the
   ``txn`` app ids of those winning commits with the commit's own and refuses with ``CommitFailedError:
   Concurrent transaction failed`` when they share one. A commit that lost the race for the next version to
   winners of other marks is put again by delta-rs itself at the version after them (``max_commit_retries``
   `PUT_RETRIES`: only the log entry is written again, not the data files, and each put follows the last in
   milliseconds, within the attempt the fence passed); one refused, or out of retries, comes back here,
   passes the fence again and goes round (1) with the winners. Four tasks committing to one table at once lost
   that race in 25 of 60 commits (measured in one process, local disk), each of which wrote its rows again when
   delta-rs made one put only.

**Verified against deltalake 1.6.6** (local file system and Azurite; tests/unit/test_delta_table.py and
tests/integration/test_delta_azurite.py keep checking it): two writers that both load version v and both
commit ``txn(appId="m")``: the first commits v+1, the second is refused with ``CommitFailedError``
("Concurrent transaction failed."), its log holds nothing of it (its Parquet file stays behind, unreferenced,
until a VACUUM). Two writers of different app ids both commit (v+1 and v+2). delta-rs does **not** guard the
creation of a table: of 8 writers creating one table at once, usually two and up to three commit, each later one
as a new version that replaces the table's metadata (``protocol`` and ``metaData`` again, with a new table
id), rows and ``txn`` included. So the first commit never creates the table: the table is first created
empty, with the rows' schema and no marks (under a lock per table within a process), and the rows and marks
follow as an ordinary append under both layers above. Writers racing to create a table can still leave a
second metadata-only version; it holds no rows and no marks.

Every attempt to write (the table's creation and each append) is preceded by ``before_attempt`` (the sink's
fence, docs/guarantees.md); transient storage failures retry the whole attempt under the system's retry policy
(`weirflow_delta.tables`).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping
from functools import partial
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import CommitProperties, Transaction

from weirflow.base.errors import InvalidArgumentError
from weirflow.interfaces.table import TableConflictError, TableSnapshot, TableWriter
from weirflow_delta.errors import DeltaSchemaError, DeltaTableError
from weirflow_delta.log import COMMIT_TOKEN_FIELD
from weirflow_delta.rows import concat
from weirflow_delta.schema import check_new_table, check_partitioning, fit_rows
from weirflow_delta.tables import DeltaTables, arrow_schema

# Rounds of one attempt (load, check the commits since, commit) that may each be overtaken by another
# writer's commit before the attempt gives up: a table written by every task of a job at once is overtaken a few
# times at most.
MAX_ROUNDS = 32
# Puts of one commit's log entry delta-rs makes itself when other commits took the next versions first (it checks
# them for conflicts before each, and refuses a winner's mark): the writers of one table race every batch.
PUT_RETRIES = 10


def one_batch(rows: pa.Table) -> pa.Table:
    """``rows`` as a single Arrow batch: delta-rs writes the batches of one commit in no fixed order (measured
    on deltalake 1.6.6: 300,000 rows in 43 runs), but keeps the order of one batch's rows within each table
    partition, across as many files as it writes, and readers rely on that order (`SystemAdmin.
    ordered_partitions`). Rows too big for one batch (over 2 GiB of one string column) keep their batches."""
    try:
        return rows.combine_chunks()
    except pa.ArrowInvalid:
        return rows


def as_arrow(rows: Any) -> pa.Table:
    """``rows`` as a ``pyarrow.Table`` (any Arrow table or stream object is taken)."""
    return rows if isinstance(rows, pa.Table) else pa.table(rows)


class DeltaTableWriter(TableWriter):
    """Commits to the tables of one ``delta`` system. Thread-safe."""

    def __init__(self, tables: DeltaTables) -> None:
        self.tables = tables
        self.id_column = tables.id_column
        self._lock = threading.Lock()
        self._creating: dict[str, threading.Lock] = {}

    def snapshot(self, table: str, marks: Collection[str]) -> TableSnapshot:
        def read() -> TableSnapshot:
            loaded = self.tables.load(table)
            if loaded is None:
                return TableSnapshot(-1, {})
            found = {mark: loaded.transaction_version(mark) for mark in marks}
            return TableSnapshot(loaded.version(), {m: int(v) for m, v in found.items() if v is not None})

        return self.tables.call("read the marks of", table, read)

    def commit(
        self,
        table: str,
        rows: Any,
        marks: Mapping[str, int],
        read_version: int | None,
        before_attempt: Callable[[], None] | None = None,
    ) -> int:
        if read_version is None and marks:
            raise InvalidArgumentError(
                "a commit that sets marks must say the version it read them at (read_version)"
            )
        attempt = _Commit(self, table, as_arrow(rows), dict(marks), read_version, before_attempt)
        return self.tables.call("commit to", table, attempt.run)

    def rows_since(self, table: str, version: int) -> Iterator[pa.Table]:
        """Reads the add actions of each later commit's log entry (`weirflow_delta.log`): exactly the files
        that commit added with new rows. Comparing file lists of two versions would say the same only while no
        OPTIMIZE or DELETE rewrote files in between, and would lose the commits' order."""
        loaded = self.tables.call("read", table, lambda: self.tables.load(table))
        if loaded is None:
            return
        schema, latest = arrow_schema(loaded), loaded.version()
        if self.id_column not in schema.names:
            raise DeltaSchemaError(
                f"Delta table '{table}' at {self.tables.uri(table)} has no id column '{self.id_column}' "
                "(systems.<name>.record.id.field): it was not written by weirflow, or with another id column"
            )
        handler = self.tables.handler(table)
        for at in range(max(version + 1, 0), latest + 1):
            entry = self.tables.call("read the log of", table, partial(self.tables.entry, table, at, handler))
            if entry is None:
                raise self.tables.missing_entry(table, at)
            if entry.files:
                files = self.tables.call(
                    "read the rows of", table, partial(self.tables.rows, handler, entry.files, schema)
                )
                yield concat(files, schema)

    def creation_lock(self, table: str) -> threading.Lock:
        """One lock per table: the threads of a process create a table one at a time (module docstring)."""
        with self._lock:
            return self._creating.setdefault(self.tables.uri(table), threading.Lock())


class _Commit:
    """One commit's attempts; ``base`` is the version up to which the commits are known not to conflict,
    carried across attempts (a retry after a storage failure resumes from it)."""

    def __init__(
        self,
        writer: DeltaTableWriter,
        table: str,
        rows: pa.Table,
        marks: dict[str, int],
        read_version: int | None,
        before_attempt: Callable[[], None] | None,
    ) -> None:
        self.writer, self.tables, self.table = writer, writer.tables, table
        # None: no marks, no version depended on (`TableWriter.commit`): only this commit's own landing is
        # looked for in the commits since the version its first round loads
        self.rows, self.marks, self.base = rows, marks, read_version
        self.before_attempt = before_attempt
        self.token = uuid.uuid4().hex
        self.refused: CommitFailedError | None = None

    def run(self) -> int:
        """One attempt: rounds of (load, check the commits since ``base``, commit) until a commit lands."""
        for _ in range(MAX_ROUNDS):
            loaded = self.tables.load(self.table)
            latest = -1 if loaded is None else loaded.version()
            base = self.base = latest if self.base is None else self.base  # None: a blind append's first round
            if latest < base:
                raise TableConflictError(
                    f"Delta table '{self.table}' at {self.tables.uri(self.table)} is at version {latest}, before "
                    f"the version {base} its marks were read at (was it deleted and made again?); nothing "
                    "was committed: read the marks again"
                )
            if latest > base:
                landed = self._check_since(base, latest)
                if landed is not None:
                    return landed
                self.base, self.refused = latest, None
            elif self.refused is not None:
                raise self.refused  # refused with no commit in between: not a race; the errors table maps it
            if loaded is None:
                self._create()
                continue
            try:
                return self._append(loaded)
            except CommitFailedError as refused:
                self.refused = refused  # another commit got in first: the next round reads it
        raise DeltaTableError(
            f"commit to Delta table '{self.table}' at {self.tables.uri(self.table)} was overtaken by other "
            f"commits {MAX_ROUNDS} times in a row; is something else committing to the table nonstop?"
        )

    def _fence(self) -> None:
        if self.before_attempt is not None:
            self.before_attempt()

    def _check_since(self, base: int, latest: int) -> int | None:
        """Raise `TableConflictError` when a commit after ``base`` up to ``latest`` set one of the marks;
        return the version of this commit when an earlier attempt's landed there; else None."""
        handler = self.tables.handler(self.table)
        taken: dict[str, int] = {}
        for version in range(base + 1, latest + 1):
            entry = self.tables.entry(self.table, version, handler)
            if entry is None:
                raise self.tables.missing_entry(self.table, version)
            if entry.token == self.token:
                return version
            for mark in entry.marks & self.marks.keys():
                taken.setdefault(mark, version)
        if taken:
            said = ", ".join(f"'{mark}' (version {version})" for mark, version in sorted(taken.items()))
            raise TableConflictError(
                f"Delta table '{self.table}' at {self.tables.uri(self.table)}: commits after version "
                f"{self.base} set mark {said}; nothing was committed: read the marks again"
            )
        return None

    def _create(self) -> None:
        """Create the table empty, with the rows' columns and the configured partitioning, and no marks."""
        columns, key = self.tables.settings.partition_by(self.table)
        check_new_table(self.rows, self.writer.id_column, columns, self.table, key)
        with self.writer.creation_lock(self.table):
            if self.tables.load(self.table) is not None:
                return  # another thread of this process made it meanwhile
            self._fence()
            try:
                DeltaTable.create(
                    self.tables.uri(self.table),
                    self.rows.schema,
                    mode="ignore",
                    partition_by=list(columns) or None,
                    storage_options=self.tables.settings.storage_options(),
                    commit_properties=CommitProperties(max_commit_retries=1),
                )
            except CommitFailedError:
                # another process created it first (delta-rs reports the lost race as a failed commit): the
                # next round finds the table, else this was no race and the error stands
                if self.tables.load(self.table) is None:
                    raise

    def _append(self, loaded: DeltaTable) -> int:
        where = self.tables.uri(self.table)
        partitioned = list(loaded.metadata().partition_columns)
        columns, key = self.tables.settings.partition_by(self.table)
        check_partitioning(partitioned, columns, self.table, where, key)
        data = one_batch(fit_rows(self.rows, arrow_schema(loaded), self.table, where))
        self._fence()
        write_deltalake(
            loaded,
            data,
            mode="append",
            partition_by=partitioned or None,
            commit_properties=CommitProperties(
                app_transactions=[Transaction(mark, value) for mark, value in sorted(self.marks.items())],
                custom_metadata={COMMIT_TOKEN_FIELD: self.token},
                max_commit_retries=PUT_RETRIES,
            ),
        )
        return int(loaded.version())
