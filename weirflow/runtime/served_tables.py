"""Where a served table (``stream.serve``, docs/endpoints.md) is kept: delta and snapshot files in the task's
Spark checkpoint directory, the way Spark keeps its own state store.

A served table holds, per task, the latest row of each key its stage wrote. After each micro-batch the sink's
``commit`` (on the driver's machine, before Spark records the batch as committed) writes the batch's latest
row per key as ``served/<table>/<batch>.delta``; every `COMPACT_EVERY` deltas it writes the whole table as
``<batch>.snapshot`` and deletes what the snapshot before it made redundant. Every file is written once under
a temporary name and renamed, so a reader never sees half a file and the Spark state store
(`weirflow.interfaces.spark_state`) can mirror the directory by sending new files only: the table moves with
the task's Spark state, to any machine, with nothing to rebuild.

A reader (`TableReader`, in the processor answering lookups) applies only files of batches Spark has
committed (``commits/<batch>``): a batch that fails and is replayed never shows half its rows, and after a
restore the table is exactly as of the batch the operator state is at.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from weirflow.interfaces.spark_checkpoint import COMMITS_DIR, SERVED_DIR, last_committed_batch

COMPACT_EVERY = 16  # deltas between snapshots: a reader replays at most this many files after a snapshot
_FILE = re.compile(r"^(\d+)\.(delta|snapshot)$")


def table_dir(location: Path, table: str) -> Path:
    """The directory of ``table`` in the task's Spark checkpoint directory ``location``."""
    return location / SERVED_DIR / table


def _files(directory: Path) -> list[tuple[int, str, Path]]:
    """(batch, kind, path) of the table's files, oldest first; a snapshot sorts after a delta of its batch."""
    found = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    for name in names:
        match = _FILE.match(name)
        if match:
            found.append((int(match.group(1)), match.group(2), directory / name))
    return sorted(found, key=lambda f: (f[0], f[1] == "snapshot"))


def _write_atomically(path: Path, rows: dict[str, str]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        json.dump(rows, out, separators=(",", ":"))
    os.replace(tmp, path)


def _read(path: Path) -> dict[str, str]:
    with open(path, encoding="utf-8") as f:
        rows: dict[str, str] = json.load(f)
    return rows


def write_batch(location: Path, table: str, batch: int, rows: dict[str, str]) -> None:
    """Record ``rows`` (key -> the row as JSON text) of micro-batch ``batch`` in ``table``; compact every
    `COMPACT_EVERY` deltas. Writing a batch again (Spark replays it) replaces its files."""
    directory = table_dir(location, table)
    directory.mkdir(parents=True, exist_ok=True)
    files = [f for f in _files(directory) if f[0] < batch]  # a replayed batch's later files are stale
    for stale in _files(directory):
        if stale[0] >= batch:
            stale[2].unlink(missing_ok=True)
    _write_atomically(directory / f"{batch}.delta", rows)
    snapshots = [f for f in files if f[1] == "snapshot"]
    since = [f for f in files if f[1] == "delta" and (not snapshots or f[0] > snapshots[-1][0])]
    if len(since) + 1 < COMPACT_EVERY:
        return
    table_rows: dict[str, str] = _read(snapshots[-1][2]) if snapshots else {}
    for _, _, path in since:
        table_rows.update(_read(path))
    table_rows.update(rows)
    _write_atomically(directory / f"{batch}.snapshot", table_rows)
    # Keep the previous snapshot and the deltas after it: if this batch is never committed (the query fails
    # before Spark's commit log names it) a reader still finds the table as of the last committed batch.
    keep_from = snapshots[-1][0] if snapshots else 0
    for old_batch, _, path in files:
        if old_batch < keep_from:
            path.unlink(missing_ok=True)
    (directory / f"{batch}.delta").unlink(missing_ok=True)


class ServedTable(Protocol):
    """What answers lookups of one task's copy of a table: `TableReader` (files, Spark tasks) or `MemoryTable`
    (record tasks)."""

    def get(self, key: str) -> str | None: ...

    def scan(self, prefix: str = "", after: str | None = None) -> Iterator[tuple[str, str]]: ...


class MemoryTable:
    """A record task's table: rows (key -> JSON text) in memory, rebuilt from the table's changelog stream when
    the task starts (`weirflow.tasks.record_task`)."""

    def __init__(self) -> None:
        self._rows: dict[str, str] = {}

    def put(self, key: str, row: str) -> None:
        self._rows[key] = row

    def get(self, key: str) -> str | None:
        return self._rows.get(key)

    def scan(self, prefix: str = "", after: str | None = None) -> Iterator[tuple[str, str]]:
        rows = self._rows
        for key in sorted(k for k in list(rows) if k.startswith(prefix) and (after is None or k > after)):
            yield key, rows[key]

    def __len__(self) -> int:
        return len(self._rows)


class TableReader:
    """One task's copy of one served table, read from its directory and kept current cheaply: a lookup costs
    two ``stat`` calls unless a batch was committed since the last one."""

    def __init__(self, location: Path, table: str) -> None:
        self.location = location
        self.directory = table_dir(location, table)
        self._rows: dict[str, str] = {}
        self._applied = -1  # last batch applied
        self._seen: tuple[int, int] | None = None
        self._guard = threading.Lock()

    def _signature(self) -> tuple[int, int]:
        def mtime(path: Path) -> int:
            try:
                return path.stat().st_mtime_ns
            except FileNotFoundError:
                return 0

        return mtime(self.directory), mtime(self.location / COMMITS_DIR)

    def refresh(self) -> None:
        signature = self._signature()
        if signature == self._seen:
            return
        with self._guard:
            committed = last_committed_batch(self.location)
            committed = -1 if committed is None else committed
            if committed < self._applied:  # the directory was replaced (a restore, or a fresh Spark checkpoint)
                self._rows, self._applied = {}, -1
            files = [f for f in _files(self.directory) if f[0] <= committed]
            snapshots = [f for f in files if f[1] == "snapshot" and f[0] > self._applied]
            rows = self._rows
            applied = self._applied
            try:
                if snapshots:
                    rows, applied = _read(snapshots[-1][2]), snapshots[-1][0]
                else:
                    rows = dict(rows)
                for batch, kind, path in files:
                    if kind == "delta" and batch > applied:
                        rows.update(_read(path))
                        applied = batch
            except FileNotFoundError:  # compacted away while listing: read again next time
                return
            self._rows, self._applied, self._seen = rows, max(applied, committed), signature

    def get(self, key: str) -> str | None:
        self.refresh()
        return self._rows.get(key)

    def scan(self, prefix: str = "", after: str | None = None) -> Iterator[tuple[str, str]]:
        """Rows whose key starts with ``prefix`` and sorts after ``after``, in key order."""
        self.refresh()
        rows = self._rows
        for key in sorted(k for k in rows if k.startswith(prefix) and (after is None or k > after)):
            yield key, rows[key]

    def __len__(self) -> int:
        self.refresh()
        return len(self._rows)
