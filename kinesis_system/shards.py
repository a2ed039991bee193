"""A stream's shards as `ListShards` describes them, and which of them feed a virtual task (docs/kinesis.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from weirflow_kinesis import positions
from weirflow_kinesis.hashing import slice_range


@dataclass(frozen=True)
class Shard:
    id: str
    low: int  # inclusive hash range
    high: int
    parents: tuple[str, ...]  # ParentShardId, AdjacentParentShardId (a merge has both)
    starting_sequence: str
    ending_sequence: str | None  # set once the shard is closed by a split or merge

    @classmethod
    def from_api(cls, shard: Mapping[str, Any]) -> Shard:
        parents = tuple(p for p in (shard.get("ParentShardId"), shard.get("AdjacentParentShardId")) if p)
        ranges = shard["HashKeyRange"]
        sequences = shard.get("SequenceNumberRange", {})
        return cls(
            id=shard["ShardId"],
            low=int(ranges["StartingHashKey"]),
            high=int(ranges["EndingHashKey"]),
            parents=parents,
            starting_sequence=str(sequences.get("StartingSequenceNumber", "")),
            ending_sequence=sequences.get("EndingSequenceNumber"),
        )

    @property
    def closed(self) -> bool:
        return self.ending_sequence is not None

    def overlaps(self, low: int, high: int) -> bool:
        return self.low <= high and low <= self.high


class ShardMap:
    """The shards of one stream at one listing, ordered so that parents come before their children."""

    def __init__(self, shards: Sequence[Shard]) -> None:
        self.by_id = {s.id: s for s in shards}
        # Creation order: a child's starting sequence number is above its parents' (Kinesis numbers records
        # across the stream's life), and ids break ties in the order Kinesis created them.
        self.ordered = sorted(shards, key=lambda s: (positions.sequence_key(s.starting_sequence), s.id))

    def __len__(self) -> int:
        return len(self.by_id)

    def feeding(self, task: int, virtual_tasks: int) -> list[Shard]:
        """Every shard whose hash range overlaps the task's slice, parents first."""
        low, high = slice_range(task, virtual_tasks)
        return [s for s in self.ordered if s.overlaps(low, high)]

    def readable(self, shard: Shard, position: Mapping[str, str], task: int, virtual_tasks: int) -> bool:
        """Whether ``shard`` may be read at ``position``: it has started (or has a start time), or every parent
        holding keys of the task's slice is processed to its end (or expired from the stream). A pinned start
        (`positions.pinned`) says where the shard's reading starts, not that its parents are done."""
        state = position.get(shard.id)
        if state is not None and not positions.is_pinned(state):
            return True
        low, high = slice_range(task, virtual_tasks)
        for parent_id in shard.parents:
            parent = self.by_id.get(parent_id)
            if parent is None or not parent.overlaps(low, high):
                continue  # expired, or held none of this slice's keys
            if position.get(parent_id) != positions.ENDED:
                return False
        return True

    def open_shards(self) -> list[Shard]:
        return [s for s in self.ordered if not s.closed]
