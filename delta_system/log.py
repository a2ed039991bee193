"""One commit of a Delta table as weirflow reads it: the log entry ``_delta_log/<version, 20 digits>.json``
summed up (`LogEntry`).

A log entry is immutable once written (the Delta protocol's put-if-absent of the next version is what makes a
commit), so a summary is cached for good (`EntryCache`). What weirflow needs of an entry:

* ``marks``: the application ids of its ``txn`` actions, the marks it set (`weirflow.interfaces.table`); the
  writer checks the commits after the version a commit read at against them;
* ``token``: the ``weirflow.commit`` field a weirflow writer puts in its ``commitInfo``, unique per commit, by
  which a writer recognises its own commit after a storage failure hid whether it landed;
* ``files``: the data files it added with rows that are new to the table. A commit that also removes data
  (``remove`` with ``dataChange``: a DELETE, UPDATE or MERGE rewriting files) re-adds rows the table already
  held, so none of its files count as new rows; nor do files added without ``dataChange`` (OPTIMIZE). Every
  commit weirflow makes is a blind append, so every row it wrote is in exactly one entry's ``files``.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote

from weirflow.base.errors import MalformedDocumentError

# The commitInfo field naming a weirflow commit (a random token per commit).
COMMIT_TOKEN_FIELD = "weirflow.commit"


def entry_path(version: int) -> str:
    """The log entry of ``version``, relative to the table's root."""
    return f"_delta_log/{version:020d}.json"


@dataclass(frozen=True)
class DataFile:
    """A data file a commit added: its path relative to the table's root (decoded from the log's URI form),
    its partition values as the log writes them (strings, None for null) and its row count when the log
    holds statistics."""

    path: str
    partition_values: Mapping[str, str | None] = field(default_factory=dict)
    records: int | None = None


@dataclass(frozen=True)
class LogEntry:
    """The parts of a commit weirflow reads (module docstring). ``timestamp_ms`` is the commit's time (its
    ``commitInfo.timestamp``, else the newest file's modification time, else 0)."""

    version: int
    timestamp_ms: int
    marks: frozenset[str] = frozenset()
    token: str | None = None
    files: tuple[DataFile, ...] = ()

    @property
    def records(self) -> int | None:
        """Rows the commit added, from the log's statistics; None when a file has none."""
        counts = [f.records for f in self.files]
        return None if None in counts else sum(c for c in counts if c is not None)


def _records(stats: object) -> int | None:
    if not isinstance(stats, str) or not stats:
        return None
    try:
        value = json.loads(stats).get("numRecords")
    except (ValueError, AttributeError):
        return None
    return int(value) if isinstance(value, int) else None


def parse_entry(version: int, text: str, where: str = "") -> LogEntry:
    """The summary of log entry ``version`` (newline-delimited JSON actions). `MalformedDocumentError` names
    the entry when a line is not a JSON object."""
    marks: set[str] = set()
    token: str | None = None
    added: list[DataFile] = []
    rewrites = False
    timestamp = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            action = json.loads(line)
        except ValueError as exc:
            raise MalformedDocumentError(f"{where}{entry_path(version)} line {number} is not JSON: {exc}") from exc
        if not isinstance(action, dict):
            raise MalformedDocumentError(f"{where}{entry_path(version)} line {number} is not a JSON object")
        if isinstance(action.get("txn"), dict):
            marks.add(str(action["txn"].get("appId")))
        elif isinstance(action.get("commitInfo"), dict):
            info = action["commitInfo"]
            token = str(info[COMMIT_TOKEN_FIELD]) if info.get(COMMIT_TOKEN_FIELD) is not None else None
            timestamp = int(info.get("timestamp") or 0)
        elif isinstance(action.get("remove"), dict):
            rewrites = rewrites or bool(action["remove"].get("dataChange", True))
        elif isinstance(action.get("add"), dict):
            add = action["add"]
            if add.get("dataChange", True):
                added.append(
                    DataFile(
                        unquote(str(add["path"])),
                        dict(add.get("partitionValues") or {}),
                        _records(add.get("stats")),
                    )
                )
            timestamp = timestamp or int(add.get("modificationTime") or 0)
    return LogEntry(version, timestamp, frozenset(marks), token, () if rewrites else tuple(added))


class EntryCache:
    """Summaries of log entries by (table location, version), the most recently used `capacity` of them.
    Thread-safe. Entries never change, so a cached one is never stale."""

    def __init__(self, capacity: int = 8192) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[tuple[str, int], LogEntry] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, uri: str, version: int) -> LogEntry | None:
        with self._lock:
            entry = self._entries.get((uri, version))
            if entry is not None:
                self._entries.move_to_end((uri, version))
            return entry

    def put(self, uri: str, entry: LogEntry) -> None:
        with self._lock:
            self._entries[(uri, entry.version)] = entry
            self._entries.move_to_end((uri, entry.version))
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)
