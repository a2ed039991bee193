"""Marks of lanes no row can come from again, pruned (docs/guarantees.md, "Checkpoints stay bounded").

A consuming task keeps a mark per (producer stage, ``__pss``) of each intermediate partition it reads
(`weirflow.spark.replay`). Where the producer's input is made of lanes (Kinesis: a lane per shard), every shard
a producer task ever read leaves one, and a stream resharded every day would grow each consumer's checkpoint
without end, past what one DynamoDB item or Azure Table property holds.

A lane's mark is needed while a row of that lane may still reach the consumer: a first write, or a replay of
one. Once the producer task's checkpoint says it read the lane's shard to its end
(`SystemAdmin.lanes_live` no longer lists the lane at the checkpoint's position), no attempt of that task reads
the shard again, since every later attempt starts from that checkpoint or a later one, and every earlier
attempt's sends ended before the holder that wrote it claimed the task (the fence). So every row of the lane,
first or replayed, was in the intermediate stream before that checkpoint was read. The consumer notes the
partition's end as it is *after* reading the checkpoint (``Marks.pending``), and drops the mark once its
marks hold at or past that offset: it has read every row the lane will ever have.

A read checks at most once per `CHECK_EVERY_MS` per partition (``Marks.checked_ms``), and only partitions
whose marks have lanes: it reads the producer tasks' checkpoints, lists the input stream's shards and asks
the partition's end.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from weirflow.interfaces.system import SystemStreamPartition
from weirflow.job.grouper import partition_task
from weirflow.spark.replay import Marks, input_partition, parts_of

log = logging.getLogger("weirflow.spark.marks")

CHECK_EVERY_MS = 60_000


@dataclass(frozen=True)
class LaneSource:
    """Where the rows of one producer stage's input with lanes come from: the stream, and how the producer's
    tasks are named (`weirflow.job.grouper.partition_task`)."""

    system: str
    stream: str
    task_prefix: str

    def to_json(self) -> dict[str, str]:
        return {"system": self.system, "stream": self.stream, "task_prefix": self.task_prefix}


def encode_sources(sources: Mapping[tuple[str, int], LaneSource]) -> str:
    """The source option naming, per (producer stage, input code), the input a lane of its rows comes from."""
    return json.dumps({f"{stage}|{code}": source.to_json() for (stage, code), source in sorted(sources.items())})


def decode_sources(text: str) -> dict[tuple[str, int], LaneSource]:
    sources: dict[tuple[str, int], LaneSource] = {}
    for name, value in dict(json.loads(text or "{}")).items():
        stage, code = str(name).rsplit("|", 1)
        sources[(stage, int(code))] = LaneSource(
            str(value["system"]), str(value["stream"]), str(value["task_prefix"])
        )
    return sources


def lane_of(name: str) -> tuple[str, int, int] | None:
    """(producer stage, ``__pss`` of the input partition, lane) of a mark's name; None for a mark without a
    lane."""
    producer, _, value = name.rpartition("|")
    if not value.lstrip("-").isdigit():
        return None
    lane = parts_of(int(value))[2]
    return (producer, input_partition(int(value)), lane) if lane is not None else None


def prune(
    marks: Marks,
    now_ms: int,
    live_lanes: Callable[[str, int], set[int] | None],
    end: Callable[[], str],
    reached: Callable[[str], bool],
) -> int:
    """Drop the marks of ``marks`` whose lane is done and whose rows are all read; returns how many were dropped.

    ``live_lanes(producer, pss)`` answers the lanes the producer task of that input partition may still read
    (None: it cannot tell, so nothing is decided); ``end()`` the partition's end offset, asked after every
    ``live_lanes`` of this check; ``reached(offset)`` whether ``marks.at`` is at or past an offset."""
    dropped = 0
    for name, offset in list(marks.pending.items()):
        if name not in marks.marks:
            del marks.pending[name]
        elif reached(offset):
            del marks.marks[name]
            del marks.pending[name]
            dropped += 1
    if now_ms - marks.checked_ms < CHECK_EVERY_MS:
        return dropped
    marks.checked_ms = now_ms
    done: list[str] = []
    answers: dict[tuple[str, int], set[int] | None] = {}
    for name in marks.marks:
        lane = lane_of(name)
        if lane is None or name in marks.pending:
            continue
        producer, pss, number = lane
        if (producer, pss) not in answers:
            answers[(producer, pss)] = live_lanes(producer, pss)
        live = answers[(producer, pss)]
        if live is not None and number not in live:
            done.append(name)
    if done:
        at = end()  # asked after the producers' checkpoints were read: every row of those lanes is before it
        for name in done:
            marks.pending[name] = at
    return dropped


class LaneCheck:
    """The I/O of `prune` for one read of an intermediate partition: the producer tasks' checkpoints, the
    input systems' shards, the partition's end."""

    def __init__(
        self,
        sources: Mapping[tuple[str, int], LaneSource],
        checkpoint_of: Callable[[str], Any],
        admin_of: Callable[[str], Any],
    ) -> None:
        self.sources = sources
        self.checkpoint_of = checkpoint_of
        self.admin_of = admin_of

    def live_lanes(self, producer: str, pss: int) -> set[int] | None:
        code, partition, _ = parts_of(pss)
        source = self.sources.get((producer, code))
        if source is None:
            return None
        checkpoint = self.checkpoint_of(partition_task(producer, partition, source.task_prefix))
        if checkpoint is None:
            return None
        offset = checkpoint.offsets.get(SystemStreamPartition(source.system, source.stream, partition))
        if offset is None:
            return None
        lanes: set[int] | None = self.admin_of(source.system).lanes_live(source.stream, partition, str(offset))
        return lanes
