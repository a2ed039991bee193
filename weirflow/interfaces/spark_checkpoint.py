"""The one owner of a Spark checkpoint directory's layout, and of the weirflow source's offsets in it.

Spark writes, per micro-batch ``b`` of a query, into its checkpoint directory (``checkpointLocation``):

* ``offsets/<b>`` when the batch is planned: a version line, a metadata line (JSON, with
  ``batchWatermarkMs``), then one JSON line per source: its end offsets, which for the weirflow source
  (`weirflow.spark.source`) is a `SourceOffset`;
* the state stores' files of version ``b + 1`` (``state/<operator>/<partition>/<b+1>.delta`` or ``.snapshot``,
  plus ``.zip`` / ``.changelog`` for RocksDB) while it runs;
* ``commits/<b>`` once it is done.

The served tables (`weirflow.runtime.served_tables`) keep one file per batch under ``served/``, and a stateful
task's sink
one per batch under ``results/`` (``results/<b>.json``: where the task's outputs ended when the batch committed
and the replays still to come, `weirflow.spark.result_replays.ResultsLedger`). Every file is written
once and never changed (a temporary file renamed), so a copy can be kept up to date by sending new files only
(`weirflow.interfaces.spark_state`). This module lives among the interfaces because the Spark state stores of
the plugins read the layout too; it depends on nothing else of weirflow.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

OFFSETS_DIR = "offsets"
COMMITS_DIR = "commits"
STATE_DIR = "state"
SERVED_DIR = "served"
RESULTS_DIR = "results"


# --- the weirflow source's offsets (one line per source of ``offsets/<b>``) ------------------------------
@dataclass(frozen=True)
class PartitionOffset:
    """Where a source's read of one SSP stands after a batch (JSON keys in brackets, kept short because
    Spark writes them into every batch's offset log).

    ``offset`` (``o``): the next offset to read. ``ended`` (``e``): a bounded stream's partition consumed to
    its end. ``drained`` (``d``, only with ``ended``): consumed to its drain cut instead (docs/drain.md).
    ``position`` (``x``, optional): the system's native position of the record before ``offset``, known when
    a batch reads up to the partition's newest record; it becomes the checkpoint's ``positions``."""

    offset: str
    ended: bool = False
    drained: bool = False
    position: dict[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"o": self.offset, "e": self.ended}
        if self.drained:
            data["d"] = True
        if self.position:
            data["x"] = dict(self.position)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PartitionOffset:
        position = data.get("x")
        return cls(
            offset=str(data["o"]),
            ended=bool(data.get("e")),
            drained=bool(data.get("d")),
            position=dict(position) if position else None,
        )


@dataclass(frozen=True)
class SourceOffset:
    """The weirflow source's offset for one input stream of a query: ``stream_id`` (``s``), each SSP's
    `PartitionOffset` by SSP key (``p``) and the watermark injected into Spark (``w``, ms; -1: none)."""

    stream_id: str
    partitions: dict[str, PartitionOffset] = field(default_factory=dict)
    watermark: int = -1

    def to_json(self) -> dict[str, Any]:
        return {
            "s": self.stream_id,
            "p": {key: p.to_json() for key, p in self.partitions.items()},
            "w": self.watermark,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SourceOffset:
        return cls(
            stream_id=str(data.get("s", "")),
            partitions={key: PartitionOffset.from_json(p) for key, p in data["p"].items()},
            watermark=int(data.get("w", -1)),
        )

    @staticmethod
    def is_one(data: Any) -> TypeGuard[dict[str, Any]]:
        """Whether a source's JSON in Spark's offset log (or its progress report) is the weirflow source's."""
        return isinstance(data, dict) and "p" in data


# --- the offset and commit logs --------------------------------------------------------------------------
def last_committed_batch(location: Path) -> int | None:
    """The last batch in the commit log of the Spark checkpoint at ``location``, or None (no directory, no
    committed batch)."""
    try:
        names = os.listdir(location / COMMITS_DIR)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return max((int(n) for n in names if n.isdigit()), default=None)


@dataclass(frozen=True)
class CommittedBatch:
    """Spark's last committed batch of a checkpoint: its number, its metadata line and the weirflow sources'
    end offsets (other sources' lines are left out)."""

    batch: int
    metadata: dict[str, Any]
    sources: list[SourceOffset]

    @property
    def watermark_ms(self) -> int:
        """The event-time watermark Spark ran the batch with."""
        return int(self.metadata.get("batchWatermarkMs", 0))


def last_committed(location: Path) -> CommittedBatch | None:
    """The last committed batch of the Spark checkpoint at ``location``, read from its offset log; None if
    there is none."""
    batch = last_committed_batch(location)
    return None if batch is None else planned_batch(location, batch)


def planned_batch(location: Path, batch: int) -> CommittedBatch | None:
    """Batch ``batch`` as Spark planned it in the offset log of the checkpoint at ``location`` (written before
    the batch runs): its metadata and the weirflow sources' end offsets; None when the log has no such batch."""
    try:
        lines = (location / OFFSETS_DIR / str(batch)).read_text().splitlines()
    except FileNotFoundError:
        return None
    metadata = json.loads(lines[1])
    sources = [json.loads(line) for line in lines[2:] if line.strip().startswith("{")]
    return CommittedBatch(batch, metadata, [SourceOffset.from_json(s) for s in sources if SourceOffset.is_one(s)])


def history_of(location: Path) -> str | None:
    """The identity of the Spark checkpoint at ``location``: the query id Spark wrote in its ``metadata`` file
    when the directory was new. Batch numbers of two histories (a task's directory from before a drain, or from
    before it moved away and back, and the one it has now) say nothing about each other; this tells them
    apart. None when there is no metadata file (yet)."""
    try:
        return str(json.loads((location / "metadata").read_text())["id"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def has_state(location: Path) -> bool:
    """Whether the Spark checkpoint at ``location`` holds operator state (a stateful query's)."""
    return (location / STATE_DIR).exists()


def has_offsets(location: Path) -> bool:
    """Whether Spark has planned any batch in the checkpoint at ``location``."""
    return (location / OFFSETS_DIR).exists()


# --- which files make up a Spark checkpoint as of a committed batch ------------------------------------
# Files of a batch after ``b`` may already exist while batch ``b``'s copy is being made (the next batch has
# started); they are left out, so a restored copy is exactly Spark's directory as of batch ``b``.
_LOG = re.compile(rf"^({OFFSETS_DIR}|{COMMITS_DIR})/(\d+)$")
# weirflow.runtime.served_tables: one per batch
_SERVED = re.compile(rf"^{SERVED_DIR}/[^/]+/(\d+)\.(?:delta|snapshot)$")
_RESULTS = re.compile(rf"^{RESULTS_DIR}/(\d+)\.json$")  # weirflow.spark.result_replays: one per batch
_STATE_VERSION = re.compile(rf"^{STATE_DIR}/.+/(\d+)(?:_[^/]*)?\.(?:delta|snapshot|zip|changelog)$")


def committed_files(local: Path, batch: int) -> dict[str, int]:
    """Relative path -> size of every file of ``local`` that belongs to its state as of committed ``batch``:
    metadata and source files, the offset and commit logs up to ``batch``, state files up to version
    ``batch + 1``, served-table files (`weirflow.runtime.served_tables`) and results ledgers up to ``batch``.
    Spark's
    hidden checksum and temporary files (``.*.crc``, ``.*.tmp``) are left out."""
    found: dict[str, int] = {}
    for path in local.rglob("*"):
        if not path.is_file() or path.name.startswith("."):
            continue
        rel = path.relative_to(local).as_posix()
        log = _LOG.match(rel)
        if log and int(log.group(2)) > batch:
            continue
        state = _STATE_VERSION.match(rel)
        if state and int(state.group(1)) > batch + 1:
            continue
        served = _SERVED.match(rel) or _RESULTS.match(rel)
        if served and int(served.group(1)) > batch:
            continue
        try:
            found[rel] = path.stat().st_size
        except FileNotFoundError:  # Spark purged it meanwhile
            continue
    return found


def manifest_versions(manifest: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Path -> (size, modification time in ns) of the files a stored copy's manifest lists (a
    `weirflow.interfaces.spark_state.SparkStateStore`'s record of what it holds); a manifest written before
    modification times were recorded gives -1, which no local file matches (each is sent once more)."""
    modified = manifest.get("modified", {})
    return {rel: (int(size), int(modified.get(rel, -1))) for rel, size in manifest.get("files", {}).items()}


def local_versions(local: Path, files: dict[str, int]) -> dict[str, tuple[int, int]]:
    """(size, modification time in ns) of ``files`` under ``local``, to compare with `manifest_versions`; a file
    gone since the listing (purged by Spark) is left out."""
    versions = {}
    for rel in files:
        try:
            stat = (local / rel).stat()
        except FileNotFoundError:
            continue
        versions[rel] = (stat.st_size, stat.st_mtime_ns)
    return versions
