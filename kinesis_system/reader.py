"""Reading one virtual task's slice across the shards that feed it, through the spool (docs/kinesis.md).

`SliceReader.walk` is the one place that moves a task's position: it visits the shards feeding the slice,
parents before children, takes the slice's records after the position (or up to an end position), and marks
a shard ``"E"`` once it is read to its end, which makes its children readable. Without an end (planning a
micro-batch, polling) it never waits: it takes what the spool has and lets the spool make at most one
`GetRecords` call per shard. With an end it reads everything up to it, waiting for the spool when needed; an
end is a position a planned read returned (a sequence number or ``"E"`` per shard, reached exactly) or one of
`positions`' time marks (``"@ms"``: the records that arrived before that time).

Reading ahead fails loudly: each failure is logged at WARNING with the shard and retried with a growing pause,
and after ``read.failures`` failures of a shard in a row the next walk that reads the shard raises
`ReadAheadError` with the last error, so the task fails with its text instead of planning nothing forever.
A spool file found corrupt is rebuilt (`Spool.rebuild`) and the walk taken again.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from weirflow.base.errors import UnreadableRangeError
from weirflow_kinesis import positions
from weirflow_kinesis.errors import ReadAheadError
from weirflow_kinesis.shards import ShardMap
from weirflow_kinesis.spool import Spool
from weirflow_kinesis.spool_rows import Run, SpooledRecord, is_corrupt

log = logging.getLogger("weirflow.kinesis.reader")
# A read up to an end position gives up when the spool cannot reach it in this time.
_READ_TIMEOUT_S = 120.0
# Shards read by a walk within this time are read ahead in the background; the prefetcher's idle tick.
_INTEREST_S = 60.0
_PREFETCH_TICK_S = 0.02
_PREFETCH_THREADS = 4
# Failed reads ahead of one shard in a row after which a walk reading it raises (`read.failures`' default); the
# pause before the next try starts at `_RETRY_S` and doubles up to `_RETRY_MAX_S`.
DEFAULT_READ_FAILURES = 5
_RETRY_S = 1.0
_RETRY_MAX_S = 10.0
# How often the prefetcher, paused because the spool holds `spool.max.bytes`, trims what readers have passed.
_FULL_TRIM_EVERY_S = 1.0


@dataclass
class _Failing:
    """A shard whose reads ahead keep failing: how many in a row, the last error, when it failed and when to
    try again."""

    count: int
    error: BaseException
    failed_at: float
    retry_at: float


@dataclass
class Walk:
    """What a walk took: the records, the shard and ordinal of each (`positions.ordinal_of`), the position
    before each (when asked for) and the position after the last."""

    records: list[SpooledRecord] = field(default_factory=list)
    shards: list[str] = field(default_factory=list)
    ordinals: list[int] = field(default_factory=list)
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
    bases: dict[str, int] = field(default_factory=dict)  # shard → the ordinal before its next record, when set
    pruned: set[str] = field(default_factory=set)  # shards the start position pruned (`ShardMap.prune`)
    walk: Walk = field(default_factory=Walk)

    def take(self, shard: str, records: list[SpooledRecord]) -> None:
        if not records:
            return
        ordinal = self.bases.pop(shard, None)
        if ordinal is None:
            ordinal = positions.ordinal_of(self.position.get(shard))
        for record in records:
            if self.positions_before:
                self.walk.before.append(positions.encode(self.position))
            ordinal += 1
            self.position[shard] = positions.processed(record.sequence_number, ordinal)
            self.walk.records.append(record)
            self.walk.shards.append(shard)
            self.walk.ordinals.append(ordinal)


class SliceReader:
    """Reads the slices of one stream. ``shard_map(force)`` lists the stream's shards (cached unless forced)."""

    def __init__(
        self,
        spool: Spool,
        shard_map: Callable[[bool], ShardMap],
        virtual_tasks: int,
        read_failures: int = DEFAULT_READ_FAILURES,
        retry_s: float = _RETRY_S,
    ) -> None:
        self.spool = spool
        self.shard_map = shard_map
        self.virtual_tasks = virtual_tasks
        self.read_failures = read_failures
        self.retry_s = retry_s
        self._interest: dict[str, float] = {}  # shard → when a walk last read it
        self._failing: dict[str, _Failing] = {}
        self._full = False  # reading ahead is paused: the spool holds `spool.max.bytes`
        # While the spool is full, how often the prefetcher trims what readers have passed to make room.
        self.full_trim_every_s = _FULL_TRIM_EVERY_S
        self._full_trimmed = float("-inf")
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
                if not any(list(pool.map(self.fetch_ahead, wanted))):  # nothing due: wait a little
                    self._closed.wait(max(_PREFETCH_TICK_S, self.spool.read_interval_ms / 4000))

    def fetch_ahead(self, shard: str) -> bool:
        """One read ahead of ``shard`` if it is still open and the spool has room; returns whether it read.
        A failure is logged and counted (`_failed`), a corrupt spool rebuilt; success clears the count."""
        if self._closed.is_set():
            return False
        failing = self._failing.get(shard)
        if failing is not None and time.monotonic() < failing.retry_at:
            return False
        db = self.spool.db
        try:
            try:
                run = self.spool.run(shard)
                if run is None or run.ended or not self._room():
                    return False
                fetched = self.spool.fetch(shard, wait=False)
            except sqlite3.DatabaseError as exc:
                if not is_corrupt(exc):
                    raise
                self.spool.rebuild(exc, db)
                return False
        except Exception as exc:
            self._failed(shard, exc)
            return False
        self._failing.pop(shard, None)
        return fetched

    def _room(self) -> bool:
        """Whether the spool may grow: below ``spool.max.bytes``, after trimming what every reader has passed
        when it is not. Only reading ahead stops at the bound; a task's own reads go on."""
        spool = self.spool
        if spool.size() >= spool.max_bytes and time.monotonic() - self._full_trimmed >= self.full_trim_every_s:
            self._full_trimmed = time.monotonic()
            spool.trim(every_s=0)
        full = spool.size() >= spool.max_bytes
        if full != self._full:
            self._full = full
            log.info(
                "kinesis spool %s %s reading ahead: it holds %d bytes of records (spool.max.bytes: %d)",
                spool.stream,
                "pauses" if full else "resumes",
                spool.size(),
                spool.max_bytes,
            )
        return not full

    def _failed(self, shard: str, exc: BaseException) -> None:
        previous = self._failing.get(shard)
        count = previous.count + 1 if previous is not None else 1
        pause = min(_RETRY_MAX_S, self.retry_s * 2 ** (count - 1))
        now = time.monotonic()
        self._failing[shard] = _Failing(count, exc, now, now + pause)
        log.warning(
            "kinesis %s/%s: reading ahead failed (%d in a row; the task reading it fails at %d): %s: %s; "
            "trying again in %.1f s",
            self.spool.stream,
            shard,
            count,
            self.read_failures,
            type(exc).__name__,
            exc,
            pause,
        )

    def _raise_if_failing(self, shard: str) -> None:
        failing = self._failing.get(shard)
        if failing is None or failing.count < self.read_failures:
            return
        if time.monotonic() - failing.failed_at > _INTEREST_S + _RETRY_MAX_S:  # not tried since: not news
            self._failing.pop(shard, None)
            return
        raise ReadAheadError(
            f"kinesis stream '{self.spool.stream}' shard {shard}: reading ahead failed {failing.count} times in a "
            f"row (the limit, systems.<name>.read.failures: {self.read_failures}); the last error: "
            f"{type(failing.error).__name__}: {failing.error}. Fix its cause (AWS credentials or IAM policy, disk "
            "space under systems.<name>.spool.dir, the service's reachability)"
        ) from failing.error

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
        plans again, and the prefetcher keeps the spool filled meanwhile. Raises `ReadAheadError` when reading
        a shard it needs ahead keeps failing."""
        if not patient:
            self._start_prefetcher()
        db = self.spool.db
        try:
            return self._walk(task, start, limit, end, values, positions_before, patient)
        except sqlite3.DatabaseError as exc:
            if not is_corrupt(exc):
                raise
            self.spool.rebuild(exc, db)
        return self._walk(task, start, limit, end, values, positions_before, patient)

    def _walk(
        self,
        task: int,
        start: str,
        limit: int,
        end: str | None,
        values: bool,
        positions_before: bool,
        patient: bool,
    ) -> Walk:
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
        shards = self.shard_map(False)
        state.pruned = shards.pruned_shards(state.position, task, self.virtual_tasks)
        while len(state.walk.records) < limit:
            progress = False
            shards = self.shard_map(force_listing)
            force_listing = False
            for shard in shards.feeding(task, self.virtual_tasks):
                if len(state.walk.records) >= limit:
                    break
                moved, ended = self._visit(state, shards, shard.id)
                progress, force_listing = progress or moved, force_listing or ended
            if (
                state.target is not None
                and all(
                    s in state.done or state.position.get(s) == positions.ENDED
                    for s in positions.shard_states(state.target)
                )
                and not any(
                    s not in state.target and self._pruned_by_target(state, v)
                    for s, v in positions.shard_states(state.position).items()
                )
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
        target = state.target
        if (
            state.walk.at_end
            and end is not None
            and target is not None
            and not any(v.startswith("@") for v in target.values())
        ):
            state.walk.end = end  # reached exactly: the end as planned (pruned with the planner's listing)
        else:
            state.walk.end = positions.encode(shards.prune(state.position, task, self.virtual_tasks))
        return state.walk

    def _visit(self, state: _WalkState, shards: ShardMap, shard_id: str) -> tuple[bool, bool]:
        """Take what the walk may of one shard; returns (whether the position moved, whether the shard ended)."""
        current = state.position.get(shard_id)
        if self._settled(state, shards, shard_id):
            return False, False
        goal = None
        if state.target is not None:
            goal = self._goal_in_target(state, shard_id, current)
            if goal is None:
                state.done.add(shard_id)
                return False, False
        if not shards.readable(
            shards.by_id[shard_id], state.position, state.task, self.virtual_tasks, state.pruned
        ):
            return False, False
        self._raise_if_failing(shard_id)
        if current is not None and current.startswith("@"):
            current = self.spool.resolve_time(shard_id, int(current[1:]))
            if current is None:  # no record at or after that time yet
                if goal is not None and goal.now:
                    state.done.add(shard_id)
                return False, False
            if current == positions.ENDED:
                state.position[shard_id] = current
                return True, True
        self._anchor(state, shard_id, current or "", goal)
        walk = state.walk
        if not state.patient:  # a planner: read this shard ahead from now on
            self._interest[shard_id] = time.monotonic()
        room = state.limit - len(walk.records)
        took, finished, reached = self._shard(state, shard_id, positions.sequence_of(current or ""), room, goal)
        state.take(shard_id, took)
        if finished:
            state.position[shard_id] = positions.ENDED
        if reached:
            state.done.add(shard_id)
        return bool(took) or finished, finished

    def _goal_in_target(self, state: _WalkState, shard_id: str, current: str | None) -> _Goal | None:
        """The shard's goal in the walk's end (`_goal`); its end where that end pruned it (`_pruned_by_target`)."""
        assert state.target is not None
        goal = self._goal(shard_id, current, state.target.get(shard_id))
        if goal is None and self._pruned_by_target(state, current):
            return _Goal(ended=True)
        return goal

    @staticmethod
    def _pruned_by_target(state: _WalkState, current: str | None) -> bool:
        """Whether the walk's end pruned a shard this walk has yet to finish: the shard is absent from the end,
        the walk holds it (read part way, pinned or at a time, not ended) and the end counts more shards ended
        than the walk has. A position drops a shard it holds only by pruning it once read to its end
        (`ShardMap.prune`), so the walk reads it to its end too. Taken as "nothing to read", a replay of a
        planned batch that finished a parent would skip the parent's last records (or wait forever on its
        children, which are read only after it)."""
        target = state.target
        if target is None or current is None or current == positions.ENDED:
            return False
        return positions.pruned(target) > 0 and positions.ended(target) > positions.ended(state.position)

    def _settled(self, state: _WalkState, shards: ShardMap, shard_id: str) -> bool:
        """Whether the walk has nothing more to do in the shard: read to its end (``"E"``, or pruned from the
        position, `ShardMap.prune`) or to its goal."""
        current = state.position.get(shard_id)
        if current == positions.ENDED or shard_id in state.done:
            return True
        if current is None and shard_id in state.pruned:
            state.done.add(shard_id)
            return True
        return False

    def _anchor(self, state: _WalkState, shard: str, start: str, goal: _Goal | None) -> None:
        """A read of a planned range that starts ``shard`` (no record of it processed yet): the range's end
        names the ordinal of its last record there, given when it was planned, so the records are counted back
        from it. Counted from the start, they would count from the oldest record still held (or a pinned one
        that retention has since dropped), and retention may have dropped some that the planned read (and its
        earlier attempt) counted: the replay's records would take lower ordinals and new records be taken for
        replays. One extra pass over what the read takes anyway, once per range that starts a shard."""
        ordinal = positions.ordinal_of((state.target or {}).get(shard))
        if goal is None or not goal.upto or not goal.inclusive or not ordinal:
            return
        if positions.started(state.position.get(shard)):
            return
        counting = _WalkState(state.task, {}, None, 1 << 62, False, False, state.deadline, state.patient)
        took, _, reached = self._shard(counting, shard, start, 1 << 62, goal)
        if not reached or not took or took[-1].sequence_number != goal.upto:
            return
        base = ordinal - len(took)
        if base:
            log.warning(
                "kinesis %s/%s task v%d: %d record(s) counted when this range was planned are no longer held "
                "(dropped by the stream's retention); the range's records keep the ordinals its plan gave them",
                self.spool.stream,
                shard,
                state.task,
                base,
            )
        state.bases[shard] = base

    def pin(self, task: int, start: str, oldest: dict[str, str | None] | None = None) -> str:
        """``start`` with each shard the task reads from where the stream starts now (absent: its oldest record;
        a time: the first record at or after it) pinned at that record (`positions.pinned`), when it has one.
        Checkpointed before a task's first read, it fixes where ordinals count from: retention dropping that
        record later is then reported as a loss (`Spool.oldest`), where an unpinned replay would silently count
        from a later record and give new records the ordinals of records already written. ``oldest`` keeps the
        shards' oldest records across the calls for one stream's tasks (a shard feeds several)."""
        position = positions.decode(start)
        shards = self.shard_map(False)
        pinned = dict(position)
        held = oldest if oldest is not None else {}
        done = shards.pruned_shards(position, task, self.virtual_tasks)
        for shard in shards.feeding(task, self.virtual_tasks):
            state = position.get(shard.id)
            if not positions.unanchored(state) or shard.id in done:
                continue
            if state is None:
                if shard.id not in held:
                    held[shard.id] = self.spool.oldest(shard.id)
                first = held[shard.id]
                if first is not None:
                    pinned[shard.id] = positions.pinned(first)
            elif shards.readable(shard, position, task, self.virtual_tasks, done):
                resolved = self.spool.resolve_time(shard.id, int(state[1:]))
                if resolved is not None and positions.is_pinned(resolved):
                    pinned[shard.id] = resolved
        return positions.encode(pinned) if pinned != position else start

    def _goal(self, shard: str, state: str | None, goal: str | None) -> _Goal | None:
        """The shard's goal in an end position, or None when the shard has nothing to read before it."""
        if goal is None or (state is not None and positions.sequence_of(goal) == positions.sequence_of(state)):
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
        return _Goal(upto=positions.sequence_of(goal))

    def _shard(
        self, walk: _WalkState, shard: str, state: str, room: int, goal: _Goal | None
    ) -> tuple[list[SpooledRecord], bool, bool]:
        """Up to ``room`` records of the task's slice in ``shard`` after ``state`` (up to ``goal`` when given);
        whether the shard is then processed to its end, and whether the goal is reached."""
        task, values, deadline = walk.task, walk.values, walk.deadline
        upto = goal.upto if goal is not None else None
        inclusive = goal.inclusive if goal is not None else True

        def spooled() -> tuple[list[SpooledRecord], Run]:
            """The records after ``state`` and the run they were taken from (one snapshot); the run ensured
            again whenever it no longer covers ``state`` (trimmed or restarted meanwhile), so what is taken is
            everything the run holds."""
            while True:
                taken = self.spool.take(shard, task, state, room, upto, values, inclusive)
                if taken is not None:
                    return taken
                self.spool.ensure(shard, state, task)

        self.spool.ensure(shard, state, task)
        while True:
            took, run = spooled()
            if len(took) >= room:
                return took, False, False
            if goal is None or goal.now:  # a poll: what is spooled (a patient one reads once when nothing is)
                if not run.ended and walk.patient and self.spool.fetch(shard, wait=not took):
                    took, run = spooled()
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
