"""Results of a stateful stage that a replay would write to an intermediate stream again, recognised by the
task that writes them (docs/guarantees.md, "Stateful stages").

A stateful stage's rows are *results* (an aggregation's windows, a join's matches), not input rows: they have
no input position for the consumer's marks (`weirflow.spark.replay`). But a stateful stage runs one task per
query, and that task can tell what it already wrote:

* **Tails.** When a micro-batch's write is committed (the sink's ``commit``, on the driver, before the next
  batch starts), the sink notes each intermediate partition's next offset; the task's checkpoint for that
  batch records them (``control.tails``). Every row the task writes after that checkpoint lies beyond them.
* **Replays.** A task starting from a checkpoint with tails reads each partition from its tail to the end and
  keeps the rows of packed records that name it (`TASK_KEY` in their schema metadata): what an earlier attempt
  wrote past the checkpoint, which the replay will produce again. The sink drops each result equal to one of
  them, once per copy (a multiset of row digests), and the remainder is carried in the task's checkpoint
  (``control.replays``) until it is matched or `KEEP_BATCHES` micro-batches have passed, so that a second
  fault before the replay is over still knows the first attempt's rows.

Why a replay reproduces them: the next holder restores the operator state matching the checkpoint (the state
mirror, docs/pipelines.md) and reads the same input from the same offsets; an aggregation's result in append
mode is a closed window's final value, which does not depend on how the input was cut into batches (late rows
are dropped by the watermark the commit log restores). Results of update mode are changes, which a replay
that cuts batches differently need not reproduce; those are dropped only when equal, and the rest are new.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from weirflow.control import MessageType
from weirflow.interfaces.system import SystemStreamPartition
from weirflow.spark.packing import unpack

log = logging.getLogger("weirflow.spark")

TASK_KEY = b"weirflow.task"  # a stateful stage's packed record: the schema metadata naming the task
ROWS = bytes([MessageType.ROWS])
KEEP_BATCHES = 10  # micro-batches an unmatched replay is kept for (a kill leaves at most a batch or two)


def row_digests(rows: pa.Table | pa.RecordBatch, columns: Iterable[str] | None = None) -> list[str]:
    """A digest per row of ``columns`` (all by default), the same in every process and on every machine."""
    names = list(columns) if columns is not None else list(rows.schema.names)
    values = [rows.column(name).to_pylist() for name in names]
    return [hashlib.blake2b(repr(row).encode(), digest_size=8).hexdigest() for row in zip(*values, strict=True)]


@dataclass
class Replays:
    """Rows an earlier attempt of a task wrote that its replay will produce again: digest -> [copies, the
    checkpoints left to keep them]."""

    rows: dict[str, list[int]] = field(default_factory=dict)

    def __len__(self) -> int:
        return sum(copies for copies, _ in self.rows.values())

    def add(self, digests: Iterable[str]) -> None:
        for digest in digests:
            entry = self.rows.setdefault(digest, [0, KEEP_BATCHES])
            entry[0] += 1
            entry[1] = KEEP_BATCHES

    def merge(self, other: Replays) -> None:
        for digest, (copies, left) in other.rows.items():
            entry = self.rows.setdefault(digest, [0, left])
            entry[0] += copies
            entry[1] = max(entry[1], left)

    def take(self, digest: str) -> bool:
        """Whether ``digest`` is a replay; if so one copy of it is used up."""
        if digest not in self.rows:
            return False
        self.used({digest: 1})
        return True

    def used(self, taken: Mapping[str, int]) -> None:
        """Use up the copies that writers took (``digest -> copies``)."""
        for digest, copies in taken.items():
            entry = self.rows.get(digest)
            if entry is None:
                continue
            entry[0] -= copies
            if entry[0] <= 0:
                del self.rows[digest]

    def aged(self) -> Replays:
        """After one more micro-batch: entries kept `KEEP_BATCHES` batches unmatched are dropped."""
        return Replays({d: [c, left - 1] for d, (c, left) in self.rows.items() if left > 1})

    def to_json(self) -> dict[str, list[int]]:
        return {d: list(entry) for d, entry in sorted(self.rows.items())}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Replays:
        return cls({str(d): [int(e[0]), int(e[1])] for d, e in dict(data or {}).items()})

    @classmethod
    def load(cls, path: Path) -> Replays:
        try:
            return cls.from_json(json.loads(path.read_text()))
        except FileNotFoundError:
            return cls()

    def save(self, path: Path) -> None:
        """Write the replays to ``path``; none left removes the file (its readers then find nothing to do)."""
        if not self.rows:
            path.unlink(missing_ok=True)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_json()))
        tmp.replace(path)


def written_since(systems: Any, task: str, tails: Mapping[str, str]) -> Replays:
    """The rows ``task`` wrote to each intermediate partition from its tail offset (``ssp key -> offset``) on:
    packed records naming the task, read to the partition's end."""
    found = Replays()
    for key, start in tails.items():
        ssp = SystemStreamPartition.parse(key)
        consumer = systems.consumer(ssp.system)
        offset = start
        while batch := consumer.read(ssp, offset, 10_000):
            for record in batch:
                value = record.value
                if value[:1] != ROWS:  # control messages and single JSON rows
                    continue
                try:
                    rows = unpack(value)
                except (pa.ArrowInvalid, OSError):
                    continue
                if (rows.schema.metadata or {}).get(TASK_KEY) == task.encode():
                    found.add(row_digests(rows))
            offset = batch[-1].next_offset
    return found
