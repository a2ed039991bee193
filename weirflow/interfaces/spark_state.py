"""Where a task's Spark state lives when its processor is gone (``task.spark.checkpoint.store``).

A stateful Spark task (windows, aggregations, joins) keeps its operator state in its Spark checkpoint
directory on the processor's local disk (`weirflow.spark.stage_query`). When the task moves to another processor
— a rebalance, or its processor killed — a processor on another machine has no such directory, and without
one the task would restart with empty state from the checkpoint store's offsets: windows open at the move
would be counted only from then on. A `SparkStateStore` keeps a copy of each task's directory where every
processor can reach it: the runner *mirrors* the directory after each committed micro-batch (before the
checkpoint store's own write, so the copy is never behind the store's offsets) and *restores* it before the
task's query starts, when the copy is further on than what is on local disk. Which files make up a copy as of
a committed batch, and which batch is the last committed, is `weirflow.interfaces.spark_checkpoint`.

Implementations: ``local`` (the embedded default; the local disk is the only copy, since every processor of
an embedded job shares it), ``azure`` (Blob Storage, `weirflow_azure.coordinator.spark_state`) and ``aws`` (S3,
`weirflow_aws.spark_state`); the last two are one algorithm, `weirflow.interfaces.spark_state_mirror`, over
each one's objects. The default follows ``job.coordinator.factory``.
"""

from __future__ import annotations

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
        epoch: a copy stored by a later holder refuses the write (`weirflow.base.errors.FencedOffError`)."""

    @abstractmethod
    def restore(self, task: str, local: Path) -> int | None:
        """When the stored copy has a later committed batch than ``local`` (or ``local`` has none), or is of
        another Spark history (`weirflow.interfaces.spark_checkpoint.history_of`: batch numbers of two
        histories say nothing about each other), replace ``local`` with it; returns the stored copy's batch,
        or None when nothing is stored."""

    @abstractmethod
    def discard(self, task: str) -> None:
        """Forget the stored copy (the task starts a new run with a fresh Spark checkpoint)."""

    def close(self) -> None:
        """Release clients. Idempotent."""


class SparkStateStoreFactory(ABC):
    @abstractmethod
    def get_spark_state_store(self, config: ConfigView) -> SparkStateStore: ...
