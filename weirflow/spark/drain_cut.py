"""A drain's cut of a row-wise stage's input that takes in what an earlier holder wrote past its checkpoint.

A row-wise stage's query starts from its tasks' checkpoints with a fresh Spark checkpoint, so it does not know
the batch an earlier holder of a task planned, wrote to an intermediate stream and never checkpointed: a
SIGTERM does not wait for a batch in flight, and a SIGKILL lands anywhere. Outside a drain that costs nothing:
the query reads on past that batch, its rows come again, and the consumer drops them by their positions
(`weirflow.spark.replay`). A drain cut where the query has read to, though, would leave those rows downstream,
counted, past a cut from which the next deployment reads and counts their input again.

So a drain cuts each input partition at least one past the furthest position of it that the stage's rows in
its intermediate streams hold (`cut_past_written`). Those positions are the consumers' marks: each consumer
task's checkpointed marks of its partition (`control.marks`), brought forward over the rest of the partition
(`weirflow.spark.replay.bring_forward`), as a consumer brings them forward when it starts elsewhere. The drain
then reads the killed batch's input again: its rows that reached the stream are dropped as replays, the others
are written, and the job's results are exactly its input up to the cut. Nothing past the furthest written
position is read: input that arrived after the stop stays for the next deployment (docs/drain.md).

One read of each intermediate partition's unconsumed end, once per query and drain, on the driver side.

A stateful task's query has no positions to go by: when it starts with results an earlier attempt wrote past its
checkpoint and Spark's offset log does not name the batch that wrote them, its cut is at least where its input
ended as it started (`read_floor`, the file `StageQuery._drain_floor` writes).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from weirflow.interfaces.system import SystemStreamPartition
from weirflow.spark.replay import ROW_BITS, Marks, bring_forward, parts_of


@dataclass(frozen=True)
class WrittenStream:
    """An intermediate stream a row-wise stage writes positioned rows to, with the task of each consuming stage
    that reads each of its partitions (whose checkpoint holds the partition's marks)."""

    system: str
    physical: str
    readers: dict[int, list[str]]  # partition -> consumer task names

    def to_json(self) -> dict[str, Any]:
        return {"s": self.system, "p": self.physical, "r": {str(p): t for p, t in self.readers.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WrittenStream:
        return cls(str(data["s"]), str(data["p"]), {int(p): list(t) for p, t in dict(data["r"]).items()})


def encode_written(producer: str, streams: list[WrittenStream]) -> str:
    """The source option naming the stage (``producer``) and the intermediate streams it writes to."""
    return json.dumps({"by": producer, "to": [s.to_json() for s in streams]}) if streams else ""


def decode_written(text: str) -> tuple[str, list[WrittenStream]]:
    if not text:
        return "", []
    data = json.loads(text)
    return str(data["by"]), [WrittenStream.from_json(d) for d in data["to"]]


def written_ends(
    systems: Any, checkpoints: Any, producer: str, streams: list[WrittenStream], code: int
) -> dict[int, int]:
    """Per partition of the input whose code is ``code``: one past the furthest offset whose rows stage
    ``producer`` wrote to ``streams`` (dense offsets), from the consumers' marks brought to each partition's
    end. Partitions with no row there are left out."""
    ends: dict[int, int] = {}
    for stream in streams:
        admin = systems.admin(stream.system)
        consumer = systems.consumer(stream.system)
        upcoming = admin.partition_metadata_of(stream.physical, list(stream.readers))
        for partition, readers in stream.readers.items():
            ssp = SystemStreamPartition(stream.system, stream.physical, partition)
            marks = _checkpointed_marks(checkpoints, readers, ssp.key())
            if marks is None:
                marks = Marks(str(upcoming[partition].oldest))
            marks = bring_forward(consumer, admin, ssp, marks, str(upcoming[partition].upcoming))
            for part, written in furthest_written(marks, producer, code).items():
                ends[part] = max(ends.get(part, 0), written)
    return ends


def furthest_written(marks: Marks, producer: str, code: int) -> dict[int, int]:
    """Per partition of the input whose code is ``code``: one past the furthest offset of it whose rows stage
    ``producer`` wrote to the partition ``marks`` were taken over."""
    ends: dict[int, int] = {}
    for value, pos in marks.furthest(producer).items():
        code_of, partition, _lane = parts_of(value)
        if code_of == code:
            ends[partition] = max(ends.get(partition, 0), (pos >> ROW_BITS) + 1)
    return ends


def cut_past_written(
    start: dict[str, int], written: dict[int, int], partition_of: Callable[[str], int]
) -> dict[str, int]:
    """A drain's cut per SSP key: where the query has read to (``start``), or past what an earlier holder wrote
    (`written_ends`) when that is further."""
    return {key: max(offset, written.get(partition_of(key), 0)) for key, offset in start.items()}


def read_floor(path: str) -> dict[str, int]:
    """The least cut per SSP key a stateful task's drain may take (the file `StageQuery._drain_floor` wrote, none
    when it wrote none)."""
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as file:
            return {str(k): int(v) for k, v in json.load(file).items()}
    except FileNotFoundError:
        return {}


def _checkpointed_marks(checkpoints: Any, readers: list[str], key: str) -> Marks | None:
    """The marks of intermediate partition ``key`` in the checkpoint of the reader that read it furthest; None
    when no reader has checkpointed marks of it."""
    best: Marks | None = None
    for task in readers:
        checkpoint = checkpoints.read_last_checkpoint(task)
        stored = dict(checkpoint.control).get("marks", {}).get(key) if checkpoint is not None else None
        if stored is None:
            continue
        marks = Marks.from_json(stored)
        if best is None or int(marks.at) > int(best.at):
            best = marks
    return best
