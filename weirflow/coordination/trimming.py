"""The leader deletes what no task will read again of the job's intermediate streams (docs/guarantees.md,
"Trimming").

Every `job.trim.interval.ms` (0: never) the leader reads every task's checkpoint once, works out per partition of
each intermediate stream the first offset anything may still read (`weirflow.runtime.trim_points`), and asks the
stream's system to delete the records below it (`SystemAdmin.trim`). Only systems that delete on request do
anything (the embedded log); on Event Hubs and Kinesis their retention deletes, and the leader reads nothing.

Why a leader that lost its lease meanwhile does no harm: every bound is a checkpoint, and checkpoints only move
forward (fenced writes), so a trim computed from older checkpoints deletes less, never more. A trim runs in the
leader's loop between its lease renewals; it costs one read of the checkpoint table and one delete per
partition that moved (milliseconds on the embedded log).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from weirflow.base import malformed
from weirflow.base.errors import MalformedDocumentError
from weirflow.interfaces.checkpoint import CheckpointManager
from weirflow.interfaces.system import SystemStreamPartition
from weirflow.job.model import JobModel
from weirflow.job.systems import Systems
from weirflow.runtime.trim_points import TrimPoint, TrimScope, trim_points

log = logging.getLogger("weirflow.processor")


class Trimmer:
    """The leader's trim of intermediate streams; a new one is made with each tenure."""

    def __init__(
        self,
        checkpoints: CheckpointManager,
        systems: Systems,
        scope: TrimScope | None,
        interval_ms: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._checkpoints = checkpoints
        self._systems = systems
        self._scope = scope
        self._interval_s = interval_ms / 1000
        self._clock = clock
        self._next = 0.0
        self.trimmed: dict[str, int] = {}  # records deleted per stream in this tenure (`weirflow status`, tests)

    def check(self, model: JobModel) -> int:
        """Trim when due; returns how many records this call deleted."""
        if self._scope is None or self._interval_s <= 0 or self._clock() < self._next:
            return 0
        self._next = self._clock() + self._interval_s
        ssps = [
            ssp
            for task in model.tasks.values()
            for ssp in task.ssps
            if (ssp.system, ssp.stream) in self._scope.streams and self._systems.admin(ssp.system).trims
        ]
        if not ssps:
            return 0
        try:
            checkpoints = self._checkpoints.read_all()
            points = trim_points(
                model.tasks, checkpoints, ssps, rebuilds=self._scope.rebuilds, compare=self._compare
            )
            return self._trim(points)
        except MalformedDocumentError as exc:
            malformed.report("checkpoints", exc, action="nothing of the intermediate streams is trimmed")
        except Exception as exc:  # a trim is housekeeping: it never costs the leadership, it is tried again
            log.warning(
                "could not trim the intermediate streams (%s: %s); trying again in %.0f s",
                type(exc).__name__,
                exc,
                self._interval_s,
            )
        return 0

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
        for stream, count in now.items():
            self.trimmed[stream] = self.trimmed.get(stream, 0) + count
        if now:
            log.info(
                "trimmed records of intermediate streams that no task will read again: %s",
                ", ".join(f"{stream} {count}" for stream, count in sorted(now.items())),
            )
        return sum(now.values())
