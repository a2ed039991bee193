"""What the leader does on every tick: complete or time out the current latch, notice membership changes,
debounce them, and publish job model v+1 with a sticky balanced assignment.

Debounce is derived from the registry, not from the leader's memory, so a leader elected a moment ago acts
as promptly as one that watched the change happen: membership is *stable since* the latest change visible in
the registry — the `started_ms` of a processor that joined, or the `heartbeat_ms` of one that left (STOPPING).
A new model is published once that is at least `job.debounce.time.ms` ago. A burst of joins thus causes one
rebalance. A processor that went *silent* is dropped as soon as it is past the liveness timeout, with no
debounce on top: the timeout already waited longer, and the silences of processors that die together spread
over a heartbeat interval, which a debounce would not batch. A failover thus costs the liveness timeout, one
poll and the latch; the silent processor's leases are broken rather than waited for
(`weirflow.coordination.silence`).

Each publication is recorded right after it, with why (who joined, left or went silent) and which tasks moved
where, in the ``job-model-history`` document (`weirflow.coordination.model_history`): the status page's
"job model changes" and its count of failovers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from weirflow.base import clock as wall_clock
from weirflow.base import telemetry
from weirflow.base.errors import EtagMismatchError, LockLostError
from weirflow.coordination.assignment import assign
from weirflow.coordination.job_model_store import publish_job_model, read_job_model_or_report
from weirflow.coordination.model_history import ModelChange, describe_change, read_history_or_report, record_change
from weirflow.coordination.state import has_departed, is_live
from weirflow.coordination.timings import CoordinationTimings
from weirflow.interfaces.coordination import CoordinationUtils, LatchState, ProcessorInfo, latch_name
from weirflow.interfaces.metadata import MetadataStore
from weirflow.job.model import JobModel, TaskModel

log = logging.getLogger("weirflow.leader")

# Rows silent for this many liveness timeouts are removed from the registry by the leader.
_GC_FACTOR = 6


@dataclass(frozen=True)
class JobView:
    """The job as its leader saw it at its last tick, for the job-wide gauges of ``GET /metrics`` (only the
    leader reports them, so they are counted once): live processors, the tasks of the model, those whose owner
    is not live (unassigned or on a silent processor), and the failovers since the job began."""

    live_processors: int
    tasks: int
    unassigned_tasks: int
    failovers: int


class LeaderDuties:
    """State the leader keeps between ticks; a new instance is made each time leadership is won."""

    def __init__(
        self,
        owner: str,
        coordination: CoordinationUtils,
        metadata: MetadataStore,
        planner: Callable[[], dict[str, TaskModel]],
        timings: CoordinationTimings,
        clock: Callable[[], int] | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        """``on_change`` is called after this leader published a model or completed a latch: the processor's own
        follower then acts on it at once instead of at its next poll."""
        self.owner = owner
        self._coordination = coordination
        self._registry = coordination.processor_registry()
        self._metadata = metadata
        self._planner = planner
        self._timings = timings
        self._on_change = on_change or (lambda: None)
        # the wall clock unless a test drives time; read through the module so a patched `now_ms` counts
        self._clock = clock if clock is not None else lambda: wall_clock.now_ms()
        self._watched_latch: int | None = None  # version whose latch we are waiting on
        self._latch_deadline_ms = 0
        self._seen_version = -1  # the model version whose latch this leader has looked at
        self._republish = False  # a latch timed out: publish again even if membership is unchanged
        self._failovers: int | None = None  # from the model history: read on the first tick, then kept
        self.view: JobView | None = None  # the job at the last tick (the job-wide gauges)

    def tick(self) -> JobModel | None:
        """One round of leader work; returns the model it published, if any."""
        now = self._clock()
        model, etag = read_job_model_or_report(self._metadata)
        if model is None:  # its version is unknown: a model published now could go unnoticed (versions only grow)
            return None
        rows = self._registry.processors()
        self._collect_garbage(rows, now)
        live = sorted(p.processor_id for p in rows if is_live(p, now, self._timings.liveness_timeout_ms))
        self._see(model, live)

        self._adopt(model, now)
        self._check_latch(model, now)

        if not live:
            return None
        membership_changed = tuple(live) != model.processors
        if not (membership_changed or self._republish or model.version == 0):
            return None
        if membership_changed and not self._republish:
            stable_since = self._stable_since(model, rows, live)
            if now - stable_since < self._timings.debounce_ms:
                return None
        return self._publish(model, etag, live, now, rows)

    @property
    def watching_latch(self) -> bool:
        """Whether a latch of this leader's is open: it completes the latch once every processor joined."""
        return self._watched_latch is not None

    # --- helpers --------------------------------------------------------------------------------------
    def _see(self, model: JobModel, live: list[str]) -> None:
        if self._failovers is None:
            self._failovers = read_history_or_report(self._metadata)[0].failovers
        alive = set(live)
        unassigned = sum(1 for task in model.tasks if model.owner_of(task) not in alive)
        self.view = JobView(len(live), len(model.tasks), unassigned, self._failovers)

    def _stable_since(self, model: JobModel, rows: list[ProcessorInfo], live: list[str]) -> int:
        by_id = {p.processor_id: p for p in rows}
        changes = [0]
        for pid in set(live) - set(model.processors):
            changes.append(by_id[pid].started_ms)
        for pid in set(model.processors) - set(live):
            row = by_id.get(pid)
            if row is not None and has_departed(row.state):
                changes.append(row.heartbeat_ms)
            elif row is not None:
                # silent: no debounce past the liveness timeout, which already waited longer than a debounce
                # (and deaths' silences spread over a heartbeat interval: a debounce would not batch them)
                changes.append(row.heartbeat_ms + self._timings.liveness_timeout_ms - self._timings.debounce_ms)
        return max(changes)

    def _adopt(self, model: JobModel, now: int) -> None:
        """Look once at the latch of every model version this leader did not publish itself — the one it found
        on election, one a deposed leader published meanwhile, or its own whose publication raised although it
        was stored (a lost response, then a conflict on retry): an open latch is watched (completed or timed
        out), a timed-out one makes it publish again. Without this the latch would be orphaned: followers wait
        on it, and nobody completes it or publishes the version that replaces it."""
        if model.version <= 0 or model.version == self._seen_version:
            return
        self._seen_version = model.version
        if self._watched_latch == model.version:
            return
        state = self._coordination.latch(latch_name(model.version)).state()
        if state is LatchState.OPEN:
            log.info("job model v%d: watching its open latch (published by %s)", model.version, model.leader)
            self._watch_latch(model.version, now)
        elif state is LatchState.TIMED_OUT:
            log.warning("job model v%d: its latch timed out, no newer version exists; republishing", model.version)
            self._republish = True

    def _watch_latch(self, version: int, now: int) -> None:
        self._watched_latch = version
        self._latch_deadline_ms = now + self._timings.latch_timeout_ms

    def _check_latch(self, model: JobModel, now: int) -> None:
        if self._watched_latch is None:
            return
        if self._watched_latch != model.version:  # superseded (by us or a previous leader)
            self._watched_latch = None
            return
        latch = self._coordination.latch(latch_name(model.version))
        joined = latch.participants()
        missing = set(model.processors) - joined
        if not missing:
            latch.complete()
            log.info("job model v%d: all %d processors joined; latch complete", model.version, len(joined))
            self._watched_latch = None
            self._on_change()
        elif now >= self._latch_deadline_ms:
            latch.time_out()
            telemetry.count(telemetry.LATCH_TIMEOUTS)
            log.warning(
                "job model v%d: latch timed out waiting for %s; publishing a new version",
                model.version,
                ", ".join(sorted(missing)),
            )
            self._watched_latch = None
            self._republish = True

    def _publish(
        self, model: JobModel, etag: str | None, live: list[str], now: int, rows: list[ProcessorInfo]
    ) -> JobModel | None:
        tasks = self._planner()
        assignment = assign(tasks.keys(), live, model.assignment)
        new = JobModel(
            version=model.version + 1, tasks=tasks, assignment=assignment, created_ms=now, leader=self.owner
        )
        try:
            publish_job_model(self._metadata, new, etag)
        except EtagMismatchError:
            log.warning("job model changed while publishing v%d; another leader? re-reading", new.version)
            return None
        republished = self._republish
        self._republish = False
        self._seen_version = new.version
        self._watch_latch(new.version, now)
        self._record(describe_change(model, new, rows, self._timings.liveness_timeout_ms, republished))
        moved = sum(1 for t in tasks if model.owner_of(t) not in (None, new.owner_of(t)))
        log.info(
            "published job model v%d: %d tasks on %d processors (%s); %d tasks moved",
            new.version,
            len(tasks),
            len(live),
            ", ".join(f"{p}={len(new.tasks_of(p))}" for p in live),
            moved,
        )
        self._on_change()
        return new

    def _record(self, change: ModelChange) -> None:
        """Record why the model just published was (`weirflow.coordination.model_history`), through the fenced
        store. The model is published already: a failed record costs the status page one entry, so it is
        logged, not raised — but a refused fence still steps the leader down."""
        try:
            self._failovers = record_change(self._metadata, change).failovers
        except LockLostError:
            raise
        except Exception as exc:
            log.warning("job model v%d published, but its history was not recorded: %s", change.version, exc)

    def _collect_garbage(self, rows: list[ProcessorInfo], now: int) -> None:
        horizon = self._timings.liveness_timeout_ms * _GC_FACTOR
        for row in rows:
            if now - row.heartbeat_ms > horizon:
                self._registry.unregister(row.processor_id)
                log.info(
                    "removed processor %s from the registry (silent for %d s)",
                    row.processor_id,
                    (now - row.heartbeat_ms) // 1000,
                )
