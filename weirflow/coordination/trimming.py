"""The leader deletes what no task will read again of the job's intermediate streams (docs/guarantees.md,
"Trimming").

Every `job.trim.interval.ms` (0: never) the leader reads every task's checkpoint once, works out per partition of
each intermediate stream the first offset anything may still read (`weirflow.runtime.trim_points`), and asks the
stream's system to delete the records below it (`SystemAdmin.trim`). Only systems that delete on request do
anything (the embedded log); on Event Hubs and Kinesis their retention deletes, and the leader reads nothing.

The same round applies the retention of the job's streams on a system that has no service of its own to do it
(`SystemAdmin.apply_retention`: the embedded log's `streams.<id>.retention` and `streams.<id>.retention.bytes`),
compacts a record task's table changelogs (`SystemAdmin.compact`: the latest record per key), and forgets the
output ids no replay can send again (`weirflow.coordination.id_pruning`).

Why a leader that lost its lease meanwhile does no harm: every bound is a checkpoint, and checkpoints only move
forward (fenced writes), so a trim computed from older checkpoints deletes less, never more. A trim runs on a
thread of its own, one round at a time (`Trimmer.start_due`), so that the leader loop keeps renewing its lease;
it costs one read of the checkpoint table and one delete per partition that moved (milliseconds on the
embedded log).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from weirflow.base import malformed
from weirflow.base.errors import MalformedDocumentError
from weirflow.coordination.id_pruning import ids_to_keep
from weirflow.interfaces.checkpoint import Checkpoint, CheckpointManager
from weirflow.interfaces.system import SystemStreamPartition
from weirflow.job.model import JobModel
from weirflow.job.systems import Systems
from weirflow.runtime.trim_points import TrimPoint, TrimScope, trim_points

log = logging.getLogger("weirflow.processor")


class Trimmer:
    """The leader's trim of intermediate streams, and the retention of the job's streams on systems that have no
    service to apply it (``retained``: the systems of the job's declared streams); one per tenure."""

    def __init__(
        self,
        checkpoints: CheckpointManager,
        systems: Systems,
        scope: TrimScope | None,
        interval_ms: int,
        clock: Callable[[], float] = time.monotonic,
        declared: Iterable[tuple[str, str]] = (),
    ) -> None:
        self._checkpoints = checkpoints
        self._systems = systems
        self._scope = scope
        self._declared = sorted(set(declared))  # (system, physical) of the job's own streams
        self._retained = sorted({system for system, _ in self._declared})
        self._interval_s = interval_ms / 1000
        self._clock = clock
        self._next = 0.0
        self._running = threading.Event()
        self.trimmed: dict[str, int] = {}  # records deleted per stream in this tenure (tests)
        self.forgotten: dict[str, int] = {}  # output ids forgotten per stream in this tenure

    def start_due(self, model: JobModel) -> None:
        """`check` on a thread of its own when due and no round is still running: the leader loop renews the
        leadership lease, and a round after a long stop may delete for seconds."""
        if self._interval_s <= 0 or self._clock() < self._next or self._running.is_set():
            return
        self._running.set()

        def round_() -> None:
            try:
                self.check(model)
            finally:
                self._running.clear()

        threading.Thread(target=round_, name="trimmer", daemon=True).start()

    def check(self, model: JobModel) -> int:
        """Trim and apply retention when due; returns how many records this call deleted."""
        if self._interval_s <= 0 or self._clock() < self._next:
            return 0
        self._next = self._clock() + self._interval_s
        deleted = self._retain()
        if not any(self._systems.admin(system).trims for system in self._systems_of(model)):
            return deleted
        try:
            deleted += self._compact()
            checkpoints = self._checkpoints.read_all()
            deleted += self._trim_intermediate(model, checkpoints)
            self._forget_ids(model, checkpoints)
        except MalformedDocumentError as exc:
            malformed.report("checkpoints", exc, action="nothing of the intermediate streams is trimmed")
        except Exception as exc:  # housekeeping: it never costs the leadership, and it is tried again
            log.warning(
                "could not trim the intermediate streams (%s: %s); trying again in %.0f s",
                type(exc).__name__,
                exc,
                self._interval_s,
            )
        return deleted

    def _systems_of(self, model: JobModel) -> set[str]:
        return {ssp.system for task in model.tasks.values() for ssp in task.ssps} | set(self._retained)

    def _retain(self) -> int:
        deleted: dict[str, int] = {}
        for system in self._retained:
            try:
                admin = self._systems.admin(system)
                deleted.update((admin.apply_retention() or {}) if admin.trims else {})
            except Exception as exc:  # housekeeping: tried again at the next interval
                log.warning(
                    "could not apply the retention of system '%s' (%s: %s)", system, type(exc).__name__, exc
                )
        return _tally(deleted, self.trimmed, "deleted records past their stream's retention")

    def _trim_intermediate(self, model: JobModel, checkpoints: Mapping[str, Checkpoint]) -> int:
        if self._scope is None:
            return 0
        ssps = [
            ssp
            for task in model.tasks.values()
            for ssp in task.ssps
            if (ssp.system, ssp.stream) in self._scope.streams and self._systems.admin(ssp.system).trims
        ]
        if not ssps:
            return 0
        points = trim_points(model.tasks, checkpoints, ssps, rebuilds=self._scope.rebuilds, compare=self._compare)
        return self._trim(points)

    def _compact(self) -> int:
        compacted: dict[str, int] = {}
        for system, stream in sorted(self._scope.compacted if self._scope is not None else ()):
            admin = self._systems.admin(system)
            if admin.trims and (count := admin.compact(stream)):
                compacted[stream] = count
        return _tally(
            compacted, self.trimmed, "compacted changelogs (records superseded by a later one of their key)"
        )

    def _forget_ids(self, model: JobModel, checkpoints: Mapping[str, Checkpoint]) -> None:
        """Forget the output ids of the job's streams that no replay can send again (`id_pruning`)."""
        keep = ids_to_keep(model, checkpoints, self._scope.stage_inputs if self._scope is not None else {})
        forgotten: dict[str, int] = {}
        for system, stream in self._declared:
            admin = self._systems.admin(system)
            if admin.trims and (count := admin.forget_ids(stream, keep)):
                forgotten[stream] = count
        _tally(forgotten, self.forgotten, "forgot output ids no replay sends again", logging.DEBUG)

    def _compare(self, ssp: SystemStreamPartition, a: str, b: str) -> int | None:
        return self._systems.admin(ssp.system).compare_offsets(a, b)

    def _trim(self, points: Mapping[SystemStreamPartition, TrimPoint]) -> int:
        now: dict[str, int] = {}
        for ssp, point in points.items():
            if point.offset is None:
                continue
            deleted = self._systems.admin(ssp.system).trim(ssp.stream, ssp.partition, point.offset) or 0
            if deleted:
                now[ssp.stream] = now.get(ssp.stream, 0) + deleted
                log.debug("trimmed %d records of %s below %s (%s)", deleted, ssp, point.offset, point.held_by)
        return _tally(now, self.trimmed, "trimmed records of intermediate streams that no task will read again")


def _tally(counts: dict[str, int], total: dict[str, int], what: str, level: int = logging.INFO) -> int:
    """Add one round's ``counts`` per stream to the tenure's ``total``, say them in one line, return their sum."""
    for stream, count in counts.items():
        total[stream] = total.get(stream, 0) + count
    if counts:
        log.log(level, "%s: %s", what, ", ".join(f"{stream} {count}" for stream, count in sorted(counts.items())))
    return sum(counts.values())
