"""The leader loop of a `StreamProcessor` (`weirflow.coordination.processor`): it tries to win the leadership
lease every poll; while leading, renews it and runs `LeaderDuties.tick`; on a failed renew it steps down at once,
and it also steps down (self-fence) when no renewal was confirmed by ``deadline - margin``; every write of its
duties checks that deadline first (`weirflow.coordination.leader_fence`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from weirflow.base.errors import LockLostError
from weirflow.coordination.job_finished import FinishedWatch
from weirflow.coordination.leader import LeaderDuties
from weirflow.coordination.leader_fence import FencedCoordination, FencedMetadataStore, LeaderFence
from weirflow.coordination.loops import Leadership, LoopErrors
from weirflow.coordination.processor_core import ProcessorCore
from weirflow.coordination.trimming import Trimmer
from weirflow.interfaces.coordination import LeaderElector
from weirflow.interfaces.stream_names import declared_streams
from weirflow.job.drain_notice import run_id_of
from weirflow.job.model import TaskModel

log = logging.getLogger("weirflow.processor")

# While a latch is open, the processors of its model and the leader look at it this often (never less often than
# every poll): a rebalance's tasks stay stopped until its latch completes and each processor sees that, a few
# reads for the second or so that takes, where a poll interval per step would add a second or more.
LATCH_POLL_MS = 100


class LeaderRole(ProcessorCore):
    """The leader loop and its self-fence."""

    def _leader_loop(self, planner: Callable[[], dict[str, TaskModel]]) -> None:
        assert self.ctx is not None
        elector = self.ctx.coordination.leader_elector()
        tenure = self._tenure = Leadership()
        errors = LoopErrors()
        while not self._stop.is_set():
            try:
                self._leader_round(elector, tenure, planner)
                self._recovered(errors, "leader")
            except LockLostError as exc:  # a leader write refused by the self-fence (`leader_fence`)
                log.error("stepping down as leader: %s", exc)
                tenure.step_down()
            except Exception as exc:
                self._loop_error("leader", errors, exc)
                self._fence_leadership(tenure)
            duties = tenure.duties
            pause = self._round_ms()
            if duties is not None and duties.watching_latch:
                pause = min(LATCH_POLL_MS, pause)
            self._wait(pause, self._wake_leader)
        try:
            elector.resign()
        except Exception as exc:
            log.error("could not resign leadership: %s", exc)

    def _leader_round(
        self, elector: LeaderElector, tenure: Leadership, planner: Callable[[], dict[str, TaskModel]]
    ) -> None:
        assert self.ctx is not None
        lease_s = self.timings.lease_ms / 1000
        if tenure.duties is None:
            sent_at = time.monotonic()
            won = elector.try_become_leader()
            if not won and self._break_silent_leader(elector):
                sent_at = time.monotonic()
                won = elector.try_become_leader()
            if won:
                log.info("became leader")
                tenure.confirm(sent_at, lease_s)
                tenure.lapses = self._keeper.lapses
                fence = LeaderFence(
                    self.processor_id, lambda: self._leadership_until(tenure), instance=self.instance_id
                )
                metadata = FencedMetadataStore(self.ctx.metadata, fence)
                coordination = FencedCoordination(self.ctx.coordination, fence)
                tenure.duties = LeaderDuties(
                    self.processor_id,
                    coordination,
                    metadata,
                    planner,
                    self.timings,
                    on_change=self._wake_follower.set,
                )
                tenure.finished = FinishedWatch(
                    self.ctx.checkpoints, metadata, self.timings.finished_check_interval_ms, run_id_of(self.config)
                )
                scope = self.runner.trim_scope() if self.runner is not None else None
                interval = int(self.config.get("job.trim.interval.ms"))
                declared = [(ref.system, ref.physical) for ref in declared_streams(self.config)]
                tenure.trimmer = Trimmer(
                    self.ctx.checkpoints, self.ctx.systems, scope, interval, declared=declared
                )
        elif time.monotonic() - tenure.last_sent >= self.timings.renew_interval_ms / 1000:
            self._fence_leadership(tenure)  # a renewal may take long: never act on a lease past its margin
            sent_at = time.monotonic()
            if elector.renew():
                tenure.confirm(sent_at, lease_s)
            elif tenure.duties is not None:
                log.warning("lost leadership (lease renewal failed); stepping down")
                tenure.step_down()
        self._fence_leadership(tenure)
        if tenure.duties is not None:
            tenure.duties.tick()
        if tenure.trimmer is not None and self._model.version > 0:
            tenure.trimmer.start_due(self._model)
        if tenure.finished is not None and self._model.version == self._working_version:
            if tenure.finished.check(self._model) and not self._finished_known:
                # written by this process: its follower reads it now rather than a check interval later
                self._finished_known = True
                self._next_finished_read = 0.0
                self._wake_follower.set()

    def _break_silent_leader(self, elector: LeaderElector) -> bool:
        """Break the leadership lease when its holder is silent past the liveness timeout; whether it was."""
        holders = self._silent_holders()
        silent = holders.silent()
        if not silent:
            return False
        return holders.break_lease(
            "the leadership lease", elector.current_leader(), silent, elector.break_if_held_by
        )

    def _leadership_until(self, tenure: Leadership) -> float:
        """Until when this leader may write: its lease's deadline - margin, never past the alive deadline, and
        never after a heartbeat gap (`LeaseKeeper.heartbeat_confirmed`) in its tenure."""
        if self._keeper.lapses != tenure.lapses:
            return float("-inf")
        return min(tenure.deadline - self.timings.renew_margin_ms / 1000, self._keeper.alive_until())

    def _fence_leadership(self, tenure: Leadership) -> None:
        """Step down when the leadership lease was not confirmed by ``deadline - margin``, or this processor was
        not heard for ``liveness - liveness margin`` (a silent leader's lease may be broken by a follower)."""
        if tenure.duties is None or time.monotonic() < self._leadership_until(tenure):
            return
        if time.monotonic() >= tenure.deadline - self.timings.renew_margin_ms / 1000:
            log.error(
                "leadership lease not renewed within lease - margin (%d ms); stepping down before it can expire",
                self.timings.lease_ms - self.timings.renew_margin_ms,
            )
        else:
            log.error(
                "no heartbeat of this processor confirmed within liveness - margin (%d ms); stepping down before "
                "a follower may break the leadership lease",
                self.timings.liveness_timeout_ms - self.timings.liveness_margin_ms(),
            )
        tenure.step_down()
