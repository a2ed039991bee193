"""Reading one virtual task's slice across the shards that feed it, through the spool (docs/kinesis.md).

`SliceReader.walk` is the one place that moves a task's position: it visits the shards feeding the slice,
parents before children, takes the slice's records after the position (or up to an end position), and marks
a shard ``"E"`` once it is read to its end, which makes its children readable. Without an end (planning a
micro-batch, polling) it never waits: it takes what the spool has and lets the spool make at most one
`GetRecords` call per shard. With an end it reads everything up to it, waiting for the spool when needed; an
end is a position a planned read returned (a sequence number or ``"E"`` per shard, reached exactly) or one of
`positions`' time marks (``"@ms"``: the records that arrived before that time).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from weirflow.errors import UnreadableRangeError
from weirflow_kinesis import positions
from weirflow_kinesis.shards import ShardMap
from weirflow_kinesis.spool import Spool, SpooledRecord

log = logging.getLogger("weirflow.kinesis.reader")
# A read up to an end position gives up when the spool cannot reach it in this time.
_READ_TIMEOUT_S = 120.0
# Shards read by a walk within this time are read ahead in the background; the prefetcher's idle tick.
_INTEREST_S = 60.0
_PREFETCH_TICK_S = 0.02
_PREFETCH_THREADS = 4


@dataclass
class Walk:
    """What a walk took: the records, the shard of each, the position before each (when asked for) and the
    position after the last."""

    records: list[SpooledRecord] = field(default_factory=list)
    shards: list[str] = field(default_factory=list)
    before: list[str] = field(default_factory=list)
    end: str = positions.EARLIEST
    at_end: bool = False  # the walk stopped because nothing more is there now (not because of its limit)


@dataclass(frozen=True)
class _Goal:
    """Where a shard's read stops: after sequence ``upto`` (inclusive) or before it (exclusive), at its end
    (``ended``), or wherever the spool is now (``now``: a time mark not yet reached by any record)."""

    upto: str | None = None
    inclusive: bool = True
    ended: bool = False
    now: bool = False


@dataclass
class _WalkState:
    task: int
    position: dict[str, str]
    target: dict[str, str] | None
    limit: int
    values: bool
    positions_before: bool
    deadline: float
    patient: bool = True
    behind: bool = False  # a shard visited was not read to what it held (its run not caught up)
    done: set[str] = field(default_factory=set)  # shards whose goal is reached (walks with an end)
    walk: Walk = field(default_factory=Walk)

    def take(self, shard: str, records: list[SpooledRecord]) -> None:
        for record in records:
            if self.positions_before:
                self.walk.before.append(positions.encode(self.position))
            self.position[shard] = record.sequence_number
            self.walk.records.append(record)
            self.walk.shards.append(shard)


class SliceReader:
    """Reads the slices of one stream. ``shard_map(force)`` lists the stream's shards (cached unless forced)."""

    def __init__(self, spool: Spool, shard_map: Callable[[bool], ShardMap], virtual_tasks: int) -> None:
        self.spool = spool
        self.shard_map = shard_map
        self.virtual_tasks = virtual_tasks
        self._interest: dict[str, float] = {}  # shard → when a walk last read it
        self._prefetcher: threading.Thread | None = None
        self._guard = threading.Lock()
        self._closed = threading.Event()

    def close(self) -> None:
        """Stop reading ahead, then close the spool."""
        self._closed.set()
        with self._guard:
            prefetcher = self._prefetcher
        if prefetcher is not None:
            prefetcher.join(timeout=30)
        self.spool.close()

    def _start_prefetcher(self) -> None:
        with self._guard:
            if self._prefetcher is None:
                name = f"kinesis-prefetch-{self.spool.stream}"
                self._prefetcher = threading.Thread(target=self._prefetch, name=name, daemon=True)
                self._prefetcher.start()

    def _prefetch(self) -> None:
        """Keep reading ahead, in the background, every shard a planning walk read in the last minute and not yet
        read to its end: one `GetRecords` per shard per read interval (the spool's rate and lock hold across
        processes), several shards at once, so planning a micro-batch finds its records spooled instead of
        waiting for the network (planning itself never reads Kinesis)."""
        with ThreadPoolExecutor(_PREFETCH_THREADS, thread_name_prefix="kinesis-prefetch") as pool:
            while not self._closed.is_set():
                now = time.monotonic()
                wanted = []
                for shard, seen in list(self._interest.items()):
                    if now - seen > _INTEREST_S:
                        self._interest.pop(shard, None)
                    else:
                        wanted.append(shard)
                if not any(list(pool.map(self._fetch_quietly, wanted))):  # nothing due: wait a little
                    self._closed.wait(max(_PREFETCH_TICK_S, self.spool.read_interval_ms / 4000))

    def _fetch_quietly(self, shard: str) -> bool:
        """One read ahead of ``shard`` if it is still open; failures are left to the next walk that needs it."""
        if self._closed.is_set():
            return False
        try:
            run = self.spool.run(shard)
            return run is not None and not run.ended and self.spool.fetch(shard, wait=False)
        except Exception as exc:
            log.debug("kinesis %s/%s: reading ahead failed: %s", self.spool.stream, shard, exc)
            return False

    def walk(
        self,
        task: int,
        start: str,
        limit: int,
        end: str | None = None,
        values: bool = True,
        positions_before: bool = False,
        patient: bool = True,
    ) -> Walk:
        """The task's records after ``start``: at most ``limit``, and only up to ``end`` when given. A
        ``patient`` walk without an end waits out a shard's read interval when the spool has nothing for it
        (a poll right after a write sees the write); planning a micro-batch is not patient: the next trigger
        plans again, and the prefetcher keeps the spool filled meanwhile."""
        if not patient:
            self._start_prefetcher()
        state = _WalkState(
            task,
            positions.decode(start),
            positions.decode(end) if end is not None else None,
            limit,
            values,
            positions_before,
            time.monotonic() + _READ_TIMEOUT_S,
            patient,
        )
        force_listing = False
        while len(state.walk.records) < limit:
            progress = False
            shards = self.shard_map(force_listing)
            force_listing = False
            for shard in shards.feeding(task, self.virtual_tasks):
                if len(state.walk.records) >= limit:
                    break
                moved, ended = self._visit(state, shards, shard.id)
                progress, force_listing = progress or moved, force_listing or ended
            if state.target is not None and all(
                s in state.done or state.position.get(s) == positions.ENDED for s in state.target
            ):
                state.walk.at_end = True
                break
            if not progress:
                if state.target is None:
                    state.walk.at_end = not state.behind
                    break
                if time.monotonic() > state.deadline:
                    raise UnreadableRangeError(
                        f"kinesis {self.spool.stream} task v{task}: could not read up to {end} "
                        f"(at {positions.encode(state.position)})"
                    )
                time.sleep(0.05)  # a parent still being read elsewhere in this walk's range: poll
        state.walk.end = positions.encode(state.position)
        return state.walk

    def _visit(self, state: _WalkState, shards: ShardMap, shard_id: str) -> tuple[bool, bool]:
        """Take what the walk may of one shard; returns (whether the position moved, whether the shard ended)."""
        current = state.position.get(shard_id)
        if current == positions.ENDED or shard_id in state.done:
            return False, False
        goal = None
        if state.target is not None:
            goal = self._goal(shard_id, current, state.target.get(shard_id))
            if goal is None:
                state.done.add(shard_id)
                return False, False
        if not shards.readable(shards.by_id[shard_id], state.position, state.task, self.virtual_tasks):
            return False, False
        if current is not None and current.startswith("@"):
            current = self.spool.resolve_time(shard_id, int(current[1:]))
            if current is None:  # no record at or after that time yet
                if goal is not None and goal.now:
                    state.done.add(shard_id)
                return False, False
            if current == positions.ENDED:
                state.position[shard_id] = current
                return True, True
        walk = state.walk
        if not state.patient:  # a planner: read this shard ahead from now on
            self._interest[shard_id] = time.monotonic()
        room = state.limit - len(walk.records)
        took, finished, reached = self._shard(state, shard_id, current or "", room, goal)
        state.take(shard_id, took)
        if finished:
            state.position[shard_id] = positions.ENDED
        if reached:
            state.done.add(shard_id)
        return bool(took) or finished, finished

    def _goal(self, shard: str, state: str | None, goal: str | None) -> _Goal | None:
        """The shard's goal in an end position, or None when the shard has nothing to read before it."""
        if goal is None or goal == state:
            return None
        if goal == positions.ENDED:
            return _Goal(ended=True)
        if goal.startswith("@"):
            resolved = self.spool.resolve_time(shard, int(goal[1:]))
            if resolved is None:
                return _Goal(now=True)
            if resolved == positions.ENDED:
                return _Goal(ended=True)
            goal = resolved
        if goal.startswith("<"):
            return _Goal(upto=goal[1:], inclusive=False)
        return _Goal(upto=goal)

    def _shard(
        self, walk: _WalkState, shard: str, state: str, room: int, goal: _Goal | None
    ) -> tuple[list[SpooledRecord], bool, bool]:
        """Up to ``room`` records of the task's slice in ``shard`` after ``state`` (up to ``goal`` when given);
        whether the shard is then processed to its end, and whether the goal is reached."""
        task, values, deadline = walk.task, walk.values, walk.deadline
        self.spool.ensure(shard, state)
        upto = goal.upto if goal is not None else None
        inclusive = goal.inclusive if goal is not None else True
        while True:
            took = self.spool.records(shard, task, state, room, upto, values, inclusive)
            run = self.spool.run(shard)
            assert run is not None
            if len(took) >= room:
                return took, False, False
            if goal is None or goal.now:  # a poll: what is spooled (a patient one reads once when nothing is)
                if not run.ended and walk.patient and self.spool.fetch(shard, wait=not took):
                    took = self.spool.records(shard, task, state, room, upto, values, inclusive)
                    run = self.spool.run(shard)
                    assert run is not None
                finished = run.ended and len(took) < room  # took holds everything the run has
                if not run.caught_up and not run.ended:
                    walk.behind = True
                return took, finished, goal is not None
            if upto is not None and run.hi and positions.sequence_key(run.hi) >= positions.sequence_key(upto):
                return took, False, True
            if run.ended:
                return took, True, True
            if time.monotonic() > deadline:
                raise UnreadableRangeError(f"kinesis {self.spool.stream}/{shard}: the spool did not reach {goal}")
            self.spool.fetch(shard, wait=True)
