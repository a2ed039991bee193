"""Output record ids: the one place their formats are made and read (docs/guarantees.md, "Output ids").

Every record a stage writes to an output stream, and every dead letter of an input, carries an id
(`weirflow.interfaces.system.OutgoingRecord.id`). Three kinds, told apart by their shape:

* a **row** of a row-wise stage, named by its position, which a replay reproduces::

      <stage>/<__pss hex>/<__pos hex>/<__k>            e.g. views/10002/3e8000/0

  Per output partition, the rows of one (stage, ``__pss``) arrive in position order, each replay a copy of a
  stretch already written (docs/guarantees.md): a consumer keeps a **mark** per (partition, stage, ``__pss``);

* a **result** of a stateful stage (a window's count, a join's match), named by where it was first written::

      <task>/<attempt>.<batch hex>.<spark partition hex>.<try>.<index hex>/<digest>
                                             e.g. counts-0/5f0c1e2a9b3d4c6e.1a.3.0.2f/9c0e4d1b22aa0f3e

  ``attempt`` is a random token of the task's query (one per start), so no two results ever share an id,
  however equal they are; ``digest`` is the BLAKE2b digest of the record's key and value, which the task's
  next attempt compares with what it produces again (`weirflow.spark.result_replays`). A task never writes a
  result twice, so a consumer has nothing to drop among results;

* a **dead letter** of an input record, named by the record's place::

      <ssp>/<offset>                                    e.g. local.page-views.3/1742

  ordered by offset per input partition on systems of dense offsets (a mark per (partition, ssp) again).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

_RESULT = re.compile(r"^(?P<task>.+)/(?P<origin>[0-9a-f]+(?:\.[0-9a-f]+){4})/(?P<digest>[0-9a-f]{16})$")
_ROW = re.compile(r"^(?P<stage>.+)/(?P<pss>[0-9a-f]+)/(?P<pos>[0-9a-f]+)/(?P<k>\d+)$")
_DEAD_LETTER = re.compile(r"^(?P<ssp>[^/]+\.\d+)/(?P<offset>.+)$")


@dataclass(frozen=True)
class RowId:
    """A row-wise stage's row: ``(pos, k)`` orders the rows of one (stage, ``pss``)."""

    stage: str
    pss: int
    pos: int
    k: int

    @property
    def lane(self) -> str:
        """What the row's order holds within: its stage and input partition (lane)."""
        return f"{self.stage}/{self.pss:x}"

    @property
    def place(self) -> tuple[int, int]:
        return (self.pos, self.k)


@dataclass(frozen=True)
class ResultId:
    """A stateful task's result: unique, never written twice by the task."""

    task: str
    origin: str
    digest: str


@dataclass(frozen=True)
class DeadLetterId:
    """A dead letter of record ``offset`` of input partition ``ssp`` (an SSP key)."""

    ssp: str
    offset: str

    @property
    def lane(self) -> str:
        return self.ssp

    @property
    def place(self) -> tuple[int, int] | None:
        """The offset as a number (dense offsets: ordered); None for a system of positions."""
        return (int(self.offset), 0) if self.offset.isdigit() else None


RecordId = RowId | ResultId | DeadLetterId


def row_id(stage: str, pss: int, pos: int, k: int) -> str:
    return f"{stage}/{pss:x}/{pos:x}/{k}"


def result_digest(key: bytes | None, value: bytes) -> str:
    """The digest of a result record's key and value, as its id carries it (16 hex digits)."""
    return hashlib.blake2b((key or b"") + b"\0" + value, digest_size=8).hexdigest()


def result_origin(attempt: str, batch: int, partition: int, try_number: int, index: int) -> str:
    """Where a result was first written: the query ``attempt`` token, Spark's ``batch``, the Spark
    ``partition`` that wrote it, that Spark task's ``try_number`` and the row's ``index`` in its write."""
    return f"{attempt}.{batch:x}.{partition:x}.{try_number:x}.{index:x}"


def result_id(task: str, origin: str, digest: str) -> str:
    return f"{task}/{origin}/{digest}"


def dead_letter_id(ssp_key: str, offset: str) -> str:
    return f"{ssp_key}/{offset}"


def parse(text: str | None) -> RecordId | None:
    """The kind and parts of an id, or None for no id or one of no known shape."""
    if not text:
        return None
    if (m := _RESULT.match(text)) is not None:
        return ResultId(m["task"], m["origin"], m["digest"])
    if (m := _ROW.match(text)) is not None:
        return RowId(m["stage"], int(m["pss"], 16), int(m["pos"], 16), int(m["k"]))
    if (m := _DEAD_LETTER.match(text)) is not None:
        return DeadLetterId(m["ssp"], m["offset"])
    return None


def result_task(text: str | None) -> str | None:
    """The task that wrote a result id, else None."""
    parsed = parse(text)
    return parsed.task if isinstance(parsed, ResultId) else None
