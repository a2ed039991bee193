"""Where a task's Spark state lives when its processor is gone (``task.spark.checkpoint.store``).

A stateful Spark task (windows, aggregations, joins) keeps its operator state in its Spark checkpoint
directory on the processor's local disk (`weirflow.spark.runner`). When the task moves to another processor
— a rebalance, or its processor killed — a processor on another machine has no such directory, and without
one the task would restart with empty state from the checkpoint store's offsets: windows open at the move
would be counted only from then on. A `SparkStateStore` keeps a copy of each task's directory where every
processor can reach it: the runner *mirrors* the directory after each committed micro-batch (before the
checkpoint store's own write, so the copy is never behind the store's offsets) and *restores* it before the
task's query starts, when the copy is further on than what is on local disk.

Implementations: ``local`` (the embedded default; the local disk is the only copy, since every processor of
an embedded job shares it) and ``azure`` (Blob Storage, `weirflow_azure.coordinator.spark_state`). The
default follows ``job.coordinator.factory``.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from weirflow.interfaces.config import ConfigView


@dataclass(frozen=True)
class MirrorReport:
    """What one mirror did: files and bytes sent, stored files deleted (Spark purged them), seconds taken."""

    uploaded: int = 0
    uploaded_bytes: int = 0
    deleted: int = 0
    seconds: float = 0.0


class SparkStateStore(ABC):
    """Copies of tasks' Spark checkpoint directories that any processor can restore."""

    @abstractmethod
    def mirror(self, task: str, local: Path, batch: int, epoch: int) -> MirrorReport:
        """Make the stored copy of ``task`` equal ``local`` as of committed batch ``batch`` (files of later,
        uncommitted batches are left out), sending only files not stored yet. ``epoch`` is the holder's lock
        epoch: a copy stored by a later holder refuses the write (`weirflow.errors.FencedOffError`)."""

    @abstractmethod
    def restore(self, task: str, local: Path) -> int | None:
        """When the stored copy has a later committed batch than ``local`` (or ``local`` has none), replace
        ``local`` with it; returns the stored copy's batch, or None when nothing is stored."""

    @abstractmethod
    def discard(self, task: str) -> None:
        """Forget the stored copy (the task starts a new run with a fresh Spark checkpoint)."""

    def close(self) -> None:
        """Release clients. Idempotent."""


class SparkStateStoreFactory(ABC):
    @abstractmethod
    def get_spark_state_store(self, config: ConfigView) -> SparkStateStore: ...


# --- which files make up a Spark checkpoint as of a committed batch ------------------------------------
# Which files of a Spark checkpoint directory make up its state as of a committed batch.
#
# Spark writes, per micro-batch ``b``: ``offsets/<b>`` when the batch is planned, the state stores' files of
# version ``b + 1`` (``state/<operator>/<partition>/<b+1>.delta`` or ``.snapshot``, plus ``.zip`` / ``.changelog``
# for RocksDB) while it runs, and ``commits/<b>`` once it is done. All of them are written once and never
# changed (Spark writes a temporary file and renames it), so a copy can be kept up to date by sending new files
# only. Files of a batch after ``b`` may already exist while batch ``b``'s copy is being made (the next batch
# has started); they are left out, so a restored copy is exactly Spark's directory as of batch ``b``.

_LOG = re.compile(r"^(offsets|commits)/(\d+)$")
_SERVED = re.compile(r"^served/[^/]+/(\d+)\.(?:delta|snapshot)$")  # weirflow.served_tables: one file per batch
_STATE_VERSION = re.compile(r"^state/.+/(\d+)(?:_[^/]*)?\.(?:delta|snapshot|zip|changelog)$")


def committed_files(local: Path, batch: int) -> dict[str, int]:
    """Relative path -> size of every file of ``local`` that belongs to its state as of committed ``batch``:
    metadata and source files, the offset and commit logs up to ``batch``, state files up to version
    ``batch + 1``, served-table files (`weirflow.served_tables`) up to ``batch``. Spark's hidden checksum and
    temporary files (``.*.crc``, ``.*.tmp``) are left out."""
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
        served = _SERVED.match(rel)
        if served and int(served.group(1)) > batch:
            continue
        try:
            found[rel] = path.stat().st_size
        except FileNotFoundError:  # Spark purged it meanwhile
            continue
    return found


def last_committed_batch(local: Path) -> int | None:
    """The last batch in ``local``'s commit log, or None."""
    commits = local / "commits"
    batches = [int(p.name) for p in commits.glob("[0-9]*") if p.name.isdigit()] if commits.exists() else []
    return max(batches) if batches else None
