"""Reading a Delta table commit by commit, as its stream's admin and consumer do (`TableReader`).

A stream's records are the rows its table's commits added, in commit order (`weirflow_delta.positions`), read
from the log entries (`weirflow_delta.log`) and the data files they name. Walking the log forward from a
position needs no snapshot of the table: commit v exists exactly when its log entry does, so a walk ends at the
first entry not written yet. The rows of the last commits read are kept (`ROW_CACHE` of them), since a reader
asking for a few records at a time comes back to the same commit.
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate

import pyarrow as pa
import pyarrow.fs as pafs

from weirflow.base.errors import StreamNotFoundError
from weirflow_delta.log import LogEntry
from weirflow_delta.positions import Position
from weirflow_delta.rows import concat, partition_label
from weirflow_delta.tables import DeltaTables, arrow_schema

# Commits whose rows a reader keeps in memory (the most recently read).
ROW_CACHE = 4


@dataclass(frozen=True)
class CommitRows:
    """A commit's rows (``table``), file after file: ``ends[i]`` is the row after file i's last, and
    ``partitions[i]`` file i's table partition (`weirflow_delta.rows.partition_label`)."""

    table: pa.Table
    ends: tuple[int, ...] = ()
    partitions: tuple[str, ...] = ()

    def partition_of(self, row: int) -> str:
        """The table partition of row ``row``."""
        return self.partitions[bisect_right(self.ends, row)] if self.partitions else ""


class TableReader:
    """Reads the tables of one system. Thread-safe."""

    def __init__(self, tables: DeltaTables) -> None:
        self.tables = tables
        self._rows: OrderedDict[tuple[str, int], CommitRows] = OrderedDict()
        self._schemas: dict[str, tuple[int, pa.Schema]] = {}
        self._lock = threading.Lock()

    def latest(self, table: str) -> int:
        """The table's latest version, -1 when it has no commit yet."""
        loaded = self.tables.call("read", table, lambda: self.tables.load(table))
        return -1 if loaded is None else int(loaded.version())

    def require(self, table: str) -> int:
        """The table's latest version; `StreamNotFoundError` saying how a table comes to exist when it has none."""
        latest = self.latest(table)
        if latest < 0:
            raise StreamNotFoundError(
                f"Delta table '{table}' does not exist at {self.tables.uri(table)} (system "
                f"'{self.tables.system}'): a Delta table is created by its first commit, since its columns come "
                "from the rows (docs/delta.md)"
            )
        return latest

    def entry(self, table: str, version: int) -> LogEntry | None:
        """Commit ``version``'s summary, or None when it is not written (yet, or any more)."""
        return self.tables.call("read the log of", table, lambda: self.tables.entry(table, version))

    def entries(self, table: str, first: int) -> Iterator[LogEntry]:
        """The commits from version ``first`` on, up to the last written (more may follow)."""
        version = first
        while (entry := self.entry(table, version)) is not None:
            yield entry
            version += 1

    def oldest(self, table: str) -> int:
        """The oldest version whose log entry remains (0 unless the log's clean-up removed older ones)."""
        if self.entry(table, 0) is not None:
            return 0

        def listed() -> int:
            handler = self.tables.handler(table)
            infos = handler.get_file_info_selector(pafs.FileSelector("_delta_log", allow_not_found=True))
            names = (info.path.rsplit("/", 1)[-1] for info in infos)
            versions = [int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit()]
            return min(versions) if versions else 0

        return self.tables.call("list the log of", table, listed)

    def start(self, table: str, at: Position) -> Position:
        """Where a read from ``at`` starts: ``at``, or the oldest commit's first row when the log's clean-up
        removed the entry of ``at`` (a read from before the oldest offset reads from the oldest)."""
        if self.entry(table, at.version) is None and at.version < self.latest(table):
            return max(at, Position(self.oldest(table), 0))
        return at

    def rows(self, table: str, entry: LogEntry) -> CommitRows:
        """The rows commit ``entry`` added, in the table's current schema, with their table partitions."""
        key = (self.tables.uri(table), entry.version)
        with self._lock:
            if key in self._rows:
                self._rows.move_to_end(key)
                return self._rows[key]
        schema = self.schema(table, entry.version)
        files = self.tables.call(
            "read the rows of", table, lambda: self.tables.rows(self.tables.handler(table), entry.files, schema)
        )
        rows = CommitRows(
            concat(files, schema),
            tuple(accumulate(f.num_rows for f in files)),
            tuple(partition_label(f) for f in entry.files),
        )
        with self._lock:
            self._rows[key] = rows
            while len(self._rows) > ROW_CACHE:
                self._rows.popitem(last=False)
        return rows

    def schema(self, table: str, version: int) -> pa.Schema:
        """The table's schema as of ``version`` or later: kept until a commit past the version it was read at
        is read (a later schema holds every column of an earlier commit's rows)."""
        with self._lock:
            known = self._schemas.get(table)
        if known is not None and known[0] >= version:
            return known[1]
        loaded = self.tables.call("read", table, lambda: self.tables.load(table))
        if loaded is None:
            raise StreamNotFoundError(f"Delta table '{table}' at {self.tables.uri(table)} disappeared")
        found = (int(loaded.version()), arrow_schema(loaded))
        with self._lock:
            self._schemas[table] = found
        return found[1]

    def count(self, table: str, entry: LogEntry) -> int:
        """Rows commit ``entry`` added: from the log's statistics, else by reading them."""
        return entry.records if entry.records is not None else self.rows(table, entry).table.num_rows
