"""Row positions, and the marks with which a stage drops what a replay wrote again (docs/guarantees.md).

A task killed after its batch's rows reached an intermediate stream but before its checkpoint named the
batch's input offsets is replayed by the next holder from that checkpoint: the rows are written again. They
are recognised, not avoided. Every row a row-wise stage writes carries its **position**, which a replay
reproduces: the input it came from and where in that input,

* ``__pss`` (int64): the input stream's **code** (bits 16-31: `input_codes`, from the stream's system and
  physical name, so that an upgrade that adds, removes or reorders a stage's inputs gives none of them another
  one) and its partition (bits 0-15); on a system whose partitions interleave several ordered lanes
  (Kinesis: a virtual task reads several shards; `weirflow.interfaces.system.RecordColumns`), the lane plus
  one in bits 32-62, so that each lane is a partition of its own here;
* ``__pos`` (int64): the record's offset (or its ordinal in its lane) times 4,096 plus the row's index in the
  record (a packed intermediate record holds at most 4,096 rows; an input record is one row, index 0);
* ``__k`` (int32, set by the sink): the row's index among the outputs of that input row, in order.

A consuming task keeps, per intermediate partition it reads, a **mark** per (producer stage, ``__pss``): the
largest (``__pos``, ``__k``) it has taken. A row at or below its mark is a replay and is dropped. Why that is
exact: the writers of one input partition write its rows in position order, each send durable before the
next, and a task resumes only from a checkpoint written after every row before it was durable. So whenever a
position is in the stream, every smaller position bound for the same partition is already before it, and the
consumer, which reads in order, has seen it. (This needs a deterministic transform: a replay of one input row
must produce the same rows in the same order.)

The marks of one intermediate partition after a read are a function of the stream alone. They travel with the
consuming task's checkpoint (``control.marks``, in the same fenced write as its offsets) together with the
offset they hold at (``at``), and from one micro-batch to the next through a small file per partition and
offset on the processor's machine (`MarksCache`); a read that finds neither at its start offset rebuilds
them by reading the stream from the checkpoint's offset.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import pyarrow as pa

from weirflow.base.errors import UnreadableRangeError
from weirflow.interfaces.system import SystemAdmin, SystemConsumer, SystemStreamPartition
from weirflow.spark.packing import unpack

PSS = "__pss"
POS = "__pos"
K = "__k"
POSITION_COLUMNS = (PSS, POS)
LANE_SHIFT = 32  # ``__pss`` bits above: the lane plus one (0: a partition of one lane)
PARTITION_MASK = (1 << LANE_SHIFT) - 1
ROW_BITS = 12  # a packed record holds at most 2**12 rows (`weirflow.spark.packing.MAX_ROWS`)
PRODUCER_KEY = b"weirflow.stage"  # the packed record's schema metadata naming the producing stage
_READ_CHUNK = 10_000  # records per read when marks are brought forward (`bring_forward`)


CODE_BITS = 16  # ``__pss`` bits 16-31: the input stream's code
# Codes below this were input indexes (rows written by versions before codes): no code takes one, so a mark
# such a row left in a checkpoint never meets a row placed by code.
FIRST_CODE = 256


def stream_code(system: str, physical: str) -> int:
    """A stream's code before collisions are resolved: from a digest of where it is, the same in every process,
    version and machine, in [`FIRST_CODE`, 2**16)."""
    digest = hashlib.blake2b(f"{system}.{physical}".encode(), digest_size=8).digest()
    return FIRST_CODE + int.from_bytes(digest, "big") % ((1 << CODE_BITS) - FIRST_CODE)


def input_codes(inputs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """The code of each of a stage's inputs, ``(system, physical name)`` -> code: its `stream_code`, or, when
    that is taken by an input that sorts before it, the next free one. The code depends on the stream alone
    unless two inputs of a stage collide (one chance in 65,280 per pair): a mark or an id of one input is never
    read as another's after an upgrade changes the stage's inputs (docs/guarantees.md)."""
    codes: dict[tuple[str, str], int] = {}
    taken: set[int] = set()
    for ref in sorted(set(inputs)):
        code = stream_code(*ref)
        while code in taken:
            code = code + 1 if code + 1 < 1 << CODE_BITS else FIRST_CODE
        taken.add(code)
        codes[ref] = code
    return codes


def pss(code: int, partition: int) -> int:
    """The ``__pss`` of partition ``partition`` of the input whose code is ``code`` (`input_codes`)."""
    return (code << CODE_BITS) | partition


def lane_pss(base: int, lanes: np.ndarray) -> np.ndarray:
    """The ``__pss`` of rows read from lanes ``lanes`` of the input partition whose ``__pss`` is ``base``."""
    return ((lanes.astype(np.int64) + 1) << LANE_SHIFT) | base


def input_partition(pss_value: int) -> int:
    """The ``__pss`` of the input partition a row's ``__pss`` belongs to (its lane, if any, dropped)."""
    return pss_value & PARTITION_MASK


def parts_of(pss_value: int) -> tuple[int, int, int | None]:
    """A ``__pss`` taken apart: (the input's code, its partition, the lane: None for a partition of one)."""
    lane = pss_value >> LANE_SHIFT
    return (
        (pss_value & PARTITION_MASK) >> CODE_BITS,
        pss_value & ((1 << CODE_BITS) - 1),
        lane - 1 if lane else None,
    )


@dataclass
class Marks:
    """The marks of one intermediate partition: (producer stage, ``__pss``) -> the largest (``__pos``,
    ``__k``) taken; ``at`` is the partition's offset they hold at (the next record to read)."""

    at: str
    marks: dict[str, tuple[int, int]] = field(default_factory=dict)
    # marks of lanes no row will come from again, and the offset past which they go (`weirflow.spark.lane_marks`)
    pending: dict[str, str] = field(default_factory=dict)
    checked_ms: int = 0  # when the lanes were last checked

    def admit(self, producer: str, rows: pa.Table) -> pa.Array | None:
        """The rows of one packed record that are not replays, as a boolean mask (None: all of them), and
        the marks moved past them. Rows without positions are all taken."""
        if POS not in rows.column_names or rows.num_rows == 0:
            return None
        pss_values = rows.column(PSS).to_numpy()
        pos = rows.column(POS).to_numpy()
        k = rows.column(K).to_numpy() if K in rows.column_names else np.zeros(len(pos), np.int64)
        keep = np.ones(len(pos), dtype=bool)
        for value in np.unique(pss_values):
            name = f"{producer}|{int(value)}"
            these = pss_values == value
            mark_pos, mark_k = self.marks.get(name, (-1, -1))
            fresh = these & ((pos > mark_pos) | ((pos == mark_pos) & (k > mark_k)))
            keep &= ~these | fresh
            if fresh.any():
                top = pos[fresh].max()
                self.marks[name] = (int(top), int(k[fresh & (pos == top)].max()))
        return None if keep.all() else pa.array(keep)

    def furthest(self, producer: str) -> dict[int, int]:
        """Per ``__pss`` of stage ``producer``'s rows: the largest ``__pos`` taken."""
        found: dict[int, int] = {}
        for name, (pos, _k) in self.marks.items():
            stage, _, value = name.rpartition("|")
            if stage == producer:
                found[int(value)] = pos
        return found

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "at": self.at,
            "m": {name: list(mark) for name, mark in sorted(self.marks.items())},
        }
        if self.pending:
            data["x"] = dict(sorted(self.pending.items()))
        if self.checked_ms:
            data["c"] = self.checked_ms
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Marks:
        return cls(
            str(data["at"]),
            {str(n): (int(m[0]), int(m[1])) for n, m in dict(data.get("m", {})).items()},
            {str(n): str(o) for n, o in dict(data.get("x", {})).items()},
            int(data.get("c", 0)),
        )


def producer_of(rows: pa.Table) -> str:
    """The stage that wrote a packed record (its schema's metadata), "" for records of older versions."""
    metadata = rows.schema.metadata or {}
    return metadata.get(PRODUCER_KEY, b"").decode("utf-8", "replace")


def bring_forward(
    consumer: SystemConsumer, admin: SystemAdmin, ssp: SystemStreamPartition, marks: Marks, end: str
) -> Marks:
    """``marks`` moved over the partition's records from ``marks.at`` up to ``end``, as a read of them would move
    them: where a read that finds no marks file starts from a checkpoint's marks, and where a drain learns how
    far a stage wrote (`weirflow.spark.drain_cut`). Raises `UnreadableRangeError` when a record in that range
    cannot be read."""
    position = marks.at
    while compare_offsets(admin, position, end) == -1:
        chunk = consumer.read_columns(ssp, position, _READ_CHUNK, end)
        if not len(chunk) and chunk.next_offset == position:
            raise UnreadableRangeError(
                f"{ssp.key()}: offsets [{position}, {end}) cannot be read to rebuild its marks"
            )
        for raw in chunk.values:
            if raw[:1] == b"\x04":
                try:
                    rows = unpack(raw)
                except (pa.ArrowInvalid, OSError):
                    continue
                marks.admit(producer_of(rows), rows)
        position = chunk.next_offset
    marks.at = end
    return marks


def compare_offsets(admin: SystemAdmin, a: str, b: str) -> int | None:
    """-1, 0 or 1 as offset ``a`` of a partition is before, at or after ``b``; None when the system cannot
    tell (two positions neither of which is past the other). Dense offsets compare as numbers."""
    if admin.dense_offsets:
        return (int(a) > int(b)) - (int(a) < int(b))
    return admin.compare_offsets(a, b)


def strip(rows: pa.Table) -> pa.Table:
    """A packed record's rows without the producer's position columns."""
    drop = [c for c in (PSS, POS, K) if c in rows.column_names]
    return rows.drop_columns(drop) if drop else rows


def output_index(pss_values: np.ndarray, pos: np.ndarray, carry: tuple[int, int, int] | None) -> np.ndarray:
    """``__k`` for rows in write order: each row's index among the consecutive rows of the same position;
    ``carry`` is the last row before them (its ``__pss``, ``__pos`` and ``__k``), from the previous batch."""
    n = len(pos)
    if n == 0:
        return np.zeros(0, np.int32)
    same = np.empty(n, dtype=bool)
    same[0] = carry is not None and (int(pss_values[0]), int(pos[0])) == carry[:2]
    same[1:] = (pss_values[1:] == pss_values[:-1]) & (pos[1:] == pos[:-1])
    index = np.arange(n)
    run_start = np.maximum.accumulate(np.where(same, 0, index))
    k = index - run_start
    if same[0] and carry is not None:  # the first run continues the previous batch's last one
        first = index < (np.argmin(same) if not same.all() else n)
        k = np.where(first, k + carry[2] + 1, k)
    return k.astype(np.int32)


class MarksCache:
    """Marks of each intermediate partition at the offsets reads ended at, one small file each, kept for the
    next read (the next micro-batch, or Spark's replay of the last one) and removed once older. A file is
    named by its offset; on a system of positions (``dense`` False: JSON, not a file name) by the offset's
    BLAKE2b digest, and every file but the two a save names is removed (positions do not order file names)."""

    def __init__(self, directory: str, dense: bool = True) -> None:
        self.directory = Path(directory)
        self.dense = dense

    def _dir(self, ssp_key: str) -> Path:
        return self.directory / quote(ssp_key, safe="")

    def _name(self, offset: str) -> str:
        return offset if self.dense else hashlib.blake2b(offset.encode(), digest_size=16).hexdigest()

    def load(self, ssp_key: str, offset: str) -> Marks | None:
        try:
            marks = Marks.from_json(json.loads((self._dir(ssp_key) / f"{self._name(offset)}.json").read_text()))
        except (FileNotFoundError, ValueError, KeyError):
            return None
        return marks if marks.at == offset else None

    def save(self, ssp_key: str, marks: Marks, start: str) -> None:
        """Keep ``marks`` (at the read's end) and the file at ``start`` (a replay of the read needs it);
        remove the older ones."""
        directory = self._dir(ssp_key)
        directory.mkdir(parents=True, exist_ok=True)
        name = self._name(marks.at)
        tmp = directory / f".{name}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(marks.to_json()))
        tmp.replace(directory / f"{name}.json")
        keep = {name, self._name(start)}
        for path in directory.glob("*.json"):
            if self.dense:
                try:
                    older = int(path.stem) < int(start)
                except ValueError:
                    continue
            else:
                older = path.stem not in keep
            if older:
                path.unlink(missing_ok=True)
