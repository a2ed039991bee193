"""Where a task of a shared aggregation query starts reading so that its open windows are whole again.

The tasks a processor holds of a stage whose state is one `Stream.aggregate` run as one Spark query
(docs/pipelines.md, "How a task runs"). Its operator state spans every task, so it cannot follow a task that
moves: a query that starts keeps no state at all, and each task rebuilds its open windows by reading its
intermediate partition again from a **rebuild point**. Two facts, checkpointed with the task's offsets in the
same fenced write, make that exact:

* ``closed``: Spark's watermark in the task's last checkpointed batch. Spark writes a window's result in the
  batch whose watermark reaches the window's end (`end <= watermark`, append mode), so every window of the task
  ending at or before ``closed`` was written, and none after it by a checkpointed batch.
* **rebuild marks**, per intermediate partition: ``[offset, latest]`` pairs, each saying that no row before
  ``offset`` has an event time after ``latest``. A row of time ``t`` falls in a window ending no later than
  ``t + length``, so rows before the last mark with ``latest + length <= closed`` belong only to windows
  already written: reading from that mark's offset brings back every row of every window still open.

A restart reads the rows between the rebuild point and the checkpoint again. The windows they close that end at
or before ``closed`` were written already (with all their rows, which the rebuild need not have) and are
left out by the query itself (a filter on the window's end per task); every later window gets all its rows,
since Spark drops a row only once its window ended at or before the watermark, and the query's watermark stays
at or below ``closed`` for the task until its reads pass the checkpoint (`RebuildState.cap`).
Results an earlier attempt wrote past the checkpoint are recognised as for any stateful task
(`weirflow.spark.result_replays`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

NO_WINDOW_WRITTEN = -1  # ``closed`` of a task that wrote no window yet in this deployment: nothing to leave out
MAX_MARKS = 48  # rebuild marks kept per partition: each checkpoint holds them, so they must stay few

_UNITS_MS = {
    "millisecond": 1,
    "second": 1_000,
    "minute": 60_000,
    "hour": 3_600_000,
    "day": 86_400_000,
    "week": 604_800_000,
}
_PART = re.compile(r"\s*(\d+)\s*([a-z]+)\s*", re.IGNORECASE)

Mark = list[int | str]  # [offset (a decimal string), latest event time in ms]


def duration_ms(text: str) -> int | None:
    """The milliseconds of a duration in Spark's interval text (``"1 minute"``, ``"2 minutes 30 seconds"``,
    ``"500 milliseconds"``), or None when it is not one of those (months and years have no fixed length)."""
    total, at = 0, 0
    text = text.strip()
    if text.lower().startswith("interval"):
        text = text[len("interval") :]
    while at < len(text):
        match = _PART.match(text, at)
        if match is None or match.end() == at:
            return None
        name = match.group(2).lower()
        unit = _UNITS_MS.get(name[:-1] if name.endswith("s") else name)
        if unit is None:
            return None
        total += int(match.group(1)) * unit
        at = match.end()
    return total or None


def add_mark(marks: list[Mark], offset: str, latest: int, step_ms: int) -> list[Mark]:
    """``marks`` after a batch that ended at ``offset`` with no row before it later than ``latest``. The marks are
    steps at least ``step_ms`` apart in ``latest`` and a last one that follows the reads (a ``latest`` below the
    last mark's moves that mark's offset on: the list keeps the running maximum itself). Dropping a mark is
    always safe (rebuild points only move earlier), so past `MAX_MARKS` every other mark between the first and
    the last goes: the marks thin out with age instead of losing the span back to the rebuild point."""
    out = [list(m) for m in marks]
    if out and int(out[-1][1]) >= latest:
        out[-1][0] = offset  # no later row: the same statement holds further on
    elif len(out) >= 2 and latest - int(out[-2][1]) < step_ms:
        out[-1] = [offset, latest]  # the last mark follows the reads until it is a step from the one before
    else:
        out.append([offset, latest])
    if len(out) > MAX_MARKS:
        out = [out[0], *out[1:-1][1::2], out[-1]]
    return out


def prune(marks: list[Mark], closed: int, length_ms: int) -> list[Mark]:
    """``marks`` without those before the rebuild point of ``closed`` (`rebuild_point`): later rebuild points are
    never earlier, since ``closed`` only grows."""
    keep = _point_index(marks, closed, length_ms)
    return marks[keep:] if keep is not None else marks


def rebuild_point(marks: Sequence[Mark], closed: int, length_ms: int) -> str | None:
    """The offset to read a partition again from so that every window ending after ``closed`` gets all its rows:
    that of the last mark whose rows all fall in windows ending at or before ``closed``; None when no mark is
    that early (the partition must be read from its oldest record)."""
    index = _point_index(marks, closed, length_ms)
    return str(marks[index][0]) if index is not None else None


def _point_index(marks: Sequence[Mark], closed: int, length_ms: int) -> int | None:
    found = None
    for i, (_, latest) in enumerate(marks):
        if int(latest) + length_ms <= closed:
            found = i
        else:
            break
    return found


@dataclass
class RebuildState:
    """A task's rebuild in a shared aggregation query: ``closed`` as its checkpoint had it when the query started
    and, per input partition, the offset its reads must pass before the rebuild is over (its checkpointed
    offset)."""

    closed: int
    until: dict[str, int]

    def over(self, read_to: Mapping[str, str]) -> bool:
        """Whether the task's reads (SSP key -> next offset) passed the checkpoint in every partition."""
        return all(int(read_to.get(key, -1)) >= end for key, end in self.until.items())

    def cap(self, injected: int | None) -> int | None:
        """What the task lets the query's watermark be (an injected watermark is Spark's watermark, the source
        adds the delay Spark takes off): its own, but no further than ``closed`` while its rebuild runs."""
        if injected is None:
            return None
        return min(injected, self.closed)
