"""A system whose streams are tables, in memory, for unit tests of the sink's table commits: a fake of weirflow's
own `TableWriter` interface that keeps its contract (atomic commits of rows and marks, conflicts on marks set
after the version read). Tables live in one process-wide dict per ``job.state.dir``, so every `Systems` of a
test sees the same tables. Config: ``systems.<name>.factory: tests.unit.table_fakes:MemoryTableFactory``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from weirflow.interfaces.config import ConfigView
from weirflow.interfaces.system import SystemAdmin, SystemConsumer, SystemFactory, SystemProducer
from weirflow.interfaces.table import TableConflictError, TableSnapshot, TableWriter


@dataclass
class Commit:
    rows: pa.Table | None
    marks: dict[str, int]


@dataclass
class MemoryTable:
    commits: list[Commit] = field(default_factory=list)  # version v is commits[v]

    def marks_at(self, version: int) -> dict[str, int]:
        marks: dict[str, int] = {}
        for commit in self.commits[: version + 1]:
            marks.update(commit.marks)
        return marks

    def rows(self) -> pa.Table | None:
        tables = [c.rows for c in self.commits if c.rows is not None and c.rows.num_rows]
        return pa.concat_tables(tables) if tables else None


_TABLES: dict[str, dict[str, MemoryTable]] = {}
_LOCK = threading.Lock()


def tables(root: str) -> dict[str, MemoryTable]:
    with _LOCK:
        return _TABLES.setdefault(root, {})


class MemoryTableWriter(TableWriter):
    def __init__(self, root: str) -> None:
        self.root = root
        self.before_commit: Callable[[], None] | None = None  # a test's hook: runs between read and commit

    def _table(self, table: str) -> MemoryTable:
        with _LOCK:
            return _TABLES.setdefault(self.root, {}).setdefault(table, MemoryTable())

    def snapshot(self, table: str, marks: Collection[str]) -> TableSnapshot:
        found = self._table(table)
        with _LOCK:
            version = len(found.commits) - 1
            held = found.marks_at(version)
        return TableSnapshot(version, {name: held[name] for name in marks if name in held})

    def commit(
        self,
        table: str,
        rows: Any,
        marks: Mapping[str, int],
        read_version: int | None,
        before_attempt: Callable[[], None] | None = None,
    ) -> int:
        if self.before_commit is not None:
            hook, self.before_commit = self.before_commit, None
            hook()
        if before_attempt is not None:
            before_attempt()
        found = self._table(table)
        with _LOCK:
            for commit in found.commits[(len(found.commits) if read_version is None else read_version + 1) :]:
                if set(commit.marks) & set(marks):
                    raise TableConflictError(
                        f"table {table}: a later commit set {sorted(set(commit.marks) & set(marks))}"
                    )
            found.commits.append(Commit(rows, dict(marks)))
            return len(found.commits) - 1

    def rows_since(self, table: str, version: int) -> Iterator[Any]:
        found = self._table(table)
        with _LOCK:
            later = list(found.commits[version + 1 :])
        for commit in later:
            if commit.rows is not None and commit.rows.num_rows:
                yield commit.rows


class MemoryTableFactory(SystemFactory):
    """Tables only: the admin, consumer and producer are not needed by the sink's table path."""

    def get_admin(self, system_name: str, config: ConfigView) -> SystemAdmin:
        raise NotImplementedError

    def get_consumer(self, system_name: str, config: ConfigView) -> SystemConsumer:
        raise NotImplementedError

    def get_producer(self, system_name: str, config: ConfigView) -> SystemProducer:
        raise NotImplementedError

    def get_table_writer(self, system_name: str, config: ConfigView) -> TableWriter | None:
        return MemoryTableWriter(str(config.get("job.state.dir")))
