"""A stream's shards as `ListShards` describes them, and which of them feed a virtual task (docs/kinesis.md)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
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
        self.children: dict[str, list[Shard]] = {}
        for shard in self.ordered:
            for parent in shard.parents:
                self.children.setdefault(parent, []).append(shard)

    def __len__(self) -> int:
        return len(self.by_id)

    def feeding(self, task: int, virtual_tasks: int) -> list[Shard]:
        """Every shard whose hash range overlaps the task's slice, parents first."""
        low, high = slice_range(task, virtual_tasks)
        return [s for s in self.ordered if s.overlaps(low, high)]

    def readable(
        self,
        shard: Shard,
        position: Mapping[str, str],
        task: int,
        virtual_tasks: int,
        pruned: Collection[str] | None = None,
    ) -> bool:
        """Whether ``shard`` may be read at ``position``: it has started (or has a start time), or every parent
        holding keys of the task's slice is processed to its end (`done`; or expired from the stream). A
        pinned start (`positions.pinned`) says where the shard's reading starts, not that its parents are done.
        ``pruned``: `pruned_shards` of the position, when the caller has it."""
        state = position.get(shard.id)
        if state is not None and not positions.is_pinned(state):
            return True
        low, high = slice_range(task, virtual_tasks)
        parents = [p for p in map(self.by_id.get, shard.parents) if p is not None and p.overlaps(low, high)]
        if not parents:  # expired, or held none of this slice's keys
            return True
        if pruned is None:
            pruned = self.pruned_shards(position, task, virtual_tasks)
        return all(position.get(p.id) == positions.ENDED or p.id in pruned for p in parents)

    def done(self, shard: Shard, position: Mapping[str, str], task: int, virtual_tasks: int) -> bool:
        """Whether ``shard`` is processed to its end at ``position``: ``"E"``, or pruned (`pruned_shards`)."""
        state = position.get(shard.id)
        if state is not None:
            return state == positions.ENDED
        return shard.id in self.pruned_shards(position, task, virtual_tasks)

    def pruned_shards(self, position: Mapping[str, str], task: int, virtual_tasks: int) -> set[str]:
        """The shards feeding the task that ``position`` has pruned (`prune`): absent while a child holding keys
        of the task's slice has started or is done itself. A child is read only once its parents are done, so a
        shard never read has no such child."""
        return self._followed(position, task, virtual_tasks)[1]

    def prune(self, position: Mapping[str, str], task: int, virtual_tasks: int) -> dict[str, str]:
        """``position`` without the ended shards that no read needs any more (`positions`, "pruned"): those
        expired from the stream, and those a child of which, holding keys of the task's slice, has started or
        is done (which `done` and `readable` then read from the child)."""
        states = positions.shard_states(position)
        expired = {s for s, state in states.items() if state == positions.ENDED and s not in self.by_id}
        drop = expired | self._followed(position, task, virtual_tasks)[0]
        if not drop:
            return dict(position)
        kept = {shard: state for shard, state in position.items() if shard not in drop}
        kept[positions.PRUNED] = str(positions.pruned(position) + len(drop))
        return kept

    def _followed(self, position: Mapping[str, str], task: int, virtual_tasks: int) -> tuple[set[str], set[str]]:
        """(the shards ``"E"`` at ``position`` that a child holding keys of the task's slice follows: one that
        has started or is done; the shards absent from it that such a child follows: pruned). One pass,
        children before parents, so that a child pruned itself still counts as done for its parents."""
        low, high = slice_range(task, virtual_tasks)
        done: set[str] = set()
        ended: set[str] = set()
        pruned: set[str] = set()
        for shard in reversed(self.ordered):
            state = position.get(shard.id)
            if not shard.overlaps(low, high) or state not in (None, positions.ENDED):
                continue
            children = (c for c in self.children.get(shard.id, ()) if c.overlaps(low, high))
            if any(positions.started(position.get(c.id)) or c.id in done for c in children):
                (ended if state == positions.ENDED else pruned).add(shard.id)
                done.add(shard.id)
            elif state == positions.ENDED:
                done.add(shard.id)
        return ended, pruned

    def open_shards(self) -> list[Shard]:
        return [s for s in self.ordered if not s.closed]
